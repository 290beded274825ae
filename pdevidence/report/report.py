"""Render a comparison: a compact terminal summary, ``report.md``, ``report.json`` and ``report.svg``.

Everything renders from the report dict (``compare.Summary.to_json()``),
optionally enriched with what ``report_inputs.gather`` read (scenario titles and
roles, sweep and mutation tables, the source files). ``report.json`` is that
enriched dict, so every rendering is a pure function of it: the same inputs
give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from ..core.files import dumps, write_atomic
from . import pictures
from .narrative import failure_text, markdown_summary, terminal_summary, totals, upstream_tree, value
from .report_inputs import ReportInputs, gather

COLOURS = pictures.COLOURS
SYMBOLS = {
    "a → b": "the value on base (before the fix) → the value on head (after it)",
    "-": "null: the probe recorded no value (for example no finish status)",
    "absent": "the function or attribute the probe looks for does not exist on that tree",
    "<missing>": "the probe recorded no such key or scenario on that tree",
    "met / NOT met": "the scenario observed what experiments.toml expects on both sides / it did not (which side, "
                     "which key)",
    "not declared": "experiments.toml declares no expectation for the scenario",
    "status unchanged / changed / absent": "in the full table: same on both sides / differs / one side has "
                                           "`absent` or `<missing>`",
}


def document(report, inputs: ReportInputs | None = None, *, command: str | None = None) -> dict:
    """The report dict plus what the report shows beside it; also accepts an object with ``to_json``."""
    data = dict(report) if isinstance(report, dict) else report.to_json()
    if inputs is not None:
        data.update(scenarios=inputs.scenarios, sweeps=inputs.sweeps, mutations=inputs.mutations, eras=inputs.eras)
        if inputs.corpus is not None:
            data["corpus"] = inputs.corpus
        if inputs.bisects:
            data["bisects"] = inputs.bisects
    if command is not None or inputs is not None:
        data["made_by"] = {"command": command, "sources": inputs.sources if inputs else []}
    return data


def _data(report) -> dict:
    return report if isinstance(report, dict) else report.to_json()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _changes(scenario: dict) -> str:
    keys = [f"{key} {value(k['base'])} → {value(k['head'])}" for key, k in scenario["keys"].items()
            if k["status"] != "unchanged"]
    if scenario["errors"]["base"] != scenario["errors"]["head"]:
        keys.append(f"error {value(scenario['errors']['base'])} → {value(scenario['errors']['head'])}")
    return "; ".join(keys) or "unchanged"


def _expectation(pair: dict, sid: str, note: dict) -> str:
    failures = [f for f in pair["expectation_failures"] if f["scenario"] == sid]
    if failures:
        return "NOT met: " + "; ".join(failure_text(f) for f in failures)
    return "not declared" if note.get("changes") is None else "met"


def _scenario_tables(pair: dict, notes: dict[str, dict]) -> list[str]:
    head = ["| scenario | title | base → head (keys that differ) | expectation |", "|---|---|---|---|"]
    main, controls = list(head), list(head)
    for sid, sc in pair["grid"].items():
        note = notes.get(sid, {})
        row = f"| {sid} | {_cell(note.get('title') or '')} | {_cell(_changes(sc))} | {_cell(_expectation(pair, sid, note))} |"
        (controls if note.get("changes") is False else main).append(row)
    out = []
    if len(main) > 2:
        out += ["", "Scenarios that tell base from head:", "", *main]
    if len(controls) > 2:
        out += ["", "Controls (experiments.toml expects no change):", "", *controls]
    return out


def _full_table(pair: dict) -> list[str]:
    rows = [f"| {sid} | {key} | {_cell(value(k['base']))} | {_cell(value(k['head']))} | {k['status']} |"
            for sid, sc in pair["grid"].items() for key, k in sc["keys"].items()]
    return ["", "<details>", f"<summary>All {len(rows)} observations, key by key</summary>", "",
            "| scenario | key | base | head | status |", "|---|---|---|---|---|", *rows, "", "</details>"]


def _pair_section(pair: dict, notes: dict[str, dict]) -> list[str]:
    out = ["", f"## {pair['experiment']} ({pair['kind']}): PR #{pair['pr']} {pair['title']}", "",
           f"Verdict: **{pair['verdict']}**"]
    out += ["", *[f"- {reason}" for reason in pair["reasons"]]] if pair["reasons"] else []
    if not pair["grid"]:
        return out
    out += _scenario_tables(pair, notes)
    if pair["published"]:
        out += ["", "Against the published artifacts:", ""]
        for side, pub in pair["published"].items():
            out.append(f"- {side} `{pub['file']}`: {pub['status']}")
            out += [f"  - {d}" for d in pub["diffs"][:20]]
    return out + _full_table(pair)


def _corpus_section(corpus: dict) -> list[str]:
    """Per release and fix: what check answered on the release as published, with the fix ported by hand in the
    release's own idiom, and with the port left partial (whole, where no partial port exists); an answer other than
    the expected one says so."""
    variants = ("pristine", "backport", "partial")
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for a in corpus["answers"]:
        rows.setdefault((a["release"], a["experiment"]), {"era": a["era"]})[a["variant"]] = a

    def shown(a: dict) -> str:
        return a["status"] if a["status"] == a["expected"] else f"**{a['status']}** (expected {a['expected']})"

    good = sum(a["status"] == a["expected"] for a in corpus["answers"])
    out = ["", "## The backport corpus", "",
           f"Each fix ported by hand into older releases, in each release's own idiom (`backports/`), then checked: "
           f"`check` must read the release as published `affected`, the backport `fixed` and the partial port "
           f"`partial` (`fixed` where the fix is one clause and no partial port exists: its partial tree carries "
           f"the whole port). {good} of {len(corpus['answers'])} answers are the expected ones.", "",
           "| release | era | fix | " + " | ".join(variants) + " |", "|---|---|---|---|---|---|"]
    out += [f"| {release} | {row['era'] or 'current'} | {experiment} | "
            + " | ".join(shown(row[v]) if v in row else "-" for v in variants) + " |"
            for (release, experiment), row in rows.items()]
    return out


def _unconfirmed(doc: dict, *, bullet: str, strong) -> list[str]:
    """What a publish with ``--allow-unconfirmed`` took in although the fresh comparison did not confirm it: said
    first, before any verdict is read."""
    if not doc.get("unconfirmed"):
        return []
    out = [strong("Published unconfirmed") + " (`publish --allow-unconfirmed`): the fresh comparison did not "
           "confirm these references; what follows is published as it is, not as a confirmed differential."]
    for entry in doc["unconfirmed"]:
        out.append(f"{bullet}{entry['experiment']} ({entry['kind']}): {entry['verdict']}"
                   + "".join(f"; {reason}" for reason in entry["reasons"]))
    return [*out, ""]


def markdown(report) -> str:
    doc = _data(report)
    made = doc.get("made_by")
    out = ["# Differential report", ""]
    if made:
        out += [f"Made by `{made['command'] or 'report.write'}` from the {len(made['sources'])} files under "
                "[Sources](#sources); it runs no probe.", ""]
    out += _unconfirmed(doc, bullet="- ", strong=lambda text: f"**{text}**")
    out += markdown_summary(doc)
    out += ["![per experiment: each telling scenario on each tree, coloured by the side it behaves like]"
            "(report.svg)"]
    for pair in doc["pairs"]:
        out += _pair_section(pair, doc.get("scenarios", {}).get(pair["experiment"], {}))
    if doc.get("upstream"):
        out += ["", "## The PRs' own tests", "", "| experiment | trees | base | head | verdict |",
                "|---|---|---|---|---|"]
        out += [f"| {e['experiment']} (PR #{e['pr']}) | {upstream_tree(e)} | {totals(e['sides']['base'])} | "
                f"{totals(e['sides']['head'])} | {e['verdict']} |" for e in doc["upstream"]]
    if doc.get("corpus"):
        out += _corpus_section(doc["corpus"])
    if doc.get("mutations"):
        out += ["", "## Mutants", "", "| experiment | mutant | kind | target | status | killed by |",
                "|---|---|---|---|---|---|"]
        for name, table in doc["mutations"].items():
            out += [f"| {name} | {m['id']} {_cell(m.get('title', ''))} | {m.get('kind', '')} | `{m.get('target', '')}` | "
                    f"{m['status']} | {', '.join(sorted(m.get('killed_by') or {})) or '-'} |" for m in table["mutants"]]
    out += ["", "## Legend", "", "| symbol | meaning |", "|---|---|"]
    out += [f"| `{s}` | {m} |" for s, m in SYMBOLS.items()]
    out += [f"| picture: {state} | {m} |" for state, (_, m) in pictures.LEGEND.items()]
    if made:
        out += ["", "## Sources", "", f"Command: `{made['command'] or 'report.write'}`", ""]
        out += [f"- `{source}`" for source in made["sources"]]
    return "\n".join(out) + "\n"


def terminal(report) -> str:
    doc = _data(report)
    lines = _unconfirmed(doc, bullet="  ", strong=str.upper) + terminal_summary(doc)
    for pair in doc["pairs"]:
        for side, pub in pair["published"].items():
            if pub["status"] != "identical":
                lines.append(f"  {pair['experiment']} published {side}: {pub['status']}")
                lines += [f"    {d}" for d in pub["diffs"][:10]]
    return "\n".join(lines + ["", f"exit code {doc['exit_code']}"])


def svg(report) -> str:
    return pictures.svg(_data(report))


def write(report, directory: Path) -> list[Path]:
    """``report.json`` (the enriched dict), ``report.md`` and ``report.svg``, each atomically, mode 0644."""
    doc = _data(report)
    outputs = {"report.json": dumps(doc), "report.md": markdown(doc), "report.svg": svg(doc)}
    paths = []
    for name, text in outputs.items():
        write_atomic(directory / name, text)
        paths.append(directory / name)
    return paths


def write_summary(reg, summary, directory: Path, *, runs: Path, published: Path, command: str) -> list[Path]:
    """A comparison's full report in ``directory``: the summary, plus the sweep and mutation tables and
    scenario notes found beside it; prints the compact terminal summary."""
    data = summary.to_json()
    doc = document(data, gather(reg, data, runs=runs, published=published), command=command)
    print(terminal(doc))
    return write(doc, directory)
