"""Release sweep classification and the drift lane's pin handling, on synthetic data."""

from __future__ import annotations

import json

import pytest
from synthetic import result_doc

from pdevidence.core.errors import RELEASE_WATCH, HarnessError
from pdevidence.documents import provenance
from pdevidence.documents.observations import Values
from pdevidence.documents.tables import SweepParameters, SweepTable
from pdevidence.judge import classify
from pdevidence.lanes import drift, sweep

C, B = sweep.Classification, sweep.Behaviour


def test_a_release_after_the_first_fixed_one_that_behaves_as_pre_fix_is_a_regression():
    outcomes = [sweep.ReleaseOutcome(v, c) for v, c in [
        ("0.1", C.PRE_FIX), ("0.2", C.FIXED), ("0.3", C.PRE_FIX), ("0.4", C.FIXED),
        ("0.5", C.FAILED), ("0.6", C.PARTIAL), ("0.7", C.NEITHER)]]
    assert sweep.first_fixed(outcomes) == "0.2"
    assert sweep.regressions(outcomes) == ["0.3", "0.6"]
    text = sweep.table("demo", outcomes, {"head": "0.2"})
    assert "0.3          pre-fix  REGRESSION" in text and "regressions: 0.3, 0.6" in text
    assert "0.4          fixed\n" in text
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    parameters = SweepParameters(explicit=False, pre=False, floor="0.1", references={})
    doc = sweep.document("demo", outcomes, "2026-10-01T00:00:00Z", made, parameters)
    assert (doc["schema"], doc["first_fixed"], doc["regressions"]) == ("pdevidence-sweep/7", "0.2", ["0.3", "0.6"])
    assert SweepTable.from_doc(doc, source="test").doc is doc
    assert sweep.first_fixed(outcomes[:1]) is None and sweep.regressions(outcomes[:1]) == []


def test_every_release_after_the_first_fixed_one_that_is_not_fixed_is_flagged_whatever_it_is():
    before = [sweep.ReleaseOutcome("0.1", C.ERROR), sweep.ReleaseOutcome("0.2", C.FAILED),
              sweep.ReleaseOutcome("0.3", C.FIXED), sweep.ReleaseOutcome("0.4", C.FIXED)]
    after = [sweep.ReleaseOutcome(v, c) for v, c in [
        ("0.5", C.PRE_FIX), ("0.6", C.PARTIAL), ("0.7", C.NEITHER), ("0.8", C.ERROR), ("0.9", C.FAILED)]]
    after.append(sweep.ReleaseOutcome("0.10", C.DEVIATES, {"D1": B.FIXED, "D2": B.DEVIATES}, ["D2"],
                                      deviations={"D2": {"enqueued": Values(False, True, True)}}))
    assert sweep.flagged(before) == ["0.2"]  # an error before the fix landed is not the watch's business; see below
    assert sweep.flagged(before + after) == ["0.2", "0.5", "0.6", "0.7", "0.8", "0.9", "0.10"]
    assert sweep.regressions(before + after) == ["0.5", "0.6"]  # an over-broad fix is not the fix gone
    text = sweep.table("demo", before + after, {"head": "0.3"})
    assert "0.8          error  WATCH: not fixed after a fixed release" in text
    assert "0.10         deviates (departs from both sides on D2: enqueued false (base true, head true))  WATCH" \
           in text
    assert "release watch: not fixed after 0.3: 0.5 (pre-fix), 0.6 (partial), 0.7 (neither), 0.8 (error), " \
           "0.9 (failed), 0.10 (deviates)" in text
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    parameters = SweepParameters(explicit=False, pre=False, floor="0.1", references={})
    doc = sweep.document("demo", before + after, None, made, parameters)
    assert doc["flagged"] == ["0.2", "0.5", "0.6", "0.7", "0.8", "0.9", "0.10"]
    assert doc["releases"][-1]["deviations"] == {"D2": {"enqueued": {"tree": False, "base": True, "head": True}}}
    assert SweepTable.from_doc(doc, source="test").releases[-1] == after[-1]  # read back as written


@pytest.mark.parametrize("fixed", [True, False], ids=["before-the-first-fixed", "none-fixed"])
def test_a_release_that_failed_before_the_first_fixed_one_is_flagged_it_may_hide_the_real_bracket(fixed):
    outcomes = [sweep.ReleaseOutcome("0.1", C.PRE_FIX), sweep.ReleaseOutcome("0.2", C.FAILED, error="no wheel"),
                sweep.ReleaseOutcome("0.3", C.FIXED if fixed else C.PRE_FIX)]
    assert sweep.flagged(outcomes) == ["0.2"] and sweep.regressions(outcomes) == []
    assert classify.watch_exit(outcomes) == RELEASE_WATCH
    text = sweep.table("demo", outcomes, {"head": "0.3"})
    assert "0.2          failed (no wheel)  WATCH: not probed, it may be the first fixed release" in text
    assert "release watch: not probed (the first fixed release may be among them): 0.2" in text
    assert "not fixed after" not in text


def test_a_table_of_schema_4_loads_whole_and_flags_its_failed_release_by_the_new_rule():
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    parameters = SweepParameters(explicit=False, pre=False, floor="0.1", references={})
    outcomes = [sweep.ReleaseOutcome("0.1", C.FAILED), sweep.ReleaseOutcome("0.2", C.FIXED)]
    doc = sweep.document("demo", outcomes, None, made, parameters)
    doc.update(schema="pdevidence-sweep/4", flagged=[])  # as /4 wrote it: no watch before the first fixed
    del doc["parameters"]["missing_eras"]
    table = SweepTable.from_doc(doc, source="v4.json")
    assert (table.flagged, table.parameters.missing_eras, table.partial) == (["0.1"], (), None)
    assert table.doc is doc and doc["flagged"] == []  # the document as written is left alone


def test_a_partial_sweep_says_so_above_its_releases():
    outcomes = [sweep.ReleaseOutcome("0.1", C.PRE_FIX), sweep.ReleaseOutcome("0.3", C.FIXED)]
    parameters = SweepParameters(explicit=False, pre=False, floor="0.1", references={}, missing_eras=("old",))
    assert sweep.table("demo", outcomes, {}, parameters).splitlines()[1] == \
        "  PARTIAL SWEEP (no part for era old): not every release; publish refuses it"
    whole = SweepParameters(explicit=False, pre=False, floor="0.1", references={})
    assert "PARTIAL" not in sweep.table("demo", outcomes, {}, whole)


def test_a_partial_release_names_what_raised_and_matched_neither_beside_its_pre_fix_scenarios():
    o = sweep.ReleaseOutcome("0.6", C.PARTIAL, {"D1": B.FIXED, "D2": B.PRE_FIX, "D3": B.NEITHER, "D4": B.ERROR},
                             ["D3", "D4"], "D4: KeyError: 'kv'")
    assert sweep.detail(o) == " (raised: D4: KeyError: 'kv'; pre-fix: D2; neither: D3)"


@pytest.mark.parametrize("kind", [C.PRE_FIX, C.PARTIAL, C.NEITHER, C.ERROR, C.FAILED, C.DEVIATES])
def test_the_sweep_command_exits_9_naming_a_release_that_is_not_fixed_after_the_first_fixed_one(
        kind, tmp_path, monkeypatch, capsys):
    from synthetic import make_project

    from pdevidence import cli
    from pdevidence.core import errors

    project = make_project(tmp_path / "project")
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    outcomes = [sweep.ReleaseOutcome("1.0.0", C.PRE_FIX), sweep.ReleaseOutcome("1.1.0", C.FIXED),
                sweep.ReleaseOutcome("1.2.0", kind, {"D1": sweep.Behaviour.PRE_FIX})]
    refs = {"demo": sweep.References({}, {"demo.base.release-1.0.0.json": "a" * 64})}
    monkeypatch.setattr(sweep, "sweep", lambda reg, names, **kw: ({"demo": outcomes}, "2026-10-01T00:00:00Z", refs))
    assert cli.main(["--root", str(project), "sweep", "1.0.0", "1.1.0", "1.2.0"]) == errors.RELEASE_WATCH == 9
    assert f"release watch: not fixed after 1.1.0: 1.2.0 ({kind.value})" in capsys.readouterr().out
    written = json.loads((tmp_path / "runs" / "sweep-demo.json").read_text())
    assert written["flagged"] == ["1.2.0"] and written["as_of"] == "2026-10-01T00:00:00Z"
    assert written["regressions"] == (["1.2.0"] if kind in (C.PRE_FIX, C.PARTIAL) else [])
    assert written["parameters"] == {"explicit": True, "pre": False, "floor": "1.0.0",
                                     "references": {"demo.base.release-1.0.0.json": "a" * 64}, "missing_eras": []}
    assert SweepTable.load(tmp_path / "runs" / "sweep-demo.json").stale(project, "probes/probe_demo.py") == []
    monkeypatch.setattr(sweep, "sweep", lambda reg, names, **kw: ({"demo": outcomes[:2]}, None, refs))
    assert cli.main(["--root", str(project), "sweep"]) == errors.CONFIRMED
    monkeypatch.setattr(sweep, "sweep", lambda reg, names, **kw: ({"demo": outcomes[:1]}, None, refs))
    assert cli.main(["--root", str(project), "sweep"]) == errors.BEHAVIOUR_DIFFERS  # no fixed release at all


def test_a_sweep_table_of_another_schema_is_refused():
    listed = {"experiment": "demo", "first_fixed": "1", "regressions": [], "flagged": []}
    for doc in ({"schema": "pdevidence-sweep/9", "experiment": "demo", "releases": [], "regressions": []},
                {"schema": "pdevidence-sweep/2", "experiment": "demo", "regressions": [],
                 "releases": [{"version": "1", "classification": "ok"}]},
                # a table whose watch list hides a release that is not fixed
                {**listed, "schema": "pdevidence-sweep/3", "releases": [
                    {"version": "1", "classification": "fixed"}, {"version": "2", "classification": "error"}]}):
        with pytest.raises(HarnessError, match="sweep table"):
            SweepTable.from_doc(doc, source="t.json")


def test_releases_come_from_wheels_for_this_python_from_the_floor_up_post_releases_included(monkeypatch):
    monkeypatch.setattr(sweep.trees.tags, "platform_tags", lambda: iter(["manylinux_2_34_x86_64", "linux_x86_64"]))
    files = [{"filename": f, "upload-time": f"2026-0{i}-01T00:00:00.000000Z"} for i, f in enumerate((
        "sglang-0.5.9-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.15.post1-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.16rc0-py3-none-any.whl",
        "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.17-cp312-cp312-manylinux_2_34_aarch64.whl",
        "sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl",
        "sglang-0.5.20-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.19.tar.gz",
        "sglang_router-0.5.22-cp312-cp312-manylinux_2_34_x86_64.whl",
    ), 1)] + [{"filename": "sglang-0.5.21-cp312-cp312-manylinux_2_34_x86_64.whl", "yanked": "broken"}]
    assert sweep.releases(files, "3.12", "0.5.10") == ["0.5.15.post1", "0.5.17", "0.5.20"]
    assert sweep.releases(files, "3.12", "0.5.10", pre=True) == ["0.5.15.post1", "0.5.16rc0", "0.5.17", "0.5.20"]
    # The date a table speaks for: when the newest probed release was uploaded.
    assert sweep.as_of(files, ["0.5.17", "0.5.20"]) == "2026-07-01T00:00:00.000000Z"
    assert sweep.as_of(files, ["0.5.99"]) is None


def test_drift_repins_only_the_named_packages():
    source = "# header\ntorch==2.14.1\ntorchvision==0.29.1\ntransformers==5.12.1\nnumpy\n"
    moved = drift.drift_inputs(source, {"torch": drift.LATEST, "torchvision": drift.LATEST,
                                        "transformers": "5.19.0"})
    assert moved == "# header\ntorch\ntorchvision\ntransformers==5.19.0\nnumpy\n"


def published_head(root):
    """A synthetic project whose head result is published: in results/ and in SHA256SUMS.txt."""
    from synthetic import make_project, write_cell

    from pdevidence.documents import integrity

    project = make_project(root)
    write_cell(project / "results", "head")
    (project / integrity.SUMS_FILE).write_text(integrity.render(project))
    return project


def test_an_sglang_that_no_longer_imports_is_the_drift_finding_not_a_crash(tmp_path, monkeypatch):
    from pdevidence import registry
    from pdevidence.cells import cells
    from pdevidence.core import errors

    project = published_head(tmp_path)
    reg = registry.load(project)

    def compile_(reg_, pins, dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("torch==9.0.0 \\\n    --hash=sha256:00\ntransformers==9.1.0\n")
        return dest

    def broken_cell(*args, **kwargs):
        raise errors.HarnessError("probe cannot run: ValueError: 'qwen3_asr' is already used")

    monkeypatch.setattr(drift, "compile_constraints", compile_)
    monkeypatch.setattr(cells, "run_cell", broken_cell)
    found = drift.run(reg, "demo", "head", {"torch": drift.LATEST}, published=project / "results",
                      work=tmp_path / "work")
    assert found.status == "cannot run"
    assert "qwen3_asr" in found.error
    assert found.packages == {"torch": "9.0.0", "transformers": "9.1.0"}
    assert "cannot run (advisory)" in drift.summary(found)


def test_the_weekly_sweep_job_fails_the_run_on_a_regression():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    from pathlib import Path

    doc = yaml.safe_load((Path(__file__).resolve().parent.parent / ".github/workflows/probes.yml").read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["schedule"]
    assert "schedule" in doc["jobs"]["sweep-list"]["if"]  # the era jobs and the merge follow it
    step = next(s for s in doc["jobs"]["sweep"]["steps"] if s.get("run") == "nox -s sweep_merge")
    assert not step.get("continue-on-error")  # the watch's exit code must fail the run


def test_a_sweep_of_something_that_is_not_a_version_is_a_usage_error(tmp_path, capsys):
    from synthetic import make_project

    from pdevidence import cli
    from pdevidence.core import errors

    project = make_project(tmp_path / "project")
    assert cli.main(["--root", str(project), "sweep", "demo"]) == errors.USAGE
    assert "argument versions: 'demo' is not a release version" in (err := capsys.readouterr().err)
    assert "experiments are named with --experiment" in err
    assert cli.main(["--root", str(project), "sweep", "0.5.21;"]) == errors.USAGE
    assert "argument versions: '0.5.21;' is not a release version" in capsys.readouterr().err


def drift_against(tmp_path, monkeypatch, fresh_doc):
    """The drift lane on the synthetic head cell, its rerun replaced by ``fresh_doc``."""
    from synthetic import write_cell

    from pdevidence import registry
    from pdevidence.cells import cells

    project = published_head(tmp_path)
    fresh = write_cell(tmp_path / "drift-runs", "head", doc=fresh_doc)

    def compile_(reg_, pins, dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("torch==9.0.0\n")
        return dest

    monkeypatch.setattr(drift, "compile_constraints", compile_)
    monkeypatch.setattr(cells, "run_cell", lambda *a, **k: cells.CellOutcome(
        cells.Cell("demo", "head", "release"), fresh, fresh, reused=False))
    return drift.run(registry.load(project), "demo", "head", {"torch": drift.LATEST},
                     published=project / "results", work=tmp_path / "work")


def test_drift_names_the_observations_that_moved(tmp_path, monkeypatch):
    moved = result_doc("head", "1.1.0", {"D1": {"enqueued": False, "retired": "absent"}, "D2": {"enqueued": True}})
    found = drift_against(tmp_path, monkeypatch, moved)
    assert (found.status, found.changed) == ("changed", ["D1.retired"])
    assert drift_against(tmp_path / "same", monkeypatch, result_doc("head", "1.1.0")).status == "unchanged"


def test_a_drift_result_of_another_side_is_refused_naming_the_file(tmp_path, monkeypatch):
    from pdevidence.core import errors

    with pytest.raises(errors.HarnessError, match=r"demo\.head\.release-1\.1\.0\.json.*side 'base'"):
        drift_against(tmp_path, monkeypatch, result_doc("base", "1.1.0"))


@pytest.mark.parametrize("spoil, code", [("tamper", "INTEGRITY"), ("another probe", "STALE")])
def test_drift_verifies_the_published_result_before_recompiling_anything(tmp_path, monkeypatch, spoil, code):
    from pdevidence import registry
    from pdevidence.core import errors

    project = published_head(tmp_path)
    if spoil == "tamper":
        result = project / "results" / "demo.head.release-1.1.0.json"
        result.write_text(result.read_text().replace('"retired": true', '"retired": false'))
    else:
        (project / "probes" / "probe_demo.py").write_text("print('another probe')\n")
    monkeypatch.setattr(drift, "compile_constraints", lambda *a: pytest.fail("recompiled before verifying"))
    with pytest.raises(errors.HarnessError, match=r"results/demo\.head\.release-1\.1\.0") as caught:
        drift.run(registry.load(project), "demo", "head", {"torch": drift.LATEST}, published=project / "results",
                  work=tmp_path / "work")
    assert caught.value.code == getattr(errors, code)
