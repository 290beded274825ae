"""The mutation lane's cost: in a warm engine child, in a fresh process (--cold), beside one release cell.

    python benchmarks/bench_mutate.py                 # both experiments
    python benchmarks/bench_mutate.py admission       # one

Per experiment, side by side in this one run, environments and tree warm:
  forced cell     `cell release <exp> head --force`: one probe run on the head release
  engine          `mutate <exp>`: the baseline in one warm engine child, each mutant forked from it, two at a time
  cold            `mutate <exp> --cold`: the same in one fresh process in the release cell's environment, one
                  mutant after another
Targets: the lane <= 1.2x the forced cell (issue 27); the engine no slower than cold, and its table the same
bytes: a mutant forked from the warm child observes what it observes in one process after the others.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdevidence import registry  # noqa: E402
from pdevidence.cells import cells  # noqa: E402
from pdevidence.core.files import dumps  # noqa: E402
from pdevidence.core.paths import PROJECT  # noqa: E402
from pdevidence.lanes import mutate  # noqa: E402

TARGET = 1.2


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
        cells.run_cell(reg, cell, log=quiet)  # tree and cell environment warm before timing
        mutate.run(reg, name, mutants=list(reg.experiment(name).mutants)[:1], log=quiet)  # the engine's too
        forced = seconds(lambda: cells.run_cell(reg, cell, force=True, log=quiet))
        tables = {}
        engine = seconds(lambda: tables.update(engine=mutate.run(reg, name, log=quiet)))
        cold = seconds(lambda: tables.update(cold=mutate.run(reg, name, cold=True, log=quiet)))
        same = dumps(tables["engine"].to_json()) == dumps(tables["cold"].to_json())
        score = tables["engine"].score
        rows.append((name, forced, engine, cold, f"{score['killed']}/{score['applicable']} killed", same))
    print(f"\n{'experiment':<12}{'cell s':>8}{'engine s':>10}{'cold s':>8}{'engine/cold':>13}{'engine/cell':>13}  "
          f"{'mutants':<14}{'tables':<11}target <= {TARGET}x the cell")
    for name, forced, engine, cold, detail, same in rows:
        ratio = engine / forced
        print(f"{name:<12}{forced:>8.1f}{engine:>10.1f}{cold:>8.1f}{engine / cold:>12.2f}x{ratio:>12.2f}x  "
              f"{detail:<14}{'same' if same else 'DIFFER':<11}{'met' if ratio <= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
