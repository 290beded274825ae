"""Drive the warm probe engine (probes/engine.py): one closure process, one forked child per tree.

The engine runs in a closure environment that holds no SGLang; each tree is a
directory with ``sglang/`` in it (an unpacked wheel, a source tree's ``python/``),
put first on the child's path. The children write the same documents
``probe_all.py`` writes in a fresh process; what comes back per tree and experiment
is an ``allprobes.Outcome``. The modules the children needed are kept per closure,
so the next engine for that closure preloads them before its first child.
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


def run(reg: Registry, interpreter: Path, tasks: list[TreeTask], experiments: list[str], *,
        out_dir: Path, logs: Path, preload: Path, jobs: int = 2, env: dict[str, str] | None = None,
        log=print) -> dict[str, dict[str, allprobes.Outcome]]:
    """Every experiment on every tree; per tree label, per experiment, what came back.
    ``env`` is added to the engine's environment (an era's stand-ins)."""
    if not tasks:
        return {}
    exps = [reg.experiment(name) for name in experiments]
    logs.mkdir(parents=True, exist_ok=True)
    lines = []
    for task in tasks:
        allprobes.clear(out_dir / task.label, experiments)
        argv = [*[str(e.probe) for e in exps], "--out-dir", str(out_dir / task.label),
                *allprobes.tree_argv(task.tree_args)]
        lines.append(json.dumps({"id": task.label, "path": str(task.path), "log": str(logs / f"{task.label}.log"),
                                 "argv": argv}))
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
                           todo=f"read {engine_log}; `--cold` probes each tree in its own process instead")
    out = {}
    for task in tasks:
        report = reports.get(task.label)
        status = _status(report) if report else "was never reported by the engine"
        out[task.label] = allprobes.collect(exps, out_dir / task.label, logs / f"{task.label}.log", status)
    return out


def _status(report: dict) -> str:
    if report["timeout"]:
        return f"timed out after {report['seconds']} s and was killed"
    if report["signal"] is not None:
        return f"was killed by signal {report['signal']}"
    return f"exited with status {report['status']}"
