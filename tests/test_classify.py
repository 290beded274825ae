"""The judge's classification of one tree against the published base and head, on synthetic data."""

from __future__ import annotations

from synthetic import result_doc

from pdevidence.documents.vocabulary import Behaviour, Classification
from pdevidence.judge import classify

BASE = result_doc("base", "1.0.0")
HEAD = result_doc("head", "1.1.0")
B, C = Behaviour, Classification


def release(version, d1, d3=None):
    scenarios = {"D1": d1, "D2": {"enqueued": True}}
    if d3 is not None:
        scenarios["D3"] = d3
    return result_doc("sweep", version, scenarios)


def test_releases_are_classified_by_the_scenarios_that_tell_base_from_head():
    pre = classify.classify(release("1.0.1", {"enqueued": True, "retired": False}), BASE, HEAD)
    assert (pre.classification, pre.scenarios) == (C.PRE_FIX, {"D1": B.PRE_FIX})
    assert classify.classify(release("1.2.0", {"enqueued": False, "retired": True}), BASE, HEAD).classification \
        == C.FIXED
    odd = classify.classify(release("1.3.0", {"enqueued": True, "retired": True}), BASE, HEAD)
    assert (odd.classification, odd.differing, odd.error) == (C.NEITHER, ["D1"], None)
    assert odd.to_json()["scenarios"] == {"D1": "neither"}


def test_one_scenario_that_raises_makes_a_pre_fix_release_an_error_naming_it_not_neither():
    base = result_doc("base", "1.0.0", {"D1": {"enqueued": True}, "D3": {"sent": 1}})
    head = result_doc("head", "1.1.0", {"D1": {"enqueued": False}, "D3": {"sent": 0}})
    doc = result_doc("sweep", "1.0.1", {"D1": {"enqueued": True}, "D3": {}},
                     errors={"D3": {"type": "AttributeError", "message": "no attribute 'sender'"}})
    found = classify.classify(doc, base, head)
    assert found.classification is C.ERROR
    assert found.scenarios == {"D1": B.PRE_FIX, "D3": B.ERROR}  # the others' behaviour stays beside it
    assert found.differing == ["D3"] and found.error == "D3: AttributeError: no attribute 'sender'"


def test_an_error_outranks_neither_and_partial_mixes_the_two_sides():
    assert classify.overall({"A1": B.FIXED, "A2": B.PRE_FIX}) is C.PARTIAL
    assert classify.overall({"A1": B.FIXED, "A2": B.ERROR}) is C.ERROR
    assert classify.overall({"A1": B.NEITHER, "A2": B.ERROR}) is C.ERROR
    assert classify.overall({"A1": B.FIXED, "A2": B.NEITHER}) is C.NEITHER
    assert classify.overall({}) is C.NEITHER


def test_true_is_not_the_count_1():
    base = result_doc("base", "1.0.0", {"D1": {"sent": 1}})
    head = result_doc("head", "1.1.0", {"D1": {"sent": 0}})
    doc = result_doc("sweep", "1.0.1", {"D1": {"sent": True}})
    assert classify.classify(doc, base, head).classification is C.NEITHER


def test_a_control_that_moves_does_not_decide_the_classification():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": False}
    assert classify.classify(doc, BASE, HEAD).classification == C.FIXED


def test_with_a_declared_differential_only_its_changing_scenarios_and_keys_decide(tmp_path):
    from synthetic import make_project

    from pdevidence import registry

    exp = registry.load(make_project(tmp_path)).experiment("demo")
    doc = release("0.9.0", {"enqueued": True, "retired": False, "door_check": "absent"})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": True, "backup_marker": "older layout"}
    assert classify.classify(doc, BASE, HEAD, exp).classification == C.PRE_FIX
