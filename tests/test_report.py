"""The report: summary first, generated words, and pictures checked by a real renderer (cairosvg)."""

from __future__ import annotations

import ast
import copy
import io
import json
import math
import os
import re
import tempfile
import tokenize
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import cairocffi
import cairosvg
import pytest
from PIL import Image
from report_data import (TITLES, full_document, many_experiments, mutations, notes, report_dict, sweep_v1, sweep_v3,
                         sweep_v4, sweep_v5, sweep_v6)
from synthetic import make_project, write_cell

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.documents import integrity
from pdevidence.documents.tables import SweepTable
from pdevidence.documents.vocabulary import Behaviour
from pdevidence.report import narrative, pictures, report, report_inputs, timeline

NS = "{http://www.w3.org/2000/svg}"


def _not_reproduced(doc: dict, *, same_as_base: bool) -> dict:
    """The admission head still enqueues A1's rejected request (and, if asked, observes all of base)."""
    doc = copy.deepcopy(doc)
    pair = doc["pairs"][0]
    a1 = pair["grid"]["A1"]["keys"]
    moved = [k for k in a1 if a1[k]["status"] != "unchanged"] if same_as_base else ["enqueued"]
    for key in moved:
        expected = a1[key]["head"]
        a1[key] = {"base": a1[key]["base"], "head": a1[key]["base"], "status": "unchanged"}
        pair["expectation_failures"].append({"scenario": "A1", "side": "head", "key": key,
                                             "expected": expected, "observed": a1[key]["base"]})
    pair["grid"]["A1"]["status"] = "unchanged" if same_as_base else "changed"
    pair["verdict"], pair["reasons"] = "not reproduced", ["scenarios not as expected: A1"]
    return doc


def _incomplete(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["pairs"][1].update(grid={}, verdict="incomplete", published={},
                           reasons=['no result for release(prefill, head): run `nox -s "release(prefill, head)"`'])
    return doc


def _many_releases(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["sweeps"]["admission"]["releases"] = [
        {"version": f"0.{minor}.{patch}.post12", "classification": "fixed" if minor > 6 else "pre-fix",
         "differing": [], "error": None} for minor in range(4, 9) for patch in range(5)]
    doc["sweeps"]["admission"]["first_fixed"] = "0.7.0.post12"
    return doc


def _deviating(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["sweeps"]["prefill"] = sweep_v4()
    return doc


def _partial(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["sweeps"]["prefill"] = sweep_v5()
    return doc


def _present_but_off(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["sweeps"]["prefill"] = sweep_v6()
    return doc


DOCUMENTS = {
    "full": full_document(),
    "a release that deviates": _deviating(full_document()),
    "a partial sweep": _partial(full_document()),
    "a gated fix present but off": _present_but_off(full_document()),
    "bare report dict": report_dict(),
    "not reproduced": _not_reproduced(full_document(), same_as_base=False),
    "head observes base": _not_reproduced({**report_dict(), "scenarios": notes()}, same_as_base=True),
    "incomplete": _incomplete(full_document()),
    "many long release labels": _many_releases(full_document()),
}


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def texts(root: ET.Element) -> list[ET.Element]:
    return list(root.iter(f"{NS}text"))


def rects(root: ET.Element, kind: str) -> list[ET.Element]:
    return [r for r in root.iter(f"{NS}rect") if r.get("class") == kind]


def render(svg: str) -> Image.Image:
    png = cairosvg.svg2png(bytestring=svg.encode("utf-8"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    return Image.open(io.BytesIO(png)).convert("RGB")


def rendered_width(text: str, size: float, bold: bool) -> float:
    """The advance cairo gives the text in the font cairosvg picks (the first of font-family)."""
    ctx = cairocffi.Context(cairocffi.ImageSurface(cairocffi.FORMAT_ARGB32, 1, 1))
    weight = cairocffi.FONT_WEIGHT_BOLD if bold else cairocffi.FONT_WEIGHT_NORMAL
    ctx.select_font_face(pictures.FONT.split(",")[0], cairocffi.FONT_SLANT_NORMAL, weight)
    ctx.set_font_size(size)
    return ctx.text_extents(text)[4]


def text_box(node: ET.Element) -> list[tuple[float, float]]:
    """The corners of a text's ink as cairo renders it (its advance, from a descender to an ascender's top),
    turned as its transform turns it."""
    x, y, size = float(node.get("x")), float(node.get("y")), float(node.get("font-size"))
    width = rendered_width(node.text, size, node.get("font-weight") == "bold")
    left = x - width / 2 if node.get("text-anchor") == "middle" else x
    corners = [(left, y - 0.76 * size), (left + width, y - 0.76 * size), (left + width, y + 0.24 * size),
               (left, y + 0.24 * size)]
    turn = re.fullmatch(r"rotate\((-?[\d.]+) ([\d.]+) ([\d.]+)\)", node.get("transform") or "")
    if not turn:
        return corners
    angle, cx, cy = math.radians(float(turn[1])), float(turn[2]), float(turn[3])
    return [(cx + (px - cx) * math.cos(angle) - (py - cy) * math.sin(angle),
             cy + (px - cx) * math.sin(angle) + (py - cy) * math.cos(angle)) for px, py in corners]


def rect_box(node: ET.Element) -> list[tuple[float, float]]:
    x, y, w, h = (float(node.get(k)) for k in ("x", "y", "width", "height"))
    return [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Two convex boxes overlap by more than half a pixel: no edge of either separates them."""
    for box in (a, b):
        for (x1, y1), (x2, y2) in zip(box, box[1:] + box[:1]):
            nx, ny = y1 - y2, x2 - x1
            norm = math.hypot(nx, ny)
            pa, pb = [[(px * nx + py * ny) / norm for px, py in q] for q in (a, b)]
            if min(max(pa), max(pb)) - max(min(pa), min(pb)) <= 0.5:
                return False
    return True


def published_document() -> dict:
    """The published report enriched from the published tables (results/ only; nothing is written there)."""
    reg = registry.load(Path(__file__).resolve().parents[1])
    doc = json.loads((reg.root / "results" / "report.json").read_text())
    with tempfile.TemporaryDirectory() as runs:
        return report.document(doc, report_inputs.gather(reg, doc, runs=Path(runs), published=reg.root / "results"))


PICTURES = {**DOCUMENTS, "four experiments over 80 releases": many_experiments()}
PUBLISHED = "the published report"


def picture(name: str) -> dict:
    return published_document() if name == PUBLISHED else PICTURES[name]


@pytest.mark.parametrize("name", [*PICTURES, PUBLISHED])
def test_every_svg_renders_at_its_declared_size_with_every_text_inside_the_canvas(name):
    svg = report.svg(picture(name))
    root = parse(svg)
    width, height = int(root.get("width")), int(root.get("height"))
    assert render(svg).size == (width, height)
    for node in texts(root):
        for x, y in text_box(node):
            assert 0 <= x <= width and 0 <= y <= height, (name, node.text, x, y, width, height)


@pytest.mark.parametrize("name", [*PICTURES, PUBLISHED])
def test_no_text_overlaps_another_text_or_a_cell(name):
    root = parse(report.svg(picture(name)))
    boxes = [(node.text, text_box(node)) for node in texts(root)]
    cells = [rect_box(r) for r in rects(root, "cell")]
    for i, (text, box) in enumerate(boxes):
        assert not [other for other, theirs in boxes[i + 1:] if overlap(box, theirs)], (name, text)
        assert not any(overlap(box, cell) for cell in cells), (name, text)


@pytest.mark.parametrize("name", [PUBLISHED, "four experiments over 80 releases"])
def test_the_picture_reads_at_the_readmes_width(name):
    """At most 1,600 px wide and, shown 1,000 px wide as the README shows it, no text under 11 px."""
    doc = picture(name)
    svg = report.svg(doc)
    width = render(svg).size[0]
    smallest = min(float(node.get("font-size")) for node in texts(parse(svg)))
    assert width <= 1600 and smallest * min(1, 1000 / width) >= 11, (width, smallest)
    swept = {r["version"] for sweep in doc["sweeps"].values() for r in sweep["releases"]}
    assert len(swept) >= 70


def test_runs_split_at_each_era_each_change_and_each_first_fixed_release():
    doc = many_experiments()
    strips = [t.strips[0] for t in timeline.timelines(doc)]
    assert len({tuple(col.label for col in strip.columns) for strip in strips}) == 1  # shared by every experiment
    versions = [r["version"] for r in doc["sweeps"]["fix0"]["releases"]]
    for strip in strips:
        assert [v for col in strip.columns for v in col.releases] == versions
        for before, col in zip(strip.columns, strip.columns[1:]):
            assert {doc["eras"][v] for v in col.releases} == {col.era}
            assert col.label == timeline.range_label(col.releases)
            assert before.era != col.era or any(
                before.states != other.columns[strip.columns.index(col)].states
                or before.note != other.columns[strip.columns.index(col)].note for other in strips) \
                or col.releases[0] in {s["first_fixed"] for s in doc["sweeps"].values()}, col.label
        assert strip.columns[strip.first_fixed].releases[0] in {s["first_fixed"] for s in doc["sweeps"].values()}
    assert len(strips[0].columns) < len(versions) / 2


def test_a_run_is_labelled_with_its_range_and_how_many_releases_it_holds():
    labels = {node.text for node in texts(parse(report.svg(published_document())))}
    assert {"0.5.13: head", "0.4.4.post2–0.4.5.post2 (6)", "0.5.15: base", "0.4.4.post1", "0.5.19: base",
            "0.5.22–0.5.23 (2)"} <= labels
    assert {f"first fixed: {v}" for v in ("0.5.13", "0.5.19", "0.5.20", "0.5.21")} <= labels


@pytest.mark.parametrize("name", ["full", "many long release labels", "incomplete"])
def test_the_timeline_shows_every_swept_release_in_a_run_labelled_with_its_range(name):
    doc = DOCUMENTS[name]
    labels = {node.text for node in texts(parse(report.svg(doc)))}
    for t in timeline.timelines(doc):
        if t.experiment in doc["sweeps"]:
            columns = t.strips[0].columns
            swept = [r["version"] for r in doc["sweeps"][t.experiment]["releases"]]
            assert [v for col in columns for v in col.releases if v in swept] == swept
            assert all(any(label.startswith(col.label) for label in labels) for col in columns)


def test_no_module_names_an_experiment_of_the_registry():
    """The harness reads experiments from experiments.toml: no module's code, comment or docstring may know one
    by name. SGLang's own module paths (sglang/srt/disaggregation/prefill.py) are SGLang's words, not the
    registry's."""
    package = Path(__file__).resolve().parents[1] / "pdevidence"
    names = tomllib.loads((package.parent / "experiments.toml").read_text())["experiments"]
    assert names
    found = []
    for module in package.rglob("*.py"):
        source = module.read_text()
        strings = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str)]
        words = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                 if t.type in (tokenize.NAME, tokenize.COMMENT)]
        text = re.sub(r"sglang[\w/.]*", "", " ".join(strings + words))
        found += [f"{module.relative_to(package)}: {name}" for name in names if re.search(rf"\b{name}\b", text)]
    assert not found


def test_compared_trees_are_labelled_in_full_when_there_is_no_sweep():
    labels = {node.text for node in texts(parse(report.svg(report_dict())))}
    assert {"0.5.20: base", "0.5.21: head", "0.5.19: base", "0.5.20: head"} <= labels


@pytest.mark.parametrize("name", DOCUMENTS)
def test_cell_colours_follow_the_legend_in_the_file_and_in_the_rendered_pixels(name):
    svg = report.svg(DOCUMENTS[name])
    root = parse(svg)
    legend = {r.get("data-state"): r.get("fill") for r in rects(root, "legend")}
    assert {s: legend[s] for s in pictures.COLOURS} == pictures.COLOURS
    legend_texts = {node.text.split(":")[0] for node in texts(root)}
    assert set(pictures.COLOURS) <= legend_texts
    image = render(svg)
    cells = rects(root, "cell")
    assert cells
    for cell in cells:
        state, fill = cell.get("data-state"), cell.get("fill")
        assert fill == legend[state]
        x, y = int(cell.get("x")) + int(cell.get("width")) // 2, int(cell.get("y")) + int(cell.get("height")) // 2
        assert "#%02x%02x%02x" % image.getpixel((x, y)) == fill, (name, cell.find(f"{NS}title").text)


def _states(doc: dict) -> dict[str, str]:
    """'<sid> on <tree>' -> state, from the cells' tooltips."""
    out = {}
    for cell in rects(parse(report.svg(doc)), "cell"):
        where, state = cell.find(f"{NS}title").text.rsplit(": ", 1)
        assert cell.get("data-state") == state
        out[where] = state
    return out


def test_cells_say_which_side_each_release_behaves_like():
    states = _states(full_document())
    # Schema 1: every telling cell takes the release's classification; a failed release is an error.
    assert [states[f"A1 on {v}"] for v in ("0.5.20", "0.5.21", "0.5.22", "0.5.23.post1")] == \
        [Behaviour.PRE_FIX, Behaviour.FIXED, Behaviour.ERROR, Behaviour.FIXED]
    assert states["A9 on 0.5.17"] == Behaviour.PRE_FIX and "A3p on 0.5.17" not in states  # controls are not placed
    # Schema 2: per scenario; a release without per-scenario data falls back to its classification.
    assert states["B2 on 0.5.18"] == Behaviour.NEITHER and states["B1 on 0.5.18"] == Behaviour.PRE_FIX
    assert states["B1 on 0.5.21"] == Behaviour.PRE_FIX and states["B2 on 0.5.21"] == Behaviour.FIXED
    assert states["B1 on 0.5.17"] == Behaviour.ERROR


def test_a_head_that_misses_its_expectation_is_coloured_by_what_it_observes():
    assert _states(DOCUMENTS["not reproduced"])["A1 on 0.5.20"] == Behaviour.PRE_FIX  # the sweep decides here
    plain = _not_reproduced(report_dict(), same_as_base=False)
    assert _states(plain)["A1 on 0.5.21"] == Behaviour.NEITHER
    assert _states(DOCUMENTS["head observes base"])["A1 on 0.5.21"] == Behaviour.PRE_FIX
    assert _states(report_dict())["A1 on 0.5.21"] == Behaviour.FIXED


def test_a_release_whose_gated_fix_is_present_but_off_has_its_own_mark_not_fixed():
    """Seen fixed with the gate turned on, exposed with the release's defaults: at a glance it must not look
    fixed, and its mark is in the legend like every other class of the sweep."""
    doc = DOCUMENTS["a gated fix present but off"]
    states = _states(doc)
    assert states["B1 on 0.5.19.post1"] == states["B2 on 0.5.19.post1"] == "present but off"
    assert states["B1 on 0.5.20"] == Behaviour.FIXED  # its default turns the fix on
    root = parse(report.svg(doc))
    legend = {r.get("data-state"): r.get("fill") for r in rects(root, "legend")}
    assert legend["present but off"] not in {legend[Behaviour.FIXED], legend[Behaviour.PRE_FIX]}
    words = [node.text for node in texts(root)]
    assert any(w.startswith("present but off: behaves like the tree with the fix only with its variable turned on")
               for w in words)
    assert "release sweep: present but off (0.5.19.post1): the fix is there, but SGLANG_GATE is off by default, " \
           "so a server run with the" in words


def test_the_published_deferred_releases_present_but_off_are_not_coloured_fixed():
    """0.5.19 and 0.5.20 carry both deferred fixes off by default (the published sweeps say so)."""
    states = _states(published_document())
    for sid in ("D1", "D5", "P1", "X1", "X9"):
        assert [states[f"{sid} on {v}"] for v in ("0.5.19", "0.5.20", "0.5.21")] == \
            ["present but off", "present but off", Behaviour.FIXED]


def test_the_first_fixed_release_is_marked_at_its_column():
    root = parse(report.svg(full_document()))
    markers = rects(root, "first-fixed")
    assert [m.find(f"{NS}title").text for m in markers] == ["first fixed: 0.5.21", "first fixed: 0.5.22"]
    first = next(c for c in rects(root, "cell") if c.find(f"{NS}title").text == "A1 on 0.5.21: fixed")
    assert abs(int(markers[0].get("x")) - int(first.get("x"))) <= 3
    # Without a sweep the compared pair decides: a head still pre-fix on A1 is no first fixed tree.
    unfixed = rects(parse(report.svg(DOCUMENTS["head observes base"])), "first-fixed")
    assert [m.find(f"{NS}title").text for m in unfixed] == ["first fixed: 0.5.20"]


def test_mutants_and_the_prs_tests_are_drawn_as_panels_in_their_legend_colours():
    root = parse(report.svg(full_document()))
    squares = rects(root, "mutant")
    assert [s.get("data-state") for s in squares] == [m["status"] for m in mutations()["mutants"]]
    assert all(s.get("fill") == pictures.MUTANT_COLOURS[s.get("data-state")] for s in squares)
    bars = rects(root, "tests")
    assert {(b.find(f"{NS}title").text, b.get("fill")) for b in bars} == {
        ("base: 1 passed", pictures.TEST_COLOURS["passed"]), ("base: 2 failed", pictures.TEST_COLOURS["failed"]),
        ("base: 3 errors", pictures.TEST_COLOURS["errors"]), ("head: 6 passed", pictures.TEST_COLOURS["passed"])}
    words = " ".join(node.text for node in texts(root))
    assert "the probe kills 2 of 3 applicable (4 declared); not killed: M3 (survived), M4 (not applicable)" in words
    assert "the PR's own tests on git (my-branch)" in words


def test_the_first_screen_holds_every_verdict_tree_and_narrative():
    screen = "\n".join(report.markdown(full_document()).splitlines()[:40])
    assert "### admission: differential confirmed" in screen and "### prefill: differential confirmed" in screen
    assert "**release 0.5.20 → 0.5.21**" in screen and "**release 0.5.19 → 0.5.20**" in screen
    for sid in ("A1", "A9", "B1", "B2"):
        assert f"**{sid}** {TITLES[sid]}" in screen
    assert "enqueued true → false" in screen and "requeued 1 → 0" in screen
    assert "controls unchanged, as expected: A3p" in screen and "controls unchanged, as expected: B9" in screen
    assert "differently after the fix, each as experiments.toml declares;" in screen
    assert "0.5.17–0.5.20 pre-fix, 0.5.21 fixed, 0.5.22 failed, 0.5.23.post1 fixed; first fixed 0.5.21" in screen
    assert "pre-fix again after a fixed release: 0.5.21" in screen
    assert "kv_chunk_sent" not in screen.split("**B1**")[1].split("\n")[0]  # unchanged keys are not told


def test_the_report_names_every_release_the_watch_flags_and_shows_an_erroring_scenario_as_raised():
    doc = full_document()
    doc["sweeps"]["prefill"] = sweep_v3()
    # Loaded, a failed release before the first fixed one is flagged too (/5); the report shows the table as written.
    assert SweepTable.from_doc(sweep_v3(), source="sweep_v3").flagged == ["0.5.17", "0.5.21", "0.5.23"]
    md = report.markdown(doc)
    assert "release watch, not fixed after 0.5.20: 0.5.21 (partial), 0.5.23 (error)" in md
    prefill = next(t for t in timeline.timelines(doc) if t.experiment == "prefill")
    swept = next(col for col in prefill.strips[0].columns if col.label == "0.5.23")
    assert swept.states["B2"] == Behaviour.ERROR


def test_a_partial_sweep_says_partial_in_the_words_and_the_picture_and_names_a_failed_release_before_the_fix():
    doc = DOCUMENTS["a partial sweep"]
    assert SweepTable.from_doc(sweep_v5(), source="sweep_v5").partial == "no part for era torch2.7-tf4"
    for words in (report.markdown(doc), report.terminal(doc)):
        assert "PARTIAL release sweep (no part for era torch2.7-tf4; 8 releases): 0.5.17 failed" in words
        assert "release watch, not probed (the first fixed release may be among them): 0.5.17" in words
    captions = " ".join(node.text for node in texts(parse(report.svg(doc))))
    assert "PARTIAL release sweep (no part for era torch2.7-tf4): 8 releases" in captions
    whole = report.markdown(DOCUMENTS["a release that deviates"])
    assert "PARTIAL" not in whole and "not probed" not in whole


def test_a_release_that_deviates_is_flagged_and_its_control_is_a_row_marked_only_where_it_departs():
    doc = DOCUMENTS["a release that deviates"]
    assert SweepTable.from_doc(sweep_v4(), source="sweep_v4").flagged == ["0.5.17", "0.5.21", "0.5.23", "0.5.24"]
    assert "release watch, not fixed after 0.5.20: 0.5.21 (partial), 0.5.23 (error), 0.5.24 (deviates)" \
        in report.markdown(doc)
    prefill = next(t for t in timeline.timelines(doc) if t.experiment == "prefill")
    assert prefill.rows[-1] == "B9"
    states = _states(doc)
    assert (states["B9 on 0.5.24"], states["B1 on 0.5.24"]) == (Behaviour.DEVIATES, Behaviour.FIXED)
    # Elsewhere the release agrees with both sides on it: no mark; a release that failed is an error in every row.
    assert {where: state for where, state in states.items() if where.startswith("B9 on")} == {
        "B9 on 0.5.24": Behaviour.DEVIATES, "B9 on 0.5.17": Behaviour.ERROR}


def test_the_narrative_is_generated_from_the_data():
    md = report.markdown(DOCUMENTS["not reproduced"])
    line = next(line for line in md.splitlines() if line.startswith("- **A1**"))
    assert "NOT as expected: head enqueued: expected false, observed true" in line
    assert "enqueued" not in line.split(":", 1)[1].split("; NOT")[0]
    assert "### admission: not reproduced" in md
    flat = report.markdown(DOCUMENTS["head observes base"])
    assert "expected to change but unchanged: A1" in flat
    assert "2 scenarios behave differently after the fix; not as declared: A1; 1 control behaves the same." in md
    assert "1 scenario behaves differently after the fix; not as declared: A1;" in flat
    retitled = full_document()
    retitled["scenarios"]["admission"]["A1"]["title"] = "a title the registry never had"
    assert "**A1** a title the registry never had" in report.markdown(retitled)


def test_one_row_per_scenario_with_only_the_keys_that_differ_and_the_full_table_folded():
    md = report.markdown(full_document())
    assert (f"| A1 | {TITLES['A1']} | abort_streamed 0 → 1; door_check absent → present; enqueued true → false; "
            "finished_status - → 400; retired false → true; sender_created true → false | met |") in md
    controls = md.split("Controls (experiments.toml expects no change):")[1]
    assert f"| A3p | {TITLES['A3p']} | unchanged | met |" in controls.split("<details>")[0]
    folded = md.split("<details>")[1].split("</details>")[0]
    assert "| A1 | door_check | absent | present | absent |" in folded
    assert "| A3p | finished_status | - | - | unchanged |" in folded
    failing = report.markdown(DOCUMENTS["not reproduced"])
    assert "NOT met: head enqueued: expected false, observed true |" in failing


def test_the_legend_explains_every_symbol_the_tables_use():
    md = report.markdown(full_document())
    legend = md.split("## Legend")[1]
    for symbol in ("`-`", "`absent`", "`<missing>`", "`a → b`", "`met / NOT met`", "`not declared`"):
        assert symbol in legend
    for state in pictures.COLOURS:
        assert f"picture: {state} |" in legend


def test_the_report_says_which_command_made_it_from_which_files():
    md = report.markdown(full_document())
    assert "Made by `python -m pdevidence compare --kind release` from the 3 files" in md.splitlines()[2]
    assert "- `runs/sweep-admission.json`" in md.split("## Sources")[1]


def test_the_terminal_shows_the_same_summary_compactly():
    out = report.terminal(full_document())
    assert "admission (PR #38935) release 0.5.20 -> 0.5.21: DIFFERENTIAL CONFIRMED" in out
    assert f"A1 {TITLES['A1']}: abort_streamed 0 -> 1" in out
    assert "release sweep (7 releases): 0.5.17-0.5.20 pre-fix" in out
    assert "door_check" not in out and "| scenario |" not in out
    assert out.rstrip().endswith("exit code 0")
    assert len(out.splitlines()) < 25


def test_write_makes_world_readable_files_and_the_same_bytes_every_time(tmp_path):
    old = os.umask(0o077)
    try:
        first = report.write(full_document(), tmp_path / "a")
        second = report.write(full_document(), tmp_path / "b")
    finally:
        os.umask(old)
    assert [p.name for p in first] == ["report.json", "report.md", "report.svg"]
    for a, b in zip(first, second):
        assert a.stat().st_mode & 0o777 == 0o644
        assert a.read_bytes() == b.read_bytes()
    assert json.loads(first[0].read_text())["sweeps"]["prefill"]["schema"] == "pdevidence-sweep/2"
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project")
    for side in ("base", "head"):
        write_cell(root / "runs", side)
        write_cell(root / "results", side)
    return root


def bless(project):
    """Sums over whatever is there (old tables have no provenance, so `checksums` refuses them)."""
    (project / integrity.SUMS_FILE).write_text(integrity.render(project))


def _table(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_gather_reads_fresh_tables_before_published_ones_and_titles_from_the_results(project):
    sweep = {**sweep_v1(), "experiment": "demo"}
    _table(project / "results" / "sweep-demo.json", {**sweep, "as_of": "2026-01-01T00:00:00Z"})
    _table(project / "results" / "mutate.demo.json", {**mutations(), "experiment": "demo"})
    bless(project)  # published tables are always under the sums
    data = {"pairs": [{"experiment": "demo", "cells": {"base": {"file": "demo.base.release-1.0.0.json"},
                                                       "head": {"file": "demo.head.release-1.1.0.json"}}}],
            "upstream": []}
    reg = registry.load(project)
    found = report_inputs.gather(reg, data, runs=project / "runs", published=project / "results")
    assert found.sweeps["demo"].get("as_of") == "2026-01-01T00:00:00Z" and "demo" in found.mutations
    _table(project / "runs" / "sweep-demo.json", sweep)
    found = report_inputs.gather(reg, data, runs=project / "runs", published=project / "results")
    assert found.sweeps["demo"].get("as_of") is None
    assert found.scenarios["demo"]["D1"] == {"title": "D1", "changes": True, "keys": ["enqueued", "retired"]}
    assert found.scenarios["demo"]["D2"]["changes"] is False
    assert found.sources == ["experiments.toml", "results/mutate.demo.json", "runs/demo.base.release-1.0.0.json",
                             "runs/demo.head.release-1.1.0.json", "runs/sweep-demo.json"]
    _table(project / "runs" / "sweep-demo.json", {"schema": "pdevidence-sweep/9", "experiment": "demo"})
    with pytest.raises(errors.HarnessError, match="sweep-demo.json is not a sweep table"):
        report_inputs.gather(reg, data, runs=project / "runs", published=project / "results")


@pytest.mark.parametrize("content", ["flipped", "valid JSON, not a sweep"])
def test_a_published_table_that_fails_its_sums_is_an_integrity_failure_naming_it(project, capsys, content):
    table = project / "results" / "sweep-demo.json"
    _table(table, {**sweep_v1(), "experiment": "demo"})
    bless(project)
    if content == "flipped":  # no longer parses
        data = bytearray(table.read_bytes())
        data[0] ^= 0x20
        table.write_bytes(bytes(data))
    else:
        table.write_text('{"first_fixed": "9.9.9"}\n')

    assert cli.main(["--root", str(project), "compare"]) == errors.INTEGRITY
    assert "published table results/sweep-demo.json fails verification" in capsys.readouterr().err


def test_a_published_table_its_sums_vouch_for_but_not_its_loader_is_an_integrity_failure(project):
    _table(project / "results" / "mutate.demo.json", {"schema": "pdevidence-mutate/1"})
    bless(project)  # `checksums` would refuse: the sums vouch for it only by hand
    data = {"pairs": [{"experiment": "demo", "cells": {}}], "upstream": []}
    with pytest.raises(errors.HarnessError, match="results/mutate.demo.json fails verification: .*not a mutation table") as err:
        report_inputs.gather(registry.load(project), data, runs=project / "runs", published=project / "results")
    assert err.value.code == errors.INTEGRITY


def test_the_compare_command_writes_the_enriched_report(project, capsys):
    _table(project / "runs" / "sweep-demo.json", {**sweep_v1(), "experiment": "demo",
                                                   "releases": [{"version": "1.0.0", "classification": "pre-fix"},
                                                                {"version": "1.1.0", "classification": "fixed"}],
                                                   "first_fixed": "1.1.0"})
    from pdevidence.documents import integrity
    integrity.regenerate(project)
    assert cli.main(["--root", str(project), "compare"]) == errors.CONFIRMED
    assert "release sweep (2 releases): 1.0.0 pre-fix, 1.1.0 fixed; first fixed 1.1.0" in capsys.readouterr().out
    written = sorted(project.glob("*/report.*"))
    assert [p.name for p in written] == ["report.json", "report.md", "report.svg"]
    md = written[1].read_text()
    assert "Made by `python -m pdevidence compare --kind release`" in md
    assert "- **D1** D1: enqueued true → false, retired false → true" in md
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in written)
    render(written[2].read_text())


def test_upstream_sides_whose_subtests_failed_show_pytests_own_counts():
    side = {"totals": {"passed": 1, "total": 1}, "types": {"KeyError": 1},
            "subtest_totals": {"passed": 2, "failed": 1, "total": 3},
            "pytest_summary": {"failed": 1, "passed": 1, "subtests passed": 2}}
    assert narrative.totals(side) == "1/1 passed (pytest: 1 failed, 1 passed, 2 subtests passed) (1 KeyError)"
    assert narrative.totals({**side, "subtest_totals": {"total": 0}}) == "1/1 passed (1 KeyError)"


def test_the_sweep_line_names_each_rule_that_set_keys_aside_and_where_it_held():
    from pdevidence.report.narrative import sweep_text

    def entry(version, *rules):
        found = {"version": version, "classification": "pre-fix"}
        return {**found, "not_deciding": [f"{rule}: why" for rule in rules]} if rules else found
    sweep = {"releases": [entry("0.1", "old_intake"), entry("0.2", "old_intake", "retries"), entry("0.3"),
                          entry("0.4", "retries")], "first_fixed": None}
    assert sweep_text(sweep, dash="-").endswith(
        "; judged without the keys a registry rule sets aside: old_intake (0.1-0.2), retries (0.2, 0.4)")
    del sweep["releases"][0]["not_deciding"], sweep["releases"][1]["not_deciding"], sweep["releases"][3]["not_deciding"]
    assert "judged without" not in sweep_text(sweep)


def _control_grid(**moved: tuple) -> dict:
    """One control scenario C whose keys ``moved`` differ (base, head) beside ``held``, which both sides agree on."""
    keys = {"held": {"base": 1, "head": 1, "status": "unchanged"}}
    keys.update({key: {"base": b, "head": h, "status": "changed"} for key, (b, h) in moved.items()})
    return {"grid": {"C": {"status": "changed", "present": {"base": True, "head": True},
                           "errors": {"base": None, "head": None}, "keys": keys}},
            "expectation_failures": []}


def test_a_control_whose_other_keys_differ_as_the_registry_declares_is_held_and_says_why():
    notes = {"C": {"title": None, "changes": False, "keys": ["held"],
                   "beside": {"keys": ["gate_default_on"], "why": "a fact of the tree"}}}
    told = narrative.story(_control_grid(gate_default_on=(None, False)), notes)
    assert (told.controls_held, told.changes) == (["C"], [])
    assert told.beside == [("C", ["gate_default_on"], "a fact of the tree")]
    assert "each as experiments.toml declares" in narrative.overview(told)
    # A key the registry did not declare beside it is still a control that changed: not as declared.
    undeclared = narrative.story(_control_grid(gate_default_on=(None, False), freed=(0, 8)), notes)
    assert [c.sid for c in undeclared.changes] == ["C"] and "not as declared: C" in narrative.overview(undeclared)
