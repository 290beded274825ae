"""The report's picture: per experiment a release timeline, plus mutation and PR-test panels.

The canvas grows to fit its longest text (widths estimated generously from the
font size), so no label is cut; every coloured mark comes from one legend.
"""

from __future__ import annotations

import math
from html import escape

from ..documents.vocabulary import Behaviour, MutantStatus
from .narrative import mutation_text, upstream_text
from .timeline import Timeline, timelines

FONT = "DejaVu Sans, Verdana, sans-serif"
# Average advance per character, in font sizes: above DejaVu Sans (about 0.56 and 0.63), a wide font.
EM = {False: 0.62, True: 0.7}
MARGIN, CELL_H, GAP = 12, 20, 6

# Each legend: state -> (colour, meaning). Every coloured mark in the picture takes its colour from one.
LEGEND = {
    Behaviour.PRE_FIX.value: ("#d95f02", "behaves like the tree before the fix (base)"),
    Behaviour.FIXED.value: ("#1b9e77", "behaves like the tree with the fix (head)"),
    Behaviour.NEITHER.value: ("#7570b3", "behaves like neither"),
    Behaviour.ERROR.value: ("#4d4d4d", "raised, missing, or the release could not be probed"),
    Behaviour.NOT_AFFECTED.value: ("#80b1d3", "the vulnerable path is not in the release"),
    Behaviour.NOT_DECIDING.value: ("#e6e6e6", "none of its keys decides on this release: a registry rule says why"),
    Behaviour.DEVIATES.value: ("#e7298a", "a control on which the release departs from both trees (an over-broad "
                                          "fix: not the fixed code); no mark where it agrees with both"),
}
MUTANT_LEGEND = {
    MutantStatus.KILLED.value: ("#2c7bb6", "a mutant of the fix that a scenario noticed"),
    MutantStatus.SURVIVED.value: ("#fdae61", "a mutant of the fix no scenario noticed"),
    MutantStatus.NOT_APPLICABLE.value: ("#d9d9d9", "a mutant whose target is not on this tree"),
    MutantStatus.ERROR.value: ("#762a83", "a mutant that could not be run"),
}
TEST_LEGEND = {
    "passed": ("#66bd63", "a test of the PR that passed"),
    "failed": ("#f46d43", "a test of the PR that failed"),
    "errors": ("#a50026", "a test of the PR that errored (collection, setup or teardown)"),
    "skipped": ("#bababa", "a test of the PR that was skipped"),
}
COLOURS = {state: colour for state, (colour, _) in LEGEND.items()}
MUTANT_COLOURS = {state: colour for state, (colour, _) in MUTANT_LEGEND.items()}
TEST_COLOURS = {state: colour for state, (colour, _) in TEST_LEGEND.items()}


def text_width(text: str, size: int, bold: bool = False) -> int:
    return math.ceil(len(text) * size * EM[bold])


class Canvas:
    """SVG elements in drawing order; the width is the rightmost thing drawn plus a margin."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.right = 0
        self.bottom = 0

    def text(self, x: int, y: int, text: str, *, size: int = 12, bold: bool = False, anchor: str = "start",
             colour: str = "#000000") -> None:
        width = text_width(text, size, bold)
        left = x - width // 2 if anchor == "middle" else x
        weight = ' font-weight="bold"' if bold else ""
        self.parts.append(f'<text x="{x}" y="{y}" font-size="{size}"{weight} text-anchor="{anchor}" '
                          f'fill="{colour}">{escape(text)}</text>')
        self.right = max(self.right, left + width)
        self.bottom = max(self.bottom, y + size // 3)

    def rect(self, x: int, y: int, w: int, h: int, fill: str, *, kind: str, state: str = "", tip: str = "") -> None:
        data = f' data-state="{escape(state)}"' if state else ""
        title = f"<title>{escape(tip)}</title>" if tip else ""
        self.parts.append(f'<rect class="{kind}"{data} x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}" '
                          f'stroke="#ffffff">{title}</rect>')
        self.right = max(self.right, x + w)
        self.bottom = max(self.bottom, y + h)

    def svg(self) -> str:
        width, height = self.right + MARGIN, self.bottom + MARGIN
        head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                f'viewBox="0 0 {width} {height}" font-family="{FONT}">',
                f'<rect class="background" width="{width}" height="{height}" fill="#ffffff"/>']
        return "\n".join(head + self.parts + ["</svg>"]) + "\n"


def _timeline(c: Canvas, t: Timeline, y: int, label_w: int) -> int:
    c.text(MARGIN, y + 14, t.heading, size=14, bold=True)
    y += 20
    for verdict in t.verdicts:
        c.text(MARGIN, y + 13, verdict)
        y += 17
    if not t.rows:
        c.text(MARGIN, y + 13, "no scenario tells base from head: nothing to place on a timeline", colour="#555555")
        return y + 20
    for strip in t.strips:
        col_w = max(48, *(text_width(col.label, 11) + 2 * GAP for col in strip.columns))
        y += 8
        c.text(MARGIN, y + 12, strip.caption, size=11, colour="#555555")
        y += 16
        for i, col in enumerate(strip.columns):
            centre = MARGIN + label_w + i * col_w + col_w // 2
            c.text(centre, y + 12, col.label, size=11, anchor="middle")
            if col.note:
                c.text(centre, y + 25, col.note, size=10, anchor="middle", colour="#555555")
        y += 30
        for r, sid in enumerate(t.rows):
            c.text(MARGIN, y + r * CELL_H + 14, sid)
            for i, col in enumerate(strip.columns):
                if col.states[sid] is None:  # a control the release agrees with both sides on
                    continue
                state = col.states[sid].value
                c.rect(MARGIN + label_w + i * col_w + 1, y + r * CELL_H + 1, col_w - 2, CELL_H - 2, COLOURS[state],
                       kind="cell", state=state, tip=f"{sid} on {col.label}: {state}")
        y += len(t.rows) * CELL_H
        if strip.first_fixed is not None:
            x = MARGIN + label_w + strip.first_fixed * col_w - 2
            top = y - len(t.rows) * CELL_H - 4
            c.rect(x, top, 3, y - top + 6, "#000000", kind="first-fixed",
                   tip=f"first fixed: {strip.columns[strip.first_fixed].label}")
            c.text(x, y + 18, f"first fixed: {strip.columns[strip.first_fixed].label}", size=11)
            y += 22
    return y + 8


def _mutants(c: Canvas, table: dict, y: int) -> int:
    c.text(MARGIN, y + 13, mutation_text(table))
    y += 18
    for i, m in enumerate(table["mutants"]):
        c.rect(MARGIN + i * 16, y, 14, 14, MUTANT_COLOURS.get(m["status"], MUTANT_COLOURS[MutantStatus.ERROR]),
               kind="mutant", state=m["status"], tip=f"{m['id']}: {m['status']}")
    return y + 22


def _tests(c: Canvas, entry: dict, y: int) -> int:
    c.text(MARGIN, y + 13, upstream_text(entry))
    y += 18
    counts = {side: (found or {}).get("totals", {}) for side, found in entry["sides"].items()}
    unit = max(1, min(12, 240 // max(1, *(t.get("total", 0) for t in counts.values()))))  # bars at most 240 px
    for side in ("base", "head"):
        c.text(MARGIN, y + 12, side, size=11)
        x = MARGIN + text_width("base", 11) + GAP
        for outcome in TEST_COLOURS:
            if n := counts.get(side, {}).get(outcome, 0):
                c.rect(x, y + 2, unit * n, 12, TEST_COLOURS[outcome], kind="tests", state=outcome,
                       tip=f"{side}: {n} {outcome}")
                x += unit * n
        y += 16
    return y + 4


def _legend(c: Canvas, kind: str, legend: dict[str, tuple[str, str]], y: int) -> int:
    for state, (colour, meaning) in legend.items():
        c.rect(MARGIN, y, 14, 14, colour, kind=kind, state=state)
        c.text(MARGIN + 20, y + 12, f"{state}: {meaning}", size=11)
        y += 18
    return y + 6


def svg(doc: dict) -> str:
    c = Canvas()
    y = MARGIN
    found = timelines(doc)
    # One row-label column for every experiment, so the timelines line up.
    label_w = max((text_width(sid, 12) for t in found for sid in t.rows), default=0) + 2 * GAP
    for t in found:
        y = _timeline(c, t, y, label_w)
        if t.experiment in doc.get("mutations", {}):
            y = _mutants(c, doc["mutations"][t.experiment], y)
        for entry in doc.get("upstream", []):
            if entry["experiment"] == t.experiment:
                y = _tests(c, entry, y)
        y += 10
    y = _legend(c, "legend", LEGEND, y)
    if doc.get("mutations"):
        y = _legend(c, "mutant-legend", MUTANT_LEGEND, y)
    if doc.get("upstream"):
        _legend(c, "tests-legend", TEST_LEGEND, y)
    return c.svg()
