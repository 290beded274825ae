"""What containment costs: a release probed contained (bubblewrap) against the same run uncontained.

    python benchmarks/bench_sandbox.py                      # 0.5.21, 3 rounds
    python benchmarks/bench_sandbox.py --version 0.5.20 --rounds 5

Each round runs, contained then uncontained (in turn, so a machine whose speed drifts weighs on
both alike): the release through the warm engine, reprobed (what ``check`` and the sweep run),
and every probe alone in a fresh process of the release's cell environment (what a cell runs);
and a bare ``python -c pass`` both ways, the sandbox's own start-up. It prints the median of each
and the ratio of the medians. Target (issue 24): containment adds at most a few percent to a
cell's time (ratio <= 1.05). Environments are built first: the figures compare probe runs, not
builds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdevidence import environments, registry  # noqa: E402
from pdevidence.cells import probe_run, warm  # noqa: E402
from pdevidence.core import sandbox  # noqa: E402
from pdevidence.core.paths import PROJECT, tree_lock_file, work_dir  # noqa: E402
from pdevidence.sources import trees  # noqa: E402

TARGET = 1.05
MODES = ("bubblewrap", "none")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def engine(reg, tree, out: Path) -> None:
    args = {"side": "sweep", "tree_kind": tree.kind, "tree_ref": tree.ref, "tree_resolved": tree.resolved}
    warm.probe_trees(reg, [tree], list(reg.experiments), {tree.label(): args}, out_dir=out, force=True,
                     log=lambda msg: None)


def cells(reg, tree, env, out: Path) -> None:
    for name, exp in reg.experiments.items():
        probe_run.run_probe(env.interpreter, exp.probe, ["--side", "sweep", "--tree-kind", tree.kind, "--tree-ref",
                                                         tree.ref, "--tree-resolved", tree.resolved],
                            out / f"{name}.json", work_dir(reg.root) / "logs" / f"bench-sandbox.{name}.log",
                            experiment=name, side="sweep", trusted=True, env=env.probe_env)


def start_up(out: Path) -> None:
    with sandbox.launch([sys.executable, "-c", "pass"], sandbox.View(write=(out,)), dict(os.environ),
                        trusted=True, what="python -c pass") as launch:
        subprocess.run(launch.argv, env=launch.env, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="0.5.21")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reg = registry.load(PROJECT)
    tree = trees.release_tree(args.version, reg.python, trees.LockFile(tree_lock_file(reg.root)))
    env = environments.cell_environment(reg, tree, f"bench-sandbox.{tree.label()}")
    environments.closure_environment(reg, environments.era_of(reg, tree))
    lanes = {"warm engine (check, sweep)": lambda out: engine(reg, tree, out),
             "fresh processes (cells)": lambda out: cells(reg, tree, env, out),
             "python -c pass (start-up)": start_up}
    seconds = {(lane, mode): [] for lane in lanes for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as scratch:
        for round_ in range(args.rounds):
            for number, (lane, run) in enumerate(lanes.items()):
                for mode in MODES:
                    os.environ["PDEVIDENCE_SANDBOX"] = mode
                    out = Path(scratch) / f"{round_}-{number}-{mode}"
                    out.mkdir()
                    seconds[lane, mode].append(timed(lambda: run(out)))
    os.environ.pop("PDEVIDENCE_SANDBOX")
    print(f"sglang {args.version}, {args.rounds} rounds, median seconds (contained by "
          f"{sandbox.detect().version}):")
    worst = 0.0
    for lane in lanes:
        contained, bare = (statistics.median(seconds[lane, mode]) for mode in MODES)
        ratio = contained / bare
        if "start-up" not in lane:
            worst = max(worst, ratio)
        print(f"  {lane:<28} contained {contained:7.2f}  uncontained {bare:7.2f}  ratio {ratio:.3f}"
              f"  (+{contained - bare:.2f} s)")
    print(f"worst ratio of a probe run {worst:.3f} (target <= {TARGET}): {'ok' if worst <= TARGET else 'OVER'}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
