"""The mutation lane's cost beside one release cell; prints its figures.

    python benchmarks/bench_mutate.py                 # both experiments
    python benchmarks/bench_mutate.py admission       # one

Per experiment, side by side in this one run, environment and tree warm:
  forced cell     `cell release <exp> head --force`: one probe run on the head release
  mutate(<exp>)   every declared mutant in one probe process, plus the baseline
Target (issue 10): mutate <= 1.5x the forced cell.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdevidence import registry  # noqa: E402
from pdevidence.cells import cells  # noqa: E402
from pdevidence.lanes import mutate  # noqa: E402
from pdevidence.core.paths import PROJECT  # noqa: E402

TARGET = 1.5


def quiet(_msg: str) -> None:
    pass


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("experiments", nargs="*")
    args = parser.parse_args()
    reg = registry.load(PROJECT)
    names = args.experiments or [n for n, e in reg.experiments.items() if e.mutants]
    rows = []
    for name in names:
        cell = cells.Cell(name, "head", "release")
        cells.run_cell(reg, cell, log=quiet)  # tree and environment warm before timing
        forced = seconds(lambda: cells.run_cell(reg, cell, force=True, log=quiet))
        result = []
        lane = seconds(lambda: result.append(mutate.run(reg, name, log=quiet)))
        score = result[0].score
        rows.append((name, forced, lane, f"{score['killed']}/{score['applicable']} killed"))
    print(f"\n{'experiment':<12}{'cell s':>8}{'mutate s':>10}{'ratio':>7}  {'mutants':<14}target <= {TARGET}x")
    for name, forced, lane, detail in rows:
        ratio = lane / forced
        print(f"{name:<12}{forced:>8.1f}{lane:>10.1f}{ratio:>7.2f}  {detail:<14}{'met' if ratio <= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
