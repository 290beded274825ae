"""`check --server-env` on real SGLang: 0.5.19's own ``Envs`` reads the server environment.

Slow (an SGLang import per probe process, two of them): runs with ``--sglang``. The probe runs and the reading
are check's own (the warm engine, the driver's environment record, the lane's reading of it); the published
references are not needed for what is read, so this holds while the evidence awaits a republish.
0.5.19 defines ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`` (an EnvBool, off by default); 0.5.18 does not.
"""

from __future__ import annotations

import pytest

from pdevidence import registry
from pdevidence.core import arguments, errors
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.lanes import check
from pdevidence.cells import warm
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

GATE = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
TYPO = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMOUT"  # the real one ends in _TIMEOUT


def read(tmp_path, version: str, *given: str) -> check.Environment:
    """The environment given, as the release reads it in its probe process (every probe runs first, as in check)."""
    reg = registry.load(PROJECT)
    tree = trees.release_tree(version, reg.python, trees.LockFile(tree_lock_file(reg.root)))
    env = arguments.ServerEnvironment.joined([arguments.server_env(v) for v in given])
    target = check.target_of(reg, tree)
    exps = list(reg.experiments.values())
    args = {**check._tree_args(tree), **check._environment_args(exps, env)}
    warm.probe_trees(reg, [tree], list(reg.experiments), {tree.label(): args}, out_dir=tmp_path / "check",
                     log=lambda msg: None)
    return check._environment(exps, env, tmp_path / "check" / tree.label(), target)


def test_the_releases_own_envs_reads_the_variable_and_a_typo_is_named(tmp_path, monkeypatch):
    """Alone proves: 0.5.19's own EnvBool reads `1` as on, and a name its Envs and sources lack is a warning."""
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    found = read(tmp_path, "0.5.19", f"{GATE}=1", f"{TYPO}=5")
    assert found.values == {GATE: True}
    assert found.undefined == [TYPO]
    assert any(TYPO in warning for warning in found.warnings())


def test_a_value_the_releases_envs_refuses_is_a_usage_error_naming_it(tmp_path, monkeypatch):
    """Alone proves: a value 0.5.19's EnvBool refuses (its server would warn and fall back to off) is exit 2."""
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    with pytest.raises(errors.HarnessError) as refused:
        read(tmp_path, "0.5.19", f"{GATE}=maybe")
    assert refused.value.code == errors.USAGE
    assert f"this tree's Envs refuses {GATE}='maybe'" in str(refused.value)
