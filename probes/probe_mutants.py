"""Run a differential probe's scenarios under each mutant, in one process.

One SGLang import: the probe's ``prepare`` runs once, then the scenarios run
unmutated (the baseline), then once per mutant (apply, run, restore, check the
restore), then unmutated again (``baseline_after``). The harness (``python -m pdevidence mutate <exp>``) judges the kills
from this document; this script only observes.

With ``--jobs N`` (N > 1) each mutant runs in a child forked from this process once the
baseline has run, N at a time: every mutant starts from the same imported, prepared
SGLang, and whatever a mutant leaves behind dies with its child.

    python probes/probe_mutants.py --probe probes/probe_admission_differential.py \
        --mutants specs.json [--only A_m1 --only A_m2] [--jobs 2] --out /tmp/mutants.json

``specs.json`` is a JSON list of the registry's ``Mutant.spec()``. Exit 0 when
every mutant ran (an inapplicable or unbuildable mutant is recorded, not fatal),
3 when SGLang cannot be set up, a restore failed (every later run would be
void) or the driver itself failed (its traceback is printed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _mutants  # noqa: E402
import _probekit  # noqa: E402
import _standins  # noqa: E402

SCHEMA = "pd-mutant-probe/1"


def run_all(scenario_set) -> dict:
    return {sc.id: _probekit.run_scenario(sc) for sc in scenario_set.scenarios}


def run_mutant(spec: _mutants.MutantSpec, scenario_set) -> dict:
    """One mutant's record; a failed restore propagates (RestoreError)."""
    record = {"status": "applied", "error": None, "scenarios": {}}
    with contextlib.ExitStack() as mutated:  # restored and checked on the way out, whatever the scenarios do
        try:
            mutated.enter_context(_mutants.applied(spec))
        except _mutants.NotApplicable as exc:
            return {**record, "status": "not applicable", "error": _probekit.scrub(str(exc))}
        except _mutants.MutantError as exc:
            return {**record, "status": "error", "error": _probekit.scrub(str(exc))}
        except Exception as exc:  # an operator that breaks on this tree's source: record it, run the rest
            err = _probekit.describe_error(exc)
            return {**record, "status": "error", "error": f"cannot apply: {err['type']}: {err['message']}"}
        record["scenarios"] = run_all(scenario_set)
    return record


def run_forked(specs: list, scenario_set, jobs: int) -> dict:
    """Each mutant's record from a child forked per mutant, at most ``jobs`` alive at once, in ``specs`` order."""
    records, running = {}, {}
    pending = list(specs)
    while pending or running:
        while pending and len(running) < jobs:
            spec = pending.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: one mutant, its record down the pipe, never back into the parent's loop
                os.close(read)
                code = 0
                try:
                    text = json.dumps(run_mutant(spec, scenario_set))
                except _mutants.RestoreError as exc:
                    text = json.dumps({"restore_error": str(exc)})
                except BaseException:
                    traceback.print_exc()
                    text, code = "", _probekit.EXIT_CANNOT_RUN
                with os.fdopen(write, "w", encoding="utf-8") as out:
                    out.write(text)
                os._exit(code)
            os.close(write)
            running[pid] = (spec, os.fdopen(read, encoding="utf-8"))
        pid, status = os.wait()
        if pid not in running:
            continue
        spec, pipe = running.pop(pid)
        with pipe:
            text = pipe.read()
        code = os.waitstatus_to_exitcode(status)
        if code != 0 or not text:
            raise ChildDied(spec.id, code)
        records[spec.id] = json.loads(text)
    return {spec.id: records[spec.id] for spec in specs}


class ChildDied(Exception):
    """A mutant's child ended without its record: the driver ends as that child did, as one process would."""

    def __init__(self, mutant: str, code: int):
        super().__init__(f"the child running mutant {mutant} ended with {code}")
        self.status = code if code > 0 else 128 - code  # killed by a signal: the shell's 128 + N


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=Path, required=True, help="the differential probe whose scenarios run")
    parser.add_argument("--mutants", type=Path, required=True, help="JSON list of mutant specs")
    parser.add_argument("--only", action="append", default=[], help="run only this mutant id (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants at once, each in a forked child (default 1: "
                        "in this process, one after another)")
    _probekit.add_tree_arguments(parser)
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
    try:
        scenario_set, prepare = _probekit.load_probe(args.probe)
    except TypeError as exc:
        print(exc, file=sys.stderr)
        return _probekit.EXIT_USAGE
    _probekit.quiet_environment()
    _probekit.block_network()
    _standins.install()
    found = _probekit.prepared(scenario_set, prepare)
    if found is None:
        return _probekit.EXIT_CANNOT_RUN
    version, absent = found
    if absent:
        print(f"probe cannot run: sglang {version} has no PD disaggregation ({_probekit.PD_PACKAGE}): "
              "no fix to mutate", file=sys.stderr)
        return _probekit.EXIT_CANNOT_RUN
    doc = {
        "schema": SCHEMA,
        "experiment": scenario_set.experiment,
        "tree": _probekit.tree_of(args, version),
        "sglang_version": version,
        "baseline": run_all(scenario_set),
        "mutants": {},
    }
    if args.jobs > 1:
        try:
            doc["mutants"] = run_forked(specs, scenario_set, args.jobs)
        except ChildDied as exc:
            print(exc, file=sys.stderr)
            return exc.status
        failed = [f"{sid}: {rec['restore_error']}" for sid, rec in doc["mutants"].items() if "restore_error" in rec]
        if failed:  # only the child's copy was left mutated, but a mutant that cannot be undone is broken
            print(f"restore failed: {'; '.join(failed)}", file=sys.stderr)
            return _probekit.EXIT_CANNOT_RUN
    else:
        for spec in specs:
            try:
                doc["mutants"][spec.id] = run_mutant(spec, scenario_set)
            except _mutants.RestoreError as exc:
                print(f"restore failed, every later run would be void: {exc}", file=sys.stderr)
                return _probekit.EXIT_CANNOT_RUN
    # Run again unmutated: a mutant that left state behind shows up as a different baseline.
    doc["baseline_after"] = run_all(scenario_set)
    if scenario_set.adaptations:  # as a result lists them (absent where none ran): a judge's rules may hold on one
        doc["adaptations"] = sorted(scenario_set.adaptations)
    _probekit.emit(_probekit.dumps(doc), args.out)
    return _probekit.EXIT_OK


if __name__ == "__main__":
    sys.exit(_probekit.run_driver(main))
