"""One real release of every era, end to end: it runs, in its closure with its stand-ins, and how it was driven.

Slow (``--sglang``): one ``sweep`` over a release per era (one warm engine per era) into a
temporary runs directory; the tests read what that run wrote. What is pinned here is what
these releases do today: the one without PD disaggregation is not affected, every other behaves pre-fix for
admission and prefill, and where telling keys differ for a reason the fix does not decide (the tree finishes a
rejected request at once; it has no optimistic prefill; it retries a result whose bootstrap is pending), the
registry rule that set them aside is named in the table. Of the decode-offload fixes, what their brackets and
the wheels say (``real_runs.answer_known``): not affected where the tree has no offload manager (before 0.5.3),
offload_slots pre-fix on its base 0.5.12 and fixed on 0.5.14, offload_rid pre-fix on 0.5.14; on the releases
between (0.5.5, 0.5.6, 0.5.10) nothing of them is pinned but that they run in the era's closure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT
from real_runs import OFFLOAD_KNOWN_FROM, answer_known

pytestmark = [pytest.mark.sglang, pytest.mark.scheduled]  # the scheduled lane (--scheduled)

# One release per era, oldest first (the era named in experiments.toml).
ERA_RELEASES = {
    "0.4.4.post1": "torch2.5-tf4.48",  # the last release without PD disaggregation (its pins: transformers 4.48)
    "0.4.4.post2": "torch2.5-tf4",  # the first with it
    "0.4.5": "torch2.5-tf4",
    "0.4.6": "torch2.6-tf4",
    "0.4.10": "torch2.7-tf4",
    "0.5.5": "torch2.8-tf4",
    "0.5.6": "torch2.9-tf4",
    "0.5.10": "torch2.9-tf5",
    "0.5.12": "torch2.11-tf5-sgl-kernel",
    "0.5.14": "torch2.11-tf5",
}

# How each release was driven (the result's `adaptations`), per experiment.
ADAPTATIONS = {
    "0.4.5": {
        "admission": ["door-without-is-rebootstrap", "door-without-is-retracted", "door-without-num-kv-heads",
                      "inline-intake-reject", "named-kv-classes", "no-beam-groups", "no-queued-abort-release",
                      "no-transfer-backend", "server-args-defaults", "server-args-unpublished",
                      "session-id-only", "session-without-inflight", "to-abort-marker"],
        "prefill": ["batch-result-required-fields", "batch-sampling-info", "chunk-fill-ids", "infight-queue-name",
                    "is-chunked-counter", "no-cache-abort-release", "no-grammar-in-result", "no-optimistic-prefill",
                    "no-req-kv-info", "no-req-mamba-slot", "no-sender-abort", "release-without-insert-flag",
                    "server-args-defaults", "server-args-unpublished", "to-abort-marker", "tree-cache-release",
                    "tree-cache-unfinished"],
    },
    "0.4.6": {
        "admission": ["door-without-is-rebootstrap", "door-without-is-retracted", "door-without-num-kv-heads",
                      "inline-intake-reject", "kv-class-lookup", "no-beam-groups", "no-queued-abort-release",
                      "server-args-defaults", "server-args-unpublished", "session-id-only",
                      "session-without-inflight", "to-abort-marker"],
    },
    "0.4.10": {"admission": ["door-without-is-rebootstrap", "no-beam-groups", "no-queued-abort-release",
                             "server-args-defaults", "server-args-unpublished", "session-id-only",
                             "session-without-inflight", "to-abort-marker", "tp-rank-patch"]},
    "0.5.6": {"admission": ["door-without-is-rebootstrap", "no-beam-groups", "publish-global-server-args",
                            "session-id-only", "session-without-inflight", "tp-rank-patch"]},
    "0.5.10": {"admission": ["door-without-is-rebootstrap", "no-beam-groups", "publish-global-server-args",
                             "session-without-inflight", "tp-rank-patch"]},
    "0.5.14": {"admission": ["door-without-is-rebootstrap", "no-beam-groups", "publish-global-server-args",
                             "tp-rank-patch"],
               "prefill": ["chunk-fill-len", "no-req-kv-info", "optimistic-prefill-retries",
                           "publish-global-server-args", "scheduler-server-args", "single-rank-poll"]},
}

ADAPTATIONS["0.4.4.post2"] = ADAPTATIONS["0.4.5"]  # the first PD release is driven as 0.4.5 is
PD_RELEASES = [v for v in ERA_RELEASES if v != "0.4.4.post1"]

# Every PD release is pre-fix; the registry rules (`not_deciding`) that set telling or control keys aside on it. The first
# PD releases cannot express four of the prefill fix's steps at all (no insert flag on their release, no
# cache-side abort, no KV-less mamba slot, no abortable sender) nor its grammar gate (no grammar there).
OLDEST_PREFILL_RULES = ["no_optimistic_prefill", "release_without_insert_flag", "no_cache_abort_release",
                        "no_req_mamba_slot", "no_grammar_in_result", "no_sender_abort"]
SET_ASIDE = {
    "admission": {**{v: ["intake_finishes", "door_without_is_retracted", "door_without_is_rebootstrap",
                         "no_host_backup", "no_mamba_slots", "no_beam_groups", "no_queued_abort_release",
                         "session_without_inflight"] for v in ("0.4.4.post2", "0.4.5", "0.4.6")},
                  "0.4.10": ["intake_finishes", "door_without_is_rebootstrap", "no_mamba_slots", "no_beam_groups",
                             "no_queued_abort_release", "session_without_inflight"],
                  **{v: ["door_without_is_rebootstrap", "no_beam_groups", "session_without_inflight"]
                     for v in ("0.5.5", "0.5.6", "0.5.10")},
                  **{v: ["door_without_is_rebootstrap", "no_beam_groups"] for v in ("0.5.12", "0.5.14")}},
    "prefill": {"0.4.4.post2": OLDEST_PREFILL_RULES, "0.4.5": OLDEST_PREFILL_RULES, "0.4.6": OLDEST_PREFILL_RULES,
                "0.4.10": ["no_optimistic_prefill", "release_without_insert_flag", "no_cache_abort_release",
                           "no_req_mamba_slot"],
                "0.5.5": ["no_optimistic_prefill"],
                "0.5.6": ["no_optimistic_prefill"], "0.5.10": ["no_optimistic_prefill"],
                "0.5.12": ["no_optimistic_prefill"], "0.5.14": ["bootstrap_retries"]},
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    env = {**os.environ, "PDEVIDENCE_RUNS": str(runs), "PYTHONPATH": str(PROJECT)}
    done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(PROJECT), "sweep", *ERA_RELEASES],
                          env=env, capture_output=True, text=True, timeout=3600)
    # 1: no release among these carries the admission or prefill fix (no first fixed release); never 3 (could
    # not run). offload_slots' first fixed among these is the newest, 0.5.14 (fixed from 0.5.13): none after it
    # to lose the fix (9).
    assert done.returncode == 1, done.stdout + done.stderr
    return runs


def result(runs, version: str, experiment: str) -> dict:
    folder = runs / "sweep" / f"release-{version}"
    assert not (folder / f"{experiment}.cannot-run.json").exists(), f"{experiment} could not run on {version}"
    return json.loads((folder / f"{experiment}.json").read_text())


@pytest.mark.parametrize("version", ERA_RELEASES)
def test_every_era_runs_every_probe_in_its_closure_with_its_stand_ins_never_called(swept, version):
    """Alone proves: a release of every era imports and runs every probe in that era's closure, with exactly the
    era's stand-ins installed and none called."""
    reg = registry.load(PROJECT)
    era = reg.eras[ERA_RELEASES[version]]
    for experiment in reg.experiments:
        doc = result(swept, version, experiment)
        assert doc["sglang_version"] == version
        if answer_known(experiment, version):  # where not (an offload probe on a release nobody read), the
            # scenarios may meet a manager they were not written for: what they find is the sweep's to say
            assert not [sid for sid, sc in doc["scenarios"].items() if sc["error"]], f"{experiment} on {version}"
        if era.stand_ins:
            assert doc["stand_ins"]["installed"] == sorted(era.stand_ins)
            assert doc["stand_ins"]["called"] == []
        else:
            assert "stand_ins" not in doc


@pytest.mark.parametrize("version", ERA_RELEASES)
def test_each_release_names_how_it_was_driven(swept, version):
    """Alone proves: the adaptations the admission and prefill probes need on each era's release are the ones
    their result names (the offload probes' are not pinned: nobody has read them release by release)."""
    for experiment, names in ADAPTATIONS.get(version, {}).items():
        assert result(swept, version, experiment).get("adaptations") == names, f"{experiment} on {version}"


def test_what_a_tree_lacks_is_recorded_absent_and_an_inline_intake_still_rejects(swept):
    """Alone proves: what an old tree lacks is recorded `absent`, never made up, and an old tree's inline intake
    rejection goes through the real validator."""
    assert result(swept, "0.5.10", "admission")["scenarios"]["A7b"]["observed"] == {"is_rebootstrap": "absent"}
    b2 = result(swept, "0.5.12", "prefill")["scenarios"]["B2"]["observed"]
    assert b2["optimistic_prefill"] == "absent" and b2["requeued"] == 0
    # 0.4.5 rejects inline through the real validate_input_length: finished at once, and the door admits it.
    a1 = result(swept, "0.4.5", "admission")["scenarios"]["A1"]["observed"]
    assert (a1["finished_before_door"], a1["finished_status"], a1["sender_created"], a1["enqueued"]) \
        == (True, 400, True, True)
    # A control's resource the tree has no such thing as is not made up: a mamba slot before 0.5.4, a host
    # retraction backup before 0.4.7 (from then a `kv_cache_cpu` attribute, set while the backup exists).
    assert result(swept, "0.4.10", "admission")["scenarios"]["A11"]["observed"] == {"held": "absent"}
    assert result(swept, "0.4.6", "admission")["scenarios"]["A5"]["observed"] == {"backup_marker": "absent"}
    assert result(swept, "0.4.10", "admission")["scenarios"]["A5"]["observed"]["backup_marker"] == "kv_cache_cpu"


def test_the_door_admits_an_already_finished_request_on_every_era(swept):
    """Alone proves: A12, the case the fix also retires; every era's door lets it through, as the base release
    does."""
    for version in PD_RELEASES:
        a12 = result(swept, version, "admission")["scenarios"]["A12"]["observed"]
        assert (a12["sender_created"], a12["enqueued"], a12["retired"]) == (True, True, False), version


@pytest.mark.parametrize("experiment", ["admission", "prefill"])
def test_each_release_is_pre_fix_naming_the_rules_that_set_keys_aside(swept, experiment):
    """Alone proves: every PD era's release is pre-fix for admission and prefill, judged without exactly the
    registry rules named for it. Only these two: their `not_deciding` rules are what is pinned per release (the
    offload fixes: test_the_offload_fixes_read_as_their_brackets_say)."""
    table = json.loads((swept / f"sweep-{experiment}.json").read_text())
    rows = {row["version"]: row for row in table["releases"]}
    got = {v: (rows[v]["classification"], rows[v]["differing"]) for v in ERA_RELEASES}
    assert got == {v: ("pre-fix" if v in PD_RELEASES else "not affected", []) for v in ERA_RELEASES}
    aside = {v: [rule.split(":")[0] for rule in rows[v].get("not_deciding", [])] for v in ERA_RELEASES}
    assert aside == {v: SET_ASIDE[experiment].get(v, []) for v in ERA_RELEASES}


@pytest.mark.parametrize("experiment", ["admission", "prefill"])
def test_a_release_without_pd_disaggregation_is_not_affected_from_what_it_lacks(swept, experiment):
    """Alone proves: 0.4.4.post1 imports, has no sglang.srt.disaggregation: every scenario of the admission and
    prefill probes says so and nothing else, and it is their only release not affected. (The offload fixes are
    not affected on every release before 0.5.3: test_the_offload_fixes_read_as_their_brackets_say.)"""
    doc = result(swept, "0.4.4.post1", experiment)
    assert {sid: sc["observed"] for sid, sc in doc["scenarios"].items()} \
        == {sid: {"pd_disaggregation": "absent"} for sid in doc["scenarios"]}
    table = json.loads((swept / f"sweep-{experiment}.json").read_text())
    assert [row["version"] for row in table["releases"] if row["classification"] == "not affected"] == ["0.4.4.post1"]


def test_the_offload_fixes_read_as_their_brackets_say_where_the_answer_is_known(swept):
    """Alone proves: across the eras, the decode-offload probes read not affected where the tree has no
    DecodeKVCacheOffloadManager (before 0.5.3: recorded absent), offload_slots pre-fix on 0.5.12 and fixed on
    0.5.14 (fixed from 0.5.13), offload_rid pre-fix on 0.5.14 (fixed from 0.5.19). Releases between 0.5.3 and
    ``OFFLOAD_KNOWN_FROM`` are left out: where offloading while decoding starts was not read from the wheels."""
    expected = {
        "offload_slots": {"0.5.12": "pre-fix", "0.5.14": "fixed"},
        "offload_rid": {"0.5.14": "pre-fix"},
    }
    assert set(expected) == set(OFFLOAD_KNOWN_FROM)
    for experiment, known in expected.items():
        table = json.loads((swept / f"sweep-{experiment}.json").read_text())
        rows = {row["version"]: row for row in table["releases"]}
        got = {v: rows[v]["classification"] for v in ERA_RELEASES if answer_known(experiment, v)}
        assert got == {v: known.get(v, "not affected") for v in got}, experiment
        for version in (v for v in PD_RELEASES if v in got and v not in known):  # a PD tree without the manager
            doc = result(swept, version, experiment)
            assert {sc["observed"].get("offload_manager") for sc in doc["scenarios"].values()} == {"absent"}, \
                f"{experiment} on {version}"
        assert table["first_fixed"] == ("0.5.14" if experiment == "offload_slots" else None)
