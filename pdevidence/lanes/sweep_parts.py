"""The release sweep split by era, for CI fan-out: one job per era probes its releases, one merges.

    python -m pdevidence sweep --era torch2.7-tf4   # that era's releases; tables under runs/sweep-parts/<era>/
    python -m pdevidence sweep-merge                # every era's part under runs/sweep-parts/ -> runs/sweep-<exp>.json
    python -m pdevidence sweep-merge --partial      # what parts there are: a table that says it is partial

``current`` names the releases of no declared era (today's closure). Every era's job
writes its part, an empty one when the era has no release, so a missing part is a job
that did not finish: the merge refuses it (exit 8) unless asked for a partial table,
which records the eras it went without and which publish refuses. A merged table is
what one sweep over every release would have written: the parts' releases in version
order, then first fixed release and regressions worked out over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from ..core.errors import INCOMPLETE, HarnessError, usage
from ..core.files import relative
from ..documents.provenance import stale_error
from ..documents.tables import ReleaseOutcome, SweepParameters, SweepTable
from ..registry import Registry

CURRENT = "current"
PARTS = "sweep-parts"


def era_names(reg: Registry) -> list[str]:
    return [CURRENT, *reg.eras]


def in_era(reg: Registry, era: str, versions: list[str]) -> list[str]:
    """The versions that run in ``era`` (``current``: in no declared era)."""
    if era not in era_names(reg):
        raise usage(f"unknown era {era!r}", expected=f"one of: {', '.join(era_names(reg))}")
    wanted = None if era == CURRENT else reg.eras[era]
    return [v for v in versions if reg.era_of(v) == wanted]


def part_dir(runs: Path, era: str) -> Path:
    return runs / PARTS / era


@dataclass(frozen=True)
class Merged:
    outcomes: list[ReleaseOutcome]
    as_of: str | None
    parameters: SweepParameters


def part_file(parts: Path, era: str, experiment: str) -> Path:
    return parts / era / f"sweep-{experiment}.json"


def missing_parts(reg: Registry, parts: Path, experiments: list[str]) -> dict[str, list[str]]:
    """Per era of the registry that lacks any, the experiments it has no part for; a part under a directory
    that is no era's is refused (a usage error)."""
    strays = sorted(p.parent.name for p in parts.glob("*/sweep-*.json") if p.parent.name not in era_names(reg))
    if strays:
        raise usage(f"sweep parts of no era of the registry under {parts}: {', '.join(sorted(set(strays)))}",
                    expected=f"one directory per era: {', '.join(era_names(reg))}",
                    todo="remove the stray parts (a renamed era's job writes under its new name)")
    missing = {era: [name for name in experiments if not part_file(parts, era, name).is_file()]
               for era in era_names(reg)}
    return {era: names for era, names in missing.items() if names}


def merge(reg: Registry, parts: Path, experiments: list[str], *, partial: bool = False) -> dict[str, Merged]:
    """Per experiment, every part's releases in version order, the newest as-of date, and the parameters.

    Every era's part must be there (else exit 8, naming each missing one), unless ``partial``: then the
    table records the eras it went without. Every part must be current (made by this checkout: else exit 8)
    and judged against the same base and head results; the merged table is partial when any part was.
    """
    missing = missing_parts(reg, parts, experiments)
    if missing and not partial:
        named = [f"{era} ({relative(part_file(parts, era, name), reg.root)})" for era, names in missing.items()
                 for name in names]
        raise HarnessError(f"the sweep is missing era parts: {', '.join(named)}", code=INCOMPLETE,
                           expected=f"a part of every era: {', '.join(era_names(reg))}",
                           todo="rerun the missing era jobs (`nox -s \"sweep_era(<era>)\"`), or `sweep-merge "
                           "--partial` for a table that says it is partial (publish refuses it)")
    found: dict[str, Merged] = {}
    for name in experiments:
        files = [part_file(parts, era, name) for era in era_names(reg) if name not in missing.get(era, [])]
        if not files:
            raise HarnessError(f"no sweep part for {name} under {parts}", code=INCOMPLETE,
                               todo="run `python -m pdevidence sweep --era <era>` for each era first")
        outcomes, dates, seen, tables = [], [], {}, []
        for path in files:
            table = SweepTable.load(path)
            tables.append((path, table))
            for release in table.releases:
                if release.version in seen:
                    raise usage(f"{release.version} is in two sweep parts: {seen[release.version]} and {path}",
                                todo="each era's job probes only its own releases; remove the stray part")
                seen[release.version] = path
                outcomes.append(release)
            dates.append(table.as_of)
        probe = relative(reg.experiment(name).probe, reg.root)
        stale = {relative(path, reg.root): why for path, table in tables if (why := table.stale(reg.root, probe))}
        references = {str(table.parameters.references) for _, table in tables if table.parameters}
        if len(references) > 1:
            stale.update({relative(path, reg.root): ["judged against other base and head results than the other "
                                                     "parts"] for path, _ in tables})
        if stale:
            raise stale_error(stale, reg, what="sweep parts")
        params = [table.parameters for _, table in tables]
        outcomes.sort(key=lambda o: Version(o.version))
        found[name] = Merged(outcomes, max((d for d in dates if d), default=None),
                             SweepParameters(explicit=any(p.explicit for p in params), pre=any(p.pre for p in params),
                                             floor=reg.floor(name), references=params[0].references,
                                             missing_eras=tuple(era for era in missing if name in missing[era])))
    return found
