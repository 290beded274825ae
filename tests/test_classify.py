"""The judge's classification of one tree against the published base and head, on synthetic data."""

from __future__ import annotations

import pytest
from synthetic import OBSERVED, result_doc

from pdevidence.documents.observations import NOT_OBSERVED, Values
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


def test_an_error_outranks_neither_and_partial_mixes_the_two_sides_whatever_else_happened():
    assert classify.overall({"A1": B.FIXED, "A2": B.PRE_FIX}) is C.PARTIAL
    assert classify.overall({"A1": B.FIXED, "A2": B.ERROR}) is C.ERROR
    assert classify.overall({"A1": B.NEITHER, "A2": B.ERROR}) is C.ERROR
    assert classify.overall({"A1": B.FIXED, "A2": B.NEITHER}) is C.NEITHER
    assert classify.overall({"A1": B.FIXED, "A2": B.PRE_FIX, "A3": B.NEITHER}) is C.PARTIAL
    assert classify.overall({"A1": B.FIXED, "A2": B.PRE_FIX, "A3": B.ERROR}) is C.PARTIAL
    assert classify.overall({}) is C.NEITHER


def test_a_partial_tree_names_what_raised_and_what_matched_neither():
    base = result_doc("base", "1.0.0", {"D1": {"sent": 1}, "D3": {"sent": 1}, "D4": {"sent": 1}, "D5": {"sent": 1}})
    head = result_doc("head", "1.1.0", {"D1": {"sent": 0}, "D3": {"sent": 0}, "D4": {"sent": 0}, "D5": {"sent": 0}})
    doc = result_doc("sweep", "1.0.1", {"D1": {"sent": 0}, "D3": {"sent": 1}, "D4": {"sent": 2}, "D5": {}},
                     errors={"D5": {"type": "KeyError", "message": "'kv'"}})
    found = classify.classify(doc, base, head)
    assert found.classification is C.PARTIAL
    assert found.scenarios == {"D1": B.FIXED, "D3": B.PRE_FIX, "D4": B.NEITHER, "D5": B.ERROR}
    assert (found.differing, found.error) == (["D4", "D5"], "D5: KeyError: 'kv'")


def test_true_is_not_the_count_1():
    base = result_doc("base", "1.0.0", {"D1": {"sent": 1}})
    head = result_doc("head", "1.1.0", {"D1": {"sent": 0}})
    doc = result_doc("sweep", "1.0.1", {"D1": {"sent": True}})
    assert classify.classify(doc, base, head).classification is C.NEITHER


def test_a_fixed_tree_that_departs_from_both_sides_on_a_control_deviates_and_names_its_values():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": False}
    found = classify.classify(doc, BASE, HEAD)
    assert found.classification is C.DEVIATES
    assert found.scenarios == {"D1": B.FIXED, "D2": B.DEVIATES} and found.differing == ["D2"]
    assert found.deviations == {"D2": {"enqueued": Values(False, True, True)}}
    assert found.to_json()["deviations"] == {"D2": {"enqueued": {"tree": False, "base": True, "head": True}}}


def test_a_control_that_raises_keeps_a_tree_from_fixed_and_is_named():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"].update(observed={}, error={"type": "AttributeError", "message": "no attribute 'kv'"})
    found = classify.classify(doc, BASE, HEAD)
    assert (found.classification, found.scenarios["D2"]) == (C.ERROR, B.ERROR)
    assert found.error == "D2: AttributeError: no attribute 'kv'" and found.deviations == {}


def test_a_control_that_departs_on_a_pre_fix_tree_is_named_beside_its_answer():
    doc = release("1.0.1", {"enqueued": True, "retired": False})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": False}
    found = classify.classify(doc, BASE, HEAD)
    assert (found.classification, found.scenarios["D2"]) == (C.PRE_FIX, B.DEVIATES)
    assert found.deviations == {"D2": {"enqueued": Values(False, True, True)}}


def test_a_control_key_never_recorded_matches_neither_side_and_is_named_never_an_over_broad_fix():
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"]["observed"] = {}
    found = classify.classify(doc, BASE, HEAD)
    assert (found.classification, found.scenarios["D2"]) == (C.NEITHER, B.NEITHER)  # fixed needs the controls seen
    assert found.deviations == {} and found.unobserved == ["D2.enqueued"]
    assert found.to_json()["unobserved"] == ["D2.enqueued"]


def test_a_pristine_tree_keeps_its_bytes():
    found = classify.classify(release("1.2.0", {"enqueued": False, "retired": True}), BASE, HEAD)
    assert found.classification is C.FIXED
    assert set(found.to_json()) == {"version", "classification", "scenarios", "differing", "error"}


def test_what_kept_a_tree_from_fixed_is_each_key_beside_base_and_head():
    doc = release("1.3.0", {"enqueued": True, "retired": True})
    judged = classify.judge(doc, BASE, HEAD)
    assert judged.classification is C.NEITHER
    assert judged.explain == {"D1": {"enqueued": Values(True, True, False)}}  # retired is head's: not a reason
    pre = classify.judge(release("1.0.1", {"enqueued": True, "retired": False}), BASE, HEAD)
    assert pre.explain == {"D1": {"enqueued": Values(True, True, False), "retired": Values(False, False, True)}}
    assert classify.judge(release("1.2.0", {"enqueued": False, "retired": True}), BASE, HEAD).explain == {}


def test_with_a_declared_differential_only_its_changing_scenarios_and_keys_decide(tmp_path):
    from synthetic import make_project

    from pdevidence import registry

    exp = registry.load(make_project(tmp_path)).experiment("demo")
    doc = release("0.9.0", {"enqueued": True, "retired": False, "door_check": "absent"})
    doc["scenarios"]["D2"]["observed"] = {"enqueued": True, "backup_marker": "older layout"}
    assert classify.classify(doc, BASE, HEAD, exp).classification == C.PRE_FIX


# D3 tells too; two rules set keys aside: one where the tree has an older intake (D3 observes it),
# one on every tree. Base and head below are the synthetic pair plus D3.
SET_ASIDE = """
[experiments.demo.expect.D3]
changes = true
base = { sent = 1, status = "none", streamed = 0 }
head = { sent = 0, status = "400", streamed = 1 }

[experiments.demo.not_deciding.older_intake]
when = { "D3.intake" = "inline" }
keys = { D3 = ["status"], D1 = "all" }
why = "the older intake sets the status itself"

[experiments.demo.not_deciding.everywhere]
keys = { D3 = ["sent"] }
why = "where the chunk goes is not what the fix decides"
"""
BASE3 = result_doc("base", "1.0.0", {"D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True},
                                     "D3": {"sent": 1, "status": "none", "streamed": 0}})
HEAD3 = result_doc("head", "1.1.0", {"D1": {"enqueued": False, "retired": True}, "D2": {"enqueued": True},
                                     "D3": {"sent": 0, "status": "400", "streamed": 1}})


@pytest.fixture
def demo(tmp_path):
    from synthetic import REGISTRY, make_project

    from pdevidence import registry
    return registry.load(make_project(tmp_path, REGISTRY + SET_ASIDE)).experiment("demo")


def old_tree(d1, d3, intake="inline"):
    return result_doc("sweep", "0.9.0", {"D1": d1, "D2": {"enqueued": True}, "D3": {**d3, "intake": intake}})


def test_keys_set_aside_where_the_rule_holds_decide_nothing_there_and_the_rule_is_named(demo):
    # Pre-fix on the keys that decide (streamed), different from base on the set-aside status and sent.
    doc = old_tree({"enqueued": True, "retired": True}, {"sent": 0, "status": "400", "streamed": 0})
    found = classify.classify(doc, BASE3, HEAD3, demo)
    assert found.scenarios == {"D1": B.NOT_DECIDING, "D3": B.PRE_FIX}
    assert found.classification is C.PRE_FIX
    assert found.not_deciding == ["older_intake: the older intake sets the status itself"]  # not `everywhere`
    assert found.to_json()["not_deciding"] == found.not_deciding


def test_where_the_condition_does_not_hold_the_keys_decide_as_before(demo):
    doc = old_tree({"enqueued": True, "retired": False}, {"sent": 1, "status": "400", "streamed": 0}, intake="queue")
    found = classify.classify(doc, BASE3, HEAD3, demo)
    assert (found.classification, found.scenarios["D3"], found.not_deciding) == (C.NEITHER, B.NEITHER, [])
    assert "not_deciding" not in found.to_json()  # entries without a rule keep their bytes


def test_a_set_aside_rule_cannot_hide_a_fix_or_a_raise(demo):
    fixed = old_tree({"enqueued": False, "retired": True}, {"sent": 1, "status": "none", "streamed": 1})
    assert classify.classify(fixed, BASE3, HEAD3, demo).classification is C.FIXED
    broken = old_tree({}, {"sent": 1, "status": "none", "streamed": 0})
    broken["scenarios"]["D1"]["error"] = {"type": "KeyError", "message": "'sender'"}
    found = classify.classify(broken, BASE3, HEAD3, demo)
    assert (found.classification, found.scenarios["D1"]) == (C.ERROR, B.ERROR)


def test_a_tree_where_no_telling_scenario_decides_is_neither():
    assert classify.overall({"D1": B.NOT_DECIDING}) is C.NEITHER
    assert classify.overall({"D1": B.NOT_DECIDING, "D3": B.FIXED}) is C.FIXED


def test_a_rule_that_holds_on_an_adaptation_the_probe_ran(demo):
    from pdevidence.registry import NotDeciding
    rule = NotDeciding("retries", {"adaptation": "optimistic-prefill-retries"}, {"D3": ("status",)}, "")
    assert rule.holds({"adaptations": ["optimistic-prefill-retries"], "scenarios": {}})
    assert not rule.holds({"scenarios": {}}) and not rule.holds({"adaptations": ["other"]})
    typed = NotDeciding("typed", {"D3.sent": True}, {"D3": ("status",)}, "")
    assert not typed.holds({"scenarios": {"D3": {"observed": {"sent": 1}}}})  # True is not 1


CONTROL_ASIDE = """
[experiments.demo.not_deciding.older_queue]
when = { "D2.queue" = "list" }
keys = { D2 = ["enqueued"] }
why = "the older queue is a list the probe cannot look into"
"""


def test_a_rule_sets_a_control_key_aside_where_it_holds_and_only_there(tmp_path):
    from synthetic import REGISTRY, make_project

    from pdevidence import registry
    exp = registry.load(make_project(tmp_path, REGISTRY + CONTROL_ASIDE)).experiment("demo")
    doc = release("1.2.0", {"enqueued": False, "retired": True})
    doc["scenarios"]["D2"]["observed"] = {"queue": "list"}
    found = classify.classify(doc, BASE, HEAD, exp)
    assert (found.classification, found.scenarios) == (C.FIXED, {"D1": B.FIXED})
    assert found.not_deciding == ["older_queue: the older queue is a list the probe cannot look into"]
    doc["scenarios"]["D2"]["observed"] = {"queue": "deque", "enqueued": False}
    assert classify.classify(doc, BASE, HEAD, exp).classification is C.DEVIATES


def test_the_rejudge_script_lists_each_control_departure_with_the_rule_that_sets_it_aside(tmp_path):
    """benchmarks/rejudge_sweep.py, on a synthetic sweep: the release documents the sweep kept, its table and the
    references it names. It fails while a departure on a release has no rule, and passes once a rule holds."""
    import json
    import subprocess
    import sys

    from synthetic import REGISTRY, make_project, write_cell, write_sweep

    from pdevidence.core.paths import PROJECT
    root = make_project(tmp_path / "project")
    write_cell(root / "results", "base")
    write_cell(root / "results", "head")
    write_sweep(root / "runs" / "sweep-demo.json")
    for version, side in (("1.0.0", "base"), ("1.1.0", "head")):
        doc = result_doc("sweep", version, {**OBSERVED[side], "D2": {"enqueued": True, "queue": "list"}})
        if version == "1.0.0":
            doc["scenarios"]["D2"]["observed"]["enqueued"] = False  # the older queue: a departure
        (root / "runs" / "sweep" / f"release-{version}").mkdir(parents=True)
        (root / "runs" / "sweep" / f"release-{version}" / "demo.json").write_text(json.dumps(doc))

    def rejudge():
        return subprocess.run([sys.executable, str(PROJECT / "benchmarks" / "rejudge_sweep.py"), "--root", str(root)],
                              capture_output=True, text=True, timeout=60)

    done = rejudge()
    assert done.returncode == 1, done.stderr
    assert "D2: enqueued false: NOT SET ASIDE" in done.stdout and "1 problem(s)" in done.stdout
    (root / "experiments.toml").write_text(REGISTRY + CONTROL_ASIDE)
    done = rejudge()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "D2: enqueued false: set aside by older_queue" in done.stdout
    assert "demo       1.1.0    fixed\n" in done.stdout


# ---------------------------------------------------------------- an all-clear only from evidence

NULL_AT_HEAD = """
[experiments.demo.expect.D4]
changes = true
base = { status = 400 }
head = {}
head_null_keys = ["status"]

[experiments.demo.not_affected.no_door]
scenario = "D1"
key = "door"
value = "absent"
justification = "vulnerable_code_not_present"
why = "the door the fix guards is not in this tree"

[experiments.demo.not_deciding.older_intake]
when = { "D1.intake" = "inline" }
keys = { D4 = "all" }
why = "the older intake sets the status itself"

[experiments.demo.not_deciding.no_status]
when = { adaptation = "no-status" }
keys = { D4 = ["status"] }
why = "the tree has no status to set"
"""
BASE4 = result_doc("base", "1.0.0", {**OBSERVED["base"], "D4": {"status": 400}})
HEAD4 = result_doc("head", "1.1.0", {**OBSERVED["head"], "D4": {"status": None}})


@pytest.fixture
def nulls(tmp_path):
    from synthetic import REGISTRY, make_project

    from pdevidence import registry
    return registry.load(make_project(tmp_path, REGISTRY + NULL_AT_HEAD)).experiment("demo")


def fixed_tree(**changes):
    doc = result_doc("sweep", "1.2.0", {**OBSERVED["head"], "D4": {"status": None}})
    for sid, observed in changes.items():
        doc["scenarios"][sid]["observed"] = observed
    return doc


def test_a_key_never_recorded_is_not_the_null_a_side_observed_and_is_named(nulls):
    assert classify.classify(fixed_tree(), BASE4, HEAD4, nulls).classification is C.FIXED
    found = classify.classify(fixed_tree(D4={}), BASE4, HEAD4, nulls)
    assert (found.classification, found.scenarios["D4"]) == (C.NEITHER, B.NEITHER)
    assert found.unobserved == ["D4.status"] and found.to_json()["unobserved"] == ["D4.status"]
    judged = classify.judge(fixed_tree(D4={}), BASE4, HEAD4, nulls)
    assert judged.explain == {"D4": {"status": Values(NOT_OBSERVED, 400, None)}}


def test_a_scenario_the_tree_never_ran_matches_neither_side(nulls):
    doc = fixed_tree()
    del doc["scenarios"]["D4"]
    found = classify.classify(doc, BASE4, HEAD4, nulls)
    assert (found.classification, found.scenarios["D4"], found.unobserved) == (C.NEITHER, B.NEITHER, ["D4.status"])


def test_the_signature_of_a_key_never_recorded_equals_nothing():
    sig = classify.signature({"scenarios": {"D1": {"observed": {}}}}, {"D1": ["retired"], "D9": ["x"]})
    assert sig == {"D1": {"retired": NOT_OBSERVED}, "D9": NOT_OBSERVED}
    for side in ({"retired": None}, {"retired": False}, {"retired": NOT_OBSERVED}):
        assert not classify.matches(sig["D1"], side)
    assert Values(NOT_OBSERVED, None, None).neither() and not Values(NOT_OBSERVED, None, NOT_OBSERVED).neither()


def raising(doc, sid, error=None):
    doc["scenarios"][sid]["error"] = error or {"type": "RuntimeError", "message": "after recording"}
    return doc


def test_a_not_affected_observation_from_a_scenario_that_raised_is_no_evidence(nulls):
    absent = fixed_tree(D1={"door": "absent"})
    assert classify.classify(absent, BASE4, HEAD4, nulls).classification is C.NOT_AFFECTED
    found = classify.classify(raising(absent, "D1"), BASE4, HEAD4, nulls)
    assert found.classification is C.ERROR
    assert "rule no_door not applied: D1 raised RuntimeError: after recording" in found.error


def test_keys_set_aside_on_an_observation_from_a_scenario_that_raised_stay_decided(nulls):
    older = fixed_tree(D4={"status": 400})
    older["scenarios"]["D1"]["observed"]["intake"] = "inline"
    assert classify.classify(older, BASE4, HEAD4, nulls).classification is C.FIXED  # D4 set aside
    found = classify.classify(raising(older, "D1"), BASE4, HEAD4, nulls)
    assert found.classification is C.ERROR and found.not_deciding == []
    assert "rule older_intake not applied: D1 raised RuntimeError" in found.error


def test_an_adaptation_sets_nothing_aside_in_a_scenario_that_raised(nulls):
    adapted = fixed_tree(D4={"status": 400})
    adapted["adaptations"] = ["no-status"]
    assert classify.classify(adapted, BASE4, HEAD4, nulls).classification is C.FIXED
    found = classify.classify(raising(adapted, "D4"), BASE4, HEAD4, nulls)
    assert (found.classification, found.scenarios["D4"]) == (C.ERROR, B.ERROR)
    assert "rule no_status not applied: D4 raised RuntimeError: after recording" in found.error


def test_the_judge_reads_no_file():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(classify))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | \
        {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & {"pathlib", "io", "os", "json", "..documents.results", "..documents.references",
                           "..documents.integrity", "..documents.receipts", "..core.files"}, imported
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert not calls & {"read_text", "read_bytes", "open", "load", "exists"}, calls


# Keys both sides agree on are controls in every scenario (issue 36 item 5): D1 tells base from head on
# `enqueued`/`retired`, and both sides free 16 slots and release one row there, as O2 of offload_slots does.
LEAK_BASE = result_doc("base", "1.0.0", {"D1": {"enqueued": True, "retired": False, "freed": 16, "rows": 1},
                                         "D2": {"enqueued": True}})
LEAK_HEAD = result_doc("head", "1.1.0", {"D1": {"enqueued": False, "retired": True, "freed": 16, "rows": 1},
                                         "D2": {"enqueued": True}})


def leaking(d1):
    return result_doc("sweep", "1.2.0", {"D1": {"enqueued": False, "retired": True, **d1}, "D2": {"enqueued": True}})


@pytest.fixture
def plain(tmp_path):
    from synthetic import REGISTRY, make_project

    from pdevidence import registry
    return registry.load(make_project(tmp_path, REGISTRY)).experiment("demo")


def test_a_fix_that_never_releases_deviates_on_the_keys_both_sides_agree_on_and_names_them(plain):
    found = classify.judge(leaking({"freed": 0, "rows": 0}), LEAK_BASE, LEAK_HEAD, plain)
    assert found.classification is C.DEVIATES
    assert found.scenarios == {"D1": B.DEVIATES}
    assert found.deviations == {"D1": {"freed": Values(0, 16, 16), "rows": Values(0, 1, 1)}}
    assert classify.judge(leaking({"freed": 16, "rows": 1}), LEAK_BASE, LEAK_HEAD, plain).classification is C.FIXED


def test_a_pre_fix_tree_is_not_made_to_deviate_by_an_agreed_key_of_a_telling_scenario(plain):
    doc = leaking({"freed": 0, "rows": 1})
    doc["scenarios"]["D1"]["observed"].update(enqueued=True, retired=False)
    found = classify.judge(doc, LEAK_BASE, LEAK_HEAD, plain)
    assert (found.classification, found.scenarios) == (C.PRE_FIX, {"D1": B.PRE_FIX})


def test_an_agreed_key_the_tree_never_recorded_is_not_a_deviation_but_named_unobserved(plain):
    found = classify.judge(leaking({"freed": 16}), LEAK_BASE, LEAK_HEAD, plain)
    assert (found.classification, found.scenarios) == (C.NEITHER, {"D1": B.NEITHER})
    assert found.unobserved == ["D1.rows"] and found.deviations == {}


LEAK_ASIDE = """
[experiments.demo.expect.D1]
changes = true
base = { enqueued = true, retired = false, rows = 1 }
head = { enqueued = false, retired = true, rows = 1 }

[experiments.demo.not_deciding.older_rows]
when = { "D1.rows_layout" = "old" }
keys = { D1 = ["rows"] }
why = "the older pool releases rows elsewhere"
"""


def test_an_agreed_key_a_rule_sets_aside_is_not_judged_as_a_control(tmp_path):
    from synthetic import REGISTRY, make_project

    from pdevidence import registry
    declared = "base = { enqueued = true, retired = false }\nhead = { enqueued = false, retired = true }\n"
    text = REGISTRY.replace(f"[experiments.demo.expect.D1]\nchanges = true\n{declared}", "") + LEAK_ASIDE
    exp = registry.load(make_project(tmp_path, text)).experiment("demo")
    assert classify.telling_scenarios(LEAK_BASE, LEAK_HEAD, exp) == {"D1": ["enqueued", "retired"]}  # rows agrees
    doc = leaking({"freed": 16, "rows": 0, "rows_layout": "old"})
    found = classify.judge(doc, LEAK_BASE, LEAK_HEAD, exp)
    assert (found.classification, found.scenarios) == (C.FIXED, {"D1": B.FIXED})
    assert found.not_deciding == ["older_rows: the older pool releases rows elsewhere"]
    doc["scenarios"]["D1"]["observed"]["rows_layout"] = "new"
    assert classify.judge(doc, LEAK_BASE, LEAK_HEAD, exp).deviations == {"D1": {"rows": Values(0, 1, 1)}}


def test_the_published_base_reads_pre_fix_and_head_fixed_for_every_experiment():
    """The published sweep tables keep only behaviours, so this is what pins the new controls on real data:
    each side judged against the pair reads as itself, no agreed key departing."""
    from pathlib import Path

    from pdevidence import registry
    from pdevidence.documents import results
    from pdevidence.documents.references import expected_file

    root = Path(__file__).resolve().parent.parent
    reg = registry.load(root)
    for name, exp in reg.experiments.items():
        base, head = (results.load(root / "results" / expected_file(exp, side, "release")) for side in registry.SIDES)
        assert classify.judge(base, base, head, exp).classification is C.PRE_FIX, name
        assert classify.judge(head, base, head, exp).classification is C.FIXED, name
