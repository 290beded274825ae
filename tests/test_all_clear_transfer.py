"""The all-clear rules the abort-mid-transfer experiments added (abort_notify, deferred_release,
deferred_release_nixl, issue 36), each against the observations that need it.

test_all_clear.py breaks every rule's observations generically; here each rule is named, and a tree as its
``why`` describes (the published head release, with the scenarios the rule speaks of as the tree that needs it
records them) must read fixed through that rule, and not without it: a rule taken out of experiments.toml
fails its case. Then the server's side: a gated fix present but off is never an all-clear; a backend the
server does not use reads not affected only from an established value; a backend no probe covers is named
outside the probes and never answered by another's code.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from test_all_clear import ALL_CLEAR, REFS, REG, answer, raise_in

from pdevidence.core.arguments import ServerArguments
from pdevidence.documents.vocabulary import Classification, GateState
from pdevidence.judge import classify
from pdevidence.lanes import check
from pdevidence.lanes.check import Status
from pdevidence.registry import Experiment, Justification

class Only(dict):
    """A scenario's whole observation: the tree recorded nothing else there."""


# 0.5.21's observations where they differ from 0.5.19's (the published head): the tree the rules were made for.
DEFERRED_ON_BY_DEFAULT = {"abort_sent": 1, "double_freed": 0, "freed_before_last_write": 0, "freed_total": 8,
                          "gate_default_on": True, "meta_freed": 1, "meta_freed_before_last_write": 0,
                          "written_after_free": 0, "written_into_other": 0}
NIXL_ON_BY_DEFAULT = {"acks_at_abort": 1, "acks_sent": 1, "acks_while_writing": 0, "deferred_enabled": True,
                      "targets_held": 0, "worker_error": None, "writes": 0, "writes_after_ack": 0}
SETTLED = {"acks_sent": 1, "acks_while_writing": 0, "siblings_settled": True, "targets_held": 0,
           "worker_error": "RuntimeError", "writes": 2, "writes_after_ack": 0}

# 0.4.8's N4: the chunks queued when the wait should have run out land in pages the decode still holds.
STILL_WAITING = {"abort_acks": 0, "abort_max_per_rank": 0, "abort_ranks": 0, "abort_sent": 0, "chunks_after_abort": 2,
                 "chunks_written": 3, "decode_poll": "WaitingForInput", "pages_after_abort": 4, "prefill_failed": 0,
                 "room_status": "Success", "timeout_poll": "WaitingForInput", "tree_error": None}

RECEIVER_ABORTS = ("N1", "N2", "N3", "N6", "N7", "N8", "N10")
DECODE_ABORTS = ("D1", "D2", "D3", "D4", "D5", "D6", "D7", "D8", "P1", "P2")
NIXL_HANDLER = ("X1", "X2", "X3", "X4", "X5", "X6", "X7", "X8")

# rule -> (the scenarios as a tree that needs it records them, the same with the rule's condition not met)
RULES = {
    ("abort_notify", "unarmed_abort_unacked"): (  # 0.5.22: N8's receiver never published, so it is never acked
        {"N1": {"aborts_armed": 1}, "N8": {"abort_acks": 0}},
        {"N1": {"aborts_armed": 0}, "N8": {"abort_acks": 0}}),
    ("deferred_release", "prefill_not_told"): (  # a port of #35049 before #27372: no prefill rank handles ABORT
        {"P1": Only(abort_handled="absent"), "P2": Only(abort_handled="absent")},
        {"P2": Only(abort_handled="absent")}),  # P1 handles it: P2 recorded no ack at all
    ("deferred_release", "no_abort_notification"): (  # the same port: decode tells no prefill rank
        {sid: {"abort_sent": 0} for sid in ("D1", "D2", "D3", "D8")},
        {sid: {"abort_sent": 0} for sid in ("D2", "D3", "D8")}),
    ("deferred_release", "deferred_on_by_default"): (  # 0.5.21: D8, the gate unset, holds as D1 does
        {"D8": DEFERRED_ON_BY_DEFAULT},
        {"D8": {**DEFERRED_ON_BY_DEFAULT, "gate_default_on": False}}),  # the gate_ignored mutant: over-broad
    ("deferred_release", "failures_held_too"): (  # 0.5.21: a prefill-reported failure is held for the acks too
        {"D6": {"abort_sent": 1, "double_freed": 0, "freed_at_failure": 0, "freed_total": 0, "meta_freed": 0}},
        {"D6": {"abort_sent": 0, "double_freed": 0, "freed_at_failure": 0, "freed_total": 0, "meta_freed": 0}}),
    ("deferred_release_nixl", "deferred_on_by_default"): (  # 0.5.21: X7, the gate unset, acks as with it set
        {"X7": NIXL_ON_BY_DEFAULT},
        {"X7": {**NIXL_ON_BY_DEFAULT, "deferred_enabled": False}}),
    ("deferred_release_nixl", "error_path_settles"): (  # 0.5.21: the error path acks once the siblings landed
        {"X4": SETTLED, "X5": SETTLED},
        {"X4": SETTLED, "X5": {**SETTLED, "siblings_settled": False}}),
    # Old layouts (the rules set aside what such a tree cannot run; what is left must still decide, as the head's)
    ("abort_notify", "no_receiver_abort"): (  # 0.4.9.post1-0.4.9.post4: no abort(), only N4's timeout decides
        {sid: Only(receiver_abort="absent") for sid in RECEIVER_ABORTS},
        {sid: Only(receiver_abort="absent") for sid in RECEIVER_ABORTS if sid != "N1"}),
    ("deferred_release", "no_receiver_abort"): (  # 0.4.9.post1-0.4.9.post4: no abort(), D9's timeout decides
        {sid: Only(receiver_abort="absent") for sid in DECODE_ABORTS},
        {sid: Only(receiver_abort="absent") for sid in DECODE_ABORTS if sid != "D1"}),
    ("abort_notify", "no_waiting_timeout"): (  # 0.4.5.post1-0.4.9: N4's poll past the wait still waits
        {"N4": STILL_WAITING},
        {"N4": {**STILL_WAITING, "timeout_poll": "Failed", "decode_poll": "Failed"}}),
    ("abort_notify", "no_prefill_stages"): (  # 0.4.9.post5-0.4.10.post2: one prefill rank per TP rank
        {"N6": Only(stages_bootstrapped=1)},
        {"N6": Only(stages_bootstrapped=2)}),
    ("deferred_release_nixl", "no_abort_handler"): (  # up to 0.5.15: no ABORT handler, X9's loop decides
        {sid: Only(nixl_abort_handler="absent") for sid in NIXL_HANDLER},
        {sid: Only(nixl_abort_handler="absent") for sid in NIXL_HANDLER if sid != "X1"}),
}

TRANSFER = ("abort_notify", "deferred_release", "deferred_release_nixl")


def observing(exp: Experiment, scenarios: dict[str, dict]) -> dict:
    """The published head release, with these scenarios' observations changed (or replaced) as given."""
    doc = copy.deepcopy(REFS[exp.name][1])
    for sid, observed in scenarios.items():
        if isinstance(observed, Only):
            doc["scenarios"][sid]["observed"] = dict(observed)
        else:
            doc["scenarios"][sid]["observed"].update(observed)
    return doc


def without(exp: Experiment, rule: str) -> Experiment:
    return dataclasses.replace(exp, not_deciding={k: v for k, v in exp.not_deciding.items() if k != rule})


def test_every_not_deciding_rule_of_the_transfer_experiments_has_its_case_here():
    declared = {(name, rule) for name in TRANSFER for rule in REG.experiments[name].not_deciding}
    assert declared == set(RULES)


@pytest.mark.parametrize(("name", "rule"), RULES, ids=[f"{n}.{r}" for n, r in RULES])
def test_a_tree_the_rule_was_made_for_reads_fixed_through_it_and_not_without_it(name, rule):
    exp, (needs_it, _) = REG.experiments[name], RULES[name, rule]
    found = answer(exp, observing(exp, needs_it))
    assert found.status is Status.FIXED and any(line.startswith(f"{rule}:") for line in found.not_deciding)
    assert answer(without(exp, rule), observing(exp, needs_it)).status not in ALL_CLEAR


@pytest.mark.parametrize(("name", "rule"), RULES, ids=[f"{n}.{r}" for n, r in RULES])
def test_where_the_rules_condition_does_not_hold_it_sets_nothing_aside(name, rule):
    exp, (_, condition_unmet) = REG.experiments[name], RULES[name, rule]
    found = answer(exp, observing(exp, condition_unmet))
    assert found.status not in ALL_CLEAR
    assert not any(line.startswith(f"{rule}:") for line in found.not_deciding)


def test_a_settling_error_path_that_acks_while_a_write_still_lands_is_never_an_all_clear():
    """error_path_settles sets aside only the ack the settled error path sends: an ack while a sibling write still
    lands is what #35360 prevents, and decides on every tree."""
    exp = REG.experiments["deferred_release_nixl"]
    early = {**SETTLED, "acks_while_writing": 1}
    assert answer(exp, observing(exp, {"X4": early, "X5": SETTLED})).status not in ALL_CLEAR


# ---------------------------------------------------------------- the gate


GATED = [name for name in TRANSFER if REG.experiments[name].gate is not None]
# Trees whose code reads fixed with the gate on: the published head, and each tree a rule was made for.
FIXED_CODE = [(name, None) for name in GATED] + [(name, rule) for name, rule in RULES if name in GATED]


def gate_read(exp: Experiment, state: GateState) -> dict:
    """The gate's entry in the probe process's environment record (probes/_serverenv.py), at the tree's default."""
    return {"given": False, "on": exp.gate.on, "value": state is GateState.ON, "state": state.value,
            "why": "its default: not given"}


def code_doc(exp: Experiment, rule: str | None) -> dict:
    return observing(exp, RULES[exp.name, rule][0] if rule else {})


def test_the_deferred_release_experiments_are_gated_by_their_variable():
    assert {name: REG.experiments[name].gate.variable for name in GATED} == {
        "deferred_release": "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
        "deferred_release_nixl": "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"}


@pytest.mark.parametrize(("name", "rule"), FIXED_CODE, ids=[f"{n}.{r or 'head'}" for n, r in FIXED_CODE])
def test_fixed_code_behind_a_gate_the_default_leaves_off_is_affected_never_an_all_clear(name, rule):
    exp = REG.experiments[name]
    doc = code_doc(exp, rule)
    outcome = check.allprobes.Outcome(name, doc, "0" * 64)
    base, head = REFS[name]
    found = {state: check.judge(exp, outcome, base, head,
                                environment=check.Environment(None, gates={exp.gate.variable: gate_read(exp, state)}))
             for state in GateState}
    assert {state: f.status for state, f in found.items()} == {
        GateState.ON: Status.FIXED, GateState.UNDEFINED: Status.FIXED,  # on, or a tree without the variable
        GateState.OFF: Status.AFFECTED,  # present but off
        GateState.UNREAD: Status.UNKNOWN}  # how the tree reads it is not known: no all-clear
    off = found[GateState.OFF]
    assert off.gated_off and off.deciding == [] and f"{exp.gate.variable}={exp.gate.on}" in off.gate.describe()
    # The sweep reads the release as it ships the same way.
    swept = classify.classify(doc, base, head, exp)
    assert classify.as_shipped(swept, exp.gate, gate_read(exp, GateState.OFF)).classification \
        is Classification.PRESENT_OFF
    assert classify.as_shipped(swept, exp.gate, None).classification is Classification.ERROR


@pytest.mark.parametrize("name", GATED)
def test_a_gate_off_leaves_pre_fix_code_affected_and_a_raised_scenario_unknown(name):
    exp = REG.experiments[name]
    base, head = REFS[name]
    off = check.Environment(None, gates={exp.gate.variable: gate_read(exp, GateState.OFF)})
    for doc, status in ((copy.deepcopy(base), Status.AFFECTED),
                        (raise_in(copy.deepcopy(head), next(iter(exp.expect))), Status.UNKNOWN)):
        found = check.judge(exp, check.allprobes.Outcome(name, doc, "0" * 64), base, head, environment=off)
        assert found.status is status and not found.gated_off


# ---------------------------------------------------------------- the transfer backend

BACKEND = "disaggregation_transfer_backend"
BACKEND_NEEDED = {name: REG.experiments[name].needs.server_args[BACKEND] for name in TRANSFER}


def decode_server(backend, *, established: bool = True) -> check.Configuration:
    given = ServerArguments(("--disaggregation-mode", "decode", "--disaggregation-transfer-backend", str(backend)),
                            "--server-args")
    if not established:  # the tree's resolution did not run through: it may still rewrite the value
        return check.Configuration(given, {"disaggregation_mode": "decode"},
                                   {BACKEND: "the tree's resolution stopped before it"})
    return check.Configuration(given, {"disaggregation_mode": "decode", BACKEND: backend})


def judged(name: str, side: str, configuration: check.Configuration) -> check.ExperimentCheck:
    exp = REG.experiments[name]
    base, head = REFS[name]
    doc = copy.deepcopy(base if side == "base" else head)
    return check.judge(exp, check.allprobes.Outcome(name, doc, "0" * 64), base, head, configuration)


def test_each_transfer_experiment_covers_the_backend_its_probe_drives():
    assert BACKEND_NEEDED == {"abort_notify": ("mooncake",), "deferred_release": ("mooncake",),
                              "deferred_release_nixl": ("nixl",)}


@pytest.mark.parametrize("name", TRANSFER)
def test_pre_fix_code_on_a_backend_the_server_does_not_use_is_not_affected_resting_on_that_value(name):
    other = "nixl" if BACKEND_NEEDED[name] == ("mooncake",) else "mooncake"
    found = judged(name, "base", decode_server(other))
    assert found.status is Status.NOT_AFFECTED and found.rests_on_configuration
    assert found.justification == Justification.NOT_IN_EXECUTE_PATH.value
    assert found.config.code_status is Status.AFFECTED  # the code's own answer, kept beside
    assert f'{BACKEND} = "{other}"' in found.evidence[0]
    # The backend it covers enters the path: the code answers.
    assert judged(name, "base", decode_server(BACKEND_NEEDED[name][0])).status is Status.AFFECTED


@pytest.mark.parametrize("name", TRANSFER)
def test_a_backend_whose_value_the_tree_does_not_establish_is_never_an_all_clear(name):
    other = "nixl" if BACKEND_NEEDED[name] == ("mooncake",) else "mooncake"
    found = judged(name, "base", decode_server(other, established=False))
    assert found.status is Status.AFFECTED and found.config.enters_path is None
    assert BACKEND in found.config.unestablished


@pytest.mark.parametrize("backend", ["ascend", "mori", "mooncake_tcp", "fake"])
def test_a_backend_no_probe_covers_is_named_outside_the_probes_and_answered_by_no_ones_code(backend):
    exps = [REG.experiments[name] for name in TRANSFER]
    (outside,) = check.outside_probes(exps, {BACKEND: backend})
    assert outside.experiments == TRANSFER and set(outside.covered) == {"mooncake", "nixl"}
    assert "no probe observed it" in outside.describe()
    for name in TRANSFER:  # off every covered path: never the fixed (or affected) code of another backend
        found = judged(name, "head", decode_server(backend))
        assert found.status is Status.NOT_AFFECTED and found.rests_on_configuration and found.deciding == []


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_a_backend_the_probes_cover_is_not_outside_them(backend):
    assert check.outside_probes([REG.experiments[name] for name in TRANSFER], {BACKEND: backend}) == []
