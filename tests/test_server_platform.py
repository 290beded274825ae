"""`check --server-platform`: a gate that holds only off some platforms (the registry's ``gate.platforms``), as
war_barrier's does (the overlap scheduler's barrier runs by default on CUDA only), on test_server_env.py's
synthetic fork. On a platform where the fix runs by default the tree's code decides; elsewhere the variable does,
and a tree that defines no such variable runs the fix nowhere there: present but off.
"""

from __future__ import annotations

import argparse
import json

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project
from test_forks import ERAS, make_fork, quiet_git, world, write_closures  # noqa: F401 - fixtures
from test_server_env import GATE, GATE_TABLE, _fork, check, with_gate

from pdevidence import cli, registry
from pdevidence.core import arguments, errors
from pdevidence.documents import integrity
from pdevidence.lanes import check as check_lane

PLATFORM_GATE = GATE_TABLE + 'platforms = ["cuda"]\n'


@pytest.fixture
def on_cuda(world):
    """The registry's demo gated on SGLANG_DEMO_GATE off CUDA only; its base and head results made by it."""
    return with_gate(world, PLATFORM_GATE)


@pytest.fixture
def fork(on_cuda):
    """A fork that carries the fix (observed fixed by its probe), and defines the variable."""
    return _fork(on_cuda, "fork", guard=True)


def test_on_cuda_the_trees_default_decides_whatever_the_variable(on_cuda, fork, capsys):
    code, doc, _ = check(on_cuda, capsys, "--path", str(fork))  # cuda is the default platform
    assert code == errors.CONFIRMED
    [answer] = doc["experiments"]
    assert answer["status"] == "fixed" and doc["server_platform"] == "cuda"
    assert (answer["gate"]["state"], answer["gate"]["decides"], answer["gate"]["platforms"]) == ("off", False, ["cuda"])
    assert problems("check", doc) == []
    cli.main(["--root", str(on_cuda.root), "check", "--path", str(fork), "--server-platform", "cuda"])
    table = capsys.readouterr().out
    assert "server platform: cuda" in table
    assert f"on cuda the fix runs without {GATE}: this tree's default there decides" in table


def test_elsewhere_the_fix_left_off_is_affected_and_the_variable_named(on_cuda, fork, capsys, tmp_path):
    vex = tmp_path / "vex.json"
    code, doc, _ = check(on_cuda, capsys, "--path", str(fork), "--server-platform", "rocm", "--openvex", str(vex))
    assert code == errors.BEHAVIOUR_DIFFERS
    [answer] = doc["experiments"]
    assert (answer["status"], answer["deciding"], answer["scenarios"]) == ("affected", [], {"D1": "fixed"})
    assert (answer["gate"]["state"], answer["gate"]["decides"], answer["gate"]["platform"]) == ("off", True, "rocm")
    assert problems("check", doc) == []
    [statement] = json.loads(vex.read_text())["statements"]
    assert statement["status"] == "affected"
    assert statement["action_statement"].startswith(f"Set {GATE}=true in the server's environment")
    assert statement["action_statement"].endswith(f"--server-env {GATE}=true --server-platform rocm.")
    assert "on rocm (the fix runs by default only on cuda)" in statement["status_notes"]
    assert problems("openvex-0.2.0", json.loads(vex.read_text())) == []


def test_elsewhere_the_variable_given_on_turns_the_answer_fixed(on_cuda, fork, capsys):
    code, doc, _ = check(on_cuda, capsys, "--path", str(fork), "--server-platform", "npu",
                         "--server-env", f"{GATE}=true")
    assert code == errors.CONFIRMED
    assert (doc["experiments"][0]["status"], doc["experiments"][0]["gate"]["state"]) == ("fixed", "on")


def test_elsewhere_a_tree_without_the_variable_runs_the_fix_nowhere(on_cuda, capsys, tmp_path):
    ungated = _fork(on_cuda, "ungated", guard=True, environ=False)
    code, doc, _ = check(on_cuda, capsys, "--path", str(ungated), "--server-platform", "cpu")
    assert code == errors.BEHAVIOUR_DIFFERS
    [answer] = doc["experiments"]
    assert (answer["status"], answer["gate"]["state"], answer["gate"]["code_status"]) == \
        ("affected", "undefined", "fixed")
    vex = tmp_path / "vex.json"
    check(on_cuda, capsys, "--path", str(ungated), "--server-platform", "cpu", "--openvex", str(vex))
    [statement] = json.loads(vex.read_text())["statements"]
    assert f"defines no {GATE}: upgrade to an SGLang release that does" in statement["action_statement"]
    # On CUDA the same tree is fixed: its code runs the fix there.
    assert check(on_cuda, capsys, "--path", str(ungated))[1]["experiments"][0]["status"] == "fixed"


def test_a_gate_without_platforms_is_read_on_every_platform(world, capsys):
    """deferred_release's kind of gate: the platform changes nothing."""
    from synthetic import result_doc, write_cell

    registry_file = world.root / "experiments.toml"
    registry_file.write_text(registry_file.read_text() + GATE_TABLE)
    for side, version in (("base", "1.0.0"), ("head", "1.1.0")):
        write_cell(world.root / "results", side, result_doc(side, version))
    integrity.regenerate(world.root)
    fixed = _fork(world, "fork", guard=True)
    for platform in ("cuda", "rocm"):
        code, doc, _ = check(world, capsys, "--path", str(fixed), "--server-platform", platform)
        assert (code, doc["experiments"][0]["status"]) == (errors.BEHAVIOUR_DIFFERS, "affected")
        assert "platform" not in doc["experiments"][0]["gate"]


@pytest.mark.parametrize("value", ["ROCm", "tpu", "", "cuda "])
def test_a_malformed_platform_is_a_usage_error_before_anything_runs(world, capsys, value):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a server platform: one of cuda, rocm"):
        arguments.server_platform(value)
    assert cli.main(["--root", str(world.root), "check", "--release", "0.5.13", "--server-platform", value]) == \
        errors.USAGE
    assert "--server-platform" in capsys.readouterr().err


def test_the_registrys_platforms_are_validated(tmp_path):
    root = make_project(tmp_path, REGISTRY + GATE_TABLE + 'platforms = ["cuda", "tpu"]\n')
    with pytest.raises(errors.HarnessError, match=r"platforms: \['tpu'\] not server platforms"):
        registry.load(root)
    root = make_project(tmp_path / "ok", REGISTRY + PLATFORM_GATE)
    gate = registry.load(root).experiment("demo").gate
    assert gate.platforms == ("cuda",) and not gate.decides_on("cuda") and gate.decides_on("rocm")


def test_the_judge_reads_the_platform_given():
    """The lane's judge, without the CLI: a platform gate on a fixed answer, per platform."""
    gate = registry.Gate(GATE, "true", "why", ("cuda",))
    env = check_lane.Environment(None, gates={GATE: {"state": "off", "value": False, "why": "default"}})
    for platform, status in (("cuda", "fixed"), ("rocm", "affected")):
        found = check_lane.ExperimentCheck("demo", 1, check_lane.Status.FIXED, deciding=["D1"])
        assert check_lane._gated(gate, found, env, platform).status.value == status
