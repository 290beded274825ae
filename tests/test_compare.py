"""The aggregate step on synthetic cell results: one test per verdict."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import synthetic
from synthetic import make_project, receipt_doc, result_doc, write_cell, write_sweep

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity, reports
from pdevidence.judge import compare
from pdevidence.report import report


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "project")


def run_compare(project):
    reg = registry.load(project)
    return compare.compare_all(reg, runs=project / "runs", published=project / "results", kinds=["release"])


def snapshot(directory):
    """Every file under ``directory`` with its SHA-256: equal snapshots mean byte-identical trees."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def publish_both(project):
    for side in ("base", "head"):
        write_cell(project / "runs", side)
        write_cell(project / "results", side)
    integrity.regenerate(project)


def test_a_differential_matching_the_registry_and_the_published_bytes_is_confirmed(project):
    publish_both(project)
    summary = run_compare(project)
    (pair,) = summary.pairs
    assert pair.verdict == compare.Verdict.CONFIRMED
    assert summary.exit_code == errors.CONFIRMED
    assert pair.grid["D1"]["status"] == "changed"
    assert pair.grid["D2"]["status"] == "unchanged"
    assert pair.grid["D1"]["keys"]["retired"] == {"base": False, "head": True, "status": "changed"}
    assert {p["status"] for p in pair.published.values()} == {"identical"}


def test_a_missing_cell_makes_the_comparison_incomplete_and_names_it(project):
    write_cell(project / "runs", "base")
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.INCOMPLETE
    assert pair.exit_code == errors.INCOMPLETE
    assert any("release(demo, head)" in r for r in pair.reasons)


def test_a_head_that_still_admits_the_request_is_not_reproduced(project):
    publish_both(project)
    write_cell(project / "runs", "head", result_doc("head", "1.1.0", {
        "D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.NOT_REPRODUCED
    assert pair.exit_code == errors.BEHAVIOUR_DIFFERS
    assert {"scenario": "D1", "side": "head", "key": "retired", "expected": True, "observed": False} \
        in pair.expectation_failures
    assert "D1" in pair.reasons[0]


def test_a_control_that_changes_is_not_reproduced(project):
    publish_both(project)
    write_cell(project / "runs", "head", result_doc("head", "1.1.0", {
        "D1": {"enqueued": False, "retired": True}, "D2": {"enqueued": False}}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.NOT_REPRODUCED
    assert pair.grid["D2"]["status"] == "changed"


def test_a_scenario_error_fails_its_expectation(project):
    publish_both(project)
    write_cell(project / "runs", "base", result_doc("base", "1.0.0", errors={
        "D1": {"type": "AttributeError", "message": "no attribute 'kv'"}}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.NOT_REPRODUCED
    assert pair.expectation_failures[0]["observed"]["type"] == "AttributeError"


def test_a_fresh_result_that_differs_from_the_published_one_is_shown_key_by_key(project):
    publish_both(project)
    doc = result_doc("base", "1.0.0")
    doc["scenarios"]["D2"]["observed"]["extra"] = 3
    write_cell(project / "runs", "base", doc)
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.PUBLISHED_DIFFERS
    assert pair.published["base"]["diffs"] == ["scenarios.D2.observed.extra: published <missing>, now 3"]


def test_same_behaviour_on_other_pins_is_environment_differs(project):
    publish_both(project)
    write_cell(project / "runs", "head", receipt=receipt_doc(torch="2.15.0+cu130"))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.ENVIRONMENT_DIFFERS
    assert pair.exit_code == errors.ENVIRONMENT_DIFFERS
    assert pair.pins_differ == {"head": ["torch"]}


def test_a_tampered_published_artifact_is_refused_by_name(project):
    publish_both(project)
    published = project / "results" / "demo.head.release-1.1.0.json"
    data = bytearray(published.read_bytes())
    data[10] ^= 1
    published.write_bytes(bytes(data))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.Verdict.INTEGRITY
    assert pair.exit_code == errors.INTEGRITY
    assert "results/demo.head.release-1.1.0.json" in pair.reasons[0]
    with pytest.raises(errors.HarnessError, match="demo.head.release-1.1.0.json"):
        integrity.verify(project)


def test_the_compare_command_writes_reports_under_runs_and_leaves_results_alone(project, capsys):
    publish_both(project)
    before = snapshot(project / "results")
    assert cli.main(["--root", str(project), "compare"]) == errors.CONFIRMED
    out = capsys.readouterr().out
    assert "DIFFERENTIAL CONFIRMED" in out
    machine = reports.load_report(project / "runs" / "report.json")
    assert machine["pairs"][0]["verdict"] == "differential confirmed"
    markdown = (project / "runs" / "report.md").read_text()
    assert "| D1 | retired | false | true | changed |" in markdown
    svg = (project / "runs" / "report.svg").read_text()
    assert svg.count("<rect") >= 4 + len(report.COLOURS)
    assert all(colour in svg for colour in report.COLOURS.values())
    assert snapshot(project / "results") == before
    integrity.verify(project)


@pytest.mark.parametrize("argv", [["compare"], ["compare", "--kind", "git"], ["compare", "--kind", "all"]])
def test_no_comparison_touches_results_even_without_runs(project, argv):
    """A fresh clone has no runs: the published report must stay as published."""
    publish_both(project)
    for path in (project / "runs").iterdir():
        path.unlink()
    before = snapshot(project / "results")
    assert cli.main(["--root", str(project), *argv]) == errors.INCOMPLETE
    assert snapshot(project / "results") == before
    assert reports.load_report(project / "runs" / "report.json")["exit_code"] == errors.INCOMPLETE


def test_the_report_is_byte_stable_across_processes(project):
    publish_both(project)
    outputs = []
    for seed in ("1", "2"):  # another hash seed: set and dict orders that leak into bytes would show
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(PROJECT)}
        done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(project), "compare"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == errors.CONFIRMED, done.stderr
        outputs.append({name: (project / "runs" / name).read_bytes()
                        for name in ("report.json", "report.md", "report.svg")})
    assert outputs[0] == outputs[1]


def flip_byte(path, at=10):
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def bless(project):
    """Rewrite SHA256SUMS.txt for whatever is there: only receipt validation stands between a bad file and 0."""
    (project / "SHA256SUMS.txt").write_text(integrity.render(project))


PUBLISHED_RECEIPT = "results/demo.head.release-1.1.0.receipt.json"


@pytest.mark.parametrize("content, blessed, why", [
    (None, False, "SHA-256"),  # a flipped byte
    ("{}", False, "SHA-256"),
    ("{}", True, "schema None"),
    ('{"python": {}}', True, "not a valid receipt"),
    ("[1, 2]", True, "not a JSON object"),
    ("", True, "not a readable receipt"),
])
def test_a_bad_published_receipt_exits_5_naming_it_in_compare_and_verify(project, capsys, content, blessed, why):
    publish_both(project)
    receipt = project / PUBLISHED_RECEIPT
    if content is None:
        flip_byte(receipt, at=40)
    else:
        receipt.write_text(content)
    if blessed:
        bless(project)
    assert cli.main(["--root", str(project), "compare"]) == errors.INTEGRITY
    captured = capsys.readouterr()
    assert PUBLISHED_RECEIPT in captured.out and why in captured.out
    assert "Traceback" not in captured.err
    assert cli.main(["--root", str(project), "verify"]) == errors.INTEGRITY
    err = capsys.readouterr().err
    assert PUBLISHED_RECEIPT in err and why in err


def test_a_published_receipt_of_another_result_fails_verification(project, capsys):
    publish_both(project)
    receipt = project / PUBLISHED_RECEIPT
    doc = json.loads(receipt.read_text())
    doc["result"]["sha256"] = "0" * 64
    receipt.write_text(json.dumps(doc))
    bless(project)
    (pair,) = run_compare(project).pairs
    assert pair.verdict is compare.Verdict.INTEGRITY
    assert "does not match its receipt" in pair.reasons[0]
    assert pair.published["head"]["status"] is compare.PublishedStatus.FAILED
    with pytest.raises(errors.HarnessError, match="demo.head.release-1.1.0.json") as err:
        integrity.verify(project)
    assert err.value.code == errors.INTEGRITY


def test_a_published_receipt_with_a_wrong_type_is_named_with_the_field(project):
    publish_both(project)
    receipt = project / PUBLISHED_RECEIPT
    doc = json.loads(receipt.read_text())
    doc["exit_status"] = "0"
    receipt.write_text(json.dumps(doc))
    bless(project)
    (pair,) = run_compare(project).pairs
    assert pair.verdict is compare.Verdict.INTEGRITY
    assert "exit_status must be an integer, got str" in pair.reasons[0]


def test_a_fresh_receipt_that_does_not_match_its_result_is_an_integrity_failure(project, capsys):
    publish_both(project)
    fresh = project / "runs" / "demo.base.release-1.0.0.json"
    fresh.write_text(fresh.read_text() + " ")
    assert cli.main(["--root", str(project), "compare"]) == errors.INTEGRITY
    assert "does not match its receipt" in capsys.readouterr().err


def test_a_fresh_result_without_its_receipt_is_incomplete(project):
    publish_both(project)
    (project / "runs" / "demo.head.release-1.1.0.receipt.json").unlink()
    (pair,) = run_compare(project).pairs
    assert pair.verdict is compare.Verdict.INCOMPLETE
    assert "no receipt for release(demo, head)" in pair.reasons[0]


@pytest.mark.parametrize("table, line, typo", [
    ("D1", "base = {{ enqueued = true, retired = false }}", None),
    ("D1", "head = {{ enqueued = false, retired = true }}", None),
    ("D2", "keys = {{ enqueued = true }}", None),
    ("D2", "keys = {{ enqueued = true }}", 'keys = {{ enqueued = true }}\nbeside = {{ keys = ["enqeued"], why = "x" }}'),
])
def test_a_misspelled_expected_key_is_a_registry_error_naming_the_nearest_key(tmp_path, capsys, table, line, typo):
    assert line.format() in synthetic.REGISTRY
    typo = (typo or line.replace("enqueued = ", "enqeued = ")).format()
    project = make_project(tmp_path / "project", synthetic.REGISTRY.replace(line.format(), typo))
    publish_both(project)
    assert cli.main(["--root", str(project), "compare"]) == errors.USAGE
    err = capsys.readouterr().err
    assert f"experiments.demo.expect.{table}.enqeued" in err
    assert "did you mean 'enqueued'?" in err
    assert "Traceback" not in err


def test_a_scenario_that_raised_on_both_sides_is_not_blamed_on_the_registry(project):
    publish_both(project)
    boom = {"D1": {"type": "ImportError", "message": "no module"}}
    for side, version in (("base", "1.0.0"), ("head", "1.1.0")):
        write_cell(project / "runs", side, result_doc(side, version, {"D1": {}, "D2": {"enqueued": True}}, boom))
    (pair,) = run_compare(project).pairs
    assert pair.verdict is compare.Verdict.NOT_REPRODUCED
    assert {f["expected"] for f in pair.expectation_failures if f["key"] is None} == {"no error"}


def test_pins_compare_versions_not_spellings(project):
    publish_both(project)
    write_cell(project / "runs", "head", receipt=receipt_doc(packages={"torch": "2.14.1.0", "transformers": "5.12.1"}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict is compare.Verdict.CONFIRMED, pair.reasons


def test_the_report_loader_refuses_a_report_whose_verdict_is_unknown(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": compare.REPORT_SCHEMA, "exit_code": 0, "upstream": [],
                                "pairs": [{"experiment": "demo", "verdict": "confirmed", "published": {},
                                           "exit_code": 0}]}))
    with pytest.raises(errors.HarnessError, match="confirmed") as err:
        reports.load_report(path)
    assert err.value.code == errors.INTEGRITY


def test_the_report_shows_the_prs_own_tests_with_their_failure_types(project):
    publish_both(project)
    summary = run_compare(project)
    base = {"totals": {"passed": 0, "failed": 1, "errors": 6, "skipped": 0, "total": 7},
            "types": {"AttributeError": 6, "ValueError": 1}}
    head = {"totals": {"passed": 7, "failed": 0, "errors": 0, "skipped": 0, "total": 7}, "types": {}}
    summary.upstream = [{"experiment": "demo", "pr": 1, "kind": "git", "verdict": "tests fail on base, pass on head",
                         "sides": {"base": base, "head": head}}]
    assert ("| demo (PR #1) | git | 0/7 passed (6 AttributeError, 1 ValueError) | 7/7 passed | "
            "tests fail on base, pass on head |") in report.markdown(summary)
    assert "base: 0/7 passed (6 AttributeError, 1 ValueError)" in report.terminal(summary)


@pytest.mark.parametrize("name", ["report.md", "report.json", "report.svg", "sweep-demo.json"])
def test_a_flipped_byte_in_any_published_file_is_named_by_compare_and_verify(project, capsys, name):
    for side in ("base", "head"):
        write_cell(project / "runs", side)
    write_sweep(project / "runs" / "sweep-demo.json")
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    capsys.readouterr()
    flip_byte(project / "results" / name, at=3)
    assert cli.main(["--root", str(project), "compare"]) == errors.INTEGRITY
    assert f"results/{name}" in capsys.readouterr().out
    assert reports.load_report(project / "runs" / "report.json")["published_failures"].keys() == {f"results/{name}"}
    assert cli.main(["--root", str(project), "verify"]) == errors.INTEGRITY
    assert f"results/{name}" in capsys.readouterr().err


@pytest.mark.parametrize("posargs", [[], ["--", "--kind", "git"]])
def test_on_a_fresh_clone_nox_compare_leaves_the_checkout_clean(tmp_path, posargs):
    """No runs yet: the comparison is incomplete, and the published report stays as published."""
    def status():
        return subprocess.run(["git", "-C", str(PROJECT), "status", "--porcelain", "--untracked-files=all"],
                              capture_output=True, text=True, check=True).stdout

    before = snapshot(PROJECT / "results"), status()
    env = {**os.environ, "PDEVIDENCE_RUNS": str(tmp_path / "runs"), "PYTHONPATH": str(PROJECT)}
    done = subprocess.run([sys.executable, "-m", "nox", "-f", str(PROJECT / "noxfile.py"), "-s", "compare", *posargs],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == errors.INCOMPLETE, done.stdout + done.stderr
    assert (snapshot(PROJECT / "results"), status()) == before
    assert reports.load_report(tmp_path / "runs" / "report.json")["exit_code"] == errors.INCOMPLETE


def test_verify_refuses_a_published_report_that_is_not_a_report_even_with_blessed_sums(project, capsys):
    publish_both(project)
    write_sweep(project / "runs" / "sweep-demo.json")
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    path = project / "results" / "report.json"
    doc = json.loads(path.read_text())
    doc["pairs"][0]["verdict"] = "confirmed, trust me"
    path.write_text(json.dumps(doc))
    bless(project)
    capsys.readouterr()
    assert cli.main(["--root", str(project), "verify"]) == errors.INTEGRITY
    assert "results/report.json is not a valid report" in capsys.readouterr().err
