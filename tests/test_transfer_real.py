"""The transfer experiments on SGLang from PyPI: what each bracket release's cell wrote (the session's release
matrix), and a cell of the newest release run here.

Slow (a cell per side, each probe alone in its own process, in the user cache's environments): runs with
``--sglang``.
"""

from __future__ import annotations

import json

import pytest

from pdevidence.core import errors
from real_runs import cli_run

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def deferred(release_matrix):
    """deferred_release's base (0.5.18) and head (0.5.19) cells of the session's release matrix: each side's
    scenarios, as its result holds them."""
    return {side: release_matrix.scenarios("deferred_release", side) for side in ("base", "head")}


def test_0_5_18_hands_an_aborted_request_s_slots_to_the_next_one_before_the_prefill_s_last_write(deferred):
    d1 = deferred["base"]["D1"]
    assert d1["error"] is None
    assert (d1["observed"]["freed_before_last_write"], d1["observed"]["written_into_other"]) == (8, 8)


def test_0_5_19_with_the_gate_holds_them_until_every_rank_acks_or_the_deadline(deferred):
    head = {sid: sc["observed"] for sid, sc in deferred["head"].items()}
    assert not [sid for sid, sc in deferred["head"].items() if sc["error"]]
    assert (head["D1"]["written_into_other"], head["D1"]["freed_total"]) == (0, 8)
    assert head["D3"]["freed_after_first_ack"] == 0
    assert (head["D4"]["freed_before_timeout"], head["D4"]["freed_after_timeout"]) == (0, 8)
    assert (head["P1"]["acks_at_abort"], head["P2"]["drain_acks_at_abort"]) == (0, 1)


def test_0_5_19_with_the_gate_unset_releases_at_once_as_0_5_18_does(deferred):
    d8 = dict(deferred["head"]["D8"]["observed"])
    assert d8.pop("gate_default_on") is False
    assert d8 == deferred["base"]["D1"]["observed"]


def test_0_5_21_builds_its_queue_holds_by_default_and_holds_failures_it_did_not_initiate(tmp_path):
    """The driver on the newest release: its queue reads the TP rank from the runtime context; D1-D5 read as
    0.5.19's; the gate's default is on (D8 holds) and a prefill-reported failure is held too (D6)."""
    done = cli_run(tmp_path, "cell", "release", "deferred_release", "head", "--ref", "0.5.21")
    assert done.returncode == errors.CONFIRMED, done.stdout + done.stderr
    found = json.loads((tmp_path / "deferred_release.head.release-0.5.21.json").read_text())["scenarios"]
    assert not [sid for sid, sc in found.items() if sc["error"]]
    observed = {sid: sc["observed"] for sid, sc in found.items()}
    assert (observed["D1"]["written_into_other"], observed["D1"]["freed_total"]) == (0, 8)
    assert (observed["D8"]["gate_default_on"], observed["D8"]["freed_before_last_write"]) == (True, 0)
    assert (observed["D6"]["abort_sent"], observed["D6"]["freed_at_failure"]) == (1, 0)
