"""Harness speed on the real release-backed cells; prints its figures.

    python benchmarks/bench_cells.py            # all figures (several minutes)
    python benchmarks/bench_cells.py --quick    # warm/cold single cell and cached matrix only

Figures (targets from the issues):
  warm cell overhead      harness time beyond the probe's own run, env and tree cached   (< 1 s)
  cold cell overhead      the same with the cell env deleted, uv cache warm              (< 10 s)
  matrix serial/parallel  the 4 release cells with --jobs 1 and --jobs 2, forced         (parallel <= 0.6x serial)
  cached matrix           the 4 release cells again, nothing changed                     (< 5 s)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdevidence import cli, registry  # noqa: E402
from pdevidence.cells import cells  # noqa: E402
from pdevidence.core.paths import PROJECT, work_dir  # noqa: E402

probe_seconds: list[float] = []
_real_run_probe = cells.run_probe


def timed_run_probe(*args, **kwargs):
    start = time.perf_counter()
    try:
        return _real_run_probe(*args, **kwargs)
    finally:
        probe_seconds.append(time.perf_counter() - start)


cells.run_probe = timed_run_probe


def quiet(_msg: str) -> None:
    pass


def cell_overhead(reg, cell: cells.Cell, *, cold: bool) -> tuple[float, float]:
    outcome = cells.run_cell(reg, cell, log=quiet)  # make sure the tree and env exist
    if cold:
        env_dir = next((work_dir(reg.root) / "envs").glob(f"{cell.experiment}.{cell.side}.*"))
        shutil.rmtree(env_dir)
    probe_seconds.clear()
    start = time.perf_counter()
    outcome = cells.run_cell(reg, cell, force=True, log=quiet)
    total = time.perf_counter() - start
    assert not outcome.reused
    return total, total - sum(probe_seconds)


def matrix_seconds(jobs: int, force: bool) -> float:
    start = time.perf_counter()
    args = ["--root", str(PROJECT), "matrix", "--jobs", str(jobs)] + (["--force"] if force else [])
    code = cli.main(args)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"matrix exited {code}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reg = registry.load(PROJECT)
    cell = cells.Cell("admission", "base", "release")
    figures = []
    total, overhead = cell_overhead(reg, cell, cold=False)
    figures.append(("warm cell overhead", overhead, f"total {total:.1f} s", overhead < 1.0))
    total, overhead = cell_overhead(reg, cell, cold=True)
    figures.append(("cold cell overhead", overhead, f"total {total:.1f} s", overhead < 10.0))
    if not args.quick:
        serial = matrix_seconds(jobs=1, force=True)
        parallel = matrix_seconds(jobs=2, force=True)
        figures.append(("matrix serial", serial, "4 cells, --jobs 1", True))
        figures.append(("matrix parallel", parallel, f"{parallel / serial:.2f}x serial", parallel <= 0.6 * serial))
    cached = matrix_seconds(jobs=2, force=False)
    figures.append(("cached matrix", cached, "4 cells reused + compare", cached < 5.0))
    print(f"\n{'figure':<22}{'seconds':>9}  {'detail':<26}target")
    for name, seconds, detail, met in figures:
        print(f"{name:<22}{seconds:>9.2f}  {detail:<26}{'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
