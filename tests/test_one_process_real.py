"""One process, same answers: `check` runs every probe in one process; a cell runs one probe per process.

Slow (``--sglang``): one ``check`` of every bracket release runs, per release, both probes in
one process (``probes/probe_all.py``, in a child of the warm engine), then each probe
runs alone in its own fresh process, as a cell runs it, in an environment of the same
closure and tree. The test compares what
those runs wrote, scenario by scenario and key by key, with compare's typed equality
(``true`` is not ``1``): every published reference was made one probe per process, so
check and the sweep judge a tree fairly only if the two give the same observations.
"""

from __future__ import annotations

import contextlib
import io
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from pdevidence import cli, environments, registry
from pdevidence.cells import probe_run
from pdevidence.core.paths import PROJECT, runs_dir, tree_lock_file, work_dir
from pdevidence.documents import results
from pdevidence.judge.compare import same
from pdevidence.lanes import check
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

BRACKETS = ["0.5.19", "0.5.20", "0.5.21"]  # prefill base, prefill head = admission base, admission head


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(tmp_path_factory.mktemp("runs")))
        yield registry.load(PROJECT)


@pytest.fixture(scope="module")
def both(reg, tmp_path_factory):
    """Per release and experiment: (the document check's one process wrote, the one a lone probe wrote)."""
    found = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:  # one check, one engine, every release
        cli.main(["--root", str(PROJECT), "check", *(arg for v in BRACKETS for arg in ("--version", v)), "--json"])
    assert [doc["target"]["resolved"] for doc in json.loads(out.getvalue())] == BRACKETS
    lone = []
    for version in BRACKETS:
        tree = trees.release_tree(version, reg.python, trees.LockFile(tree_lock_file(reg.root)))
        env = environments.cell_environment(reg, tree, f"alone.{tree.label()}")  # as a cell builds its own
        alone = tmp_path_factory.mktemp(f"alone-{version}")
        lone += [(version, tree, env, name, exp, alone / f"{name}.json") for name, exp in reg.experiments.items()]

    def run_alone(version, tree, env, name, exp, dest):
        probe_run.run_probe(env.interpreter, exp.probe,
                            ["--side", check.CHECK_SIDE, "--tree-kind", tree.kind, "--tree-ref", tree.ref,
                             "--tree-resolved", tree.resolved],
                            dest, work_dir(reg.root) / "logs" / f"alone.{name}.{tree.label()}.log",
                            experiment=name, side=check.CHECK_SIDE, env=env.probe_env)
        together = results.load(runs_dir(reg.root) / "check" / tree.label() / f"{name}.json", experiment=name)
        return (version, name), (together, results.load(dest, experiment=name))

    with ThreadPoolExecutor(max_workers=2) as pool:  # two lone processes at a time, as cells run
        found.update(pool.map(lambda job: run_alone(*job), lone))
    return found


def differences(together: dict, alone: dict) -> list[str]:
    """Every scenario, observation key and error on which the two runs disagree (typed)."""
    out = []
    for sid in sorted(set(together["scenarios"]) | set(alone["scenarios"])):
        one, own = together["scenarios"].get(sid), alone["scenarios"].get(sid)
        if one is None or own is None:
            out.append(f"{sid}: only {'alone' if one is None else 'together'}")
            continue
        for key in sorted(set(one["observed"]) | set(own["observed"])):
            a, b = one["observed"].get(key, "<missing>"), own["observed"].get(key, "<missing>")
            if not same(a, b):
                out.append(f"{sid}.{key}: together {a!r}, alone {b!r}")
        if not same(one.get("error"), own.get("error")):
            out.append(f"{sid}: error together {one.get('error')!r}, alone {own.get('error')!r}")
    return out


@pytest.mark.parametrize("version", BRACKETS)
@pytest.mark.parametrize("experiment", ["admission", "prefill"])
def test_check_observes_in_one_process_what_each_probe_observes_alone(both, version, experiment):
    together, alone = both[version, experiment]
    assert together["scenarios"], "the check ran no scenario"
    assert differences(together, alone) == [], f"{experiment} on {version}"
    assert together["sglang_version"] == alone["sglang_version"] == version
