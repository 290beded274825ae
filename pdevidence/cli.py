"""Command line: ``python -m pdevidence <command>``; the noxfile calls the same functions.

Every failure becomes one line of what happened, what was expected, what to
do, and the exit code documented in the README.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import cells, compare, drift, integrity, mutate, registry, report, sweep, upstream
from .errors import BEHAVIOUR_DIFFERS, CONFIRMED, EXIT_CODES, HarnessError, worst
from .paths import PROJECT, results_dir, runs_dir, work_dir
from .results import dumps, write_atomic


def run_cells(reg: registry.Registry, todo: list[cells.Cell], *, jobs: int = 1, force: bool = False) -> int:
    """Run cells, ``jobs`` at a time; every cell runs even when another fails."""
    cells.torch_choice()  # decide before the threads start, once for all of them

    def one(cell: cells.Cell) -> int:
        try:
            cells.run_cell(reg, cell, force=force, log=lambda msg: print(msg, flush=True))
            return CONFIRMED
        except HarnessError as exc:
            cells.report_failure(cell, exc)
            return exc.code

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        codes = list(pool.map(one, todo))
    return worst(codes)


def cmd_cell(args) -> int:
    reg = registry.load(args.root)
    cell = cells.parse_cell(reg, args.kind, args.experiment, args.side)
    if args.ref:
        cell = cells.Cell(cell.experiment, cell.side, cell.kind, args.ref)
    return run_cells(reg, [cell], force=args.force)


def cmd_matrix(args) -> int:
    reg = registry.load(args.root)
    code = run_cells(reg, cells.matrix(reg, args.kind), jobs=args.jobs, force=args.force)
    if code != CONFIRMED:
        return code
    return cmd_compare(args)


def cmd_compare(args) -> int:
    reg = registry.load(args.root)
    kinds = [args.kind] if args.kind != "all" else list(compare.COMPARED_KINDS)
    summary = compare.compare_all(reg, runs=runs_dir(reg.root), published=results_dir(reg.root), kinds=kinds)
    summary.upstream = upstream.summarize(runs_dir(reg.root), reg, tuple(kinds))
    report.write(summary, results_dir(reg.root))
    print(report.terminal(summary))
    return summary.exit_code


def cmd_verify(args) -> int:
    integrity.verify(args.root)
    print("SHA256SUMS.txt: every listed file matches, and every published file is listed")
    return CONFIRMED


def cmd_checksums(args) -> int:
    path = integrity.regenerate(args.root)
    print(f"wrote {path}")
    return CONFIRMED


def cmd_publish(args) -> int:
    reg = registry.load(args.root)
    published = compare.publish(reg, runs_dir(reg.root), results_dir(reg.root), kind=args.kind)
    for path in published:
        print(f"published {path.relative_to(reg.root)}")
    print(f"wrote {integrity.regenerate(args.root)}")
    return CONFIRMED


def cmd_sweep(args) -> int:
    reg = registry.load(args.root)
    outcomes = sweep.sweep(reg, args.experiment, published=results_dir(reg.root),
                           out_dir=runs_dir(reg.root) / "sweep", versions=args.versions or None, jobs=args.jobs)
    out = runs_dir(reg.root) / f"sweep-{args.experiment}.json"
    write_atomic(out, dumps(sweep.document(args.experiment, outcomes)))
    print(sweep.table(args.experiment, outcomes, reg.experiment(args.experiment).releases))
    print(f"wrote {out}")
    return CONFIRMED if sweep.first_fixed(outcomes) else BEHAVIOUR_DIFFERS


def cmd_drift(args) -> int:
    reg = registry.load(args.root)
    registry.check_side(args.side)
    pins = {"torch": args.torch, "torchvision": args.torchvision}
    if args.transformers:
        pins["transformers"] = args.transformers
    found = drift.run(reg, args.experiment, args.side, pins, published=results_dir(reg.root),
                      work=work_dir(reg.root), log=print)
    out = runs_dir(reg.root) / "drift" / f"{args.experiment}.{args.side}.drift.json"
    write_atomic(out, dumps(drift.document(found)))
    print(drift.summary(found))
    print(f"wrote {out}")
    return CONFIRMED  # advisory: a change is reported, never a failure


def cmd_upstream(args) -> int:
    """Failing upstream tests are the data, not an error: a written result exits 0."""
    reg = registry.load(args.root)
    cell = cells.parse_cell(reg, args.kind, args.experiment, args.side)
    if args.ref:
        cell = cells.Cell(cell.experiment, cell.side, cell.kind, args.ref)
    upstream.run_upstream(reg, cell, tests_dir=args.tests, log=lambda msg: print(msg, flush=True))
    return CONFIRMED


def cmd_mutate(args) -> int:
    """Every mutant of an experiment on its head release; exit 0 only when each applicable one is killed."""
    reg = registry.load(args.root)
    result = mutate.run(reg, args.experiment, log=lambda msg: print(msg, flush=True))
    print(f"wrote {mutate.write(result, reg.root)}")
    print(mutate.table(result))  # its last line is the score: "<experiment>: K of N mutants killed"
    return result.exit_code


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdevidence", description=__doc__,
                                epilog="exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
    p.add_argument("--root", type=Path, default=PROJECT, help="project directory (default: this checkout)")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("cell", help="run one cell")
    c.add_argument("kind", choices=list(cells.SESSION_OF_KIND))
    c.add_argument("experiment")
    c.add_argument("side")
    c.add_argument("--ref", help="override the registry: a version, a commit SHA or a directory")
    c.add_argument("--force", action="store_true", help="rerun even if the inputs are unchanged")
    c.set_defaults(func=cmd_cell)

    m = sub.add_parser("matrix", help="run every cell of one tree kind, then compare")
    m.add_argument("--kind", default="release", choices=["release", "git"])
    m.add_argument("--jobs", type=int, default=2, help="cells run at once (default 2)")
    m.add_argument("--force", action="store_true")
    m.set_defaults(func=cmd_matrix)

    cmp_ = sub.add_parser("compare", help="compare existing cell results; runs no probe")
    cmp_.add_argument("--kind", default="release", choices=["release", "git", "all"])
    cmp_.set_defaults(func=cmd_compare)

    sub.add_parser("verify", help="check SHA256SUMS.txt").set_defaults(func=cmd_verify)
    sub.add_parser("checksums", help="regenerate SHA256SUMS.txt").set_defaults(func=cmd_checksums)

    sw = sub.add_parser("sweep", help="run an experiment's probe on every release and classify each")
    sw.add_argument("experiment")
    sw.add_argument("versions", nargs="*", help="releases to probe (default: the registry floor up to the newest)")
    sw.add_argument("--jobs", type=int, default=2)
    sw.set_defaults(func=cmd_sweep)

    dr = sub.add_parser("drift", help="rerun a release cell on newer torch/transformers; advisory")
    dr.add_argument("experiment")
    dr.add_argument("side")
    dr.add_argument("--torch", default=drift.LATEST, help="torch version (default: the newest on PyPI)")
    dr.add_argument("--torchvision", default=drift.LATEST)
    dr.add_argument("--transformers", help="also move transformers (a version, or 'latest')")
    dr.set_defaults(func=cmd_drift)

    pub = sub.add_parser("publish", help="copy fresh results of a kind into results/ and update SHA256SUMS.txt")
    pub.add_argument("--kind", default="release", choices=["release", "git"])
    pub.set_defaults(func=cmd_publish)

    mu = sub.add_parser("mutate", help="run the probe under each declared mutant of the fix; name survivors")
    mu.add_argument("experiment")
    mu.set_defaults(func=cmd_mutate)

    up = sub.add_parser("upstream", help="run the PR's own test files (from the head tree) on one side's tree")
    up.add_argument("experiment")
    up.add_argument("side")
    up.add_argument("--kind", choices=list(cells.SESSION_OF_KIND), default=os.environ.get("PDEVIDENCE_UPSTREAM_KIND", "git"),
                    help="whose tree and environment: git (default, or $PDEVIDENCE_UPSTREAM_KIND), release or path")
    up.add_argument("--tests", type=Path, metavar="DIR",
                    help=f"an SGLang checkout (or a directory) holding the test files; default ${upstream.TESTS_ENV}, "
                    "else the head commit's tree (SGLANG_REPO or GitHub)")
    up.add_argument("--ref", help="override the side's tree: a version, a commit SHA or a directory")
    up.set_defaults(func=cmd_upstream)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
