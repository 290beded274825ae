"""The JSON Schemas describe every document we publish or ship as a fixture, and reject broken ones."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import report_data
import synthetic
from schemas import problems

from pdevidence.core.paths import PROJECT
from pdevidence.documents.bisects import (BisectDocument, BisectParameters, BoundaryReport, Line, Probed, Seen,
                                          WatchReport)
from pdevidence.documents.observations import NOT_OBSERVED, Values
from pdevidence.documents.provenance import Provenance
from pdevidence.documents.tables import MutationParameters, MutationTable, ReleaseOutcome, SweepParameters
from pdevidence.documents.upstream_model import Outcome, Subtest, TestEntry, UpstreamResult
from pdevidence.documents.vocabulary import Behaviour, Boundary, Classification, CommitOutcome, Finding
from pdevidence.lanes import check, sweep
from pdevidence.sources.history import Commit

RESULTS = PROJECT / "results"


def kind_of(path: Path) -> str:
    """Which schema a file under results/ follows, by its name."""
    name = path.name
    if path.parent.name == "osv":
        return "osv-1.6"
    if name.startswith("openvex-"):
        return "openvex-0.2.0"
    for prefix, kind in (("sweep-", "sweep"), ("mutate.", "mutation"), ("report.", "report"), ("corpus.", "corpus"),
                         ("bisect-", "bisect")):
        if name.startswith(prefix):
            return kind
    return "receipt" if name.endswith(".receipt.json") else "result"


PUBLISHED = sorted(RESULTS.rglob("*.json"))


def test_every_kind_of_published_document_is_covered():
    assert {kind_of(p) for p in PUBLISHED} == {"osv-1.6", "openvex-0.2.0", "sweep", "mutation", "report", "receipt",
                                                 "result", "corpus", "bisect"}


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_every_published_document_meets_its_schema(path):
    assert problems(kind_of(path), json.loads(path.read_text())) == []


def _upstream() -> dict:
    sub = Subtest("case", {"n": 1}, Outcome.FAILED, "AssertionError")
    tests = [TestEntry("test/unit/t.py::T::test_a", Outcome.FAILED, "call", "AssertionError", (sub,)),
             TestEntry("test/unit/t.py::T::test_b", Outcome.PASSED, None, None, ())]
    return UpstreamResult("demo", "base", {"kind": "release", "ref": "1.0.0", "resolved": "1.0.0"},
                          {"test/unit/t.py": "0" * 64}, tests).to_json()


def _check() -> dict:
    found = check.ExperimentCheck("demo", 1, check.Status.PARTIAL, {"D1": Behaviour.FIXED, "D2": Behaviour.PRE_FIX},
                                  ["D2"], "f" * 64, explain={"D2": {"sent": Values(1, 1, 0)}})
    cannot = check.ExperimentCheck("other", 2, check.Status.CANNOT_RUN, error="ImportError: no sglang")
    over_broad = check.ExperimentCheck("third", 3, check.Status.DEVIATES,
                                       {"D1": Behaviour.FIXED, "C1": Behaviour.DEVIATES}, ["C1"], "f" * 64,
                                       explain={"C1": {"retired": Values(True, False, False),
                                                       "held": Values(NOT_OBSERVED, 7, 7)}})
    return check.CheckResult(check.Target("release", "1.0.0", "1.0.0", "a" * 64), [found, cannot, over_broad],
                             "1.0.0").to_json()


MADE = Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)


def _bisect() -> dict:
    def probed(sha: str, outcome: CommitOutcome, subject: str = "work") -> Probed:
        return Probed(Commit(sha * 40, subject, "2026-05-20T10:00:00+08:00", None), Seen(outcome),
                      {"D1": Behaviour.FIXED if outcome is CommitOutcome.FIXED else Behaviour.PRE_FIX})

    fix, parent = probed("b", CommitOutcome.FIXED, "fix (#1)"), probed("a", CommitOutcome.PRE_FIX)
    line = Line("origin/main", "v1.0.0", "0" * 40, "v1.1.0", "c" * 40, 12)
    found = BoundaryReport(Boundary.FIX, "sweep-demo.json: last pre-fix 1.0.0, first fixed 1.1.0", Finding.FOUND,
                           line=line, commit=fix, parent=parent, steps=(fix, parent))
    outside = BoundaryReport(Boundary.INTRODUCED, "sweep-demo.json", Finding.OUTSIDE_HISTORY, "no tag of 0.9.0",
                             newest=Commit("d" * 40, "newest", "2026-08-18T09:10:54+08:00", 2))
    walked = (parent, probed("e", CommitOutcome.SKIPPED))
    watch = WatchReport(dataclasses.replace(line, paths=("python/sglang/a.py",), left_out=3), walked, None, walked[1:])
    return BisectDocument("demo", 1, "b" * 40, found, outside, ("a note",), watch,
                          BisectParameters("origin/main", None, None, True, {"sweep-demo.json": "1" * 64}),
                          MADE).to_json()
FIXTURES = {
    "result": lambda: synthetic.result_doc("base", "1.0.0", {"D1": {"enqueued": True}}),
    "sweep v1": lambda: report_data.sweep_v1(),
    "sweep v2": lambda: report_data.sweep_v2(),
    "sweep v3": lambda: report_data.sweep_v3(),
    "sweep": lambda: synthetic.SWEEP,
    "sweep as the lane writes it": lambda: sweep.document("demo", [
        ReleaseOutcome("1.0.0", Classification.PRE_FIX, {"D1": Behaviour.PRE_FIX}),
        ReleaseOutcome("1.1.0", Classification.FIXED, {"D1": Behaviour.FIXED}),
        ReleaseOutcome("1.2.0", Classification.ERROR, {"D1": Behaviour.ERROR}, ["D1"], "D1: KeyError: 'x'"),
        ReleaseOutcome("1.3.0", Classification.DEVIATES, {"D1": Behaviour.FIXED, "D2": Behaviour.DEVIATES}, ["D2"],
                       deviations={"D2": {"enqueued": Values(False, True, True)}}),
        ReleaseOutcome("1.4.0", Classification.CANNOT_RUN, error="AttributeError: no hip", declared="no GPU"),
        ReleaseOutcome("1.5.0", Classification.FIXED, {"D1": Behaviour.FIXED}, declared="no GPU")],
        None, MADE, SweepParameters(explicit=False, pre=False, floor="1.0.0", references={})),
    "mutation as the lane writes it": lambda: dataclasses.replace(
        MutationTable.from_doc(synthetic.MUTATIONS, source="v1"), provenance=MADE,
        parameters=MutationParameters(["M1"])).to_json(),
    "mutation": lambda: synthetic.MUTATIONS,
    "mutation report data": lambda: report_data.mutations(),
    "report": lambda: report_data.full_document(),
    "check": _check,
    "upstream": _upstream,
    "bisect as the lane writes it": _bisect,
}


@pytest.mark.parametrize("name", FIXTURES)
def test_the_test_fixtures_and_what_the_code_writes_meet_the_schemas(name):
    assert problems(name.split()[0], FIXTURES[name]()) == []


@pytest.mark.parametrize(("kind", "breaks"), [
    ("result", lambda d: d.pop("scenarios")),
    ("result", lambda d: d["scenarios"]["D1"].pop("error")),
    ("sweep", lambda d: d["releases"][0].update(classification="mostly")),
    ("sweep", lambda d: d.pop("regressions")),
    ("sweep", lambda d: d.update(schema="pdevidence-sweep/3")),  # /3 without its release watch list
    ("mutation", lambda d: d.update(schema="pdevidence-mutate/2")),  # /2 without both kill counts
    ("mutation", lambda d: d["mutants"][0].update(status="wounded")),
    ("report", lambda d: d["pairs"][0].update(verdict="probably")),
    ("check", lambda d: d["experiments"][0].update(status="fine")),
    ("check", lambda d: d["experiments"][0].pop("explain")),
    ("check", lambda d: d["experiments"][0]["explain"]["D2"]["sent"].update(published=1)),
    ("check", lambda d: d.update(schema="pdevidence-check/1")),
    ("sweep", lambda d: d["releases"][0].update(deviations={"D2": {"enqueued": {"tree": 1, "mutant": 0}}})),
    ("upstream", lambda d: d["tests"][0].pop("nodeid")),
    ("bisect", lambda d: d["fix"].update(finding="probably")),
    ("bisect", lambda d: d["fix"]["steps"][0].update(sha="abc")),
    ("bisect", lambda d: d.update(seconds=361.7)),  # no time in the published bytes
])
def test_a_broken_document_is_rejected(kind, breaks):
    doc = {"result": FIXTURES["result"], "sweep": lambda: json.loads(json.dumps(synthetic.SWEEP)),
           "mutation": lambda: json.loads(json.dumps(synthetic.MUTATIONS)), "report": FIXTURES["report"],
           "check": _check, "upstream": _upstream, "bisect": _bisect}[kind]()
    breaks(doc)
    assert problems(kind, doc)


def test_openvex_rules_beyond_field_types():
    doc = json.loads((RESULTS / "openvex-sglang-0.5.20.json").read_text())
    affected = next(s for s in doc["statements"] if s["status"] == "affected")
    affected.pop("action_statement")
    assert problems("openvex-0.2.0", doc) == [f"statements/{doc['statements'].index(affected)}: "
                                              "'action_statement' is a required property"]
    affected.update(status="not_affected")
    assert problems("openvex-0.2.0", doc)  # needs a justification or an impact statement
    affected.update(justification="vulnerable_code_not_present")
    assert problems("openvex-0.2.0", doc) == []
