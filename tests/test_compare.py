"""The aggregate step on synthetic cell results: one test per verdict."""

from __future__ import annotations

import json

import pytest

from pdevidence import cli, compare, errors, integrity, registry, report
from synthetic import make_project, receipt_doc, result_doc, write_cell


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "project")


def run_compare(project):
    reg = registry.load(project)
    return compare.compare_all(reg, runs=project / "runs", published=project / "results", kinds=["release"])


def publish_both(project):
    for side in ("base", "head"):
        write_cell(project / "runs", side)
        write_cell(project / "results", side)
    integrity.regenerate(project)


def test_a_differential_matching_the_registry_and_the_published_bytes_is_confirmed(project):
    publish_both(project)
    summary = run_compare(project)
    (pair,) = summary.pairs
    assert pair.verdict == compare.CONFIRMED_V
    assert summary.exit_code == errors.CONFIRMED
    assert pair.grid["D1"]["status"] == "changed"
    assert pair.grid["D2"]["status"] == "unchanged"
    assert pair.grid["D1"]["keys"]["retired"] == {"base": False, "head": True, "status": "changed"}
    assert {p["status"] for p in pair.published.values()} == {"identical"}


def test_a_missing_cell_makes_the_comparison_incomplete_and_names_it(project):
    write_cell(project / "runs", "base")
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.INCOMPLETE_V
    assert pair.exit_code == errors.INCOMPLETE
    assert any("release(demo, head)" in r for r in pair.reasons)


def test_a_head_that_still_admits_the_request_is_not_reproduced(project):
    publish_both(project)
    write_cell(project / "runs", "head", result_doc("head", "1.1.0", {
        "D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.NOT_REPRODUCED
    assert pair.exit_code == errors.BEHAVIOUR_DIFFERS
    assert {"scenario": "D1", "side": "head", "key": "retired", "expected": True, "observed": False} \
        in pair.expectation_failures
    assert "D1" in pair.reasons[0]


def test_a_control_that_changes_is_not_reproduced(project):
    publish_both(project)
    write_cell(project / "runs", "head", result_doc("head", "1.1.0", {
        "D1": {"enqueued": False, "retired": True}, "D2": {"enqueued": False}}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.NOT_REPRODUCED
    assert pair.grid["D2"]["status"] == "changed"


def test_a_scenario_error_fails_its_expectation(project):
    publish_both(project)
    write_cell(project / "runs", "base", result_doc("base", "1.0.0", errors={
        "D1": {"type": "AttributeError", "message": "no attribute 'kv'"}}))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.NOT_REPRODUCED
    assert pair.expectation_failures[0]["observed"]["type"] == "AttributeError"


def test_a_fresh_result_that_differs_from_the_published_one_is_shown_key_by_key(project):
    publish_both(project)
    doc = result_doc("base", "1.0.0")
    doc["scenarios"]["D2"]["observed"]["extra"] = 3
    write_cell(project / "runs", "base", doc)
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.PUBLISHED_DIFFERS
    assert pair.published["base"]["diffs"] == ["scenarios.D2.observed.extra: published <missing>, now 3"]


def test_same_behaviour_on_other_pins_is_environment_differs(project):
    publish_both(project)
    write_cell(project / "runs", "head", receipt=receipt_doc(torch="2.15.0+cu130"))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.ENV_DIFFERS
    assert pair.exit_code == errors.ENVIRONMENT_DIFFERS
    assert pair.pins_differ == {"head": ["torch"]}


def test_a_tampered_published_artifact_is_refused_by_name(project):
    publish_both(project)
    published = project / "results" / "demo.head.release-1.1.0.json"
    data = bytearray(published.read_bytes())
    data[10] ^= 1
    published.write_bytes(bytes(data))
    (pair,) = run_compare(project).pairs
    assert pair.verdict == compare.INTEGRITY_V
    assert pair.exit_code == errors.INTEGRITY
    assert "results/demo.head.release-1.1.0.json" in pair.reasons[0]
    with pytest.raises(errors.HarnessError, match="demo.head.release-1.1.0.json"):
        integrity.verify(project)


def test_the_compare_command_writes_reports_and_exits_with_the_verdict_code(project, capsys):
    publish_both(project)
    assert cli.main(["--root", str(project), "compare"]) == errors.CONFIRMED
    out = capsys.readouterr().out
    assert "DIFFERENTIAL CONFIRMED" in out
    machine = json.loads((project / "results" / "report.json").read_text())
    assert machine["pairs"][0]["verdict"] == "differential confirmed"
    markdown = (project / "results" / "report.md").read_text()
    assert "| D1 | retired | false | true | changed |" in markdown
    svg = (project / "results" / "report.svg").read_text()
    assert svg.count("<rect") >= 4 + len(report.COLOURS)
    assert all(colour in svg for colour in report.COLOURS.values())
    # The report is derived data: writing it does not make SHA256SUMS stale.
    integrity.verify(project)


def test_the_report_is_byte_stable(project):
    publish_both(project)
    first = report.markdown(run_compare(project)), report.svg(run_compare(project))
    assert first == (report.markdown(run_compare(project)), report.svg(run_compare(project)))


def test_publish_copies_results_and_receipts_and_refreshes_the_sums(project):
    for side in ("base", "head"):
        write_cell(project / "runs", side)
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    assert (project / "results" / "demo.base.release-1.0.0.receipt.json").exists()
    integrity.verify(project)


def test_publish_refuses_when_a_cell_has_no_result(project, capsys):
    write_cell(project / "runs", "base")
    assert cli.main(["--root", str(project), "publish"]) == errors.INCOMPLETE
    assert "demo.head.release-1.1.0.json" in capsys.readouterr().err
    assert not list((project / "results").iterdir())


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
