"""Issue 27's ratios, all measured in this one run: how near every lane comes to the cost of one import.

    python benchmarks/bench_warm.py                  # every figure (about 15 minutes on 2 cores)
    python benchmarks/bench_warm.py --skip-many      # without the 27-tree check
    python benchmarks/bench_warm.py --rounds 3

  import floor   a fresh interpreter of a release cell's environment importing the SGLang modules the probes
                 import (read from each probe's prepare()), bytecode present: the cost no lane can go below
  forced cell    `cell release <exp> head --force`, per experiment             target <= 1.2x the floor
  mutation lane  `mutate <exp>` (the mutants forked from one warm child)       target <= 1.2x a forced cell
  check, 1 tree  `check --force --version <head release>`, its era built       target <= 1.2x the floor
  check, +1 tree the same with a second release of that era: what it adds      target <= 0.2x a forced cell
  check, many    `check --force` of 27 releases over five eras from a fresh work directory (environments and
                 unpacked trees in the shared cache, as a second clone finds them): where the time goes
                                                                               target: probing >= half of it
  environments   each era's closure environment: its build time (recorded when it was built) and disk use
                 (all of it, and its own files: the bytecode; the rest are hard links into uv's cache)

Containment's own cost is `bench_sandbox.py`'s; the full-era sweep's per release is `bench_eras.py`'s.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdevidence import cli, environments, registry  # noqa: E402
from pdevidence.cells import cells  # noqa: E402
from pdevidence.commands.scratch import enter_scratch  # noqa: E402
from pdevidence.core import debris, files, phases  # noqa: E402
from pdevidence.core.paths import PROJECT  # noqa: E402
from pdevidence.lanes import mutate  # noqa: E402

MANY, MANY_ERAS = 27, 5


def quiet(_msg: str) -> None:
    pass


def seconds(fn) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        fn()
    return time.perf_counter() - start


def median(fn, rounds: int) -> float:
    return statistics.median(seconds(fn) for _ in range(rounds))


def probed_imports(reg: registry.Registry) -> list[str]:
    """Every import statement in each probe's ``prepare()``: what a probe process imports before its scenarios."""
    found = []
    for exp in reg.experiments.values():
        tree = ast.parse(exp.probe.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "prepare":
                found += [ast.unparse(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return list(dict.fromkeys(found))


def check(*argv: str) -> None:
    cli.main(["--root", str(PROJECT), "check", "--references", "fresh", "--force", *argv])


def many_releases(reg: registry.Registry) -> list[str]:
    """Up to 27 releases, newest first, from the five newest eras of the published sweep."""
    table = files.read_json(PROJECT / "results" / f"sweep-{next(iter(reg.experiments))}.json", "sweep table", todo="")
    picked, eras = [], []
    for row in reversed(table["releases"]):
        era = reg.era_of(row["version"])
        name = era.name if era else "current"
        if name not in eras:
            if len(eras) == MANY_ERAS:
                break
            eras.append(name)
        picked.append(row["version"])
    return picked[:MANY]


def environment_rows(reg: registry.Registry) -> list[tuple[str, float | None, int, int]]:
    """Per closure environment: its eras, build seconds, bytes in all and bytes of its own (link count 1)."""
    rows = []
    eras = {}
    for name, era in [("current", None), *reg.eras.items()]:
        eras.setdefault(environments.closure_environment_path(reg, environments.closure(reg, era)), []).append(name)
    for path, names in eras.items():
        if not path.is_dir():
            continue
        marker = files.read_marker(path / environments.ENV_INFO) or {}
        total = own = 0
        for root, _dirs, names_ in os.walk(path):
            for n in names_:
                st = os.lstat(os.path.join(root, n))
                total += st.st_size
                own += st.st_size if st.st_nlink == 1 else 0
        rows.append((", ".join(names), marker.get("build_seconds"), total, own))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-many", action="store_true")
    args = parser.parse_args()
    reg = registry.load(PROJECT)
    lines = []

    def ratio(label: str, value: float, against: float, target: float, unit: str) -> None:
        r = value / against
        lines.append(f"{label:<44}{value:>8.1f} s {r:>6.2f}x {unit:<14} target <= {target}x  "
                     f"{'met' if r <= target else 'MISSED'}")

    forced = {}
    for name in reg.experiments:
        cell = cells.Cell(name, "head", "release")
        cells.run_cell(reg, cell, log=quiet)  # its environment built and warm before anything is timed
        forced[name] = median(lambda: cells.run_cell(reg, cell, force=True, log=quiet), args.rounds)
    first = next(iter(reg.experiments))
    cell = cells.Cell(first, "head", "release")
    env = environments.cell_environment(reg, cells.resolve_tree(reg, cell), cells.cell_slug(
        reg, cell, cells.resolve_tree(reg, cell)))
    # A probe tries some imports a release may lack (it records them absent): so does the floor.
    imports = "\n".join(f"try:\n    {line}\nexcept ImportError:\n    pass" for line in probed_imports(reg))
    floor = median(lambda: subprocess.run([str(env.interpreter), "-c", imports], check=True,
                                          env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                          capture_output=True), args.rounds)
    lines.append(f"{'import floor (' + cell.name + ' environment)':<44}{floor:>8.1f} s")
    for name, s in forced.items():
        ratio(f"forced cell release({name}, head)", s, floor, 1.2, "the floor")
    for name, exp in reg.experiments.items():
        if exp.mutants:
            lane = seconds(lambda: mutate.run(reg, name, log=quiet))
            ratio(f"mutation lane {name} ({len(exp.mutants)} mutants)", lane, forced[name], 1.2, "a forced cell")

    head = reg.experiment(first).pin("release", "head")
    era = reg.era_of(head)
    fellow = next(v for v in reversed(many_releases(reg)) if v != head and reg.era_of(v) == era)
    check("--version", head)  # the era's environment and engine preload list made before timing
    one = median(lambda: check("--version", head), args.rounds)
    two = median(lambda: check("--version", head, "--version", fellow), args.rounds)
    ratio(f"check --version {head} (era built)", one, floor, 1.2, "the floor")
    ratio(f"  + {fellow} in the same call (what it adds)", two - one, forced[first], 0.2, "a forced cell")

    if not args.skip_many:
        releases = many_releases(reg)
        argv = [a for v in releases for a in ("--version", v)]
        with tempfile.TemporaryDirectory(prefix="bench-warm-work-") as work:
            os.environ["PDEVIDENCE_WORK"] = work
            try:
                with phases.recording() as spent:
                    total = seconds(lambda: check(*argv))
            finally:
                del os.environ["PDEVIDENCE_WORK"]
        probing = spent.seconds(phases.PROBING)
        eras = {(reg.era_of(v).name if reg.era_of(v) else "current") for v in releases}
        lines.append(f"check of {len(releases)} releases over {len(eras)} eras, fresh work directory: "
                     f"{phases.describe(spent, total)}")
        lines.append(f"{'  probing share':<44}{probing / total:>17.2f}  target >= 0.5  "
                     f"{'met' if probing / total >= 0.5 else 'MISSED'}")

    lines.append("closure environments (uv's cache warm): build seconds, disk in all, of their own (bytecode)")
    for eras, built, total, own in environment_rows(reg):
        lines.append(f"  {eras:<42}{built if built is not None else '-':>8} s {total / 2**30:>6.2f} GiB "
                     f"{own / 2**20:>7.0f} MiB own")
    print("\n".join(lines))


if __name__ == "__main__":
    # A run as every command is: the cells and lanes it runs in-process write in the scratch directories, where a
    # command that entered them alone would take their temporaries for a dead run's (core/debris.py).
    with debris.run():
        enter_scratch(PROJECT)
        main()
