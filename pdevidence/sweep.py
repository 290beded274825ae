"""Release sweep: which SGLang release carries the fix?

Runs an experiment's probe on every release from the registry's floor up,
and classifies each by the scenarios that tell the registry's base and head
apart: pre-fix (observes what base observes), fixed (what head observes), or
neither.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import cells, results, trees
from .compare import expected_file, same
from .errors import INCOMPLETE, HarnessError
from .registry import SIDES, Experiment, Registry

PRE_FIX, FIXED, NEITHER, FAILED = "pre-fix", "fixed", "neither", "failed"
SWEEP_SIDE = "sweep"


@dataclass
class ReleaseOutcome:
    version: str
    classification: str
    differing: list[str] = field(default_factory=list)  # scenarios matching neither reference
    error: str | None = None


def version_key(version: str) -> tuple:
    """Orders 0.5.9 < 0.5.15 < 0.5.15.post1 < 0.5.17; numbers and labels never compared directly."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"[.+-]", version))


def releases(files: list[dict], python: str, floor: str, project: str = "sglang") -> list[str]:
    """Versions with a wheel for this Python and machine, oldest first, from ``floor`` up."""
    interp, machine = trees.wheel_tag(python)
    # Final releases only (post-releases included), as pip picks by default: no rc or dev builds.
    pattern = re.compile(rf"^{project}-([0-9]+(?:\.[0-9]+)*(?:\.post[0-9]+)?)-"
                         rf"(?:{interp}-{interp}-.*{machine}|py3-none-any)\.whl$")
    found = {m.group(1) for f in files if not f.get("yanked") and (m := pattern.match(f["filename"]))}
    return sorted((v for v in found if version_key(v) >= version_key(floor)), key=version_key)


def signature(doc: dict, telling: dict[str, list[str] | None]) -> dict[str, object]:
    """The observations that decide: per scenario, the named keys (or all of them)."""
    out = {}
    for sid, keys in telling.items():
        observed = doc["scenarios"].get(sid, {}).get("observed") or {}
        out[sid] = observed if keys is None else {k: observed.get(k) for k in keys}
    return out


def telling_scenarios(base: dict, head: dict, exp: Experiment | None = None) -> dict[str, list[str] | None]:
    """What tells base from head: the registry's changing scenarios on their declared keys,
    else every scenario whose observations differ. Tree facts and controls do not decide."""
    if exp is not None and any(e.changes for e in exp.expect.values()):
        return {sid: sorted(set(e.base) | set(e.head)) for sid, e in sorted(exp.expect.items()) if e.changes}
    return {sid: None for sid in sorted(set(base["scenarios"]) | set(head["scenarios"]))
            if not same(base["scenarios"].get(sid, {}).get("observed"), head["scenarios"].get(sid, {}).get("observed"))}


def classify(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> ReleaseOutcome:
    """Pre-fix if ``doc`` observes what base observes where it matters, fixed if what head does."""
    telling = telling_scenarios(base, head, exp)
    got, was, now = signature(doc, telling), signature(base, telling), signature(head, telling)
    version = doc["tree"]["resolved"]
    if same(got, was):
        return ReleaseOutcome(version, PRE_FIX)
    if same(got, now):
        return ReleaseOutcome(version, FIXED)
    return ReleaseOutcome(version, NEITHER,
                          [sid for sid in telling if not (same(got[sid], was[sid]) or same(got[sid], now[sid]))])


def references(reg: Registry, exp: Experiment, published: Path) -> dict[str, dict]:
    """The registry's release-backed base and head results, as published."""
    docs = {}
    for side in SIDES:
        path = published / expected_file(exp, side, "release")
        if not path.exists():
            raise HarnessError(f"the sweep needs the published {side} result {path.name}", code=INCOMPLETE,
                               todo=f"run `nox -s \"release({exp.name}, {side})\"` and `nox -s publish` first")
        docs[side] = results.load(path, experiment=exp.name)
    return docs


def sweep(reg: Registry, experiment: str, *, published: Path, out_dir: Path, versions: list[str] | None = None,
          jobs: int = 2, log=print) -> list[ReleaseOutcome]:
    exp = reg.experiment(experiment)
    refs = references(reg, exp, published)
    versions = versions or releases(trees.index_files("sglang"), reg.python, reg.release_floor)
    cells.torch_choice()

    def one(version: str) -> ReleaseOutcome:
        cell = cells.Cell(experiment, SWEEP_SIDE, "release", version)
        try:
            outcome = cells.run_cell(reg, cell, out_dir=out_dir, log=log)
        except HarnessError as exc:
            return ReleaseOutcome(version, FAILED, error=str(exc).splitlines()[0])
        return classify(results.load(outcome.result), refs["base"], refs["head"], exp)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, versions))


def first_fixed(outcomes: list[ReleaseOutcome]) -> str | None:
    """The first fixed release after which no release is pre-fix again."""
    for i, outcome in enumerate(outcomes):
        if outcome.classification == FIXED and all(o.classification != PRE_FIX for o in outcomes[i:]):
            return outcome.version
    return None


def table(experiment: str, outcomes: list[ReleaseOutcome], bracket: dict[str, str | None]) -> str:
    lines = [f"release sweep: {experiment}", f"  {'release':<10} classification"]
    for o in outcomes:
        detail = f" ({', '.join(o.differing)})" if o.differing else f" ({o.error})" if o.error else ""
        lines.append(f"  {o.version:<10} {o.classification}{detail}")
    fixed = first_fixed(outcomes)
    lines.append(f"  first fixed release: {fixed or 'none found'}")
    if fixed and bracket.get("head") and fixed != bracket["head"]:
        lines.append(f"  note: the registry's release head is {bracket['head']}, the sweep says {fixed}")
    return "\n".join(lines)


def document(experiment: str, outcomes: list[ReleaseOutcome]) -> dict:
    return {"schema": "pdevidence-sweep/1", "experiment": experiment, "first_fixed": first_fixed(outcomes),
            "releases": [asdict(o) for o in outcomes]}
