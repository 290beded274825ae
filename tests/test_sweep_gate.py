"""A gated fix in the sweep: each release's own default decides whether its fixed code runs as shipped."""

from __future__ import annotations

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project, result_doc

from pdevidence import registry
from pdevidence.cells import allprobes, warm
from pdevidence.core.errors import BEHAVIOUR_DIFFERS, CONFIRMED
from pdevidence.documents import provenance
from pdevidence.documents.tables import GateDefault, SweepParameters, SweepTable, first_carrying
from pdevidence.documents.vocabulary import Classification, GateState
from pdevidence.judge.classify import as_shipped, watch_exit
from pdevidence.lanes import sweep
from pdevidence.report import narrative, timeline

C = Classification
VARIABLE = "SGLANG_DEMO_GATE"
GATED = REGISTRY + f"""
[experiments.demo.gate]
variable = "{VARIABLE}"
on = "true"
why = "the fix runs only where the server's environment sets it; off by default"
"""
GATE = registry.Gate(VARIABLE, "true", "off by default")
FIXED = result_doc("head", "1.1.0")


def record(state: str, why: str = "its default: not given") -> dict:
    """The gate's entry of probes/_serverenv.py's record."""
    return {"given": False, "on": "true", "value": state == "on", "on_value": True, "state": state, "why": why}


def outcome(doc: dict = FIXED) -> sweep.ReleaseOutcome:
    return sweep.classify(doc, result_doc("base", "1.0.0"), result_doc("head", "1.1.0"))


def test_fixed_code_whose_default_leaves_the_gate_off_is_present_but_off_naming_the_variable():
    found = as_shipped(outcome(), GATE, record("off"))
    assert found.classification is C.PRESENT_OFF
    assert found.gate == GateDefault(VARIABLE, "true", GateState.OFF)


@pytest.mark.parametrize("state", ["on", "undefined"])
def test_a_default_that_turns_the_gate_on_or_a_tree_without_the_variable_keeps_the_codes_answer(state):
    found = as_shipped(outcome(), GATE, record(state))
    assert found.classification is C.FIXED and found.gate.state is GateState(state)


@pytest.mark.parametrize("read", [record("unread", "named outside its Envs"), None], ids=["unread", "no-record"])
def test_fixed_code_whose_default_is_not_read_is_no_all_clear_but_an_error_naming_the_gate(read):
    found = as_shipped(outcome(), GATE, read)
    assert found.classification is C.ERROR and VARIABLE in found.error
    assert (read or {}).get("why", "wrote no environment record") in found.error


def test_code_that_is_not_fixed_keeps_its_class_whatever_the_default():
    pre_fix = outcome(result_doc("base", "1.0.0"))
    assert as_shipped(pre_fix, GATE, record("off")).classification is C.PRE_FIX


def table(outcomes: list[sweep.ReleaseOutcome]) -> dict:
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    return sweep.document("demo", outcomes, None, made, SweepParameters(False, False, "1.0.0", {}))


def gated(version: str, classification: Classification, state: GateState) -> sweep.ReleaseOutcome:
    return sweep.ReleaseOutcome(version, classification, gate=GateDefault(VARIABLE, "true", state))


RELEASES = [sweep.ReleaseOutcome("1.0.0", C.PRE_FIX), gated("1.1.0", C.PRESENT_OFF, GateState.OFF),
            gated("1.2.0", C.PRESENT_OFF, GateState.OFF), gated("1.3.0", C.FIXED, GateState.ON)]


def test_the_first_fixed_release_is_the_first_whose_default_turns_the_fix_on():
    assert sweep.first_fixed(RELEASES) == "1.3.0" and first_carrying(RELEASES) == "1.1.0"
    # Present but off again after a fixed release: as shipped the fix is gone again.
    later = [*RELEASES, gated("1.4.0", C.PRESENT_OFF, GateState.OFF)]
    assert sweep.regressions(later) == ["1.4.0"] and sweep.flagged(later) == ["1.4.0"]


def test_the_text_table_shows_the_class_and_a_legend_naming_the_variable():
    text = sweep.table("demo", RELEASES, {"head": "1.1.0"})
    assert f"1.1.0        present but off (fixed with {VARIABLE}=true; off by default)" in text
    assert "first fixed release: 1.3.0" in text
    assert (f"present but off: the release carries the fix, but its default leaves {VARIABLE} off, so a server run "
            f"with the defaults is exposed; set {VARIABLE}=true in the server's environment to turn it on "
            "(1.1.0, 1.2.0)") in text
    assert "present but off:" not in sweep.table("demo", RELEASES[:1], {})


def test_a_table_records_each_releases_gate_default_meets_its_schema_and_reads_back_as_written():
    doc = table(RELEASES)
    assert problems("sweep", doc) == []
    assert doc["releases"][1]["gate"] == {"variable": VARIABLE, "on": "true", "state": "off"}
    assert "gate" not in doc["releases"][0]  # an ungated outcome keeps its bytes
    assert SweepTable.from_doc(doc, source="test").releases == RELEASES


def test_the_report_names_the_class_the_releases_and_the_variable():
    doc = table(RELEASES)
    said = (f"present but off (1.1.0–1.2.0): the fix is there, but {VARIABLE} is off by default, so a server run "
            f"with the defaults is exposed; {VARIABLE}=true turns it on")
    assert said in narrative.sweep_text(doc)
    assert narrative.gated_off_text(table(RELEASES[:1])) is None
    report = {"pairs": [{"experiment": "demo", "pr": 1, "title": "t", "kind": "release", "grid": {}, "cells": {},
                         "verdict": "confirmed", "expectation_failures": []}],
              "sweeps": {"demo": doc}}
    (line,) = [v for v in timeline.timelines(report)[0].verdicts if v.startswith("release sweep")]
    assert said in line


@pytest.fixture
def reg(tmp_path):
    return registry.load(make_project(tmp_path / "project", GATED))


def test_the_sweep_reads_each_releases_gate_default_in_its_probe_process_and_classifies_by_it(reg, monkeypatch,
                                                                                              tmp_path):
    asked = {}
    defaults = {"1.1.0": "off", "1.2.0": "on"}

    class Release:  # a release tree as the engine sees it
        def __init__(self, version):
            self.resolved = version

        def label(self):
            return f"release-{self.resolved}"

    def probe(reg, trees, experiments, tree_args, **kw):  # the engine: what each probe process is given
        asked.update({t.resolved: tree_args[t.label()] for t in trees})
        return {t.label(): {"demo": allprobes.Outcome("demo", result_doc("head", t.resolved))} for t in trees}

    monkeypatch.setattr(sweep.trees, "index_files", lambda project: [])
    monkeypatch.setattr(sweep.trees, "release_tree", lambda version, python, lock: Release(version))
    monkeypatch.setattr(sweep, "references", lambda reg, exp, published, fresh=False: sweep.References(
        {"base": result_doc("base", "1.0.0"), "head": result_doc("head", "1.1.0")}, {}))
    monkeypatch.setattr(sweep.warm, "probe_trees", probe)
    monkeypatch.setattr(sweep, "_read", lambda out, gates: {"gates": {VARIABLE: record(defaults[out.name[8:]])}}
                        if gates else None)
    found, _, _ = sweep.sweep(reg, ["demo"], published=tmp_path, out_dir=tmp_path, versions=list(defaults))
    assert {v: args[warm.SERVER_GATES] for v, args in asked.items()} == {v: f'{{"{VARIABLE}": "true"}}'
                                                                         for v in defaults}
    assert [(o.version, o.classification) for o in found["demo"]] == [("1.1.0", C.PRESENT_OFF), ("1.2.0", C.FIXED)]


def test_an_ungated_sweep_asks_its_probe_processes_for_no_gate(tmp_path):
    ungated = registry.load(make_project(tmp_path / "ungated"))
    assert sweep.gate_args(ungated, ["demo"]) == {}


def test_a_sweep_whose_releases_carry_the_fix_only_off_by_default_confirms_where_it_is():
    assert watch_exit(RELEASES[:3]) == CONFIRMED and sweep.first_fixed(RELEASES[:3]) is None
    assert watch_exit(RELEASES[:1]) == BEHAVIOUR_DIFFERS
