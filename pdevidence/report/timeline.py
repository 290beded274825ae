"""Which side each tree behaves like, per telling scenario: the data behind the timeline picture.

A column is a tree (a swept release, or a compared base/head tree), a row a
scenario that tells base from head; each cell says whether that tree behaves
like the pre-fix side, the fixed side, neither, or raised. A control some
release departs from both sides on (or raised in) is a row too, marked only
where it did.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..documents.vocabulary import Behaviour, Classification
from .narrative import tree, trees_text

SIDE_STATE = {"base": Behaviour.PRE_FIX, "head": Behaviour.FIXED}
# A release's overall classification, for sweep tables without per-scenario data (schema 1).
RELEASE_STATE = {Classification.PRE_FIX: Behaviour.PRE_FIX, Classification.FIXED: Behaviour.FIXED,
                 Classification.NEITHER: Behaviour.NEITHER, Classification.PARTIAL: Behaviour.NEITHER,
                 Classification.ERROR: Behaviour.ERROR, Classification.FAILED: Behaviour.ERROR,
                 Classification.NOT_AFFECTED: Behaviour.NOT_AFFECTED, Classification.DEVIATES: Behaviour.DEVIATES}


@dataclass(frozen=True)
class Column:
    label: str  # a full version, or a commit
    note: str  # "base" / "head" when the comparison used this tree, else ""
    states: dict[str, Behaviour | None]  # None: a control row on a release that agrees with both sides there


@dataclass(frozen=True)
class Strip:
    caption: str
    columns: list[Column]
    # The column marked "first fixed": a sweep's first fixed release (the oldest that behaves as
    # fixed; the sweep names any regression after it), else the first tree that is fixed for good.
    first_fixed: int | None


@dataclass(frozen=True)
class Timeline:
    experiment: str
    heading: str
    verdicts: list[str]
    rows: list[str]
    strips: list[Strip]


def telling_rows(doc: dict, name: str) -> list[str]:
    """Scenarios the registry says change, in comparison order; else those that did change."""
    notes = doc.get("scenarios", {}).get(name, {})
    pairs = [p for p in doc["pairs"] if p["experiment"] == name]
    ordered = list(dict.fromkeys([sid for p in pairs for sid in p["grid"]] + list(notes)))
    rows = [sid for sid in ordered if notes.get(sid, {}).get("changes") is True]
    if not rows:  # no registry notes: what changed, and what was expected to
        failing = {f["scenario"] for p in pairs for f in p["expectation_failures"]}
        rows = [sid for sid in ordered
                if sid in failing or any(p["grid"].get(sid, {}).get("status") == "changed" for p in pairs)]
    sweep = doc.get("sweeps", {}).get(name)
    extra = sorted({sid for r in (sweep or {}).get("releases", []) for sid in r.get("scenarios") or {}} - set(rows))
    return rows + extra


def pair_state(pair: dict, sid: str, side: str) -> Behaviour:
    """A compared tree behaves like its own side unless its expectation failed; then like the other
    side if it observes what the other side observes, else neither."""
    sc = pair["grid"].get(sid)
    if sc is None or not sc["present"][side] or sc["errors"][side] is not None:
        return Behaviour.ERROR
    failing = {f["side"] for f in pair["expectation_failures"] if f["scenario"] == sid}
    if side not in failing:
        return SIDE_STATE[side]
    other = "head" if side == "base" else "base"
    if other not in failing and all(k["status"] != "changed" for k in sc["keys"].values()):
        return SIDE_STATE[other]
    return Behaviour.NEITHER


def release_state(release: dict, sid: str) -> Behaviour | None:
    """Per-scenario data where the table has it (schema 2), else the release's overall classification;
    a release without the vulnerable path is not affected in every row. A row the release's per-scenario
    data does not list is a control it agrees with both sides on (schema 4 lists only those it departs
    from): no mark."""
    if release["classification"] == Classification.NOT_AFFECTED.value:
        return Behaviour.NOT_AFFECTED
    per_scenario = release.get("scenarios") or {}
    if sid in per_scenario:
        return Behaviour(per_scenario[sid])
    if per_scenario:
        return None
    return RELEASE_STATE.get(release["classification"], Behaviour.NEITHER)


def fixed_for_good(columns: list[Column]) -> int | None:
    """The first all-fixed column after which no column is pre-fix again."""
    for i, col in enumerate(columns):
        rest = [s for c in columns[i:] for s in c.states.values()]
        if col.states and set(col.states.values()) == {Behaviour.FIXED} and Behaviour.PRE_FIX not in rest:
            return i
    return None


def sweep_strip(sweep: dict, rows: list[str], pairs: list[dict]) -> Strip:
    compared = {tree(p["cells"].get(side))[1]: side for p in pairs if p["kind"] == "release" for side in p["cells"]}
    columns = [Column(r["version"], compared.get(r["version"], ""), {sid: release_state(r, sid) for sid in rows})
               for r in sweep["releases"]]
    versions = [c.label for c in columns]
    fixed = versions.index(sweep["first_fixed"]) if sweep["first_fixed"] in versions else None
    return Strip(f"release sweep: {len(columns)} releases", columns, fixed)


def pair_strip(pair: dict, rows: list[str]) -> Strip:
    columns = [Column(tree(pair["cells"].get(side))[1], side, {sid: pair_state(pair, sid, side) for sid in rows})
               for side in ("base", "head")]
    return Strip(f"compared {trees_text(pair)}", columns, fixed_for_good(columns))


def timelines(doc: dict) -> list[Timeline]:
    out = []
    names = list(dict.fromkeys(p["experiment"] for p in doc["pairs"]))
    for name in names:
        pairs = [p for p in doc["pairs"] if p["experiment"] == name]
        rows = telling_rows(doc, name)
        sweep = doc.get("sweeps", {}).get(name)
        strips = [sweep_strip(sweep, rows, pairs)] if sweep else []
        strips += [pair_strip(p, rows) for p in pairs if p["grid"] and not (sweep and p["kind"] == "release")]
        verdicts = [f"{trees_text(p)}: {p['verdict']}" for p in pairs]
        out.append(Timeline(name, f"{name}: PR #{pairs[0]['pr']} {pairs[0]['title']}", verdicts, rows, strips))
    return out
