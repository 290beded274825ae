"""`cell`, `matrix`, `compare`: cells run (several at once, each failing alone) and their comparison."""

from __future__ import annotations

from .. import environments, registry
from ..cells import cells
from ..core import children
from ..core.errors import CONFIRMED, STALE, HarnessError, boundary, worst
from ..core.paths import results_dir, runs_dir
from ..documents.receipts import Receipt
from ..documents.results import receipt_path
from ..judge import compare
from ..lanes import upstream
from ..report import report


def run_cells(reg: registry.Registry, todo: list[cells.Cell], *, jobs: int = 1, force: bool = False) -> int:
    """Run cells, ``jobs`` at a time; every cell runs even when another fails."""
    return worst(run_each(reg, todo, jobs=jobs, force=force).values())


def run_each(reg: registry.Registry, todo: list[cells.Cell], *, jobs: int = 1,
             force: bool = False) -> dict[cells.Cell, int]:
    """Each cell's exit code, ``jobs`` at a time; every cell runs even when another fails."""
    environments.torch_choice(reg)  # a bad PDEVIDENCE_TORCH is one usage error, not one per cell

    def one(cell: cells.Cell) -> int:
        def run() -> int:
            cells.run_cell(reg, cell, force=force, log=lambda msg: print(msg, flush=True))
            return CONFIRMED
        # In a worker thread too: an unexpected exception fails this cell as a bug, never vanishes.
        return boundary(run, where=f"cell {cell.name}", report=lambda exc: cells.report_failure(cell, exc))

    with children.workers(jobs, "cell") as pool:
        try:
            codes = list(pool.map(one, todo))
        except children.Interrupted:
            pool.shutdown(cancel_futures=True)  # cells not started yet never start
            raise
    return dict(zip(todo, codes))


def _made_by_other_inputs(reg: registry.Registry, cell: cells.Cell) -> list[str]:
    """How the cell's stored receipt differs from this checkout now; empty: current, or nothing to tell (no
    result, or one that does not load: compare names it)."""
    result = runs_dir(reg.root) / compare.expected_file(reg.experiment(cell.experiment), cell.side, cell.kind)
    try:
        return Receipt.load(receipt_path(result)).stale(reg.root)
    except HarnessError:
        return []


def cmd_cell(args) -> int:
    reg = registry.load(args.root)
    cell = cells.parse_cell(reg, args.kind, args.experiment, args.side)
    if args.ref:
        cell = cells.Cell(cell.experiment, cell.side, cell.kind, args.ref)
    return run_cells(reg, [cell], force=args.force)


def cmd_matrix(args) -> int:
    """Every cell, then the comparison even when a cell failed: the report names what is missing."""
    reg = registry.load(args.root)
    codes = run_each(reg, cells.matrix(reg, args.kind), jobs=args.jobs, force=args.force)
    # An input edited while the cells ran (a merge mid-matrix) leaves cells made, or reused, under other inputs
    # than the checkout's now: they run once more against it, as a new matrix would. Whatever is still stale
    # after that, compare refuses (exit 8): a stale cell is rerun or refused, never counted.
    reg = registry.load(args.root)
    again = [cell for cell in cells.matrix(reg, args.kind)
             if codes.get(cell) == STALE or _made_by_other_inputs(reg, cell)]
    if again:
        print(f"inputs changed while the matrix ran: running {', '.join(c.name for c in again)} again", flush=True)
        codes.update(run_each(reg, again, jobs=args.jobs))
    ran = worst(codes.values())
    try:
        compared = cmd_compare(args)
    except HarnessError as exc:
        exc.code = worst([ran, exc.code])
        raise
    return worst([ran, compared])


def cmd_compare(args) -> int:
    reg = registry.load(args.root)
    kinds = [args.kind] if args.kind != "all" else list(compare.COMPARED_KINDS)
    summary = compare.compare_all(reg, runs=runs_dir(reg.root), published=results_dir(reg.root), kinds=kinds)
    summary.upstream = upstream.summarize(runs_dir(reg.root), reg, tuple(kinds))
    # Only `publish` writes results/: a comparison's report is fresh output, like the results it reads.
    written = report.write_summary(reg, summary, runs_dir(reg.root), runs=runs_dir(reg.root),
                                   published=results_dir(reg.root), command=f"python -m pdevidence {args.command} --kind {args.kind}")
    for rel, why in sorted(summary.published_failures.items()):
        print(f"published artifact failed verification: {rel}: {why}")
    print(f"wrote {', '.join(str(p) for p in written)}")
    return summary.exit_code
