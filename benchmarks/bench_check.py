"""`check --version X` against one forced release cell, environments cached; prints the figures.

    python benchmarks/bench_check.py                # 0.5.20 against release(admission, base)
    python benchmarks/bench_check.py --version 0.5.21 --cell prefill,head

Target (issue 11): a check, which probes every experiment in one process, takes
at most 1.3x one forced release cell, which probes one experiment.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdevidence import cli, environments, registry  # noqa: E402
from pdevidence.cells import cells  # noqa: E402
from pdevidence.lanes import check as ck  # noqa: E402
from pdevidence.core.paths import PROJECT  # noqa: E402

TARGET = 1.3


def seconds(fn) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="0.5.20")
    parser.add_argument("--cell", default="admission,base", help="experiment,side of the release cell")
    args = parser.parse_args()
    reg = registry.load(PROJECT)
    experiment, side = args.cell.split(",")
    cell = cells.Cell(experiment, side, "release")
    check = ["--root", str(PROJECT), "check", "--version", args.version]
    # Build both environments first: the figures compare cached runs, not environment builds.
    tree = cells.resolve_tree(reg, cells.Cell(experiment, side, "release", args.version))
    environments.cell_environment(reg, tree, f"{ck.CHECK_SIDE}.{tree.label()}")
    cell_tree = cells.resolve_tree(reg, cell)
    environments.cell_environment(reg, cell_tree, cells.cell_slug(reg, cell, cell_tree))
    cell_s = seconds(lambda: cells.run_cell(reg, cell, force=True, log=lambda _msg: None))
    check_s = seconds(lambda: cli.main(check))
    ratio = check_s / cell_s
    print(f"forced release cell {cell.name}: {cell_s:.1f} s (one experiment)")
    print(f"check --version {args.version}: {check_s:.1f} s (all {len(reg.experiments)} experiments, one process)")
    print(f"ratio {ratio:.2f}x (target <= {TARGET}x): {'ok' if ratio <= TARGET else 'OVER'}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
