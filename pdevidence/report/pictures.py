"""The report's picture: per experiment a release timeline, plus mutation and PR-test panels.

Sized to be read where the README shows it, about 1,000 px wide: no text under
11 px, long sentences wrapped, a timeline column per run of releases that behave
alike (not per release) with its range written at 45 degrees, so that a narrow
column still holds a long label. Widths are estimated generously from the font
size, so no label is cut; every coloured mark comes from one legend.
"""

from __future__ import annotations

import math
from html import escape

from ..documents.vocabulary import Behaviour, MutantStatus
from .narrative import mutation_text, upstream_text
from .timeline import PRESENT_OFF, Column, Timeline, timelines

FONT = "DejaVu Sans, Verdana, sans-serif"
# Average advance per character, in font sizes: above DejaVu Sans (about 0.56 and 0.63), a wide font.
EM = {False: 0.62, True: 0.7}
MARGIN, CELL_H, GAP = 12, 20, 6
# The README's width: text wraps inside it, so the picture is read at its own size there.
WIDTH = 1000
# A timeline column, and the gap that tells one era from the next. At 45 degrees, neighbouring labels are
# COL_W * sin 45 = 14 px apart: more than a line of 11 px text.
COL_W, ERA_GAP, LABEL_SIZE = 20, 4, 11
SLANT = math.sqrt(0.5)  # sin 45 = cos 45

# Each legend: state -> (colour, meaning). Every coloured mark in the picture takes its colour from one.
LEGEND = {
    Behaviour.PRE_FIX.value: ("#d95f02", "behaves like the tree before the fix (base)"),
    Behaviour.FIXED.value: ("#1b9e77", "behaves like the tree with the fix (head)"),
    PRESENT_OFF.value: ("#e6ab02", "behaves like the tree with the fix only with its variable turned on: the "
                                   "release's default leaves it off, so a server run with the defaults is exposed"),
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


def wrap(text: str, width: int, size: int = 12, bold: bool = False) -> list[str]:
    """Lines of at most ``width`` px, cut at spaces (a single longer word stays whole)."""
    lines = [""]
    for word in text.split(" "):
        joined = f"{lines[-1]} {word}" if lines[-1] else word
        if lines[-1] and text_width(joined, size, bold) > width:
            lines.append(word)
        else:
            lines[-1] = joined
    return lines


class Canvas:
    """SVG elements in drawing order; the width is the rightmost thing drawn plus a margin."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.right = 0
        self.bottom = 0

    def text(self, x: int, y: int, text: str, *, size: int = 12, bold: bool = False, anchor: str = "start",
             colour: str = "#000000", slanted: bool = False) -> None:
        """``slanted``: rising at 45 degrees from (x, y); the caller leaves room above it."""
        width = text_width(text, size, bold)
        left = x - width // 2 if anchor == "middle" else x
        weight = ' font-weight="bold"' if bold else ""
        turn = f' transform="rotate(-45 {x} {y})"' if slanted else ""
        self.parts.append(f'<text x="{x}" y="{y}" font-size="{size}"{weight} text-anchor="{anchor}"{turn} '
                          f'fill="{colour}">{escape(text)}</text>')
        self.right = max(self.right, left + (math.ceil(width * SLANT) if slanted else width))
        self.bottom = max(self.bottom, y + size // 3)

    def paragraph(self, x: int, y: int, text: str, *, size: int = 12, bold: bool = False,
                  colour: str = "#000000") -> int:
        """``text`` wrapped to the picture's width, its first baseline at ``y``; the y below its last line."""
        for line in wrap(text, WIDTH - MARGIN - x, size, bold):
            self.text(x, y, line, size=size, bold=bold, colour=colour)
            y += size + 5
        return y - size - 5

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


def column_text(col: Column) -> str:
    """A column's label: its range, how many releases a run holds, the side a compared tree was."""
    count = f" ({len(col.releases)})" if len(col.releases) > 1 else ""
    return col.label + count + (f": {col.note}" if col.note else "")


def column_xs(columns: list[Column], left: int) -> list[int]:
    xs = []
    for i, col in enumerate(columns):
        if i and col.era != columns[i - 1].era:
            left += ERA_GAP
        xs.append(left)
        left += COL_W
    return xs


def _timeline(c: Canvas, t: Timeline, y: int, label_w: int) -> int:
    y = c.paragraph(MARGIN, y + 14, t.heading, size=14, bold=True) + 6
    for verdict in t.verdicts:
        y = c.paragraph(MARGIN, y + 13, verdict) + 4
    if not t.rows:
        c.text(MARGIN, y + 13, "no scenario tells base from head: nothing to place on a timeline", colour="#555555")
        return y + 20
    for strip in t.strips:
        y += 8
        caption = strip.caption
        if any(len(col.releases) > 1 for col in strip.columns):
            caption += "; in parentheses, how many releases a run holds; a gap between runs: the next era"
        y = c.paragraph(MARGIN, y + 12, caption, size=LABEL_SIZE, colour="#555555") + 4
        xs = column_xs(strip.columns, MARGIN + label_w)
        labels = [column_text(col) for col in strip.columns]
        # The longest label's rise, and its glyphs' height above the baseline.
        y += math.ceil(max(text_width(label, LABEL_SIZE) for label in labels) * SLANT) + LABEL_SIZE + 4
        for x, label in zip(xs, labels):
            c.text(x + COL_W // 2 - 2, y, label, size=LABEL_SIZE, slanted=True)
        y += 4
        for r, sid in enumerate(t.rows):
            c.text(MARGIN, y + r * CELL_H + 14, sid)
            for x, col in zip(xs, strip.columns):
                if col.states[sid] is None:  # a control the release agrees with both sides on
                    continue
                state = col.states[sid].value
                c.rect(x + 1, y + r * CELL_H + 1, COL_W - 2, CELL_H - 2, COLOURS[state],
                       kind="cell", state=state, tip=f"{sid} on {col.label}: {state}")
        y += len(t.rows) * CELL_H
        if strip.first_fixed is not None:
            col = strip.columns[strip.first_fixed]
            first = col.releases[0] if col.releases else col.label  # a run's first release is the first fixed
            x = xs[strip.first_fixed] - 2
            top = y - len(t.rows) * CELL_H - 4
            c.rect(x, top, 3, y - top + 6, "#000000", kind="first-fixed", tip=f"first fixed: {first}")
            c.text(x, y + 18, f"first fixed: {first}", size=LABEL_SIZE)
            y += 22
    return y + 8


def _mutants(c: Canvas, table: dict, y: int) -> int:
    y = c.paragraph(MARGIN, y + 13, mutation_text(table)) + 5
    for i, m in enumerate(table["mutants"]):
        c.rect(MARGIN + i * 16, y, 14, 14, MUTANT_COLOURS.get(m["status"], MUTANT_COLOURS[MutantStatus.ERROR]),
               kind="mutant", state=m["status"], tip=f"{m['id']}: {m['status']}")
    return y + 22


def _tests(c: Canvas, entry: dict, y: int) -> int:
    y = c.paragraph(MARGIN, y + 13, upstream_text(entry)) + 5
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
        y = c.paragraph(MARGIN + 20, y + 12, f"{state}: {meaning}", size=LABEL_SIZE) + 6
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
