"""An all-clear only from evidence: every rule of the real registry, and every fixed path, against broken observations.

For each `not_affected` rule, each `not_deciding` rule and each key that makes a published head release fixed,
the observation it rests on is broken the three ways a probe can break it: the scenario raised after recording
the key, the key was never recorded, or it was recorded as another type. The answer must never be an all-clear
(not affected, fixed): `check` says unknown (or affected), the sweep an error or neither. The rules are read from
experiments.toml and the inputs are the published result documents (copied and changed in memory), so a new rule
or scenario is covered without a new test.
"""

from __future__ import annotations

import copy
import json

import pytest

from pdevidence import registry
from pdevidence.cells.allprobes import Outcome
from pdevidence.core.paths import PROJECT
from pdevidence.documents.references import expected_file
from pdevidence.documents.vocabulary import Classification
from pdevidence.judge import classify
from pdevidence.lanes import check
from pdevidence.lanes.check import Status

REG = registry.load(PROJECT)
ALL_CLEAR = (Status.FIXED, Status.NOT_AFFECTED)
RAISED = {"type": "RuntimeError", "message": "raised after recording"}


def published(exp: registry.Experiment) -> tuple[dict, dict]:
    return tuple(json.loads((PROJECT / "results" / expected_file(exp, side, "release")).read_text())
                 for side in registry.SIDES)


REFS = {name: published(exp) for name, exp in REG.experiments.items()}


def answer(exp: registry.Experiment, doc: dict) -> check.ExperimentCheck:
    """check's answer, after checking the sweep's judge agrees it is (or is not) an all-clear."""
    base, head = REFS[exp.name]
    found = check.judge(exp, Outcome(exp.name, doc, "0" * 64), base, head)
    swept = classify.classify(doc, base, head, exp).classification
    assert (found.status in ALL_CLEAR) is (swept in (Classification.FIXED, Classification.NOT_AFFECTED))
    return found


def retyped(value):
    """The same observation as another JSON type: True as 1, 0 as "0", "absent" as ["absent"], null as 0."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return str(value)
    if value is None:
        return 0
    return [value] if isinstance(value, str) else json.dumps(value)


def raise_in(doc: dict, sid: str) -> dict:
    doc["scenarios"][sid]["error"] = dict(RAISED)
    return doc


def drop(doc: dict, sid: str, key: str) -> dict:
    del doc["scenarios"][sid]["observed"][key]
    return doc


def retype(doc: dict, sid: str, key: str) -> dict:
    observed = doc["scenarios"][sid]["observed"]
    observed[key] = retyped(observed[key])
    return doc


BREAKS = ("raised", "missing", "retyped")


def broken(doc: dict, how: str, sid: str, key: str) -> dict:
    return {"raised": lambda: raise_in(doc, sid), "missing": lambda: drop(doc, sid, key),
            "retyped": lambda: retype(doc, sid, key)}[how]()


def assert_not_all_clear(exp: registry.Experiment, doc: dict, how: str, sid: str) -> check.ExperimentCheck:
    found = answer(exp, doc)
    assert found.status not in ALL_CLEAR, (found.status, found.error, found.unobserved)
    if how == "raised":  # the scenario and what it raised are named
        assert found.status is Status.UNKNOWN and f"{sid}" in found.error and RAISED["message"] in found.error
    return found


# ---------------------------------------------------------------- not_affected rules

NOT_AFFECTED = [(exp, rule) for exp in REG.experiments.values() for rule in exp.not_affected.values()]


def absent_tree(exp: registry.Experiment, rule: registry.NotAffected) -> dict:
    """The base release as a tree without the vulnerable path records itself: each scenario only that fact."""
    doc = copy.deepcopy(REFS[exp.name][0])
    doc.pop("adaptations", None)
    for scenario in doc["scenarios"].values():
        scenario.update(observed={rule.key: rule.value}, error=None)
    return doc


@pytest.mark.parametrize("how", BREAKS)
@pytest.mark.parametrize("exp, rule", NOT_AFFECTED, ids=[f"{e.name}.{r.id}" for e, r in NOT_AFFECTED])
def test_a_not_affected_rule_stands_only_on_a_clean_recorded_observation(exp, rule, how):
    assert answer(exp, absent_tree(exp, rule)).status is Status.NOT_AFFECTED  # what is broken below
    found = assert_not_all_clear(exp, broken(absent_tree(exp, rule), how, rule.scenario, rule.key), how,
                                 rule.scenario)
    if how == "raised":
        assert f"rule {rule.id} not applied" in found.error


def test_the_not_affected_rules_name_scenarios_the_published_results_run():
    for exp, rule in NOT_AFFECTED:
        assert all(rule.scenario in doc["scenarios"] for doc in REFS[exp.name]), (exp.name, rule.id)


# ---------------------------------------------------------------- not_deciding rules

NOT_DECIDING = [(exp, rule) for exp in REG.experiments.values() for rule in exp.not_deciding.values()]
HOSTILE = "a value neither side observes"


def _when(rule: registry.NotDeciding) -> list[tuple[str, str, object]]:
    return [(*name.split(".", 1), value) for name, value in rule.when.items() if name != "adaptation"]


def fixed_only_by(exp: registry.Experiment, rule: registry.NotDeciding) -> dict:
    """The head release where ``rule`` holds, with every key it sets aside at a value that matches neither side:
    fixed only because the rule sets them aside."""
    doc = copy.deepcopy(REFS[exp.name][1])
    for sid, key, value in _when(rule):
        doc["scenarios"][sid]["observed"][key] = value
    if "adaptation" in rule.when:
        doc["adaptations"] = sorted({*doc.get("adaptations", ()), rule.when["adaptation"]})
    conditions = {(sid, key) for sid, key, _ in _when(rule)}
    for sid, keys in rule.keys.items():
        expect = exp.expect[sid]
        for key in keys if keys is not None else sorted(set(expect.base) | set(expect.head)):
            if (sid, key) not in conditions:
                doc["scenarios"][sid]["observed"][key] = HOSTILE
    return doc


@pytest.mark.parametrize("exp, rule", NOT_DECIDING, ids=[f"{e.name}.{r.id}" for e, r in NOT_DECIDING])
def test_keys_set_aside_in_a_scenario_that_raised_are_no_all_clear(exp, rule):
    assert answer(exp, fixed_only_by(exp, rule)).status is Status.FIXED  # what is broken below
    for sid in rule.keys:
        assert_not_all_clear(exp, raise_in(fixed_only_by(exp, rule), sid), "raised", sid)


CONDITIONS = [(exp, rule, sid, key) for exp, rule in NOT_DECIDING for sid, key, _ in _when(rule)]


@pytest.mark.parametrize("how", BREAKS)
@pytest.mark.parametrize("exp, rule, sid, key", CONDITIONS,
                         ids=[f"{e.name}.{r.id}.{s}.{k}" for e, r, s, k in CONDITIONS])
def test_a_not_deciding_rule_holds_only_on_a_clean_recorded_observation(exp, rule, sid, key, how):
    found = assert_not_all_clear(exp, broken(fixed_only_by(exp, rule), how, sid, key), how, sid)
    if how == "raised":
        assert f"rule {rule.id} not applied: {sid} raised" in found.error


ADAPTED = [(exp, rule) for exp, rule in NOT_DECIDING if "adaptation" in rule.when]


@pytest.mark.parametrize("exp, rule", ADAPTED, ids=[f"{e.name}.{r.id}" for e, r in ADAPTED])
def test_an_adaptation_rule_holds_only_where_the_probe_named_it_and_its_scenarios_ran_clean(exp, rule):
    doc = fixed_only_by(exp, rule)
    doc["adaptations"].remove(rule.when["adaptation"])
    assert answer(exp, doc).status not in ALL_CLEAR
    sid = next(iter(rule.keys))
    found = answer(exp, raise_in(fixed_only_by(exp, rule), sid))
    assert found.status is Status.UNKNOWN and f"rule {rule.id} not applied: {sid} raised" in found.error


# ---------------------------------------------------------------- every fixed path


def deciding_keys(exp: registry.Experiment) -> list[tuple[str, str]]:
    """Every key that decides on the published head release: the telling scenarios' and the controls'."""
    base, head = REFS[exp.name]
    rules = classify.not_deciding(head, exp)
    scenarios = {**classify.deciding_here(classify.telling_scenarios(base, head, exp), rules),
                 **classify.deciding_here(classify.control_scenarios(base, head, exp), rules)}
    return [(sid, key) for sid, keys in scenarios.items() for key in keys or ()]


FIXED_PATHS = [(exp, sid, key) for exp in REG.experiments.values() for sid, key in deciding_keys(exp)]


def test_every_published_head_release_is_fixed_as_published():
    for exp in REG.experiments.values():
        assert answer(exp, copy.deepcopy(REFS[exp.name][1])).status is Status.FIXED, exp.name


@pytest.mark.parametrize("how", BREAKS)
@pytest.mark.parametrize("exp, sid, key", FIXED_PATHS, ids=[f"{e.name}.{s}.{k}" for e, s, k in FIXED_PATHS])
def test_fixed_needs_every_deciding_key_recorded_clean_and_as_the_head_recorded_it(exp, sid, key, how):
    found = assert_not_all_clear(exp, broken(copy.deepcopy(REFS[exp.name][1]), how, sid, key), how, sid)
    if how == "missing":
        assert f"{sid}.{key}" in found.unobserved and found.status is Status.UNKNOWN
