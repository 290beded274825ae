"""Same answers contained: the bracket releases give byte-identical results in the sandbox and out of it.

Slow (``--sglang``): the three bracket releases go through the sweep's warm engine twice, reprobed
each time, once contained by bubblewrap and once not (``PDEVIDENCE_SANDBOX=none``: pinned releases
may run uncontained); and each probe runs alone on the newest one in a fresh process, as a cell
runs it, contained and not. Every result document must be byte-identical to its uncontained twin:
the sandbox takes the network, the home directory and the rest of the machine away from SGLang,
and none of that may change what the probes observe. And the issue's own case, a hostile copy of
a real release, gets nothing out.
"""

from __future__ import annotations

import os
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pdevidence import environments, registry
from pdevidence.cells import probe_run, warm
from pdevidence.core.paths import PROJECT, tree_lock_file, work_dir
from pdevidence.sources import trees
from pdevidence.sources.importable import importable_dir

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

            def run_alone(name, exp):
                return probe_run.run_probe(env.interpreter, exp.probe,
                                           ["--side", "sweep", "--tree-kind", cell_tree.kind, "--tree-ref",
                                            cell_tree.ref, "--tree-resolved", cell_tree.resolved],
                                           out / f"{name}.json", work_dir(reg.root) / "logs" / f"contained.{name}.log",
                                           experiment=name, side="sweep", trusted=True, env=env.probe_env)
            with ThreadPoolExecutor(max_workers=2) as pool:  # both probes at once, as two cells run
                ran = list(pool.map(lambda item: run_alone(*item), reg.experiments.items()))
            assert {r.containment["tool"] for r in ran} == {mode}
            for name in reg.experiments:
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


def test_a_hostile_copy_of_a_release_gets_nothing_out_and_answers_cannot_run(tmp_path, monkeypatch):
    """The issue's case: a copy of the 0.5.21 tree whose ``sglang/__init__.py`` first writes into $HOME and /tmp
    and connects to a listener on 127.0.0.1 through ``_socket``, probed as `check --path` probes it."""
    reg = registry.load(PROJECT)
    release = trees.release_tree(BRACKETS[-1], reg.python, trees.LockFile(tree_lock_file(reg.root)))
    copy = tmp_path / "hostile-0.5.21"
    shutil.copytree(importable_dir(release, environments.find_python(reg.python).path), copy / "python")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    token = f"pdevidence-escaped-{os.getpid()}"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.5)
        init = copy / "python" / "sglang" / "__init__.py"
        init.write_text(f"""import os as _os, _socket as _raw
open(_os.path.join(_os.path.expanduser("~"), {token!r}), "w").write("escaped")
open("/tmp/{token}", "w").write("escaped")
_raw.socket(_raw.AF_INET, _raw.SOCK_STREAM).connect({listener.getsockname()!r})
""" + init.read_text())
        tree = trees.path_tree(copy)
        assert not tree.pinned
        found = warm.probe_trees(reg, [tree], list(reg.experiments), {tree.label(): tree_args(tree)},
                                 out_dir=tmp_path / "out", log=lambda msg: None)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody came
    for outcome in found[tree.label()].values():
        assert outcome.doc is None and outcome.error.startswith("ConnectionRefusedError"), outcome.error
        assert outcome.containment["tool"] == "bubblewrap"
    assert not (home / token).exists() and not Path("/tmp", token).exists()
