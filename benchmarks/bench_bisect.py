"""A bisection over one release bracket against one forced release cell, in one run (issue 45: at most 2x).

    SGLANG_REPO=~/src/sglang python benchmarks/bench_bisect.py                  # offload_slots, v0.5.12 .. v0.5.13
    SGLANG_REPO=~/src/sglang python benchmarks/bench_bisect.py prefill --good v0.5.19 --bad v0.5.20

The bisection is the fix's search alone over the bracket's line of the main line (no introduction, no watch),
every commit probed again (``--force``), through the warm engine as ``bisect`` probes; the cell is
``cell release <experiment> head --force``, a fresh probe process. Each is a child process; environments are
built beforehand (a warm-up, not measured), so the ratio compares probing, not downloads. The line's commits are
exported again in the measured bisection (their exports are removed first, as a prune would: what a running run
holds stays), so a step's export and compile count, as they do the first time a bracket is bisected; the child
says how its time went by phase (``trees``: exporting and compiling).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pdevidence.core import settings  # noqa: E402
from pdevidence.core.errors import HarnessError  # noqa: E402

TARGET = 2.0


def seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return time.perf_counter() - start


def cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "pdevidence", "--root", str(ROOT), *argv]


def search(experiment: str, good: str, bad: str, force: bool, drop: bool) -> None:
    """The fix's search over ``good`` .. ``bad``, as ``bisect`` runs it (in this process: the measured child); with
    ``drop``, only the exports of the line's commits removed instead (before the measured child, not timed)."""
    from pdevidence import registry
    from pdevidence.core import phases
    from pdevidence.documents.vocabulary import Boundary
    from pdevidence.lanes import bisect_run, cache
    from pdevidence.lanes.bisect import Search
    from pdevidence.sources.history import Clone

    reg = registry.load(ROOT)
    clone = Clone(settings.get("SGLANG_REPO"))
    main = clone.main()
    line, commits = bisect_run.line_between(clone, main, good, bad, clone.tip(main))
    found = Search(Boundary.FIX, commits)
    if drop:
        dropped = cache.drop_exports(commits)
        print(f"{len(dropped.removed)} export(s) removed, {len(dropped.in_use)} held by another run stayed")
        return
    started = time.monotonic()
    searches = {(experiment, Boundary.FIX): found}
    with phases.recording() as spent, bisect_run.kept_engines(reg, log=lambda _: None) as engines, \
            bisect_run.Prober(reg, clone, [experiment], fresh_references=False, force=force, log=lambda _: None,
                              engines=engines) as prober:
        pending = [commits[-1], commits[0]]
        while pending:
            prober.probe(pending, bisect_run.upcoming(searches, pending))
            pending = bisect_run.next_commits(searches, prober)
    answer = found.answer()
    print(f"{line.commits} commits, {len(prober.judged)} probed in {len(prober.steps)} rounds: {answer.finding.value}"
          f" {answer.commit or answer.why}; {phases.describe(spent, time.monotonic() - started)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", nargs="?", default="offload_slots")
    parser.add_argument("--good", default="v0.5.12")
    parser.add_argument("--bad", default="v0.5.13")
    parser.add_argument("--search", action="store_true", help=argparse.SUPPRESS)  # the measured child
    parser.add_argument("--force", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--drop-exports", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.search:
        search(args.experiment, args.good, args.bad, args.force, args.drop_exports)
        return 0
    try:  # parsed as every command parses it: a path that is not a directory stops here, not in the child
        repo = settings.get("SGLANG_REPO")
    except HarnessError as exc:
        sys.exit(str(exc))
    if repo is None:
        sys.exit("set SGLANG_REPO to a clone of SGLang's history")
    child = [sys.executable, __file__, args.experiment, "--good", args.good, "--bad", args.bad, "--search"]
    # Warm-up, not measured: the cell's environment, every era the line's commits run in, their exports.
    seconds(cli("cell", "release", args.experiment, "head"))
    seconds(child)
    cell = seconds(cli("cell", "release", args.experiment, "head", "--force"))
    seconds([*child, "--drop-exports"])  # the line's commits exported afresh in the measured run
    start = time.perf_counter()
    done = subprocess.run([*child, "--force"], cwd=ROOT, capture_output=True, text=True, check=True)
    bisected = time.perf_counter() - start
    ratio = bisected / cell
    print(f"forced release cell {args.experiment},head: {cell:.1f} s")
    print(f"bisect {args.experiment} {args.good} .. {args.bad}, every commit exported and probed again: "
          f"{bisected:.1f} s "
          f"({done.stdout.strip()})")
    print(f"bisect / cell: {ratio:.2f}x (target <= {TARGET}x): {'ok' if ratio <= TARGET else 'OVER'}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
