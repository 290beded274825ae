"""An engine kept across rounds (cells/engine.py ``Engines``, ``Session``; probes/engine.py ``--tasks -``), on the
synthetic trees of test_engine.py: one engine start for every round, each round's answers those of a fresh
process, a fault kept to its own task, and nothing left running once it is closed."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_engine import args_for, fresh_result, make_tree, world  # noqa: F401 - world is a fixture

from pdevidence.cells import engine
from pdevidence.core import children


@pytest.fixture
def kept(world, monkeypatch):  # noqa: F811 - the fixture imported above
    """``probe(label, tree)``: one round through engines kept across rounds, and how many engines started."""
    reg, tmp_path, closure = world
    monkeypatch.setenv("PYTHONPATH", str(closure))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    started = []
    popen = children.popen

    def counting(command, **kw):
        started.append(command)
        return popen(command, **kw)

    monkeypatch.setattr(children, "popen", counting)
    lines = []
    with engine.Engines(reg, reads=(tmp_path / "trees",), logs=tmp_path / "logs", log=lines.append) as engines:

        def probe(label: str, tree: Path, out: str = "out"):
            task = engine.TreeTask(label, tree, args_for(label))
            return engine.run(reg, Path(sys.executable), [task], ["demo"], out_dir=tmp_path / out,
                              logs=tmp_path / "unused-logs", preload=tmp_path / "preload.json", log=lines.append,
                              engines=engines)[label]["demo"]

        yield probe, started, engines, lines


def test_rounds_submitted_one_after_another_share_one_engine_start(world, kept):  # noqa: F811
    reg, tmp_path, closure = world
    probe, started, _, _ = kept
    trees = {v: make_tree(tmp_path / "trees" / v, v, guard=v != "1.0.0") for v in ("1.0.0", "1.1.0", "1.2.0")}
    found = {}
    for label, tree in trees.items():  # each round from a thread that then ends, as an era's in warm.probe_trees
        with ThreadPoolExecutor(1) as era:
            found[label] = era.submit(probe, label, tree).result()
    assert len(started) == 1
    for label, tree in trees.items():
        assert found[label].doc is not None, found[label].error
        assert (tmp_path / "out" / label / "demo.json").read_bytes() == fresh_result(reg, tmp_path, closure, label,
                                                                                     tree)
    assert [found[v].doc["scenarios"]["D1"]["observed"]["retired"] for v in trees] == [False, True, True]
    # Each child still saw one registration, its own: the kept parent never imported a tree's SGLang.
    assert {found[v].doc["scenarios"]["D1"]["observed"]["registrations"] for v in trees} == {1}


def test_a_child_that_dies_fails_its_own_round_only_and_the_engine_goes_on(world, kept):  # noqa: F811
    _, tmp_path, _ = world
    probe, started, _, lines = kept
    crashed = probe("1.0.0", make_tree(tmp_path / "trees" / "a", "1.0.0", guard=False, behaviour="crash"))
    after = probe("1.1.0", make_tree(tmp_path / "trees" / "b", "1.1.0", guard=True))
    assert "exited with status 9 and wrote nothing for demo" in crashed.error
    assert after.doc is not None, after.error
    assert len(started) == 1
    assert any("1.0.0 done" in line and "exited with status 9" in line for line in lines)


def test_a_tree_the_kept_engine_cannot_see_gets_an_engine_of_its_own(world, kept):  # noqa: F811
    _, tmp_path, _ = world
    probe, started, _, _ = kept
    probe("1.0.0", make_tree(tmp_path / "trees" / "a", "1.0.0", guard=False))
    elsewhere = probe("1.1.0", make_tree(tmp_path / "elsewhere", "1.1.0", guard=True))
    assert elsewhere.doc is not None, elsewhere.error
    assert len(started) == 2


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_closing_ends_the_engine_and_keeps_what_its_children_needed(world, monkeypatch):  # noqa: F811
    reg, tmp_path, closure = world
    monkeypatch.setenv("PYTHONPATH", str(closure))
    with engine.Engines(reg, reads=(tmp_path / "trees",), logs=tmp_path / "logs") as engines:
        session = engines.session(Path(sys.executable), tmp_path / "preload.json", None, 1)
        tree = make_tree(tmp_path / "trees" / "a", "1.0.0", guard=False)
        found = engine.run(reg, Path(sys.executable), [engine.TreeTask("1.0.0", tree, args_for("1.0.0"))], ["demo"],
                           out_dir=tmp_path / "out", logs=tmp_path / "unused", preload=tmp_path / "preload.json",
                           engines=engines)["1.0.0"]["demo"]
        assert found.doc is not None, found.error  # its tree made after the engine started
        assert session.alive
    assert session.proc.returncode == 0 and _gone(session.proc.pid)
    assert "closurelib" in (tmp_path / "preload.json").read_text()


def test_an_exception_kills_the_engine_with_the_child_it_was_running(world, monkeypatch):  # noqa: F811
    reg, tmp_path, closure = world
    monkeypatch.setenv("PYTHONPATH", str(closure))
    tree = make_tree(tmp_path / "trees" / "a", "1.0.0", guard=False, behaviour="hang")
    with pytest.raises(RuntimeError, match="the caller failed"):
        with engine.Session(reg, Path(sys.executable), reads=(tmp_path / "trees",), logs=tmp_path / "logs",
                            preload=tmp_path / "preload.json") as session:
            task = engine.DriverTask("1.0.0", tree, [str(reg.experiment("demo").probe), "--out-dir",
                                                     str(session.out / "1.0.0")])
            session.proc.stdin.write(engine._task_line(task, session.logs).encode())
            session.proc.stdin.flush()
            raise RuntimeError("the caller failed")
    assert session.proc.returncode != 0 and _gone(session.proc.pid)
    assert not (tmp_path / "preload.json").exists()  # a killed engine's list is not kept


def test_a_streamed_task_naming_an_unknown_driver_fails_alone_and_the_engine_goes_on(world, monkeypatch):  # noqa: F811
    reg, tmp_path, closure = world
    monkeypatch.setenv("PYTHONPATH", str(closure))
    tree = make_tree(tmp_path / "trees" / "a", "1.0.0", guard=False)
    with engine.Session(reg, Path(sys.executable), reads=(tmp_path / "trees",), logs=tmp_path / "logs",
                        preload=tmp_path / "preload.json") as session:
        argv = [str(reg.experiment("demo").probe), "--out-dir", str(session.out / "x")]
        refused = session.run([engine.DriverTask("x", tree, argv, driver="os")])
        ran = session.run([engine.DriverTask("y", tree, argv)])
    assert refused.failures == {"x": "names the unknown driver 'os'; known: probe_all, probe_mutants"}
    assert ran.failures == {"y": None}
