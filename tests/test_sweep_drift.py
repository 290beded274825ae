"""Release sweep classification and the drift lane's pin handling, on synthetic data."""

from __future__ import annotations

import json

import pytest
from synthetic import result_doc

from pdevidence.core.errors import HarnessError
from pdevidence.documents import provenance
from pdevidence.documents.tables import SweepParameters, SweepTable
from pdevidence.lanes import drift, sweep

BASE = result_doc("base", "1.0.0")
HEAD = result_doc("head", "1.1.0")
C = sweep.Classification


def release(version, d1):
    doc = result_doc("sweep", version, {"D1": d1, "D2": {"enqueued": True}})
    return doc


def test_releases_are_classified_by_the_scenarios_that_tell_base_from_head():
    pre = sweep.classify(release("1.0.1", {"enqueued": True, "retired": False}), BASE, HEAD)
    assert (pre.classification, pre.scenarios) == (C.PRE_FIX, {"D1": sweep.Behaviour.PRE_FIX})
    assert sweep.classify(release("1.2.0", {"enqueued": False, "retired": True}), BASE, HEAD).classification \
        == C.FIXED
    odd = sweep.classify(release("1.3.0", {"enqueued": True, "retired": True}), BASE, HEAD)
    assert (odd.classification, odd.differing) == (C.NEITHER, ["D1"])
    assert odd.to_json()["scenarios"] == {"D1": "neither"}


def test_a_scenario_that_raises_is_an_error_not_a_match():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D1"]["error"] = {"type": "AttributeError", "message": "x"}
    found = sweep.classify(doc, BASE, HEAD)
    assert (found.classification, found.scenarios, found.differing) == (C.NEITHER, {"D1": sweep.Behaviour.ERROR},
                                                                        ["D1"])


def test_some_scenarios_fixed_and_others_pre_fix_is_partial():
    assert sweep.overall({"A1": sweep.Behaviour.FIXED, "A2": sweep.Behaviour.PRE_FIX}) is C.PARTIAL
    assert sweep.overall({"A1": sweep.Behaviour.FIXED, "A2": sweep.Behaviour.ERROR}) is C.NEITHER


def test_a_control_that_moves_does_not_decide_the_classification():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": False}
    assert sweep.classify(doc, BASE, HEAD).classification == C.FIXED


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
    assert (doc["schema"], doc["first_fixed"], doc["regressions"]) == ("pdevidence-sweep/3", "0.2", ["0.3", "0.6"])
    assert SweepTable.from_doc(doc, source="test").doc is doc
    assert sweep.first_fixed(outcomes[:1]) is None and sweep.regressions(outcomes[:1]) == []


def test_the_sweep_command_prints_a_regression_and_exits_1(tmp_path, monkeypatch, capsys):
    from synthetic import make_project

    from pdevidence import cli
    from pdevidence.core import errors

    project = make_project(tmp_path / "project")
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    outcomes = [sweep.ReleaseOutcome("1.0.0", C.PRE_FIX), sweep.ReleaseOutcome("1.1.0", C.FIXED),
                sweep.ReleaseOutcome("1.2.0", C.PRE_FIX, {"D1": sweep.Behaviour.PRE_FIX})]
    refs = {"demo": sweep.References({}, {"demo.base.release-1.0.0.json": "a" * 64})}
    monkeypatch.setattr(sweep, "sweep", lambda reg, names, **kw: ({"demo": outcomes}, "2026-10-01T00:00:00Z", refs))
    assert cli.main(["--root", str(project), "sweep", "1.0.0", "1.1.0", "1.2.0"]) == errors.BEHAVIOUR_DIFFERS
    assert "1.2.0        pre-fix  REGRESSION: the fix is gone again" in capsys.readouterr().out
    written = json.loads((tmp_path / "runs" / "sweep-demo.json").read_text())
    assert written["regressions"] == ["1.2.0"] and written["as_of"] == "2026-10-01T00:00:00Z"
    assert written["parameters"] == {"explicit": True, "pre": False, "floor": "1.0.0",
                                     "references": {"demo.base.release-1.0.0.json": "a" * 64}}
    assert SweepTable.load(tmp_path / "runs" / "sweep-demo.json").stale(project, "probes/probe_demo.py") == []
    monkeypatch.setattr(sweep, "sweep", lambda reg, names, **kw: ({"demo": outcomes[:2]}, None, refs))
    assert cli.main(["--root", str(project), "sweep"]) == errors.CONFIRMED


def test_a_sweep_table_of_another_schema_is_refused():
    for doc in ({"schema": "pdevidence-sweep/9", "experiment": "demo", "releases": [], "regressions": []},
                {"schema": "pdevidence-sweep/2", "experiment": "demo", "regressions": [],
                 "releases": [{"version": "1", "classification": "ok"}]}):
        with pytest.raises(HarnessError, match="sweep table"):
            SweepTable.from_doc(doc, source="t.json")


def test_releases_come_from_wheels_for_this_python_from_the_floor_up(monkeypatch):
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
    assert sweep.releases(files, "3.12", "0.5.10") == ["0.5.17", "0.5.20"]
    assert sweep.releases(files, "3.12", "0.5.10", pre=True) == ["0.5.15.post1", "0.5.16rc0", "0.5.17", "0.5.20"]
    # The date a table speaks for: when the newest probed release was uploaded.
    assert sweep.as_of(files, ["0.5.17", "0.5.20"]) == "2026-07-01T00:00:00.000000Z"
    assert sweep.as_of(files, ["0.5.99"]) is None


def test_drift_repins_only_the_named_packages():
    source = "# header\ntorch==2.14.1\ntorchvision==0.29.1\ntransformers==5.12.1\nnumpy\n"
    moved = drift.drift_inputs(source, {"torch": drift.LATEST, "torchvision": drift.LATEST,
                                        "transformers": "5.19.0"})
    assert moved == "# header\ntorch\ntorchvision\ntransformers==5.19.0\nnumpy\n"


def test_with_a_declared_differential_only_its_changing_scenarios_and_keys_decide(tmp_path):
    from synthetic import make_project

    from pdevidence import registry

    exp = registry.load(make_project(tmp_path)).experiment("demo")
    doc = release("0.9.0", {"enqueued": True, "retired": False, "door_check": "absent"})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": True, "backup_marker": "older layout"}
    assert sweep.classify(doc, BASE, HEAD, exp).classification == C.PRE_FIX


def test_an_sglang_that_no_longer_imports_is_the_drift_finding_not_a_crash(tmp_path, monkeypatch):
    from synthetic import make_project, write_cell

    from pdevidence import registry
    from pdevidence.cells import cells
    from pdevidence.core import errors

    project = make_project(tmp_path)
    write_cell(project / "results", "head")
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
    assert "--experiment demo" in capsys.readouterr().err
    assert cli.main(["--root", str(project), "sweep", "latest"]) == errors.USAGE
    assert "'latest' is not a version" in capsys.readouterr().err


def drift_against(tmp_path, monkeypatch, fresh_doc):
    """The drift lane on the synthetic head cell, its rerun replaced by ``fresh_doc``."""
    from synthetic import make_project, write_cell

    from pdevidence import registry
    from pdevidence.cells import cells

    project = make_project(tmp_path)
    write_cell(project / "results", "head")
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
