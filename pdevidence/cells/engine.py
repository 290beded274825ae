"""Drive the warm probe engine (probes/engine.py): one closure process, one forked child per task.

The engine runs in a closure environment that holds no SGLang; each task names a
tree (a directory with ``sglang/`` in it: an unpacked wheel, a source tree's
``python/``), put first on the child's path, and the in-cell driver the child runs on
it with its arguments: ``probe_all`` (every probe: ``run``, for the sweep and check)
or ``probe_mutants`` (the mutation lane). A child writes the documents its driver
writes in a fresh process, and nothing else comes back but how it ended. The modules
the children needed are kept per closure, so the next engine for that closure
preloads them before its first child.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core import children
from ..core.errors import HarnessError
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


@dataclass(frozen=True)
class DriverTask:
    """One child: the in-cell driver it runs (a module in probes/), on which tree, with which arguments."""

    id: str
    path: Path
    argv: list[str]
    driver: str = "probe_all"


def preload_file(work: Path, env_path: Path) -> Path:
    """Where the modules the children of one closure environment needed are kept."""
    return work / "engine" / f"{env_path.name}.preload.json"


def run_tasks(reg: Registry, interpreter: Path, tasks: list[DriverTask], *, logs: Path, preload: Path,
              jobs: int = 2, env: dict[str, str] | None = None, log=print) -> dict[str, str | None]:
    """Fork one child per task; per task id, how its child failed (None: it exited 0). Its output is in
    ``logs/<id>.log``. ``env`` is added to the engine's environment (an era's stand-ins)."""
    if not tasks:
        return {}
    logs.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": t.id, "path": str(t.path), "log": str(logs / f"{t.id}.log"), "argv": t.argv,
                         "driver": t.driver}) for t in tasks]
    task_file = logs / "engine-tasks.jsonl"
    task_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    preload.parent.mkdir(parents=True, exist_ok=True)
    command = [str(interpreter), str(reg.root / "probes" / ENGINE), "--tasks", str(task_file), "--jobs", str(jobs),
               "--timeout", str(timeout_seconds()), "--scratch", str(logs / "engine-scratch"),
               "--preload", str(preload)]
    engine_log = logs / "engine.log"
    reports = {}
    with open(engine_log, "wb") as err:
        proc = children.popen(command, stdout=subprocess.PIPE, stderr=err, env={**os.environ, **allprobes.PROBE_ENV, **(env or {})})
        try:
            for raw in proc.stdout:  # one line per child, as each ends
                report = json.loads(raw)
                reports[report["id"]] = report
                log(f"engine: {report['id']} done in {report['seconds']} s ({_status(report)})")
        finally:
            children.wait(proc)
    if proc.returncode != 0:
        raise HarnessError(f"the probe engine exited with status {proc.returncode}; last output:\n"
                           f"{probe_run.tail(engine_log)}",
                           todo=f"read {engine_log}; `--cold` runs each task in its own process instead")
    return {t.id: _failure(reports.get(t.id)) for t in tasks}


def run(reg: Registry, interpreter: Path, tasks: list[TreeTask], experiments: list[str], *,
        out_dir: Path, logs: Path, preload: Path, jobs: int = 2, env: dict[str, str] | None = None,
        log=print) -> dict[str, dict[str, allprobes.Outcome]]:
    """Every experiment on every tree (``probe_all``); per tree label, per experiment, what came back."""
    exps = [reg.experiment(name) for name in experiments]
    driver_tasks = []
    for task in tasks:
        allprobes.clear(out_dir / task.label, experiments)
        argv = [*[str(e.probe) for e in exps], "--out-dir", str(out_dir / task.label),
                *allprobes.tree_argv(task.tree_args)]
        driver_tasks.append(DriverTask(task.label, task.path, argv))
    failures = run_tasks(reg, interpreter, driver_tasks, logs=logs, preload=preload, jobs=jobs, env=env, log=log)
    return {task.label: allprobes.collect(exps, out_dir / task.label, logs / f"{task.label}.log",
                                          failures[task.label] or "exited with status 0")
            for task in tasks}


def _failure(report: dict | None) -> str | None:
    if report is None:
        return "was never reported by the engine"
    return None if report["status"] == 0 else _status(report)


def _status(report: dict) -> str:
    if report["timeout"]:
        return f"timed out after {report['seconds']} s and was killed"
    if report["signal"] is not None:
        return f"was killed by signal {report['signal']}"
    return f"exited with status {report['status']}"
