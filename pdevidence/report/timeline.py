"""Which side each tree behaves like, per telling scenario: the data behind the timeline picture.

A column is a run of swept releases that behave alike (or a compared base/head
tree), a row a scenario that tells base from head; each cell says whether that
run behaves like the pre-fix side, the fixed side, neither, or raised. A control
some release departs from both sides on (or raised in) is a row too, marked only
where it did.

Runs are shared by every experiment's sweep, so the columns line up from one
timeline to the next: a run ends where the era changes (``eras``: the report's
version -> era map) and wherever any experiment shows something else (a cell,
a compared tree, its first fixed release).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.version import Version

from ..documents.tables import partial_sweep
from ..documents.vocabulary import Behaviour, Classification
from .narrative import gated_off_text, tree, trees_text

SIDE_STATE = {"base": Behaviour.PRE_FIX, "head": Behaviour.FIXED}
# A scenario the probe saw fixed (its gate turned on) on a release whose default leaves the gate off: as shipped
# the server runs the pre-fix path, so the picture must not show it as fixed.
PRESENT_OFF = Classification.PRESENT_OFF
State = Behaviour | Classification  # a cell's mark: a scenario's behaviour, or PRESENT_OFF
# A release's overall classification, for sweep tables without per-scenario data (schema 1).
RELEASE_STATE = {Classification.PRE_FIX: Behaviour.PRE_FIX, Classification.FIXED: Behaviour.FIXED,
                 Classification.NEITHER: Behaviour.NEITHER, Classification.PARTIAL: Behaviour.NEITHER,
                 Classification.ERROR: Behaviour.ERROR, Classification.FAILED: Behaviour.ERROR,
                 Classification.NOT_AFFECTED: Behaviour.NOT_AFFECTED, Classification.DEVIATES: Behaviour.DEVIATES,
                 Classification.PRESENT_OFF: PRESENT_OFF, Classification.CANNOT_RUN: Behaviour.ERROR}


@dataclass(frozen=True)
class Column:
    label: str  # a full version, a range of them ("0.5.13–0.5.16"), or a commit
    note: str  # "base" / "head" when the comparison used this tree, else ""
    states: dict[str, State | None]  # None: a control row on a release that agrees with both sides there
    releases: list[str] = field(default_factory=list)  # a sweep's run: its releases, oldest first
    era: str | None = None  # the era the run's releases ran in (None: not told)


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


def release_state(release: dict, sid: str) -> State | None:
    """Per-scenario data where the table has it (schema 2), else the release's overall classification;
    a release without the vulnerable path is not affected in every row, and on a release whose gated fix is
    present but off a scenario seen fixed (with the gate on) is present but off. A row the release's
    per-scenario data does not list is a control it agrees with both sides on (schema 4 lists only those it
    departs from): no mark."""
    if release["classification"] == Classification.NOT_AFFECTED.value:
        return Behaviour.NOT_AFFECTED
    per_scenario = release.get("scenarios") or {}
    if sid in per_scenario:
        seen = Behaviour(per_scenario[sid])
        off = release["classification"] == PRESENT_OFF.value
        return PRESENT_OFF if off and seen is Behaviour.FIXED else seen
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


def release_columns(sweep: dict, rows: list[str], pairs: list[dict]) -> dict[str, Column]:
    """One column per swept release, by version."""
    compared = {tree(p["cells"].get(side))[1]: side for p in pairs if p["kind"] == "release" for side in p["cells"]}
    return {r["version"]: Column(r["version"], compared.get(r["version"], ""),
                                 {sid: release_state(r, sid) for sid in rows}, [r["version"]])
            for r in sweep["releases"]}


def runs(per_experiment: dict[str, dict[str, Column]], firsts: set[str], eras: dict[str, str]) -> list[list[str]]:
    """Every swept version in version order, cut into runs: a new run at each era change, each first fixed
    release, and wherever an experiment shows that release differently from the one before."""
    def shown(version: str) -> list:
        return [(cols[version].states, cols[version].note) if version in cols else None
                for cols in per_experiment.values()]

    out: list[list[str]] = []
    for version in sorted({v for cols in per_experiment.values() for v in cols}, key=Version):
        last = out[-1][-1] if out else None
        if last is None or version in firsts or eras.get(version) != eras.get(last) or shown(version) != shown(last):
            out.append([version])
        else:
            out[-1].append(version)
    return out


def range_label(versions: list[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}–{versions[-1]}"


def sweep_strip(sweep: dict, rows: list[str], columns: dict[str, Column], cut: list[list[str]],
                eras: dict[str, str]) -> Strip:
    """The sweep's releases in the shared runs; a run this sweep has no release in shows no marks."""
    out = []
    for run in cut:
        mine = [columns[v] for v in run if v in columns]
        states = mine[0].states if mine else dict.fromkeys(rows)
        out.append(Column(range_label(run), mine[0].note if mine else "", states, run, eras.get(run[0])))
    starts = [col.releases[0] for col in out]
    fixed = starts.index(sweep["first_fixed"]) if sweep["first_fixed"] in starts else None
    partial = partial_sweep(sweep.get("parameters"))
    title = f"PARTIAL release sweep ({partial})" if partial else "release sweep"
    return Strip(f"{title}: {len(sweep['releases'])} releases in {len(out)} runs", out, fixed)


def pair_strip(pair: dict, rows: list[str]) -> Strip:
    columns = [Column(tree(pair["cells"].get(side))[1], side, {sid: pair_state(pair, sid, side) for sid in rows})
               for side in ("base", "head")]
    return Strip(f"compared {trees_text(pair)}", columns, fixed_for_good(columns))


def timelines(doc: dict) -> list[Timeline]:
    names = list(dict.fromkeys(p["experiment"] for p in doc["pairs"]))
    pairs = {name: [p for p in doc["pairs"] if p["experiment"] == name] for name in names}
    rows = {name: telling_rows(doc, name) for name in names}
    sweeps = {name: sweep for name in names if (sweep := doc.get("sweeps", {}).get(name))}
    columns = {name: release_columns(sweep, rows[name], pairs[name]) for name, sweep in sweeps.items()}
    eras = doc.get("eras", {})
    cut = runs(columns, {s["first_fixed"] for s in sweeps.values() if s["first_fixed"]}, eras)
    out = []
    for name in names:
        sweep = sweeps.get(name)
        strips = [sweep_strip(sweep, rows[name], columns[name], cut, eras)] if sweep else []
        strips += [pair_strip(p, rows[name]) for p in pairs[name]
                   if p["grid"] and not (sweep and p["kind"] == "release")]
        verdicts = [f"{trees_text(p)}: {p['verdict']}" for p in pairs[name]]
        if sweep and (off := gated_off_text(sweep)):
            verdicts.append(f"release sweep: {off}")
        first = pairs[name][0]
        out.append(Timeline(name, f"{name}: PR #{first['pr']} {first['title']}", verdicts, rows[name], strips))
    return out
