"""OSV records from sweep tables: every record meets the OSV 1.6 schema.

The schema (pdevidence/documents/schemas/osv-1.6.json) is written from the OSV
specification: required `id` and `modified`; `affected[].package` with `ecosystem`
and `name`; `ranges[]` with a `type` of GIT/SEMVER/ECOSYSTEM and a non-empty
`events` list of objects with exactly one of introduced/fixed/last_affected/limit,
at least one introduced; reference types from the specification's list.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from schemas import problems
from synthetic import make_project, sweep_doc, write_cell, write_table

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.core.errors import HarnessError
from pdevidence.documents import integrity, provenance
from pdevidence.documents.bisects import BisectDocument, BisectParameters, BoundaryReport, Probed, Seen
from pdevidence.documents.tables import SweepParameters, SweepTable
from pdevidence.documents.vocabulary import Boundary, Finding
from pdevidence.lanes import sweep
from pdevidence.publish import osv
from pdevidence.sources.history import Commit

ROOT = Path(__file__).resolve().parent.parent


def osv_problems(rec: dict) -> list[str]:
    """What violates the OSV 1.6 schema (empty: none)."""
    return problems("osv-1.6", rec)


def row(version, classification):
    return {"version": version, "classification": classification, "scenarios": {}, "differing": [], "error": None}


def table(rows, as_of="2026-10-14T09:30:12.345678Z"):
    outcomes = [sweep.ReleaseOutcome(r["version"], sweep.Classification(r["classification"])) for r in rows]
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    parameters = SweepParameters(explicit=False, pre=False, floor="1.0.0", references={})
    return SweepTable.from_doc(sweep.document("demo", outcomes, as_of, made, parameters), source="test")


@pytest.fixture
def reg(tmp_path):
    return registry.load(make_project(tmp_path / "project"))


def test_a_record_names_the_pr_the_range_and_the_versions_seen_affected(reg):
    doc = table([row("1.0.0", "pre-fix"), row("1.0.1", "partial"), row("1.1.0", "fixed"), row("1.2.0", "neither")])
    hashes = {"results/sweep-demo.json": "1" * 64, "results/demo.base.release-1.0.0.json": "2" * 64,
              "results/other.base.release-1.0.0.json": "3" * 64}
    (name, rec), = osv.records(reg, {"demo": doc}, hashes).items()
    assert osv_problems(rec) == []
    assert name == "PDEVIDENCE-2026-1.json" and rec["id"] == "PDEVIDENCE-2026-1"
    assert rec["schema_version"].startswith("1.6") and rec["modified"] == "2026-10-14T09:30:12Z"
    assert "PR #1" in rec["details"] and "https://github.com/sgl-project/sglang/pull/1" in rec["details"]
    (affected,) = rec["affected"]
    assert affected["package"] == {"ecosystem": "PyPI", "name": "sglang", "purl": "pkg:pypi/sglang"}
    assert affected["ranges"] == [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "1.1.0"}]}]
    assert affected["versions"] == ["1.0.0", "1.0.1"]
    assert rec["database_specific"]["evidence_sha256"] == {"results/demo.base.release-1.0.0.json": "2" * 64,
                                                           "results/sweep-demo.json": "1" * 64}
    assert {"type": "FIX", "url": "https://github.com/sgl-project/sglang/pull/1"} in rec["references"]


def test_a_regression_reopens_the_range(reg):
    doc = table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed"), row("1.2.0", "pre-fix"), row("1.3.0", "fixed")])
    rec = osv.record(reg.experiment("demo"), doc, {})
    assert osv_problems(rec) == []
    assert rec["affected"][0]["ranges"][0]["events"] == [
        {"introduced": "0"}, {"fixed": "1.1.0"}, {"introduced": "1.2.0"}, {"fixed": "1.3.0"}]
    assert rec["database_specific"]["regressions"] == ["1.2.0"] and "regressions" in rec["details"]


def test_with_no_fixed_release_the_range_stays_open(reg):
    rec = osv.record(reg.experiment("demo"), table([row("1.0.0", "pre-fix"), row("1.1.0", "failed")]), {})
    assert osv_problems(rec) == []
    assert rec["affected"][0]["ranges"][0]["events"] == [{"introduced": "0"}]


def test_a_gated_fix_present_but_off_is_affected_and_the_first_release_whose_default_turns_it_on_is_fixed(reg):
    gate = registry.Gate("SGLANG_DEMO_GATE", "true", "off by default")
    exp = dataclasses.replace(reg.experiment("demo"), gate=gate)
    doc = table([row("1.0.0", "pre-fix"), row("1.1.0", "present but off"), row("1.2.0", "present but off"),
                 row("1.3.0", "fixed"), row("1.4.0", "present but off")])
    rec = osv.record(exp, doc, {})
    assert osv_problems(rec) == []
    (affected,) = rec["affected"]
    # As shipped, a release carrying the fix off is exposed: no fixed event until a default turns it on, and a
    # default that turns it off again re-opens the range.
    assert affected["ranges"][0]["events"] == [{"introduced": "0"}, {"fixed": "1.3.0"}, {"introduced": "1.4.0"}]
    assert affected["versions"] == ["1.0.0", "1.1.0", "1.2.0", "1.4.0"]
    assert rec["database_specific"]["gate"] == {"variable": "SGLANG_DEMO_GATE", "on": "true", "why": "off by default",
                                                "first_carrying": "1.1.0",
                                                "present_but_off": ["1.1.0", "1.2.0", "1.4.0"]}
    assert "sets SGLANG_DEMO_GATE=true" in rec["details"] and "off by default (1.1.0, 1.2.0, 1.4.0)" in rec["details"]
    assert "its own default turns the fix on: 1.3.0" in rec["details"]


def test_a_gate_only_off_cuda_leaves_the_cuda_ranges_and_says_where_else_it_is_off(reg):
    """war_barrier's kind of gate: on CUDA the fix runs by default, so the record (for CUDA) closes at the first
    fixed release; details name the variable and the check option for other platforms."""
    gate = registry.Gate("SGLANG_DEMO_GATE", "true", "off CUDA only behind it", ("cuda",))
    exp = dataclasses.replace(reg.experiment("demo"), gate=gate)
    rec = osv.record(exp, table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed")]), {})
    assert osv_problems(rec) == []
    assert rec["affected"][0]["ranges"][0]["events"] == [{"introduced": "0"}, {"fixed": "1.1.0"}]
    assert rec["database_specific"]["gate"] == {"variable": "SGLANG_DEMO_GATE", "on": "true",
                                                "why": "off CUDA only behind it", "platforms": ["cuda"]}
    assert "On cuda the fix runs by default" in rec["details"] and "--server-platform" in rec["details"]


def test_the_range_opens_where_the_sweep_saw_the_flaw_arrive_else_at_0(reg):
    doc = table([row("0.8.0", "failed"), row("0.9.0", "not affected"), row("1.0.0", "pre-fix"), row("1.1.0", "fixed")])
    rec = osv.record(reg.experiment("demo"), doc, {})
    assert rec["affected"][0]["ranges"][0]["events"] == [{"introduced": "1.0.0"}, {"fixed": "1.1.0"}]
    assert "lack the vulnerable path (0.9.0" in rec["details"]
    unseen = osv.record(reg.experiment("demo"), table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed")]), {})
    assert unseen["affected"][0]["ranges"][0]["events"] == [{"introduced": "0"}, {"fixed": "1.1.0"}]
    assert "the sweep did not observe when the flaw arrived" in unseen["details"]
    with pytest.raises(HarnessError, match="no release of the sweep behaves pre-fix"):
        osv.record(reg.experiment("demo"), table([row("0.9.0", "not affected"), row("1.1.0", "fixed")]), {})


def test_a_sweep_from_the_first_pd_release_opens_the_range_at_its_first_pre_fix_release(reg):
    exp = reg.experiment("demo")
    doc = table([row("0.9.0", "neither"), row("1.0.0", "pre-fix"), row("1.1.0", "fixed")])
    rec = osv.record(exp, doc, {}, pd_first="0.9.0")
    assert osv_problems(rec) == []
    assert rec["affected"][0]["ranges"][0]["events"] == [{"introduced": "1.0.0"}, {"fixed": "1.1.0"}]
    assert "probed every release from 0.9.0, the first with PD disaggregation" in rec["details"]
    later = osv.record(exp, table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed")]), {}, pd_first="0.9.0")
    assert later["affected"][0]["ranges"][0]["events"][0] == {"introduced": "0"}  # it was not probed


def test_the_record_is_a_pure_function_of_its_inputs(reg):
    doc = table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed")])
    one = json.dumps(osv.record(reg.experiment("demo"), doc, {"x": "1"}), sort_keys=True)
    assert one == json.dumps(osv.record(reg.experiment("demo"), SweepTable.from_doc(json.loads(json.dumps(doc.doc)), source="copy"), {"x": "1"}),
                             sort_keys=True)
    with pytest.raises(HarnessError, match="no as_of"):
        osv.record(reg.experiment("demo"), dataclasses.replace(doc, as_of=None), {})


def test_the_checker_catches_what_the_schema_forbids():
    good = {"id": "X-1", "modified": "2026-01-01T00:00:00Z", "affected": [
        {"package": {"ecosystem": "PyPI", "name": "p"}, "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}]}]}]}
    assert osv_problems(good) == []
    assert osv_problems({"modified": "2026-01-01T00:00:00Z"}) == [": 'id' is a required property"]
    assert osv_problems({**good, "modified": "yesterday"})
    for rng in ({"type": "RANGE", "events": [{"introduced": "0"}]}, {"type": "ECOSYSTEM", "events": []},
                {"type": "ECOSYSTEM", "events": [{"fixed": "1"}]},
                {"type": "ECOSYSTEM", "events": [{"introduced": "0", "fixed": "1"}]}):
        assert osv_problems({**good, "affected": [{**good["affected"][0], "ranges": [rng]}]}), rng
    assert osv_problems({**good, "references": [{"type": "BLOG", "url": "u"}]})
    assert osv_problems({**good, "affected": [{**good["affected"][0], "package": {"name": "p"}}]}) == [
        "affected/0/package: 'ecosystem' is a required property"]


def test_publish_writes_sweep_tables_osv_records_and_vex_covered_by_the_sums(reg, capsys):
    runs = reg.root / "runs"
    for side in ("base", "head"):
        write_cell(runs, side)
    doc = sweep_doc(reg.root)
    doc["releases"] = [row("1.0.0", "pre-fix"), row("1.1.0", "fixed")]
    write_table(runs / "sweep-demo.json", doc)
    assert cli.main(["--root", str(reg.root), "publish"]) == errors.CONFIRMED
    printed = capsys.readouterr().out
    for name in ( "results/osv/PDEVIDENCE-2026-1.json", "results/sweep-demo.json"):
        assert f"published {name}" in printed, name
    rec = json.loads((reg.root / "results" / "osv" / "PDEVIDENCE-2026-1.json").read_text())
    assert osv_problems(rec) == []
    assert rec["affected"][0]["ranges"][0]["events"] == [{"introduced": "0"}, {"fixed": "1.1.0"}]
    assert set(rec["database_specific"]["evidence_sha256"]) == {
        "results/sweep-demo.json", *(f"results/demo.{side}.release-{v}{suffix}" for side, v in
                                     (("base", "1.0.0"), ("head", "1.1.0")) for suffix in (".json", ".receipt.json"))}
    covered = integrity.covered_files(reg.root)
    assert "results/osv/PDEVIDENCE-2026-1.json" in covered
    assert integrity.problems(reg.root) == {}


def test_published_osv_records_meet_the_schema():
    published = sorted((ROOT / "results" / "osv").glob("*.json"))
    reg = registry.load(ROOT)
    assert {p.name for p in published} == {f"{osv.vuln_id(exp)}.json" for exp in reg.experiments.values()}
    for path in published:
        assert osv_problems(json.loads(path.read_text())) == [], path.name


def bisected(fix: Finding, introduced: Finding) -> BisectDocument:
    """A bisect document whose fix and introduction are ``found`` (commits f... and i...) or not, and why."""
    def boundary(which: Boundary, finding: Finding, sha: str) -> BoundaryReport:
        if finding is not Finding.FOUND:
            return BoundaryReport(which, "sweep-demo.json", finding, f"why {which.value} is {finding.value}",
                                  newest=Commit("e" * 40, "newest", "2026-08-18T09:10:54+08:00", None))
        probed = [Probed(Commit(s * 40, f"{s} (#{n})", "2026-05-20T10:00:00+08:00", n), Seen(outcome), {})
                  for s, n, outcome in ((sha, 1, which.sides[1]), ("a", 2, which.sides[0]))]
        return BoundaryReport(which, "sweep-demo.json", finding, commit=probed[0], parent=probed[1])

    return BisectDocument("demo", 1, None, boundary(Boundary.FIX, fix, "f"),
                          boundary(Boundary.INTRODUCED, introduced, "b"), (), None,
                          BisectParameters("origin/main", None, None, False, {}),
                          provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64))


GIT = {"type": "GIT", "repo": "https://github.com/sgl-project/sglang"}


@pytest.mark.parametrize(("fix", "introduced", "ranged"), [
    (Finding.FOUND, Finding.FOUND, {**GIT, "events": [{"introduced": "b" * 40}, {"fixed": "f" * 40}]}),
    (Finding.FOUND, Finding.OUTSIDE_HISTORY, {**GIT, "events": [{"introduced": "0"}, {"fixed": "f" * 40}]}),
    (Finding.OUTSIDE_HISTORY, Finding.FOUND, {**GIT, "events": [{"introduced": "b" * 40}]}),
    (Finding.OUTSIDE_HISTORY, Finding.NOT_NARROWED, None),
])
def test_a_record_gains_a_git_range_of_the_commits_the_bisection_found_and_says_why_the_others_are_not(
        reg, fix, introduced, ranged):
    doc = table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed")])
    rec = osv.record(reg.experiment("demo"), doc, {}, None, bisected(fix, introduced))
    assert osv_problems(rec) == []
    ranges = rec["affected"][0]["ranges"]
    assert ranges[0]["type"] == "ECOSYSTEM" and ranges[1:] == ([ranged] if ranged else [])
    said = rec["database_specific"]["bisect"]
    for key, finding in (("fix", fix), ("introduced", introduced)):
        if finding is Finding.FOUND:
            assert said[key]["commit"] == (("f" if key == "fix" else "b") * 40)
            assert f"{key if key == 'introduced' else 'fixed'} by {said[key]['commit'][:12]}" in rec["details"]
        else:
            assert said[key] == {"finding": finding.value, "why": f"why {key} is {finding.value}"}


def test_without_a_bisection_a_record_has_the_pypi_range_alone(reg):
    rec = osv.record(reg.experiment("demo"), table([row("1.0.0", "pre-fix"), row("1.1.0", "fixed")]), {})
    assert [r["type"] for r in rec["affected"][0]["ranges"]] == ["ECOSYSTEM"] and "bisect" not in \
        rec["database_specific"]


def test_a_gated_fixs_commit_closes_no_git_range_either(reg):
    exp = dataclasses.replace(reg.experiment("demo"), gate=registry.Gate("SGLANG_DEMO_GATE", "true", "off by default"))
    doc = table([row("1.0.0", "pre-fix"), row("1.1.0", "present but off")])
    rec = osv.record(exp, doc, {}, None, bisected(Finding.FOUND, Finding.FOUND))
    assert osv_problems(rec) == []
    assert rec["affected"][0]["ranges"][1] == {"type": "GIT", "repo": osv.REPO, "events": [{"introduced": "b" * 40}]}
    assert rec["database_specific"]["bisect"]["fix"]["commit"] == "f" * 40  # found, and said: only the range stays open
