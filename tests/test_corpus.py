"""The backport corpus: declared edits applied to a pristine release, each tree checked by check's judge.

The release is a tiny "sglang" served by a local index with two doors, both open; its backport
closes both (full) or only the first (partial). The warm engine runs with this interpreter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version
from synthetic import TWO_DOORS, make_project, result_doc, serve_index, wheel_bytes, with_real_probes, write_cell
from test_engine import PROBE_HEAD

from pdevidence import cli, environments, registry
from pdevidence.core import errors
from pdevidence.core.errors import HarnessError
from pdevidence.documents import integrity
from pdevidence.documents.vocabulary import CheckStatus
from pdevidence.lanes import corpus as corpus_lane
from pdevidence.registry import TorchChannel
from pdevidence.sources import backports
from pdevidence.sources.backports import Variant

ROOT = Path(__file__).resolve().parent.parent

PROBE = PROBE_HEAD + """
@SET.scenario("D1", "the prefill door")
def d1(observed):
    import sglang
    observed["enqueued"] = not sglang.PREFILL_GUARD
    observed["retired"] = sglang.PREFILL_GUARD

@SET.scenario("D2", "a valid request")
def d2(observed):
    observed["enqueued"] = True

@SET.scenario("D3", "the decode door")
def d3(observed):
    import sglang
    observed["receiver_created"] = not sglang.DECODE_GUARD
"""
PRISTINE = "__version__ = '1.0.0'\nPREFILL_GUARD = False\nDECODE_GUARD = False\n"
BACKPORT = """
release = "1.0.0"

[demo]
partial = ["decode_door"]
partial_why = "the decode door left open"

[[demo.edits]]
id = "prefill_door"
file = "sglang/__init__.py"
old = "PREFILL_GUARD = False"
new = "PREFILL_GUARD = True"
why = "the prefill door asks the predicate"

[[demo.edits]]
id = "decode_door"
file = "sglang/__init__.py"
old = "DECODE_GUARD = False"
new = "DECODE_GUARD = True"
why = "the decode door asks the predicate"
"""
OBSERVED = {"base": {"D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True},
                     "D3": {"receiver_created": True}},
            "head": {"D1": {"enqueued": False, "retired": True}, "D2": {"enqueued": True},
                     "D3": {"receiver_created": False}}}


@pytest.fixture
def world(tmp_path, http_server, monkeypatch):
    root = with_real_probes(make_project(tmp_path / "project", TWO_DOORS), PROBE)
    (root / "backports").mkdir()
    (root / "backports" / "sglang-1.0.0.toml").write_text(BACKPORT)
    for side, version in (("base", "1.0.0"), ("head", "1.1.0")):
        write_cell(root / "results", side, result_doc(side, version, OBSERVED[side]))
    integrity.regenerate(root)
    index = serve_index(http_server, {"sglang-1.0.0-py3-none-any.whl": wheel_bytes("1.0.0", PRISTINE)})
    for name, value in {"PDEVIDENCE_WORK": tmp_path / "work", "PDEVIDENCE_RUNS": tmp_path / "runs",
                        "PDEVIDENCE_CACHE": tmp_path / "cache", "PDEVIDENCE_INDEX_URL": index}.items():
        monkeypatch.setenv(name, str(value))
    env = SimpleNamespace(interpreter=Path(sys.executable), path=tmp_path / "closure-env",
                          torch=SimpleNamespace(channel=TorchChannel.PYPI))
    monkeypatch.setattr(environments, "closure_environment", lambda reg, era=None, log=None: env)
    monkeypatch.setattr(environments, "find_python",
                        lambda v: SimpleNamespace(identity=lambda: "cpython-3.12.1", path=sys.executable))
    return SimpleNamespace(root=root, tmp=tmp_path)


def corpus(world, capsys) -> tuple[int, str, dict]:
    code = cli.main(["--root", str(world.root), "corpus"])
    out = capsys.readouterr().out
    return code, out, json.loads((world.tmp / "runs" / "corpus.json").read_text())


def test_pristine_backport_and_partial_trees_read_affected_fixed_and_partial(world, capsys):
    code, out, doc = corpus(world, capsys)
    assert code == errors.CONFIRMED, out
    assert [(a["variant"], a["status"], a["expected"]) for a in doc["answers"]] == [
        ("pristine", "affected", "affected"), ("backport", "fixed", "fixed"), ("partial", "partial", "partial")]
    assert "corpus: 3 of 3 answers as expected" in out
    pristine = world.tmp / "work" / "trees"
    assert all("PREFILL_GUARD = False" in p.read_text() for p in pristine.glob("*/sglang/__init__.py"))


def test_an_answer_that_is_not_the_expected_one_fails_and_shows_that_trees_check(world, capsys):
    path = world.root / "backports" / "sglang-1.0.0.toml"
    path.write_text(path.read_text().replace('new = "DECODE_GUARD = True"', 'new = "DECODE_GUARD = False  # "'))
    code, out, doc = corpus(world, capsys)
    assert code == errors.BEHAVIOUR_DIFFERS
    assert [a["status"] for a in doc["answers"]] == ["affected", "partial", "partial"]
    assert "partial (expected fixed)" in out and "1.0.0 backport:" in out and "pre-fix: D3" in out


def test_an_edit_whose_old_text_is_not_in_the_tree_is_a_usage_error_naming_it(world, capsys):
    path = world.root / "backports" / "sglang-1.0.0.toml"
    path.write_text(path.read_text().replace('old = "DECODE_GUARD = False"', 'old = "DECODE_GUARD = None"'))
    assert cli.main(["--root", str(world.root), "corpus"]) == errors.USAGE
    err = capsys.readouterr().err
    assert "sglang-1.0.0.toml: edit 'decode_door': its old text occurs 0 times in sglang/__init__.py" in err


@pytest.mark.parametrize("change, message", [
    ('partial = ["decode_door"]', "demo.partial: nowhere: it must name"),
    ('id = "decode_door"', "demo.edits: ids repeat: prefill_door"),
    ('file = "sglang/__init__.py"', "must be a path inside the unpacked wheel"),
    ('release = "1.0.0"', "is not the release the file name says"),
])
def test_a_malformed_backport_file_is_refused_naming_the_entry(tmp_path, change, message):
    fixes = {'partial = ["decode_door"]': 'partial = ["nowhere"]',
             'id = "decode_door"': 'id = "prefill_door"',
             'file = "sglang/__init__.py"': 'file = "../sglang/__init__.py"',
             'release = "1.0.0"': 'release = "1.0.1"'}
    path = tmp_path / "sglang-1.0.0.toml"
    path.write_text(BACKPORT.replace(change, fixes[change], 1))
    with pytest.raises(errors.HarnessError) as caught:
        backports.load(path, ["demo"])
    assert message in caught.value.what


WHOLE = BACKPORT.replace('partial = ["decode_door"]\npartial_why = "the decode door left open"',
                         'partial = []\npartial_why = "one clause: the two doors ask one predicate"')


def test_a_fix_of_one_clause_declares_no_partial_port_and_its_partial_tree_carries_the_whole_port(tmp_path):
    path = tmp_path / "sglang-1.0.0.toml"
    path.write_text(WHOLE)
    backport = backports.load(path, ["demo"])
    port = backport.ports["demo"]
    assert port.partial == () and not port.has_partial and port.partial_why.startswith("one clause")
    assert backport.edits(Variant.PARTIAL) == backport.edits(Variant.BACKPORT) == port.edits
    assert [corpus_lane.expected(backport, "demo", v, {}) for v in Variant] == \
        [CheckStatus.AFFECTED, CheckStatus.FIXED, CheckStatus.FIXED]


@pytest.mark.parametrize(("why", "said"), [(None, "missing"), ('""', "empty"), ('"  "', "empty")])
def test_no_partial_port_must_say_why(tmp_path, why, said):
    """partial = [] is a claim (the fix is one clause: no partial port exists); partial_why must make it."""
    text = WHOLE.replace('partial_why = "one clause: the two doors ask one predicate"\n',
                         "" if why is None else f"partial_why = {why}\n")
    path = tmp_path / "sglang-1.0.0.toml"
    path.write_text(text)
    with pytest.raises(errors.HarnessError) as caught:
        backports.load(path, ["demo"])
    assert f"demo.partial_why: {said}: partial = [] declares that no partial port exists: it must say why" \
        in caught.value.what


def test_a_partial_port_must_say_what_it_leaves_undone(tmp_path):
    path = tmp_path / "sglang-1.0.0.toml"
    path.write_text(BACKPORT.replace('partial_why = "the decode door left open"', 'partial_why = ""'))
    with pytest.raises(errors.HarnessError, match="demo.partial_why: empty: it must say what the partial port "
                                                  "leaves undone \\(without decode_door\\)"):
        backports.load(path, ["demo"])


def test_a_port_of_no_edits_is_refused(tmp_path):
    path = tmp_path / "sglang-1.0.0.toml"
    path.write_text('release = "1.0.0"\n[demo]\nedits = []\npartial = []\npartial_why = "one clause"\n')
    with pytest.raises(errors.HarnessError, match="demo.edits: empty: a port is one or more edits"):
        backports.load(path, ["demo"])


def test_the_partial_tree_of_a_fix_with_no_partial_port_reads_fixed_and_the_table_says_why(world, capsys):
    (world.root / "backports" / "sglang-1.0.0.toml").write_text(WHOLE)
    code, out, doc = corpus(world, capsys)
    assert code == errors.CONFIRMED, out
    assert [(a["variant"], a["status"], a["expected"]) for a in doc["answers"]] == [
        ("pristine", "affected", "affected"), ("backport", "fixed", "fixed"), ("partial", "fixed", "fixed")]
    assert "fixed (no partial port)" in out and "corpus: 3 of 3 answers as expected" in out


def test_the_table_records_what_made_it_loads_and_meets_its_schema(world, capsys):
    from schemas import problems

    from pdevidence.documents.corpus_table import CorpusTable

    _, _, doc = corpus(world, capsys)
    assert problems("corpus", doc) == []
    table = CorpusTable.load(world.tmp / "runs" / "corpus.json")
    assert table.backports == ["backports/sglang-1.0.0.toml"] and table.as_expected
    assert set(table.references) == {"demo.base.release-1.0.0.json", "demo.head.release-1.1.0.json"}
    assert table.stale(world.root, ["probes/probe_demo.py"]) == []
    path = world.root / "backports" / "sglang-1.0.0.toml"
    path.write_text(path.read_text() + "\n# an edited backport is another corpus\n")
    assert [why.split(":")[0] for why in table.stale(world.root, ["probes/probe_demo.py"])] == [
        "backports/sglang-1.0.0.toml"]
    with pytest.raises(errors.HarnessError, match="is not a corpus table: answer"):
        CorpusTable.from_doc({**doc, "answers": [{**doc["answers"][0], "status": "fine"}]}, source="t.json")


def test_publish_takes_only_a_whole_current_corpus(world, capsys):
    from pdevidence import registry
    from pdevidence.publish import publish

    _, _, doc = corpus(world, capsys)
    reg = registry.load(world.root)
    assert "corpus.json" in [d.name for d in publish.manifest(reg, "release")]
    path = world.tmp / "runs" / "corpus.json"
    publish._check_corpus(reg, path)
    path.write_text(json.dumps({**doc, "answers": doc["answers"][:2]}))
    with pytest.raises(errors.HarnessError, match="a partial corpus \\(no answer for 1.0.0 demo partial\\)") as caught:
        publish._check_corpus(reg, path)
    assert caught.value.code == errors.INCOMPLETE
    path.write_text(json.dumps(doc))
    (world.root / "experiments.toml").write_text((world.root / "experiments.toml").read_text() + "\n")
    with pytest.raises(errors.HarnessError, match="experiments.toml: made by another registry") as caught:
        publish._check_corpus(reg, path)
    assert caught.value.code == errors.STALE


def test_the_report_shows_each_release_and_fix_across_the_three_trees(world, capsys):
    from pdevidence.report import report

    _, _, doc = corpus(world, capsys)
    doc["answers"][2] = {**doc["answers"][2], "status": "fixed"}
    text = report.markdown({"schema": "pdevidence-report/1", "exit_code": 0, "pairs": [], "corpus": doc})
    assert "## The backport corpus" in text and "2 of 3 answers are the expected ones" in text
    assert "| 1.0.0 | current | demo | affected | fixed | **fixed** (expected partial) |" in text


def test_the_declared_backports_come_oldest_release_first():
    releases = [b.release for b in backports.load_all(ROOT, list(registry.load(ROOT).experiments))]
    assert releases[:3] == ["0.4.5", "0.4.6", "0.4.10"]
    assert releases == sorted(releases, key=Version)


def a_port_moving(other: str, backport: str, partial: str) -> backports.Backport:
    edit = backports.Edit("e", "sglang/__init__.py", "A", "B", "why")
    port = backports.FixPort("demo", (edit,), ("e",), "why", {other: backports.Move(backport, partial, "reachable")})
    return backports.Backport("1.0.0", {"demo": port}, Path("sglang-1.0.0.toml"))


def test_a_port_that_makes_another_fixs_bug_reachable_moves_that_answer_as_it_declares():
    """Porting one fix leaves another's answer as the sweep has it, unless the port says it moves it, and why."""
    moving = a_port_moving("other", "affected", "unknown")
    unported = {"other": {"1.0.0": CheckStatus.NOT_AFFECTED}}

    assert [corpus_lane.expected(moving, "other", v, unported) for v in Variant] == \
        [CheckStatus.NOT_AFFECTED, CheckStatus.AFFECTED, CheckStatus.UNKNOWN]
    assert corpus_lane.expected(moving, "demo", Variant.BACKPORT, unported) is CheckStatus.FIXED


@pytest.mark.parametrize(("other", "status", "named"), [("demo", "fixed", "'demo' is not an experiment"),
                                                          ("other", "mended", "mended is not a check status")])
def test_a_move_names_an_unported_experiment_and_a_check_status(other, status, named):
    with pytest.raises(HarnessError, match=named):
        corpus_lane._check_moves(a_port_moving(other, status, "fixed"), ["demo", "other"])


def test_the_corpus_checks_every_tree_with_every_gate_on_so_a_gated_port_reads_as_its_code():
    project = registry.load(Path(__file__).resolve().parents[1])
    gated = {exp.gate.variable: exp.gate.on for exp in project.experiments.values() if exp.gate is not None}
    assert gated, "the project registry declares a gated fix"
    env = corpus_lane.gates_on(project)
    assert env.values() == gated and env.source == corpus_lane.GATES_ON
    ungated = SimpleNamespace(experiments={name: SimpleNamespace(gate=None) for name in project.experiments})
    assert corpus_lane.gates_on(ungated) is None
    # With the gate on, a release the sweep finds present but off reads as its code does: fixed.
    assert corpus_lane.AS_CLASSIFIED[corpus_lane.Classification.PRESENT_OFF] is CheckStatus.FIXED
