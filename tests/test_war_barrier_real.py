"""war_barrier on real SGLang: the overlap loops of 0.5.12, 0.5.13 and 0.5.14, and check's reading of the platform.

Slow (an SGLang import per release): runs with ``--sglang``. The probe runs and the environment reading are
check's own (the warm engine, the driver's record, the lane's reading and judge); base and head are the fresh
0.5.12 and 0.5.13 results probed here, so this holds while the evidence awaits a republish.
"""

from __future__ import annotations

import pytest

from pdevidence import registry
from pdevidence.core import arguments
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.cells import warm
from pdevidence.lanes import check
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

EXP = "war_barrier"
ENABLE = "SGLANG_ENABLE_WAR_BARRIER"


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Each release's war_barrier outcome and its reading of the server environment given (``ENABLE`` on)."""
    tmp = tmp_path_factory.mktemp("war_barrier")
    reg = registry.load(PROJECT)
    exps = [reg.experiment(EXP)]
    env = arguments.ServerEnvironment.joined([arguments.server_env(f"{ENABLE}=true")])
    releases = {version: trees.release_tree(version, reg.python, trees.LockFile(tree_lock_file(reg.root)))
                for version in ("0.5.12", "0.5.13", "0.5.14")}
    outcomes, readings = {}, {version: [] for version in releases}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(tmp / "runs"))
        for name, server_env in (("unset", None), ("given", env)):  # each environment read in its own run
            args = {tree.label(): {**check._tree_args(tree), **check._environment_args(exps, server_env)}
                    for tree in releases.values()}
            ran = warm.probe_trees(reg, list(releases.values()), [EXP], args, out_dir=tmp / name,
                                   log=lambda msg: None)
            for version, tree in releases.items():
                outcomes[version] = ran[tree.label()][EXP]
                readings[version].append(check._environment(exps, server_env, tmp / name / tree.label(),
                                                            check.target_of(reg, tree)))
    return reg.experiment(EXP), {version: (outcomes[version], *readings[version]) for version in releases}


def test_the_releases_loops_wait_for_the_forward_on_cuda_only_from_the_fix(probed):
    """Alone proves: 0.5.12's three overlap loops never wait; 0.5.13's wait before each iteration's writes on
    CUDA only; 0.5.14's also off CUDA with the variable set."""
    _, found = probed
    observed = {v: {sid: sc["observed"] for sid, sc in o.doc["scenarios"].items()} for v, (o, _, _) in found.items()}
    assert all(sc["error"] is None for o, _, _ in found.values() for sc in o.doc["scenarios"].values())
    for sid, loop in (("W1", "plain"), ("W2", "decode"), ("W3", "prefill")):
        assert (observed["0.5.12"][sid]["loop"], observed["0.5.12"][sid]["waits"]) == (loop, 0)
        assert (observed["0.5.13"][sid]["war_wait_before_write"], observed["0.5.13"][sid]["waits"]) == (True, 3)
    assert [observed["0.5.13"][sid]["waits"] for sid in ("W4", "W7", "W10", "W11")] == [0, 0, 0, 0]
    assert [observed["0.5.14"][sid]["waits"] for sid in ("W4", "W7", "W14")] == [0, 3, 0]  # DFLASH opted out
    assert observed["0.5.14"]["W12"]["waits_on_read_done"] is True


def test_check_answers_the_platform_as_the_release_reads_its_variable(probed):
    """Alone proves: on CUDA 0.5.13 and 0.5.14 are fixed; on ROCm present but off unless the environment sets
    the variable, which only 0.5.14 defines."""
    exp, found = probed
    base, head = found["0.5.12"][0].doc, found["0.5.13"][0].doc

    def status(version: str, platform: str, given: bool) -> str:
        outcome, unset, with_env = found[version]
        return check.judge(exp, outcome, base, head, None, with_env if given else unset, platform).status.value

    assert [status(v, "cuda", False) for v in ("0.5.12", "0.5.13", "0.5.14")] == ["affected", "fixed", "fixed"]
    assert [status(v, "rocm", False) for v in ("0.5.13", "0.5.14")] == ["affected", "affected"]
    assert [status(v, "rocm", True) for v in ("0.5.13", "0.5.14")] == ["affected", "fixed"]
    assert found["0.5.13"][2].gates[ENABLE]["state"] == "undefined"
    assert found["0.5.14"][2].gates[ENABLE]["state"] == "on"
