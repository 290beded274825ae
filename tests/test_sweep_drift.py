"""Release sweep classification and the drift lane's pin handling, on synthetic data."""

from __future__ import annotations

import pytest

from pdevidence import drift, sweep
from synthetic import result_doc

BASE = result_doc("base", "1.0.0")
HEAD = result_doc("head", "1.1.0")


def release(version, d1):
    doc = result_doc("sweep", version, {"D1": d1, "D2": {"enqueued": True}})
    return doc


def test_releases_are_classified_by_the_scenarios_that_tell_base_from_head():
    assert sweep.classify(release("1.0.1", {"enqueued": True, "retired": False}), BASE, HEAD).classification \
        == sweep.PRE_FIX
    assert sweep.classify(release("1.2.0", {"enqueued": False, "retired": True}), BASE, HEAD).classification \
        == sweep.FIXED
    odd = sweep.classify(release("1.3.0", {"enqueued": True, "retired": True}), BASE, HEAD)
    assert (odd.classification, odd.differing) == (sweep.NEITHER, ["D1"])


def test_a_control_that_moves_does_not_decide_the_classification():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": False}
    assert sweep.classify(doc, BASE, HEAD).classification == sweep.FIXED


def test_the_first_fixed_release_is_the_one_after_which_none_regresses():
    outcomes = [sweep.ReleaseOutcome(v, c) for v, c in [
        ("0.1", sweep.PRE_FIX), ("0.2", sweep.FIXED), ("0.3", sweep.PRE_FIX), ("0.4", sweep.FIXED),
        ("0.5", sweep.FAILED), ("0.6", sweep.FIXED)]]
    assert sweep.first_fixed(outcomes) == "0.4"
    assert "first fixed release: 0.4" in sweep.table("demo", outcomes, {"head": "0.2"})
    assert "the sweep says 0.4" in sweep.table("demo", outcomes, {"head": "0.2"})
    assert sweep.first_fixed(outcomes[:1]) is None


def test_releases_come_from_wheels_for_this_python_from_the_floor_up(monkeypatch):
    monkeypatch.setattr(sweep.trees.platform, "machine", lambda: "x86_64")
    files = [{"filename": f} for f in (
        "sglang-0.5.9-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.15.post1-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.16rc0-py3-none-any.whl",
        "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.17-cp312-cp312-manylinux_2_34_aarch64.whl",
        "sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl",
        "sglang-0.5.20-cp312-cp312-manylinux_2_34_x86_64.whl",
        "sglang-0.5.19.tar.gz",
    )] + [{"filename": "sglang-0.5.21-cp312-cp312-manylinux_2_34_x86_64.whl", "yanked": "broken"}]
    assert sweep.releases(files, "3.12", "0.5.10") == ["0.5.15.post1", "0.5.17", "0.5.20"]


def test_drift_repins_only_the_named_packages():
    source = "# header\ntorch==2.14.1\ntorchvision==0.29.1\ntransformers==5.12.1\nnumpy\n"
    moved = drift.drift_inputs(source, {"torch": drift.LATEST, "torchvision": drift.LATEST,
                                        "transformers": "5.19.0"})
    assert moved == "# header\ntorch\ntorchvision\ntransformers==5.19.0\nnumpy\n"


def test_with_a_declared_differential_only_its_changing_scenarios_and_keys_decide(tmp_path):
    from pdevidence import registry
    from synthetic import make_project

    exp = registry.load(make_project(tmp_path)).experiment("demo")
    doc = release("0.9.0", {"enqueued": True, "retired": False, "door_check": "absent"})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": True, "backup_marker": "older layout"}
    assert sweep.classify(doc, BASE, HEAD, exp).classification == sweep.PRE_FIX


def test_an_sglang_that_no_longer_imports_is_the_drift_finding_not_a_crash(tmp_path, monkeypatch):
    from pdevidence import cells, errors, registry
    from synthetic import make_project, write_cell

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


def drift_against(tmp_path, monkeypatch, fresh_doc):
    """The drift lane on the synthetic head cell, its rerun replaced by ``fresh_doc``."""
    from pdevidence import cells, registry
    from synthetic import make_project, write_cell

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
    from pdevidence import errors

    with pytest.raises(errors.HarnessError, match=r"demo\.head\.release-1\.1\.0\.json.*side 'base'"):
        drift_against(tmp_path, monkeypatch, result_doc("base", "1.1.0"))
