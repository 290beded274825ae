"""Drive the warm probe engine (probes/engine.py): one closure process, one forked child per task.

The engine runs in a closure environment that holds no SGLang; each task names a
tree (a directory with ``sglang/`` in it: an unpacked wheel, a source tree's
``python/``), put first on the child's path, and the in-cell driver the child runs on
it with its arguments: ``probe_all`` (every probe: ``run``, for the sweep and check)
or ``probe_mutants`` (the mutation lane). A child writes the documents its driver
writes in a fresh process, and nothing else comes back but how it ended. The modules
the children needed are kept per closure, so the next engine for that closure
preloads them before its first child.

The engine runs contained (``core/sandbox.py``), and so does every child it forks: it
sees the closure, the probes and its tasks' trees read-only, and writes only its logs
and its tasks' output directories. Its children share that sandbox, so one engine
probes trees that trust each other: the releases from the package index together,
any other tree alone (``warm.py`` groups them).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import children, phases, sandbox
from ..core.errors import HarnessError
from ..core.files import dumps, read_json, write_atomic
from ..registry import Registry
from . import allprobes, probe_run
from .probe_run import timeout_seconds

ENGINE = "engine.py"


@dataclass(frozen=True)
class TreeTask:
    """One tree for the engine: where its ``sglang`` package is, and how the results name it."""

    label: str
    path: Path
    tree_args: dict[str, str]
    trusted: bool = False  # pinned with a verified hash (``Tree.pinned``): may run where nothing contains it
    shared: bool = False  # may share an engine with the other shared trees (``warm._groups``)


@dataclass(frozen=True)
class DriverTask:
    """One child: the in-cell driver it runs (a module in probes/), on which tree, with which arguments."""

    id: str
    path: Path
    argv: list[str]
    driver: str = "probe_all"
    writes: tuple[Path, ...] = ()  # the directories its driver writes its documents in


@dataclass(frozen=True)
class Finished:
    failures: dict[str, str | None]  # per task id, how its child failed (None: it exited 0)
    containment: dict  # how the engine and its children ran (sandbox.Containment.record)


def preload_file(env_path: Path) -> Path:
    """Where the modules the children of one closure environment needed are kept: beside it, so every checkout
    and the installed tool that share the environment start its engines as warm."""
    return env_path.parent / f"{env_path.name}.preload.json"


def run_tasks(reg: Registry, interpreter: Path, tasks: list[DriverTask], *, logs: Path, preload: Path,
              trusted: bool = False, jobs: int = 2, env: dict[str, str] | None = None, log=print) -> Finished:
    """Fork one child per task, in one contained engine (``trusted``: every task's tree is pinned); how each
    child ended and how they ran. A child's output is in ``logs/<id>.log``. ``env`` is added to the engine's
    environment (an era's stand-ins)."""
    if not tasks:
        return Finished({}, sandbox.detect().record())
    logs.mkdir(parents=True, exist_ok=True)
    # Its tasks, its preload list and its children's module lists in a directory of its own (no other
    # engine sees it); the list it leaves is checked before it replaces ours.
    with tempfile.TemporaryDirectory(prefix="pdevidence-engine-") as private:
        task_file, needed = Path(private) / "tasks.jsonl", Path(private) / "preload.json"
        task_file.write_text("".join(json.dumps({"id": t.id, "path": str(t.path), "log": str(logs / f"{t.id}.log"),
                                                 "argv": t.argv, "driver": t.driver}) + "\n" for t in tasks),
                             encoding="utf-8")
        write_atomic(needed, dumps(_preload_list(preload)))
        command = [str(interpreter), str(reg.root / "probes" / ENGINE), "--tasks", str(task_file), "--jobs",
                   str(jobs), "--timeout", str(timeout_seconds()), "--scratch", str(Path(private) / "scratch"),
                   "--preload", str(needed)]
        view = sandbox.View(read=(reg.root / "probes", *(t.path for t in tasks)),
                            write=(Path(private), logs, *(w for t in tasks for w in t.writes)), cwd=logs)
        engine_log = logs / "engine.log"
        launched = time.monotonic()
        what = f"the probe engine on {', '.join(t.id for t in tasks)}"
        run_env = {**os.environ, **allprobes.PROBE_ENV, **(env or {})}
        reports = {}
        with open(engine_log, "wb") as err, sandbox.launch(command, view, run_env, trusted=trusted,
                                                           what=what) as launch:
            proc = children.popen(launch.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                  env=launch.env)
            try:
                for raw in proc.stdout:  # one line per child, as each ends
                    report = json.loads(raw)
                    if not report.get("timeout") and launch.killed_at_memory_limit(report.get("signal")):
                        report["error"] = launch.out_of_memory()
                    reports[report["id"]] = report
                    log(f"engine: {report['id']} done in {report['seconds']} s ({_status(report)})")
            finally:
                children.wait(proc)
            said = launch.out_of_memory() if launch.exited_at_memory_limit(proc.returncode) else None
        if proc.returncode != 0 and not said and probe_run.raised_memory_error(engine_log):  # in its own imports
            said = sandbox.out_of_memory(launch.record, killed=False)
        _spent(reports.values(), launched, time.monotonic())
        if said:  # its children not yet reported died with it: each tree's answer is the limit
            log(f"engine: out of memory; "
                f"{', '.join(t.id for t in tasks if t.id not in reports) or 'no task'} unfinished")
            return Finished({t.id: _failure(reports.get(t.id)) if t.id in reports else said for t in tasks},
                            launch.record)
        if proc.returncode != 0:
            raise HarnessError(f"the probe engine exited with status {proc.returncode}; last output:\n"
                               f"{probe_run.tail(engine_log)}",
                               todo=f"read {engine_log}; `--cold` runs each task in its own process instead")
        write_atomic(preload, dumps(_preload_list(needed)))
    return Finished({t.id: _failure(reports.get(t.id)) for t in tasks}, launch.record)


def _spent(reports, launched: float, ended: float) -> None:
    """The engine's start (its closure's import, until the first child forks) and its probing (first fork to last
    end), placed on the clock by when its children forked (``at``) and how long each ran."""
    spans = [(r["at"], r["at"] + r["seconds"]) for r in reports if isinstance(r.get("at"), (int, float))]
    if not spans:
        phases.add(phases.ENGINE_START, launched, ended)
        return
    first = min(start for start, _ in spans)
    phases.add(phases.ENGINE_START, launched, first)
    phases.add(phases.PROBING, first, max(end for _, end in spans))


def _preload_list(path: Path) -> list[str]:
    """The module names in a preload file (a list of dotted names); anything else counts as none."""
    if not path.exists():
        return []
    try:
        names = read_json(path, "preload list", todo="")
    except HarnessError:
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and all(part.isidentifier() for part in n.split("."))]


def run(reg: Registry, interpreter: Path, tasks: list[TreeTask], experiments: list[str], *,
        out_dir: Path, logs: Path, preload: Path, jobs: int = 2, env: dict[str, str] | None = None,
        log=print) -> dict[str, dict[str, allprobes.Outcome]]:
    """Every experiment on every tree (``probe_all``), in one engine; per tree label, per experiment, what came
    back. The trees share the engine's sandbox: pass only trees that trust each other (``warm.py``)."""
    exps = [reg.experiment(name) for name in experiments]
    driver_tasks = []
    for task in tasks:
        allprobes.clear(out_dir / task.label, experiments)
        argv = [*[str(e.probe) for e in exps], "--out-dir", str(out_dir / task.label),
                *allprobes.tree_argv(task.tree_args)]
        driver_tasks.append(DriverTask(task.label, task.path, argv, writes=(out_dir / task.label,)))
    done = run_tasks(reg, interpreter, driver_tasks, logs=logs, preload=preload,
                     trusted=all(task.trusted for task in tasks), jobs=jobs, env=env, log=log)
    return {task.label: allprobes.collect(exps, out_dir / task.label, logs / f"{task.label}.log",
                                          done.failures[task.label] or "exited with status 0", done.containment)
            for task in tasks}


def _failure(report: dict | None) -> str | None:
    if report is None:
        return "was never reported by the engine"
    return None if report["status"] == 0 else _status(report)


def _status(report: dict) -> str:
    if report.get("error"):
        return report["error"]
    if report["timeout"]:
        return f"timed out after {report['seconds']} s and was killed"
    if report["signal"] is not None:
        return f"was killed by signal {report['signal']}"
    return f"exited with status {report['status']}"
