"""`sweep` and `sweep-merge`: every release probed (or an era's part of them), the tables written and the
release watch's exit code."""

from __future__ import annotations

from pathlib import Path

from .. import registry
from ..core.errors import CONFIRMED, worst
from ..core.files import dumps, write_atomic
from ..core.paths import results_dir, runs_dir
from ..documents.tables import SweepParameters
from ..judge import classify
from ..lanes import sweep, sweep_parts


def cmd_sweep(args) -> int:
    reg = registry.load(args.root)
    names = args.experiment or list(reg.experiments)
    versions = args.versions or None
    fresh = args.references == "fresh"
    out = runs_dir(reg.root)
    if args.era:  # one job of the CI fan-out: this era's releases, written as a part
        versions = sweep_parts.in_era(reg, args.era, versions or sweep.default_releases(reg, pre=args.pre,
                                                                                        experiments=names))
        out = sweep_parts.part_dir(out, args.era)  # written even with no release: the merge expects every era's
    made = sweep.made_by(reg, names)  # before anything runs: what a change during the run must not pass for
    found, as_of, refs = sweep.sweep(reg, names, published=runs_dir(reg.root) if fresh else results_dir(reg.root),
                                     out_dir=runs_dir(reg.root) / "sweep", versions=versions, pre=args.pre,
                                     jobs=args.jobs, cold=args.cold, force=args.force, fresh_references=fresh,
                                     floored=not args.versions)
    parameters = {name: SweepParameters(explicit=bool(args.versions), pre=args.pre, floor=reg.floor(name),
                                        references=refs[name].digests) for name in found}
    if args.era:
        for name, outcomes in found.items():
            write_atomic(out / f"sweep-{name}.json", dumps(sweep.document(name, outcomes, as_of, made,
                                                                          parameters[name])))
        print(f"wrote the {args.era} part under {out}; `sweep-merge` joins the parts")
        return CONFIRMED
    return _sweep_tables(reg, found, as_of, made, parameters, out)


def cmd_sweep_merge(args) -> int:
    reg = registry.load(args.root)
    names = args.experiment or list(reg.experiments)
    merged = sweep_parts.merge(reg, runs_dir(reg.root) / sweep_parts.PARTS, names, partial=args.partial)
    return _sweep_tables(reg, {name: m.outcomes for name, m in merged.items()},
                         max((m.as_of for m in merged.values() if m.as_of), default=None),
                         sweep.made_by(reg, names), {name: m.parameters for name, m in merged.items()},
                         runs_dir(reg.root))


def _sweep_tables(reg: registry.Registry, found: dict, as_of: str | None, made, parameters: dict,
                  out: Path) -> int:
    """Write and print each experiment's table; the exit code is the release watch's."""
    for name, outcomes in found.items():
        path = out / f"sweep-{name}.json"
        write_atomic(path, dumps(sweep.document(name, outcomes, as_of, made, parameters[name])))
        print(sweep.table(name, outcomes, reg.experiment(name).releases, parameters[name]))
        print(f"wrote {path}")
    return worst(classify.watch_exit(outcomes) for outcomes in found.values())
