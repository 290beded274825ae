"""`drift`, `upstream`, `mutate`: the lanes beyond the matrix that run one experiment."""

from __future__ import annotations

from .. import registry
from ..cells import cells
from ..core import settings
from ..core.errors import CONFIRMED
from ..core.files import dumps, write_atomic
from ..core.paths import results_dir, runs_dir, work_dir
from ..lanes import drift, mutate, upstream


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
    cell = cells.parse_cell(reg, args.kind or settings.get("PDEVIDENCE_UPSTREAM_KIND"), args.experiment, args.side)
    if args.ref:
        cell = cells.Cell(cell.experiment, cell.side, cell.kind, args.ref)
    upstream.run_upstream(reg, cell, tests_dir=args.tests, log=lambda msg: print(msg, flush=True))
    return CONFIRMED


def cmd_mutate(args) -> int:
    """Every mutant of an experiment on its head release; exit 0 only when each declared one applied and was killed."""
    reg = registry.load(args.root)
    result = mutate.run(reg, args.experiment, cold=args.cold, mutants=args.mutant,
                        log=lambda msg: print(msg, flush=True))
    print(f"wrote {mutate.write(result, reg.root)}")
    print(mutate.table(result))  # its last line is the score: "<experiment>: K of N mutants killed"
    return result.exit_code
