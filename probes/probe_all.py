"""Run every experiment's probe in one process: one SGLang import for all of them.

Loads each probe module by path (default: every ``probe_*_differential.py``
beside this file), runs its ``prepare()`` and its scenario set, and writes the
same result document the probe writes alone to ``DIR/<experiment>.json``. An
experiment whose ``prepare()`` fails gets ``DIR/<experiment>.cannot-run.json``
with the error instead; the others still run. SGLang is imported once, before any probe: when that
import fails, every experiment's cannot-run record carries its error.

With ``--server-args`` (a JSON array: an operator's server arguments) it then reads them as the
tree does (``_serverconfig``: its parser, then its own resolution of the arguments that follow from
others) and writes ``DIR/config.json``: the effective values of the ``--server-attrs`` attributes
it establishes (one its parser does not define is left out), why the others are not established,
or the error naming the argument it refused. With ``--server-env`` (a JSON object: an operator's server
environment) and ``--server-gates`` (a JSON object: each gate's variable and the value that turns its
fix on) it reads them as the tree does (``_serverenv``: its own ``Envs``) and writes ``DIR/environment.json``.

    python probes/probe_all.py --out-dir /tmp/out --tree-kind release --tree-ref 0.5.21

Exit 0 when at least one experiment ran, 3 when none could (or the driver itself failed:
its traceback is printed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _standins  # noqa: E402
from _probekit import (EXIT_CANNOT_RUN, EXIT_OK, EXIT_USAGE, add_tree_arguments, block_network,  # noqa: E402
                       build_document, describe_error, dumps, load_probe, prepare_tree, quiet_environment, run_driver,
                       tree_of, write_atomic)

CANNOT_RUN_SCHEMA = "pd-probe-cannot-run/1"
CANNOT_RUN_SUFFIX = ".cannot-run.json"
CONFIG_FILE = "config.json"
ENVIRONMENT_FILE = "environment.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run every differential probe against the installed SGLang.")
    parser.add_argument("probes", nargs="*", type=Path, help="probe files (default: probe_*_differential.py here)")
    parser.add_argument("--out-dir", type=Path, required=True, help="one <experiment>.json per experiment")
    parser.add_argument("--side", default="local", help="label of the tree under test")
    add_tree_arguments(parser, kinds=None)
    parser.add_argument("--server-args", type=json.loads, default=None,
                        help="a JSON array: server arguments to parse with the tree's own ServerArgs parser")
    parser.add_argument("--server-attrs", default="", help="comma-separated ServerArgs attributes to report")
    parser.add_argument("--server-env", type=json.loads, default=None,
                        help="a JSON object: the server's environment variables, read with the tree's own Envs")
    parser.add_argument("--server-gates", type=json.loads, default=None,
                        help="a JSON object: each gate's variable -> the value that turns its fix on")
    return parser.parse_args(argv)


def import_sglang() -> Exception | None:
    """Why the tree's ``sglang`` does not import, or None (it imports, or there is none: each ``prepare()`` says
    so). Tried once per process: a failed import leaves the submodules it had imported behind (Python drops only
    the package that raised), so a second attempt meets that half-imported state and fails with another error
    (``KeyError: 'sglang'``), not the tree's own."""
    try:
        import sglang  # noqa: F401
    except ModuleNotFoundError as exc:
        return None if exc.name == "sglang" else exc
    except Exception as exc:  # the tree's import error is the answer of every probe
        return exc
    return None


def run_one(path: Path, args: argparse.Namespace, import_error: Exception | None) -> bool:
    """Write one experiment's result, or its cannot-run record; True when it ran."""
    experiment = path.stem.removeprefix("probe_").removesuffix("_differential")
    try:
        scenario_set, prepare = load_probe(path)
        experiment = scenario_set.experiment
        if import_error is not None:
            raise import_error
        version, absent = prepare_tree(scenario_set, prepare)
    except Exception as exc:  # this experiment cannot run; the next one still may
        error = describe_error(exc)
        print(f"{experiment}: probe cannot run: {error['type']}: {error['message']}", file=sys.stderr)
        record = {"schema": CANNOT_RUN_SCHEMA, "experiment": experiment, "error": error}
        write_atomic(args.out_dir / f"{experiment}{CANNOT_RUN_SUFFIX}", dumps(record))
        return False
    doc = build_document(scenario_set, args.side, tree_of(args, version), {"sglang_version": version},
                         pd_absent=absent)
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
    import_error = import_sglang()
    ran = [run_one(path.resolve(), args, import_error) for path in probes]
    if args.server_args is not None:  # after the probes: their results are those of a run without it
        attrs = [a for a in args.server_attrs.split(",") if a]
        from _serverconfig import read_configuration
        write_atomic(args.out_dir / CONFIG_FILE, dumps(read_configuration(args.server_args, attrs)))
    if args.server_env is not None or args.server_gates is not None:
        from _serverenv import read_environment
        write_atomic(args.out_dir / ENVIRONMENT_FILE,
                     dumps(read_environment(args.server_env or {}, args.server_gates or {})))
    return EXIT_OK if any(ran) else EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(run_driver(main))
