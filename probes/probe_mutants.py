"""Run a differential probe's scenarios under each mutant, in one process.

One SGLang import: the probe's ``prepare`` runs once, then the scenarios run
unmutated (the baseline), then once per mutant (apply, run, restore, check the
restore), then unmutated again (``baseline_after``). The harness (``python -m pdevidence mutate <exp>``) judges the kills
from this document; this script only observes.

    python probes/probe_mutants.py --probe probes/probe_admission_differential.py \
        --mutants specs.json [--only A_m1 --only A_m2] --out /tmp/mutants.json

``specs.json`` is a JSON list of the registry's ``Mutant.spec()``. Exit 0 when
every mutant ran (an inapplicable or unbuildable mutant is recorded, not fatal),
3 when SGLang cannot be set up, a restore failed (every later run would be
void) or the driver itself failed (its traceback is printed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _mutants  # noqa: E402
import _probekit  # noqa: E402
import _standins  # noqa: E402

SCHEMA = "pd-mutant-probe/1"


def load_probe(path: Path):
    """The probe module's scenario set and its ``prepare``."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    sets = [v for v in vars(module).values() if isinstance(v, _probekit.ScenarioSet)]
    if len(sets) != 1 or not callable(getattr(module, "prepare", None)):
        raise SystemExit(f"{path}: expected one ScenarioSet and a prepare() function")
    return sets[0], module.prepare


def run_all(scenario_set) -> dict:
    return {sc.id: _probekit.run_scenario(sc) for sc in scenario_set.scenarios}


def run_mutant(spec: _mutants.MutantSpec, scenario_set) -> dict:
    """One mutant's record; a failed restore propagates (RestoreError)."""
    record = {"status": "applied", "error": None, "scenarios": {}}
    try:
        patch = _mutants.apply(spec)
    except _mutants.NotApplicable as exc:
        return {**record, "status": "not applicable", "error": _probekit.scrub(str(exc))}
    except _mutants.MutantError as exc:
        return {**record, "status": "error", "error": _probekit.scrub(str(exc))}
    except Exception as exc:  # an operator that breaks on this tree's source: record it, run the rest
        err = _probekit.describe_error(exc)
        return {**record, "status": "error", "error": f"cannot apply: {err['type']}: {err['message']}"}
    try:
        record["scenarios"] = run_all(scenario_set)
    finally:
        patch.restore()
        patch.check()
    return record


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=Path, required=True, help="the differential probe whose scenarios run")
    parser.add_argument("--mutants", type=Path, required=True, help="JSON list of mutant specs")
    parser.add_argument("--only", action="append", default=[], help="run only this mutant id (repeatable)")
    parser.add_argument("--tree-kind", default="path", choices=["git", "release", "path"])
    parser.add_argument("--tree-ref", default="")
    parser.add_argument("--tree-resolved", default="")
    parser.add_argument("--out", type=Path, help="write the document here (atomically); default: stdout")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        specs = [_mutants.MutantSpec.from_json(d) for d in json.loads(args.mutants.read_text(encoding="utf-8"))]
    except SystemExit as exc:
        return _probekit.EXIT_USAGE if exc.code else _probekit.EXIT_OK
    except (OSError, ValueError, TypeError, _mutants.MutantError) as exc:
        print(f"bad mutant specs: {exc}", file=sys.stderr)
        return _probekit.EXIT_USAGE
    unknown = set(args.only) - {s.id for s in specs}
    if unknown:
        print(f"--only names unknown mutants: {', '.join(sorted(unknown))}", file=sys.stderr)
        return _probekit.EXIT_USAGE
    specs = [s for s in specs if not args.only or s.id in args.only]
    scenario_set, prepare = load_probe(args.probe)
    _probekit.quiet_environment()
    _probekit.block_network()
    _standins.install()
    try:
        version = prepare()
    except Exception as exc:
        err = _probekit.describe_error(exc)
        print(f"probe cannot run: SGLang setup failed: {err['type']}: {err['message']}", file=sys.stderr)
        return _probekit.EXIT_CANNOT_RUN
    doc = {
        "schema": SCHEMA,
        "experiment": scenario_set.experiment,
        "tree": {"kind": args.tree_kind, "ref": args.tree_ref or version, "resolved": args.tree_resolved or version},
        "sglang_version": version,
        "baseline": run_all(scenario_set),
        "mutants": {},
    }
    for spec in specs:
        try:
            doc["mutants"][spec.id] = run_mutant(spec, scenario_set)
        except _mutants.RestoreError as exc:
            print(f"restore failed, every later run would be void: {exc}", file=sys.stderr)
            return _probekit.EXIT_CANNOT_RUN
    # Run again unmutated: a mutant that left state behind shows up as a different baseline.
    doc["baseline_after"] = run_all(scenario_set)
    text = _probekit.dumps(doc)
    if args.out:
        _probekit.write_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return _probekit.EXIT_OK


if __name__ == "__main__":
    sys.exit(_probekit.run_driver(main))
