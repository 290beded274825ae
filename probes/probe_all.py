"""Run every experiment's probe in one process: one SGLang import for all of them.

Loads each probe module by path (default: every ``probe_*_differential.py``
beside this file), runs its ``prepare()`` and its scenario set, and writes the
same result document the probe writes alone to ``DIR/<experiment>.json``. An
experiment whose ``prepare()`` fails gets ``DIR/<experiment>.cannot-run.json``
with the error instead; the others still run.

    python probes/probe_all.py --out-dir /tmp/out --tree-kind release --tree-ref 0.5.21

Exit 0 when at least one experiment ran, 3 when none could (or the driver itself failed:
its traceback is printed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _standins  # noqa: E402
from _probekit import (EXIT_CANNOT_RUN, EXIT_OK, EXIT_USAGE, ScenarioSet, block_network,  # noqa: E402
                       build_document, describe_error, dumps, quiet_environment, run_driver, write_atomic)

CANNOT_RUN_SCHEMA = "pd-probe-cannot-run/1"
CANNOT_RUN_SUFFIX = ".cannot-run.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run every differential probe against the installed SGLang.")
    parser.add_argument("probes", nargs="*", type=Path, help="probe files (default: probe_*_differential.py here)")
    parser.add_argument("--out-dir", type=Path, required=True, help="one <experiment>.json per experiment")
    parser.add_argument("--side", default="local", help="label of the tree under test")
    # Free text here (not the single probes' choices): a check also names wheels and interpreters.
    parser.add_argument("--tree-kind", default="path")
    parser.add_argument("--tree-ref", default="")
    parser.add_argument("--tree-resolved", default="", help="default: sglang.__version__")
    return parser.parse_args(argv)


def load_probe(path: Path):
    """The probe's scenario set and prepare(), whatever the module names them."""
    spec = importlib.util.spec_from_file_location(f"pdprobe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sets = [value for value in vars(module).values() if isinstance(value, ScenarioSet)]
    if len(sets) != 1 or not callable(getattr(module, "prepare", None)):
        raise TypeError(f"{path.name} must define one ScenarioSet and a prepare() function")
    return sets[0], module.prepare


def run_one(path: Path, args: argparse.Namespace) -> bool:
    """Write one experiment's result, or its cannot-run record; True when it ran."""
    experiment = path.stem.removeprefix("probe_").removesuffix("_differential")
    try:
        scenario_set, prepare = load_probe(path)
        experiment = scenario_set.experiment
        version = prepare()
    except Exception as exc:  # this experiment cannot run; the next one still may
        error = describe_error(exc)
        print(f"{experiment}: probe cannot run: {error['type']}: {error['message']}", file=sys.stderr)
        record = {"schema": CANNOT_RUN_SCHEMA, "experiment": experiment, "error": error}
        write_atomic(args.out_dir / f"{experiment}{CANNOT_RUN_SUFFIX}", dumps(record))
        return False
    tree = {"kind": args.tree_kind, "ref": args.tree_ref or version, "resolved": args.tree_resolved or version}
    doc = build_document(scenario_set, args.side, tree, {"sglang_version": version})
    write_atomic(args.out_dir / f"{experiment}.json", dumps(doc))
    return True


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    probes = args.probes or sorted(HERE.glob("probe_*_differential.py"))
    quiet_environment()
    block_network()
    _standins.install()  # before any probe imports SGLang
    ran = [run_one(path.resolve(), args) for path in probes]
    return EXIT_OK if any(ran) else EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(run_driver(main))
