"""Same answers contained: the bracket releases give byte-identical results in the sandbox and out of it.

Slow (``--sglang``): the three bracket releases go through the sweep's warm engine twice, reprobed
each time, once contained by bubblewrap and once not (``PDEVIDENCE_SANDBOX=none``: pinned releases
may run uncontained); and each probe runs alone on the newest one in a fresh process, as a cell
runs it, contained and not. Every result document must be byte-identical to its uncontained twin:
the sandbox takes the network, the home directory and the rest of the machine away from SGLang,
and none of that may change what the probes observe.
"""

from __future__ import annotations

import pytest

from pdevidence import environments, registry
from pdevidence.cells import probe_run, warm
from pdevidence.core.paths import PROJECT, tree_lock_file, work_dir
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

BRACKETS = ["0.5.19", "0.5.20", "0.5.21"]  # prefill base, prefill head = admission base, admission head
MODES = ("bubblewrap", "none")


def tree_args(tree: trees.Tree) -> dict[str, str]:
    return {"side": "sweep", "tree_kind": tree.kind, "tree_ref": tree.ref, "tree_resolved": tree.resolved}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Per mode, per (release, experiment): the bytes the warm engine wrote; and under "cell", those a lone
    contained probe wrote."""
    reg = registry.load(PROJECT)
    brackets = [trees.release_tree(v, reg.python, trees.LockFile(tree_lock_file(reg.root))) for v in BRACKETS]
    assert all(tree.pinned for tree in brackets)  # so they may run uncontained below, as the operator's releases
    found: dict[str, dict] = {}
    for mode in MODES:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PDEVIDENCE_SANDBOX", mode)
            out = tmp_path_factory.mktemp(mode)
            outcomes = warm.probe_trees(reg, brackets, list(reg.experiments),
                                        {t.label(): tree_args(t) for t in brackets}, out_dir=out, force=True,
                                        log=lambda msg: None)
            assert {o.containment["tool"] for per in outcomes.values() for o in per.values()} == {mode}
            found[mode] = {(t.resolved, name): (out / t.label() / f"{name}.json").read_bytes()
                           for t in brackets for name in reg.experiments}
    cell_tree = brackets[-1]
    env = environments.cell_environment(reg, cell_tree, f"contained.{cell_tree.label()}")
    for mode in MODES:
        found[f"cell-{mode}"] = {}
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PDEVIDENCE_SANDBOX", mode)
            out = tmp_path_factory.mktemp(f"cell-{mode}")
            for name, exp in reg.experiments.items():
                ran = probe_run.run_probe(env.interpreter, exp.probe,
                                          ["--side", "sweep", "--tree-kind", cell_tree.kind, "--tree-ref",
                                           cell_tree.ref, "--tree-resolved", cell_tree.resolved],
                                          out / f"{name}.json", work_dir(reg.root) / "logs" / f"contained.{name}.log",
                                          experiment=name, side="sweep", trusted=True, env=env.probe_env)
                assert ran.containment["tool"] == mode
                found[f"cell-{mode}"][cell_tree.resolved, name] = (out / f"{name}.json").read_bytes()
    return found


@pytest.mark.parametrize("version", BRACKETS)
@pytest.mark.parametrize("experiment", ["admission", "prefill"])
def test_the_warm_engine_contained_writes_the_bytes_it_writes_uncontained(written, version, experiment):
    uncontained = written["none"][version, experiment]
    assert b'"scenarios"' in uncontained
    assert written["bubblewrap"][version, experiment] == uncontained


@pytest.mark.parametrize("experiment", ["admission", "prefill"])
def test_a_lone_probe_contained_writes_the_bytes_it_writes_uncontained(written, experiment):
    uncontained = written["cell-none"][BRACKETS[-1], experiment]
    assert b'"scenarios"' in uncontained
    assert written["cell-bubblewrap"][BRACKETS[-1], experiment] == uncontained
