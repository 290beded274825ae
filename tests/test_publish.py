"""publish, the one writer of results/: validated, confirmed, then report and sums from the published files."""

from __future__ import annotations

import json
import stat

import pytest
from synthetic import publishable_project, result_doc, write_cell, write_sweep

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.documents import integrity, reports
from pdevidence.publish import publish

PUBLISHED = ("demo.base.release-1.0.0.json", "demo.base.release-1.0.0.receipt.json",
             "demo.head.release-1.1.0.json", "demo.head.release-1.1.0.receipt.json")


@pytest.fixture
def project(tmp_path):
    """Fresh cells and a full, current sweep table in runs/: the smallest declared set."""
    return publishable_project(tmp_path / "project")


def test_publish_copies_results_receipts_and_tables_then_reports_from_what_it_published(project):
    (project / "runs" / "report.json").write_text("{}\n")  # a compare's report is not published as is
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    results = project / "results"
    for name in (*PUBLISHED, "sweep-demo.json"):
        assert (results / name).read_bytes() == (project / "runs" / name).read_bytes(), name
    doc = reports.load_report(results / "report.json")
    assert [p["verdict"] for p in doc["pairs"]] == ["differential confirmed"]
    assert {p["status"] for p in doc["pairs"][0]["published"].values()} == {"identical"}
    listed = integrity.listed(project)
    for rel in ("experiments.toml", "constraints/cells.txt", "probes/probe_demo.py", "results/report.json",
                "results/report.md", "results/report.svg", "results/osv/PDEVIDENCE-2026-1.json",
                *(f"results/{name}" for name in PUBLISHED)):
        assert rel in listed, rel
    integrity.verify(project)
    osv_record = json.loads((results / "osv" / "PDEVIDENCE-2026-1.json").read_text())
    assert osv_record["affected"][0]["ranges"][0]["events"] == [{"introduced": "0"}, {"fixed": "1.1.0"}]


def test_published_files_are_world_readable(project):
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    for path in [*(p for p in (project / "results").rglob("*") if p.is_file()), project / "SHA256SUMS.txt"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_publish_refuses_when_a_cell_has_no_result(project, capsys):
    (project / "runs" / "demo.head.release-1.1.0.json").unlink()
    assert cli.main(["--root", str(project), "publish"]) == errors.INCOMPLETE
    assert "demo.head.release-1.1.0.json" in capsys.readouterr().err
    assert not list((project / "results").iterdir())


def test_publish_refuses_an_unconfirmed_differential_unless_told(project, capsys):
    write_cell(project / "runs", "head", result_doc("head", "1.1.0", {
        "D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}}))
    write_sweep(project / "runs" / "sweep-demo.json")  # judged against this head
    assert cli.main(["--root", str(project), "publish"]) == errors.BEHAVIOUR_DIFFERS
    err = capsys.readouterr().err
    assert "not reproduced" in err and "--allow-unconfirmed" in err
    assert not list((project / "results").iterdir())
    assert cli.main(["--root", str(project), "publish", "--allow-unconfirmed"]) == errors.CONFIRMED
    doc = reports.load_report(project / "results" / "report.json")
    assert doc["pairs"][0]["verdict"] == "not reproduced"
    integrity.verify(project)


def test_a_publish_told_to_take_unconfirmed_references_says_so_in_what_it_publishes(project, capsys):
    write_cell(project / "runs", "head", result_doc("head", "1.1.0", {
        "D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}}))
    write_sweep(project / "runs" / "sweep-demo.json")

    assert cli.main(["--root", str(project), "publish", "--allow-unconfirmed"]) == errors.CONFIRMED

    (entry,) = reports.load_report(project / "results" / "report.json")["unconfirmed"]
    assert (entry["experiment"], entry["kind"], entry["verdict"]) == ("demo", "release", "not reproduced")
    assert entry["reasons"]
    markdown = (project / "results" / "report.md").read_text()
    assert "**Published unconfirmed** (`publish --allow-unconfirmed`)" in markdown
    assert markdown.index("Published unconfirmed") < markdown.index("### demo")
    assert "PUBLISHED UNCONFIRMED" in capsys.readouterr().out
    integrity.verify(project)  # what says so is in the sums like the rest


def test_a_confirmed_publish_records_that_nothing_was_taken_unconfirmed(project):
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED

    assert reports.load_report(project / "results" / "report.json")["unconfirmed"] == []
    assert "Published unconfirmed" not in (project / "results" / "report.md").read_text()


def test_a_report_written_before_publish_recorded_unconfirmed_references_loads_as_unknown(tmp_path):
    old = tmp_path / "report.json"
    old.write_text(json.dumps({"schema": "pdevidence-report/1", "exit_code": 0, "pairs": [], "upstream": []}))

    assert reports.load_report(old)["unconfirmed"] is None


def test_publish_refuses_a_result_its_receipt_does_not_vouch_for(project, capsys):
    fresh = project / "runs" / "demo.base.release-1.0.0.json"
    doc = json.loads(fresh.read_text())
    doc["scenarios"]["D2"]["observed"]["enqueued"] = False
    fresh.write_text(json.dumps(doc))
    assert cli.main(["--root", str(project), "publish"]) == errors.INTEGRITY
    assert "does not match its receipt" in capsys.readouterr().err
    assert not list((project / "results").iterdir())


def test_publish_refuses_an_invalid_fresh_result(project, capsys):
    write_cell(project / "runs", "base", {"schema": "pd-differential-probe/1", "experiment": "demo"})
    assert cli.main(["--root", str(project), "publish"]) == errors.ENVIRONMENT
    assert "not a valid probe result" in capsys.readouterr().err


def test_publish_does_not_bless_a_tampered_file_it_does_not_replace(project, capsys):
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    (project / "runs" / "sweep-demo.json").unlink()
    (project / "results" / "sweep-demo.json").write_text('{"first_fixed": "9.9.9"}\n')
    assert cli.main(["--root", str(project), "publish"]) == errors.INTEGRITY
    assert "results/sweep-demo.json" in capsys.readouterr().err


def test_checksums_refuses_to_vouch_for_an_invalid_published_receipt(project, capsys):
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    (project / "results" / "demo.base.release-1.0.0.receipt.json").write_text("{}")
    assert cli.main(["--root", str(project), "checksums"]) == errors.INTEGRITY
    assert "results/demo.base.release-1.0.0.receipt.json" in capsys.readouterr().err


def test_the_published_report_covers_every_kind_that_is_published(project):
    assert cli.main(["--root", str(project), "publish"]) == errors.CONFIRMED
    assert publish.published_kinds(registry.load(project), project / "results") == ["release"]
    for side in ("base", "head"):
        write_cell(project / "runs", side, kind="git")
    assert cli.main(["--root", str(project), "publish", "--kind", "git"]) == errors.CONFIRMED
    doc = reports.load_report(project / "results" / "report.json")
    assert [(p["kind"], p["verdict"]) for p in doc["pairs"]] == [("release", "differential confirmed"),
                                                                  ("git", "differential confirmed")]
