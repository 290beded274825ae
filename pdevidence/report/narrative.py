"""The words of the report, generated from the results and the registry.

Nothing here is written per result: scenario titles come from the result
documents, roles from the registry, values from the comparison, so the story
stays true when the results change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from ..documents.tables import partial_sweep
from ..documents.vocabulary import Classification, Finding, MutantStatus

SIDE_ROLE = {"base": "before the fix", "head": "after it"}


def value(v: Any) -> str:
    """How an observation is shown: ``-`` for null, strings bare, everything else as JSON."""
    return "-" if v is None else v if isinstance(v, str) else json.dumps(v)


def tree(cell: dict | None) -> tuple[str, str]:
    """(kind, label) from a result file name ``<exp>.<side>.<kind>-<ref>.json``: a version or a commit."""
    if not cell:
        return "", "?"
    label = cell["file"].split(".", 2)[2].removesuffix(".json")
    kind, _, ref = label.partition("-")
    return kind, ref or label


def trees_text(pair: dict, arrow: str = "→") -> str:
    """``release 0.5.20 → 0.5.21`` or ``commits 17ba2c2e7c7b → 8f3d6944b76c``."""
    kinds = {side: tree(pair["cells"].get(side)) for side in ("base", "head")}
    word = {"release": "release", "git": "commits"}.get(pair["kind"], pair["kind"])
    return f"{word} {kinds['base'][1]} {arrow} {kinds['head'][1]}"


@dataclass(frozen=True)
class Change:
    """One scenario whose observations differ between base and head."""

    sid: str
    title: str | None
    keys: list[tuple[str, Any, Any]]  # (key, base, head), changed keys only
    role: bool | None  # registry: True changes, False control, None not declared
    failures: list[dict]


@dataclass
class Story:
    changes: list[Change] = field(default_factory=list)
    flat: list[str] = field(default_factory=list)  # expected to change, did not
    controls_held: list[str] = field(default_factory=list)
    beside: list[tuple[str, list[str], str]] = field(default_factory=list)  # held controls: (sid, keys moved, why)
    errors: list[str] = field(default_factory=list)


def changed_keys(scenario: dict, declared: list[str] | None = None) -> list[tuple[str, Any, Any]]:
    """The keys whose values differ; only the registry's keys for the scenario when it names them."""
    out = [(key, k["base"], k["head"]) for key, k in scenario["keys"].items() if k["status"] != "unchanged"]
    narrowed = [item for item in out if declared and item[0] in declared]
    return narrowed or out


def story(pair: dict, notes: dict[str, dict]) -> Story:
    result = Story()
    for sid, sc in pair["grid"].items():
        note = notes.get(sid, {})
        failures = [f for f in pair["expectation_failures"] if f["scenario"] == sid]
        if any(sc["errors"][side] for side in ("base", "head")) or not all(sc["present"].values()):
            result.errors.append(sid)
        if sc["status"] == "unchanged" and note.get("changes") is not True:
            if note.get("changes") is False and not failures:
                result.controls_held.append(sid)
            continue
        if sc["status"] == "unchanged":
            result.flat.append(sid)
            continue
        moved = [key for key, k in sc["keys"].items() if k["status"] != "unchanged"]
        declared = note.get("beside") or {}
        if (note.get("changes") is False and not failures and sc["errors"]["base"] == sc["errors"]["head"]
                and set(moved) <= set(declared.get("keys", ()))):
            result.controls_held.append(sid)  # what it controls held; the rest moved as the registry says
            result.beside.append((sid, moved, declared["why"]))
            continue
        keys = changed_keys(sc, note.get("keys"))
        result.changes.append(Change(sid, note.get("title"), keys, note.get("changes"), failures))
    return result


def change_text(change: Change, arrow: str = "→") -> str:
    return ", ".join(f"{key} {value(b)} {arrow} {value(h)}" for key, b, h in change.keys)


def failure_text(f: dict) -> str:
    return (f"{f['side']} {f['key'] or 'scenario'}: expected {value(f['expected'])}, "
            f"observed {value(f['observed'])}")


def ranges(items: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """Consecutive items with the same class merged: [(first, last, class)]."""
    out: list[tuple[str, str, str]] = []
    for version, cls in items:
        if out and out[-1][2] == cls:
            out[-1] = (out[-1][0], version, cls)
        else:
            out.append((version, version, cls))
    return out


def sweep_text(sweep: dict, dash: str = "–") -> str:
    spans = ranges([(r["version"], r["classification"]) for r in sweep["releases"]])
    parts = [f"{a} {cls}" if a == b else f"{a}{dash}{b} {cls}" for a, b, cls in spans]
    partial = partial_sweep(sweep.get("parameters"))
    text = (f"PARTIAL release sweep ({partial}; {len(sweep['releases'])} releases): " if partial
            else f"release sweep ({len(sweep['releases'])} releases): ") + ", ".join(parts)
    fixed = sweep["first_fixed"]
    text += f"; first fixed {fixed}" if fixed else "; no release behaves as fixed"
    kinds = {r["version"]: r["classification"] for r in sweep["releases"]}
    declared = [r["version"] for r in sweep["releases"] if r.get("declared")]
    if sweep.get("flagged"):
        after = [v for v in sweep["flagged"] if fixed and Version(v) > Version(fixed) and v not in declared]
        unprobed = [v for v in sweep["flagged"] if v not in after and v not in declared]
        wrong = [v for v in sweep["flagged"] if v in declared]
        if after:
            text += f"; release watch, not fixed after {fixed}: " + ", ".join(f"{v} ({kinds.get(v)})" for v in after)
        if unprobed:
            text += f"; release watch, not probed (the first fixed release may be among them): {', '.join(unprobed)}"
        if wrong:
            text += ("; release watch, declared cannot be probed on a CPU but did not fail as declared: "
                     + ", ".join(f"{v} ({kinds.get(v)})" for v in wrong))
    unrun = [r for r in sweep["releases"] if r["classification"] == Classification.CANNOT_RUN.value]
    if unrun:
        text += "; cannot run on a CPU, as the registry declares: " + "; ".join(
            f"{r['version']} ({r.get('declared')})" for r in unrun)
    elif sweep.get("regressions"):  # tables written before the release watch (schema 1 and 2)
        text += "; pre-fix again after a fixed release: " + ", ".join(sweep["regressions"])
    off = gated_off_text(sweep, dash)
    text += f"; {off}" if off else ""
    aside = set_aside(sweep, dash)
    return text + (f"; judged without the keys a registry rule sets aside: {aside}" if aside else "")


def gated_off_text(sweep: dict, dash: str = "–") -> str | None:
    """A gated fix's releases that carry it off by default, the variable, and what turns it on; None: none do."""
    off = [r for r in sweep["releases"] if r["classification"] == Classification.PRESENT_OFF.value and r.get("gate")]
    if not off:
        return None
    gate = off[0]["gate"]
    spans = ", ".join(a if a == b else f"{a}{dash}{b}" for a, b, _ in ranges([(r["version"], "") for r in off]))
    return (f"{Classification.PRESENT_OFF.value} ({spans}): the fix is there, but {gate['variable']} is off by "
            f"default, so a server run with the defaults is exposed; {gate['variable']}={gate['on']} turns it on")


def set_aside(sweep: dict, dash: str) -> str:
    """Each ``not_deciding`` rule the judge applied, with the releases it held on: ``id (first-last)``."""
    where: dict[str, list[int]] = {}
    for i, release in enumerate(sweep["releases"]):
        for rule in release.get("not_deciding", []):
            where.setdefault(rule.split(":")[0], []).append(i)
    versions = [r["version"] for r in sweep["releases"]]
    spans = []
    for rid, rows in where.items():
        run = rows == list(range(rows[0], rows[-1] + 1))
        held = (f"{versions[rows[0]]}{dash}{versions[rows[-1]]}" if run and len(rows) > 1
                else ", ".join(versions[i] for i in rows))
        spans.append(f"{rid} ({held})")
    return ", ".join(spans)


def mutation_text(table: dict) -> str:
    score = table["score"]
    unkilled = [f"{m['id']} ({m['status']})" for m in table["mutants"] if m["status"] != MutantStatus.KILLED.value]
    text = (f"mutants: the probe kills {score['killed']} of {score['applicable']} applicable "
            f"({score['total']} declared)")
    if "only_raising" in score:  # tables since schema 2 count kills only by raising apart
        text += f", {score['by_observation']} by observation and {score['only_raising']} only by raising"
    return text + (f"; not killed: {', '.join(unkilled)}" if unkilled else "")


def bisect_text(doc: dict) -> str:
    """The commits a bisection found: the fix and the introduction, each its commit and PR, or why not."""
    parts = []
    for key, name in (("fix", "fixed by"), ("introduced", "introduced by")):
        found = doc[key]
        commit = found["commit"]
        if found["finding"] == Finding.FOUND.value:
            pr = f" (PR #{commit['pr']})" if commit["pr"] else ""
            parts.append(f"{name} commit {commit['sha'][:12]}{pr}, {commit['date'][:10]}, its parent "
                         f"{found['parent']['sha'][:12]} {found['parent']['outcome']}")
        else:
            parts.append(f"{name}: {found['finding']}")
    return "bisected on upstream's history: " + "; ".join(parts)


def totals(side: dict | None) -> str:
    if side is None:
        return "not run"
    t = side["totals"]
    text = f"{t['passed']}/{t['total']} passed"
    if side.get("subtest_totals", {}).get("total") and side.get("pytest_summary"):
        # A unittest method whose subtests failed still counts as passed: pytest's own words say more.
        text += " (pytest: " + ", ".join(f"{n} {what}" for what, n in side["pytest_summary"].items()) + ")"
    types = ", ".join(f"{n} {name}" for name, n in side["types"].items())
    return text + (f" ({types})" if types else "")


def upstream_tree(entry: dict) -> str:
    """The tree kind, and a ``tree``/``label`` field when an entry names its tree (``--ref`` runs)."""
    label = entry.get("label") or entry.get("tree")
    if isinstance(label, dict):  # a tree record: {"kind", "ref", "resolved"}
        label = label.get("ref") or label.get("resolved")
    return f"{entry['kind']} ({label})" if isinstance(label, str) and label else entry["kind"]


def upstream_text(entry: dict) -> str:
    return (f"the PR's own tests on {upstream_tree(entry)}: {entry['verdict']}; "
            f"base: {totals(entry['sides']['base'])}; head: {totals(entry['sides']['head'])}")


def overview(told: Story) -> str:
    """The story in one sentence: how many scenarios changed, whether as declared, and the controls."""
    unexpected = [c.sid for c in told.changes if c.failures or c.role is not True] + told.flat
    text = f"{_counted(len(told.changes), 'scenario')} differently after the fix"
    text += f"; not as declared: {', '.join(unexpected)}" if unexpected else ", each as experiments.toml declares"
    if told.controls_held:
        text += f"; {_counted(len(told.controls_held), 'control')} the same"
    return text + "."


def _counted(count: int, noun: str) -> str:
    return f"1 {noun} behaves" if count == 1 else f"{count} {noun}s behave"


def _lines(pair: dict, doc: dict, *, arrow: str, bullet: str, strong) -> list[str]:
    """The summary of one pair: what changed, what did not, and the other evidence for it."""
    name = pair["experiment"]
    if not pair["grid"]:
        return [f"{bullet}{reason}" for reason in pair["reasons"]] or [f"{bullet}not compared"]
    told = story(pair, doc.get("scenarios", {}).get(name, {}))
    lines = [f"{bullet}{overview(told)}"]
    for c in told.changes:
        title = f" {c.title}" if c.title else ""
        flag = ("" if not c.failures else "; NOT as expected: " + "; ".join(failure_text(f) for f in c.failures))
        role = " (a control)" if c.role is False else " (not declared in the registry)" if c.role is None else ""
        lines.append(f"{bullet}{strong(c.sid)}{title}{role}: {change_text(c, arrow)}{flag}")
    if told.flat:
        lines.append(f"{bullet}expected to change but unchanged: {', '.join(told.flat)}")
    if told.controls_held:
        lines.append(f"{bullet}controls unchanged, as expected: {', '.join(told.controls_held)}")
    for sid, moved, why in told.beside:
        lines.append(f"{bullet}{strong(sid)} beside its control, as declared: {', '.join(moved)} differ ({why})")
    if told.errors:
        lines.append(f"{bullet}scenarios that raised or are missing on a side: {', '.join(told.errors)}")
    others = [f["scenario"] for f in pair["expectation_failures"]
              if f["scenario"] not in {c.sid for c in told.changes} | set(told.flat)]
    if others:
        lines.append(f"{bullet}not as expected: {', '.join(dict.fromkeys(others))}")
    return lines + [f"{bullet}{reason}" for reason in pair["reasons"]]


def evidence(doc: dict, name: str, *, dash: str, bullet: str) -> list[str]:
    """Per experiment, what the sweep, the mutants, the bisection and the PR's own tests add."""
    lines = []
    if name in doc.get("sweeps", {}):
        lines.append(bullet + sweep_text(doc["sweeps"][name], dash))
    if name in doc.get("mutations", {}):
        lines.append(bullet + mutation_text(doc["mutations"][name]))
    if name in doc.get("bisects", {}):
        lines.append(bullet + bisect_text(doc["bisects"][name]))
    lines += [bullet + upstream_text(e) for e in doc.get("upstream", []) if e["experiment"] == name]
    return lines


def pair_lines(pairs: list[dict], doc: dict, *, arrow: str, bullet: str, strong) -> Iterator[list[str]]:
    """Each pair's lines; a pair that tells the same story as an earlier one says so in one line."""
    told: list[list[str]] = []
    for i, pair in enumerate(pairs):
        lines = _lines(pair, doc, arrow=arrow, bullet=bullet, strong=strong)
        same = next((pairs[j] for j in range(i) if lines and told[j] == lines), None)
        told.append(lines)
        yield [f"{bullet}the same changes and controls as on {trees_text(same, arrow)}"] if same else lines


def experiments(doc: dict) -> dict[str, list[dict]]:
    """Pairs grouped by experiment, in report order."""
    grouped: dict[str, list[dict]] = {}
    for pair in doc["pairs"]:
        grouped.setdefault(pair["experiment"], []).append(pair)
    return grouped


def markdown_summary(doc: dict) -> list[str]:
    out = []
    for name, pairs in experiments(doc).items():
        several = len(pairs) > 1
        verdicts = ", ".join(p["verdict"] + (f" ({p['kind']})" if several else "") for p in pairs)
        out += [f"### {name}: {verdicts}", f"PR #{pairs[0]['pr']}: *{pairs[0]['title']}*."]
        stories = pair_lines(pairs, doc, arrow="→", bullet="- ", strong=lambda s: f"**{s}**")
        for pair, lines in zip(pairs, stories):
            out += ["", f"**{trees_text(pair)}** ({SIDE_ROLE['base']} → {SIDE_ROLE['head']}): "
                        f"**{pair['verdict']}**", *lines]
        more = evidence(doc, name, dash="–", bullet="- ")
        out += ["", "Beyond the compared trees:", *more, ""] if more else [""]
    return out


def terminal_summary(doc: dict) -> list[str]:
    out = []
    for name, pairs in experiments(doc).items():
        for pair, lines in zip(pairs, pair_lines(pairs, doc, arrow="->", bullet="  ", strong=str)):
            out += ["", f"{name} (PR #{pair['pr']}) {trees_text(pair, '->')}: {pair['verdict'].upper()}", *lines]
        out += evidence(doc, name, dash="-", bullet="  ")
    return out
