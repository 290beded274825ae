"""war_barrier below the PD floor on real SGLang: 0.3.3.post1's scheduler has no overlap loop, 0.3.4's plain loop
(PR #1677, 'Add a new event loop') and 0.4.1's never wait for the forward; every other probe reads no PD there.

Slow (an SGLang import per release, in two eras, one of them older than any bracket's): the scheduled lane
(``--scheduled``). Base and head are the fresh 0.5.12 and 0.5.13 results probed here.
"""

from __future__ import annotations

import pytest

from pdevidence import registry
from pdevidence.cells import warm
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.lanes import check
from pdevidence.sources import trees

pytestmark = [pytest.mark.sglang, pytest.mark.scheduled]  # the scheduled lane (--scheduled)

EXP = "war_barrier"
OLD = ("0.3.3.post1", "0.3.4", "0.4.1")  # the last release without the loop, the first with it, one with vLLM's ops


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Every experiment's outcome on the old releases, and war_barrier's on its bracket (the references)."""
    tmp = tmp_path_factory.mktemp("war_barrier_old")
    reg = registry.load(PROJECT)
    lock = trees.LockFile(tree_lock_file(reg.root))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(tmp / "runs"))
        old = [trees.release_tree(v, reg.python, lock) for v in OLD]
        every = warm.probe_trees(reg, old, list(reg.experiments), {t.label(): check._tree_args(t) for t in old},
                                 out_dir=tmp / "old", log=lambda msg: None)
        refs = [trees.release_tree(v, reg.python, lock) for v in ("0.5.12", "0.5.13")]
        bracket = warm.probe_trees(reg, refs, [EXP], {t.label(): check._tree_args(t) for t in refs},
                                   out_dir=tmp / "refs", log=lambda msg: None)
    found = {t.resolved: every[t.label()] for t in old}
    base, head = (bracket[t.label()][EXP].doc for t in refs)
    return reg, found, base, head


def test_the_plain_loop_arrives_in_0_3_4_and_never_waits_for_the_forward(probed):
    """Alone proves: the probe drives the old releases' scheduler (no speculative module, the loop called
    directly): 0.3.3.post1 has none to drive, 0.3.4 and 0.4.1 launch three forwards with no wait; no PD loop."""
    reg, found, _, _ = probed
    docs = {v: found[v][EXP].doc for v in OLD}
    assert all(sc["error"] is None for doc in docs.values() for sc in doc["scenarios"].values())
    observed = {v: {sid: sc["observed"] for sid, sc in doc["scenarios"].items()} for v, doc in docs.items()}
    assert observed["0.3.3.post1"]["W1"]["loop"] == "absent"
    for version in ("0.3.4", "0.4.1"):
        assert {k: observed[version]["W1"][k] for k in ("loop", "forwards", "waits", "war_wait_before_write")} == \
            {"loop": "plain", "forwards": 3, "waits": 0, "war_wait_before_write": False}
        assert observed[version]["W2"]["loop"] == observed[version]["W3"]["loop"] == "absent"
        assert observed[version]["W14"] == {"dflash": "absent"}
        assert {"overlap_loop_called_directly", "no_speculative_module"} <= set(docs[version]["adaptations"])


def test_check_reads_the_bracket_of_the_introduction(probed):
    """Alone proves: judged as check judges, 0.3.3.post1 is not affected (no overlap loop) and 0.3.4, 0.4.1
    affected: the sweep's bracket for bisecting the loop's arrival."""
    reg, found, base, head = probed
    exp = reg.experiment(EXP)
    status = {v: check.judge(exp, found[v][EXP], base, head).status.value for v in OLD}
    assert status == {"0.3.3.post1": "not affected", "0.3.4": "affected", "0.4.1": "affected"}


def test_every_probe_runs_with_its_eras_stand_ins_never_called_and_reads_no_pd(probed):
    """Alone proves: the era of 0.3.x-0.4.2 (real vLLM and outlines, pyairports stood in) imports every probe's
    tree, no stand-in is called, and every other experiment's no-PD rule holds there."""
    reg, found, _, _ = probed
    for version in OLD:
        era = reg.era_of(version)
        for name, outcome in found[version].items():
            assert outcome.doc is not None, f"{name} on {version}: {outcome.error}"
            assert outcome.doc["stand_ins"]["installed"] == sorted(era.stand_ins)
            assert outcome.doc["stand_ins"]["called"] == []
            if name != EXP:
                assert reg.experiment(name).not_affected["no_pd_disaggregation"].holds(outcome.doc), (name, version)
