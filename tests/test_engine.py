"""The warm probe engine (probes/engine.py) on synthetic trees, with this interpreter and no SGLang.

Each synthetic tree is a directory holding an ``sglang`` package; a "closure"
directory holds a third-party module with a global registry that refuses a second
registration, as transformers refuses a config name twice. The engine must give every
tree the answers a fresh process gives it, keep each fault to its own tree, and never
carry one tree's SGLang into the next.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import REGISTRY, make_project, with_real_probes

from pdevidence import registry
from pdevidence.cells import allprobes, engine
from pdevidence.core import errors, sandbox

ROOT = Path(__file__).resolve().parent.parent

CLOSURE_MODULE = """
REGISTERED = set()

def register(name):
    if name in REGISTERED:
        raise ValueError(f"{name!r} is already registered")
    REGISTERED.add(name)
"""
SGLANG = """
import os
import closurelib
closurelib.register("sglang-config")
__version__ = "{version}"
GUARD = {guard}
BEHAVIOUR = "{behaviour}"
if BEHAVIOUR == "crash":
    os._exit(9)
if BEHAVIOUR == "hang":
    import time
    time.sleep(600)
if BEHAVIOUR == "slow":  # a tree whose probing takes a while
    import time
    time.sleep(20)  # longer than the next era's engine takes to start on a loaded 2-core machine (8 s was not)
if BEHAVIOUR == "brief":  # long enough to overlap a slow tree whose engine started a moment later
    import time
    time.sleep(3)
if BEHAVIOUR == "kill-engine":  # as the kernel's OOM killer would
    os.kill(os.getppid(), 9)
    import time
    time.sleep(600)
"""
# Every demo probe: the scenario set and its prepare(); each adds its scenarios.
PROBE_HEAD = """
from _probekit import ScenarioSet
SET = ScenarioSet("demo")

def prepare():
    import sglang
    return sglang.__version__
"""
PROBE = PROBE_HEAD + """
@SET.scenario("D1", "the door")
def d1(observed):
    import sglang, closurelib
    observed["retired"] = sglang.GUARD
    observed["registrations"] = len(closurelib.REGISTERED)
"""


def make_tree(root: Path, version: str, *, guard: bool, behaviour: str = "normal") -> Path:
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text(SGLANG.format(version=version, guard=guard, behaviour=behaviour))
    return root


@pytest.fixture
def world(tmp_path):
    """A project whose probes dir holds the real in-cell files and a demo probe; a closure on PYTHONPATH."""
    root = with_real_probes(make_project(tmp_path / "project", REGISTRY), PROBE)
    closure = tmp_path / "closure"
    closure.mkdir()
    (closure / "closurelib.py").write_text(CLOSURE_MODULE)
    return registry.load(root), tmp_path, closure


def args_for(version: str) -> dict[str, str]:
    return {"side": "sweep", "tree_kind": "release", "tree_ref": version, "tree_resolved": version}


def run_engine(reg, tmp_path, closure, trees: dict[str, Path], monkeypatch, jobs=1, timeout=None):
    monkeypatch.setenv("PYTHONPATH", str(closure))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    if timeout:
        monkeypatch.setenv("PDEVIDENCE_PROBE_TIMEOUT", str(timeout))
    tasks = [engine.TreeTask(label, path, args_for(label)) for label, path in trees.items()]
    lines = []
    found = engine.run(reg, Path(sys.executable), tasks, ["demo"], out_dir=tmp_path / "out", logs=tmp_path / "logs",
                       preload=tmp_path / "preload.json", jobs=jobs, log=lines.append)
    return found, lines


def fresh_result(reg, tmp_path, closure, label: str, tree: Path) -> bytes:
    """What probe_all writes for the tree in a process of its own."""
    out = tmp_path / "fresh" / label
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(closure)]), "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, str(reg.root / "probes" / "probe_all.py"), str(reg.experiment("demo").probe),
                    "--out-dir", str(out), *allprobes.tree_argv(args_for(label))], env=env, check=True, timeout=60)
    return (out / "demo.json").read_bytes()


def test_every_tree_gets_the_bytes_a_fresh_process_writes(world, monkeypatch):
    reg, tmp_path, closure = world
    trees = {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False),
             "1.1.0": make_tree(tmp_path / "t2", "1.1.0", guard=True),
             "1.2.0": make_tree(tmp_path / "t3", "1.2.0", guard=True)}
    found, _ = run_engine(reg, tmp_path, closure, trees, monkeypatch)
    for label, tree in trees.items():
        assert found[label]["demo"].doc is not None, found[label]["demo"].error
        assert (tmp_path / "out" / label / "demo.json").read_bytes() == fresh_result(reg, tmp_path, closure, label, tree)
    assert [found[v]["demo"].doc["scenarios"]["D1"]["observed"]["retired"] for v in trees] == [False, True, True]


def with_old(reg: registry.Registry) -> registry.Registry:
    """``reg`` with a second experiment, ``old`` (demo's expectations, a probe of its own), whose floor is older."""
    text = (reg.root / "experiments.toml").read_text()
    older = text.split("[experiments.demo]", 1)[1].replace("experiments.demo", "experiments.old").replace(
        'probe = "probes/probe_demo.py"', 'probe = "probes/probe_old.py"\nrelease_floor = "0.9.0"')
    (reg.root / "experiments.toml").write_text(text + "\n[experiments.old]" + older)
    (reg.root / "probes" / "probe_old.py").write_text(PROBE.replace('ScenarioSet("demo")', 'ScenarioSet("old")'))
    return registry.load(reg.root)


def test_each_tree_is_probed_only_for_the_experiments_asked_of_it(world, monkeypatch):
    """The sweep probes a release below an experiment's floor without it: its child runs none of its probe, and
    its outcomes, output directory and cache entry name only what ran."""
    reg, tmp_path, closure = world
    reg = with_old(reg)
    monkeypatch.setenv("PYTHONPATH", str(closure))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    tasks = [engine.TreeTask(v, make_tree(tmp_path / f"t{v}", v, guard=False), args_for(v)) for v in ("0.9.5", "1.0.0")]
    found = engine.run(reg, Path(sys.executable), tasks, ["demo", "old"], out_dir=tmp_path / "out",
                       logs=tmp_path / "logs", preload=tmp_path / "preload.json", log=lambda line: None,
                       only={"0.9.5": ["old"]})
    assert set(found["0.9.5"]) == {"old"} and set(found["1.0.0"]) == {"demo", "old"}
    assert all(o.doc is not None for outcomes in found.values() for o in outcomes.values())
    assert sorted(p.name for p in (tmp_path / "out" / "0.9.5").iterdir()) == ["old.json"]
    assert sorted(p.name for p in (tmp_path / "out" / "1.0.0").iterdir()) == ["demo.json", "old.json"]


def test_the_engine_preloads_what_children_needed_but_never_sglang(world, monkeypatch):
    reg, tmp_path, closure = world
    trees = {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False),
             "1.1.0": make_tree(tmp_path / "t2", "1.1.0", guard=True)}
    found, _ = run_engine(reg, tmp_path, closure, trees, monkeypatch)
    preloaded = json.loads((tmp_path / "preload.json").read_text())
    assert "closurelib" in preloaded
    assert not [name for name in preloaded if name.partition(".")[0] in ("sglang", "_probekit", "probe_all")]
    # The second child ran in a parent that had imported closurelib: it still saw one registration,
    # its own, as a fresh process does - the parent never imported the first tree's SGLang.
    for label in trees:
        assert found[label]["demo"].doc["scenarios"]["D1"]["observed"]["registrations"] == 1
    again, _ = run_engine(reg, tmp_path, closure, trees, monkeypatch)  # starts warm from the preload file
    assert again["1.1.0"]["demo"].doc == found["1.1.0"]["demo"].doc


def test_a_child_that_dies_fails_its_own_tree_only(world, monkeypatch):
    reg, tmp_path, closure = world
    trees = {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False, behaviour="crash"),
             "1.1.0": make_tree(tmp_path / "t2", "1.1.0", guard=True)}
    found, lines = run_engine(reg, tmp_path, closure, trees, monkeypatch, jobs=2)
    assert found["1.0.0"]["demo"].doc is None
    assert "exited with status 9 and wrote nothing for demo" in found["1.0.0"]["demo"].error
    assert found["1.1.0"]["demo"].doc is not None
    assert any("1.0.0 done" in line and "exited with status 9" in line for line in lines)


def test_a_child_past_the_timeout_is_killed_and_reported_for_its_tree(world, monkeypatch):
    reg, tmp_path, closure = world
    trees = {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False, behaviour="hang"),
             "1.1.0": make_tree(tmp_path / "t2", "1.1.0", guard=True)}
    found, _ = run_engine(reg, tmp_path, closure, trees, monkeypatch, jobs=2, timeout=3)
    assert "timed out after" in found["1.0.0"]["demo"].error
    assert found["1.1.0"]["demo"].doc is not None


@pytest.mark.parametrize(("oom_kills", "peak"), [(1, None), (1, 64 << 20), (0, None)])
def test_an_engine_killed_at_the_memory_limit_leaves_its_unfinished_trees_cannot_run_naming_it(world, monkeypatch,
                                                                                               oom_kills, peak):
    """Killed with the sandbox's memory cgroup counting an OOM kill, the engine's finished trees keep their results
    and the rest cannot run for want of memory: at the limit, or (the sandbox's peak well under it) because the
    machine ran out first; any other death of the engine is still an error of the run."""
    reg, tmp_path, closure = world
    monkeypatch.setattr(sandbox, "oom_kills", lambda group: oom_kills)
    monkeypatch.setattr(sandbox, "memory_peak", lambda group: peak)
    trees = {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False),
             "1.1.0": make_tree(tmp_path / "t2", "1.1.0", guard=True, behaviour="kill-engine"),
             "1.2.0": make_tree(tmp_path / "t3", "1.2.0", guard=True)}  # never started
    if not oom_kills:
        with pytest.raises(errors.HarnessError, match="the probe engine exited with status"):
            run_engine(reg, tmp_path, closure, trees, monkeypatch)
        return
    found, lines = run_engine(reg, tmp_path, closure, trees, monkeypatch)
    assert found["1.0.0"]["demo"].doc is not None
    error = found["1.1.0"]["demo"].error
    assert found["1.1.0"]["demo"].doc is None and "memory" in error and "wrote nothing for demo" in error, error
    if sandbox.detect().contained:
        assert ("when the machine ran out of memory, its sandbox holding 64 MiB at most, under its limit of 8 GiB"
                if peak else "killed by the kernel at the memory limit of 8 GiB (PDEVIDENCE_PROBE_MEMORY)") in error
    assert "it left no output" in found["1.2.0"]["demo"].error and "memory" in found["1.2.0"]["demo"].error
    assert any("engine: out of memory; 1.1.0, 1.2.0 unfinished" in line for line in lines)


def test_an_engine_that_raised_memory_error_itself_leaves_its_trees_cannot_run_naming_the_limit(world, monkeypatch):
    """The engine's own imports (its closure, the preload list) past the limit per process: here an import of the
    engine's that raises MemoryError as one past it does."""
    reg, tmp_path, closure = world
    monkeypatch.setenv("PDEVIDENCE_PROBE_MEMORY", "1G")
    (closure / "sitecustomize.py").write_text("""
import sys
class Hog:
    def find_spec(self, name, path=None, target=None):
        if name == "probe_all":
            raise MemoryError
if sys.argv and sys.argv[0].endswith("engine.py"):
    sys.meta_path.insert(0, Hog())
""")
    found, lines = run_engine(reg, tmp_path, closure, {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False)},
                              monkeypatch)
    error = found["1.0.0"]["demo"].error
    assert found["1.0.0"]["demo"].doc is None and "it left no output" in error, error
    if sandbox.detect().contained:
        assert "hit the memory limit of 1 GiB per process (PDEVIDENCE_PROBE_MEMORY;" in error, error
    assert any("engine: out of memory; 1.0.0 unfinished" in line for line in lines)


def test_a_driver_that_ran_out_of_memory_outside_any_scenario_cannot_run_naming_the_limit(world):
    reg, tmp_path, _ = world
    log = tmp_path / "driver.log"
    log.write_text("Traceback (most recent call last):\n  File \"probe_all.py\", line 1, in <module>\nMemoryError\n"
                   "probe cannot run: the probe driver failed outside any scenario\n")
    record = {"tool": "bubblewrap", "limits": {"memory_bytes": 2 << 30}}
    (tmp_path / "out").mkdir()
    found = allprobes.collect([reg.experiment("demo")], tmp_path / "out", log, "exited with status 3", record)["demo"]
    assert found.doc is None and found.out_of_memory
    assert found.error.startswith("MemoryError: the probe process hit the memory limit of 2 GiB per process "
                                  "(PDEVIDENCE_PROBE_MEMORY;"), found.error


def test_a_tree_whose_sglang_does_not_import_is_recorded_as_cannot_run(world, monkeypatch):
    reg, tmp_path, closure = world
    broken = tmp_path / "t1"
    (broken / "sglang").mkdir(parents=True)
    (broken / "sglang" / "__init__.py").write_text("import gpu_only_kernels\n")
    found, _ = run_engine(reg, tmp_path, closure, {"1.0.0": broken}, monkeypatch)
    assert found["1.0.0"]["demo"].error == "ModuleNotFoundError: No module named 'gpu_only_kernels'"


DOOR = """

def door():
    return GUARD
"""
DOOR_MUTANT_PROBE = PROBE + """

@SET.scenario("D2", "the door, asked")
def d2(observed):
    import sglang
    observed["door"] = sglang.door()
"""
MUTANTS = [{"id": "shut", "title": "the door always says no", "kind": "removes-fix", "target": "sglang:door",
            "operator": "constant", "value": False}]


def mutation_task(reg, tmp_path, label: str, tree: Path) -> engine.DriverTask:
    """The mutant driver on ``tree``: it reads its specs from, and writes its document in, tmp_path/mutants
    (the only directory its sandbox lets it write, as the lane's runs/mutate/)."""
    specs = tmp_path / "mutants" / "specs.json"
    specs.write_text(json.dumps(MUTANTS))
    return engine.DriverTask(label, tree, ["--probe", str(reg.experiment("demo").probe), "--mutants", str(specs),
                                           "--tree-kind", "release", "--tree-ref", label, "--tree-resolved", label,
                                           "--out", str(tmp_path / "mutants" / f"{label}.json")],
                             driver="probe_mutants", writes=(tmp_path / "mutants",))


def test_a_mutation_task_runs_probe_mutants_in_a_child_and_writes_what_a_fresh_process_writes(world, monkeypatch):
    reg, tmp_path, closure = world
    reg.experiment("demo").probe.write_text(DOOR_MUTANT_PROBE)
    tree = make_tree(tmp_path / "t1", "1.1.0", guard=True)
    (tree / "sglang" / "__init__.py").write_text((tree / "sglang" / "__init__.py").read_text() + DOOR)
    monkeypatch.setenv("PYTHONPATH", str(closure))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    (tmp_path / "mutants").mkdir()
    task = mutation_task(reg, tmp_path, "1.1.0", tree)
    lines = []
    failures = engine.run_tasks(reg, Path(sys.executable), [task], logs=tmp_path / "logs",
                                preload=tmp_path / "preload.json", log=lines.append).failures
    assert failures == {"1.1.0": None} and any("1.1.0 done" in line for line in lines)
    forked = (tmp_path / "mutants" / "1.1.0.json").read_bytes()
    doc = json.loads(forked)
    assert doc["baseline"]["D2"]["observed"]["door"] is True
    assert doc["mutants"]["shut"]["scenarios"]["D2"]["observed"]["door"] is False
    assert doc["baseline_after"] == doc["baseline"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(closure)])}
    subprocess.run([sys.executable, str(reg.root / "probes" / "probe_mutants.py"), *task.argv], env=env, check=True,
                   timeout=60)
    assert (tmp_path / "mutants" / "1.1.0.json").read_bytes() == forked


def test_a_mutation_child_that_dies_fails_its_own_task_only(world, monkeypatch):
    reg, tmp_path, closure = world
    reg.experiment("demo").probe.write_text(DOOR_MUTANT_PROBE)
    trees = {"1.0.0": make_tree(tmp_path / "t1", "1.0.0", guard=False, behaviour="crash"),
             "1.1.0": make_tree(tmp_path / "t2", "1.1.0", guard=True)}
    for tree in trees.values():
        (tree / "sglang" / "__init__.py").write_text((tree / "sglang" / "__init__.py").read_text() + DOOR)
    monkeypatch.setenv("PYTHONPATH", str(closure))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    (tmp_path / "mutants").mkdir()
    tasks = [mutation_task(reg, tmp_path, label, tree) for label, tree in trees.items()]
    failures = engine.run_tasks(reg, Path(sys.executable), tasks, logs=tmp_path / "logs",
                                preload=tmp_path / "preload.json", jobs=2, log=lambda line: None).failures
    assert failures == {"1.0.0": "exited with status 9", "1.1.0": None}
    assert not (tmp_path / "mutants" / "1.0.0.json").exists()
    assert json.loads((tmp_path / "mutants" / "1.1.0.json").read_text())["mutants"]["shut"]["status"] == "applied"


def test_a_task_naming_an_unknown_driver_is_refused_before_any_child_runs(world, monkeypatch):
    reg, tmp_path, closure = world
    task = engine.DriverTask("1.0.0", make_tree(tmp_path / "t1", "1.0.0", guard=False), [], driver="os")
    with pytest.raises(errors.HarnessError, match="exited with status 2") as exc:
        engine.run_tasks(reg, Path(sys.executable), [task], logs=tmp_path / "logs", preload=tmp_path / "preload.json",
                         log=lambda line: None)
    assert "unknown drivers ['os']" in str(exc.value)
    assert not (tmp_path / "logs" / "1.0.0.log").exists()


@pytest.fixture
def warm_world(world, monkeypatch):
    """probe_trees with this interpreter as the closure environment (PYTHONPATH holds the closure)."""
    from types import SimpleNamespace

    from pdevidence import environments
    from pdevidence.registry import TorchChannel
    from pdevidence.sources.trees import Tree

    reg, tmp_path, closure = world
    monkeypatch.setenv("PDEVIDENCE_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("PYTHONPATH", str(closure))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = SimpleNamespace(interpreter=Path(sys.executable), path=tmp_path / "closure-env",
                          torch=SimpleNamespace(channel=TorchChannel.PYPI))
    monkeypatch.setattr(environments, "closure_environment", lambda reg, era=None, log=None: env)
    monkeypatch.setattr(environments, "find_python", lambda version: SimpleNamespace(identity=lambda: "cpython-3.12.1"))

    def tree(version: str, guard: bool) -> Tree:
        path = make_tree(tmp_path / f"tree-{version}", version, guard=guard)
        return Tree("release", version, version, path, version.replace(".", "") * 8, "pypi", "test")

    return reg, tmp_path, [tree("1.0.0", False), tree("1.1.0", True)]


def probe(reg, tmp_path, trees, **kw):
    from pdevidence.cells import warm

    lines = []
    found = warm.probe_trees(reg, trees, ["demo"], {t.label(): args_for(t.resolved) for t in trees},
                             out_dir=tmp_path / "sweep", log=lines.append, **kw)
    return found, "\n".join(lines)


def test_an_unchanged_rerun_probes_nothing_and_gives_the_same_outcomes(warm_world):
    reg, tmp_path, trees = warm_world
    first, said = probe(reg, tmp_path, trees)
    assert "probing release-1.0.0, release-1.1.0" in said
    again, said = probe(reg, tmp_path, trees)
    assert "probing" not in said and "2 tree(s) unchanged" in said
    assert {k: v["demo"].doc for k, v in again.items()} == {k: v["demo"].doc for k, v in first.items()}
    forced, said = probe(reg, tmp_path, trees, force=True)
    assert "probing release-1.0.0, release-1.1.0" in said


def test_a_changed_probe_or_a_new_release_is_probed_again(warm_world):
    reg, tmp_path, trees = warm_world
    probe(reg, tmp_path, trees[:1])
    _, said = probe(reg, tmp_path, trees)
    assert "probing release-1.1.0 " in said and "1 tree(s) unchanged" in said
    probe_file = reg.experiment("demo").probe
    probe_file.write_text(probe_file.read_text() + "\n# a comment is a change\n")
    _, said = probe(reg, tmp_path, trees)
    assert "probing release-1.0.0, release-1.1.0" in said


def test_an_outcome_kept_for_some_experiments_is_reused_for_those_alone(warm_world):
    from pdevidence.cells import warm

    reg, tmp_path, trees = warm_world
    reg = with_old(reg)
    args = {t.label(): args_for(t.resolved) for t in trees}

    def probe_only(only):
        lines = []
        found = warm.probe_trees(reg, trees, ["demo", "old"], args, out_dir=tmp_path / "sweep", log=lines.append,
                                 only=only)
        return found, "\n".join(lines)

    found, said = probe_only({"release-1.0.0": ["old"]})
    assert "probing release-1.0.0 (old only), release-1.1.0 " in said
    assert set(found["release-1.0.0"]) == {"old"} and set(found["release-1.1.0"]) == {"demo", "old"}
    assert sorted(p.name for p in (tmp_path / "sweep" / "release-1.0.0").iterdir()) == ["old.json"]
    _, said = probe_only({"release-1.0.0": ["old"]})
    assert "probing" not in said and "2 tree(s) unchanged" in said
    found, said = probe_only(None)  # asked for both now: what was kept for old alone does not answer demo
    assert "probing release-1.0.0 " in said and "outcomes reused: release-1.1.0" in said
    assert set(found["release-1.0.0"]) == {"demo", "old"}


def test_what_the_engine_could_not_finish_is_never_kept(warm_world):
    reg, tmp_path, trees = warm_world
    crash = trees[0].install_target / "sglang" / "__init__.py"
    crash.write_text(crash.read_text().replace('BEHAVIOUR = "normal"', 'BEHAVIOUR = "crash"'))
    found, _ = probe(reg, tmp_path, trees)
    assert found["release-1.0.0"]["demo"].doc is None
    _, said = probe(reg, tmp_path, trees)
    assert "probing release-1.0.0 " in said and "outcomes reused: release-1.1.0 " in said


def test_an_engine_started_ahead_for_a_tree_is_the_one_its_round_probes_through(warm_world, monkeypatch):
    """A bisection starts each era's kept engine as the era's first tree is made (``warm.start_kept_engine``); the
    round that probes the tree then finds that engine, not a second one (both ask with ``warm._engine_settings``)."""
    from pdevidence import environments
    from pdevidence.cells import warm
    from pdevidence.core import children

    reg, tmp_path, trees = warm_world
    monkeypatch.setattr(environments, "closure_environment_path", lambda reg, installs: tmp_path)  # built already
    started, popen = [], children.popen
    monkeypatch.setattr(children, "popen", lambda command, **kw: started.append(command) or popen(command, **kw))
    with engine.Engines(reg, reads=(tmp_path,), logs=tmp_path / "logs") as engines:
        warm.start_kept_engine(reg, trees[0], engines)
        assert len(started) == 1
        found, said = probe(reg, tmp_path, trees, engines=engines)
    assert len(started) == 1 and "in the engine kept across rounds" in said
    assert [found[t.label()]["demo"].doc["scenarios"]["D1"]["observed"]["retired"] for t in trees] == [False, True]


def test_the_next_era_starts_while_the_one_before_still_probes_and_its_time_counts_once(warm_world, monkeypatch):
    from types import SimpleNamespace

    from pdevidence import environments
    from pdevidence.core import phases

    reg, tmp_path, trees = warm_world
    for tree, behaviour in zip(trees, ("slow", "brief")):
        init = tree.install_target / "sglang" / "__init__.py"
        init.write_text(init.read_text().replace('BEHAVIOUR = "normal"', f'BEHAVIOUR = "{behaviour}"'))
    eras = {"1.0.0": SimpleNamespace(name="old"), "1.1.0": SimpleNamespace(name="new")}  # one era per tree
    monkeypatch.setattr(environments, "era_of", lambda reg, tree: eras[tree.resolved])
    monkeypatch.setattr(environments, "closure", lambda reg, era: reg.root / "constraints" / "cells.txt")
    monkeypatch.setattr(environments, "stand_in_env", lambda era: {})
    with phases.recording() as spans:
        found, said = probe(reg, tmp_path, trees)
    assert said.index("engine (new): probing") < said.index("engine: release-1.0.0 done")
    assert said.index("engine: release-1.1.0 done") < said.index("engine: release-1.0.0 done")
    assert [found[t.label()]["demo"].doc["scenarios"]["D1"]["observed"]["retired"] for t in trees] == [False, True]
    (first_start, first_end), (second_start, second_end) = sorted(spans[phases.PROBING])
    assert second_start < first_end  # probed side by side (either engine may fork first): the wall saw the overlap once
    assert spans.seconds(phases.PROBING) == pytest.approx(max(first_end, second_end) - first_start)


# The fixture registry's differential (synthetic.REGISTRY: D1 changes, D2 does not), read from the tree's GUARD.
DOOR_PROBE = PROBE_HEAD + """
@SET.scenario("D1", "the door")
def d1(observed):
    import sglang
    observed["enqueued"] = not sglang.GUARD
    observed["retired"] = sglang.GUARD

@SET.scenario("D2", "a valid request")
def d2(observed):
    observed["enqueued"] = True
"""


def test_several_check_targets_each_get_their_answer_and_trees_not_pinned_never_share_an_engine(warm_world, capsys):
    from synthetic import result_doc, wheel_bytes, write_cell

    from pdevidence import cli
    from pdevidence.documents import integrity

    reg, tmp_path, _ = warm_world
    reg.experiment("demo").probe.write_text(DOOR_PROBE)
    write_cell(reg.root / "results", "base", result_doc("base", "1.0.0"))
    write_cell(reg.root / "results", "head", result_doc("head", "1.1.0"))
    integrity.regenerate(reg.root)  # check verifies the published references before judging by them
    wheels = []
    for version, guard in (("2.0.0", False), ("2.1.0", True)):
        wheel = tmp_path / f"sglang-{version}-py3-none-any.whl"
        wheel.write_bytes(wheel_bytes(version, SGLANG.format(version=version, guard=guard, behaviour="normal")))
        wheels += ["--wheel", str(wheel)]
    vex = tmp_path / "vex.json"
    code = cli.main(["--root", str(reg.root), "check", *wheels, "--json", "--openvex", str(vex)])
    captured = capsys.readouterr()
    docs = json.loads(captured.out)
    assert [(d["target"]["resolved"], d["experiments"][0]["status"]) for d in docs] == [
        ("2.0.0", "affected"), ("2.1.0", "fixed")]
    assert code == docs[0]["exit_code"] == 1  # the worst of the two
    # A wheel file is the operator's: its children could write the other's results if they shared a sandbox.
    assert captured.err.count("engine: probing") == 2 and "in an engine of its own" in captured.err
    assert "wheel-2.0.0-" in captured.err and "wheel-2.1.0-" in captured.err  # each wheel's name has its digest
    products = [s["products"][0]["@id"] for s in json.loads(vex.read_text())["statements"]]
    assert products == ["pkg:pypi/sglang@2.0.0", "pkg:pypi/sglang@2.1.0"]


def test_a_tree_probed_for_another_lane_is_probed_again_not_reused_under_its_side(warm_world):
    from pdevidence.cells import warm

    reg, tmp_path, trees = warm_world
    probe(reg, tmp_path, trees[:1])  # side "sweep"
    lines = []
    found = warm.probe_trees(reg, trees[:1], ["demo"], {trees[0].label(): {**args_for("1.0.0"), "side": "check"}},
                             out_dir=tmp_path / "check", log=lines.append)
    assert "probing release-1.0.0" in "\n".join(lines)
    assert found["release-1.0.0"]["demo"].doc["side"] == "check"


def test_a_module_that_fails_to_preload_is_left_to_the_children_but_ctrl_c_stops_the_engine(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("warm_engine", ROOT / "probes" / "engine.py")
    warm_engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm_engine)
    (tmp_path / "broken_at_import.py").write_text("raise ImportError('no such library')\n")
    (tmp_path / "exits_at_import.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "interrupted_at_import.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    warm_engine._preload(["broken_at_import", "exits_at_import"], set())
    with pytest.raises(KeyboardInterrupt):
        warm_engine._preload(["interrupted_at_import"], set())


RECORDING_CLOSURE_MODULE = CLOSURE_MODULE + """
import os
with open(RECORD, "a") as record:
    record.write(f"{os.getpid()} {os.getppid()}\\n")  # who imported me, and its parent
"""


def recording_closure(closure: Path, record: Path) -> None:
    """closurelib records every process that imports it (the engine and its children may write in logs/)."""
    record.parent.mkdir(parents=True, exist_ok=True)
    (closure / "closurelib.py").write_text(f"RECORD = {str(record)!r}\n" + RECORDING_CLOSURE_MODULE)


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_engine_imports_what_a_child_needed_only_while_a_task_waits_for_its_fork(world, monkeypatch, jobs):
    """One tree at jobs 1, two at jobs 2: every fork happens before any child ends, so the engine itself never
    imports closurelib (each child does), though it still keeps it for the next engine."""
    reg, tmp_path, closure = world
    record = tmp_path / "logs" / "imports.txt"
    recording_closure(closure, record)
    trees = {v: make_tree(tmp_path / f"t{v}", v, guard=True) for v in ["1.0.0", "1.1.0"][:jobs]}
    found, _ = run_engine(reg, tmp_path, closure, trees, monkeypatch, jobs=jobs)
    assert all(found[label]["demo"].doc is not None for label in trees)
    importers = [tuple(line.split()) for line in record.read_text().splitlines()]
    children_of = {parent for _, parent in importers}
    assert len(importers) == jobs and not [pid for pid, _ in importers if pid in children_of], importers
    assert "closurelib" in json.loads((tmp_path / "preload.json").read_text())


def test_the_engine_imports_what_a_child_needed_before_the_next_fork(world, monkeypatch):
    reg, tmp_path, closure = world
    record = tmp_path / "logs" / "imports.txt"
    recording_closure(closure, record)
    trees = {v: make_tree(tmp_path / f"t{v}", v, guard=True) for v in ["1.0.0", "1.1.0"]}
    run_engine(reg, tmp_path, closure, trees, monkeypatch, jobs=1)
    (_, engine_pid), (importer, _) = [tuple(line.split()) for line in record.read_text().splitlines()]
    assert importer == engine_pid  # the second child inherited it from the warm engine


def test_what_a_preloaded_module_prints_goes_to_the_engines_log_not_among_its_reports(world, monkeypatch):
    """vLLM 0.6's logger writes to stdout at import: preloaded by the engine after the first child, its lines must
    not reach the channel the harness reads one JSON report per line from."""
    reg, tmp_path, closure = world
    (closure / "closurelib.py").write_text("print('INFO chatty at import')\n" + CLOSURE_MODULE)
    trees = {v: make_tree(tmp_path / f"t{v}", v, guard=True) for v in ["1.0.0", "1.1.0"]}
    found, lines = run_engine(reg, tmp_path, closure, trees, monkeypatch, jobs=1)
    assert all(found[label]["demo"].doc is not None for label in trees), found
    assert [line for line in lines if line.startswith("engine: ") and " done in " in line]
    assert "INFO chatty at import" in (tmp_path / "logs" / "engine.log").read_text()
