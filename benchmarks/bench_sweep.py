"""The warm engine's sweep against today's cold sweep and one forced release cell, in one run.

    python benchmarks/bench_sweep.py                       # 0.5.17 ... 0.5.23, both experiments
    python benchmarks/bench_sweep.py 0.5.20 0.5.21 0.5.22  # fewer releases

Every figure is a whole CLI run in a child process, environments built beforehand, so
the ratios compare probing, not downloads. Targets (issue 18): a sweep through the
engine with no outcome cached takes at most 0.5x the cold sweep (one environment and
one fresh process per release); each tree beyond the first costs at most 0.2x a forced
cold release cell; an unchanged rerun takes under 3 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ["0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
TARGETS = {"engine / cold sweep": 0.5, "per extra tree / cell": 0.2}
RERUN_SECONDS = 3.0


def seconds(*argv: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(ROOT), *argv], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: a sweep that finds a regression is still a timing
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="*", default=RELEASES)
    parser.add_argument("--cell", default="admission,head", help="experiment,side of the forced release cell")
    args = parser.parse_args()
    experiment, side = args.cell.split(",")
    # Warm-up, not measured: every environment and the engine's preload list exist afterwards.
    seconds("cell", "release", experiment, side)
    seconds("sweep", "--cold", *args.versions)
    seconds("sweep", "--force", args.versions[0])
    cell = seconds("cell", "release", experiment, side, "--force")
    cold = seconds("sweep", "--cold", *args.versions)
    one = seconds("sweep", "--force", args.versions[0])
    warm = seconds("sweep", "--force", *args.versions)
    rerun = seconds("sweep", *args.versions)
    extra = (warm - one) / max(1, len(args.versions) - 1)
    ratios = {"engine / cold sweep": warm / cold, "per extra tree / cell": extra / cell}
    print(f"forced release cell {experiment},{side}: {cell:.1f} s")
    print(f"cold sweep ({len(args.versions)} releases, a fresh process each): {cold:.1f} s")
    print(f"engine sweep, nothing cached: {warm:.1f} s (one release: {one:.1f} s; each further: {extra:.1f} s)")
    print(f"unchanged rerun: {rerun:.2f} s (target < {RERUN_SECONDS:.0f} s): {'ok' if rerun < RERUN_SECONDS else 'OVER'}")
    ok = rerun < RERUN_SECONDS
    for name, ratio in ratios.items():
        met = ratio <= TARGETS[name]
        ok &= met
        print(f"{name}: {ratio:.2f}x (target <= {TARGETS[name]}x): {'ok' if met else 'OVER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
