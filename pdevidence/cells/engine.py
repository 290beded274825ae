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

A caller probing trees round after round (``bisect``) keeps one engine per closure across its rounds
(``Engines``, ``Session``): the closure is imported once, not once a round. Such an engine is launched
before its trees are known, so it reads every tree under the directories it is given and writes only a
directory of its own, whose results are moved where each round asked: its trees must trust each other (the
commits of one clone).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core import children, phases, sandbox
from ..core.errors import HarnessError
from ..core.files import dumps, read_json, write_atomic
from ..core.paths import run_logs
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


def _task_line(task: DriverTask, logs: Path) -> str:
    return json.dumps({"id": task.id, "path": str(task.path), "log": str(logs / f"{task.id}.log"), "argv": task.argv,
                       "driver": task.driver}) + "\n"


class Session:
    """One engine kept alive for tasks submitted round after round (``probes/engine.py --tasks -``): started
    once, each round's tasks forked as they are submitted, ended by ``close`` (or, on any exception or Ctrl-C,
    killed with whatever it started). It reads ``reads`` (where its trees lie) and writes only ``private``:
    each task's driver writes under ``out``, its log in ``logs``."""

    def __init__(self, reg: Registry, interpreter: Path, *, reads: tuple[Path, ...], logs: Path, preload: Path,
                 jobs: int = 2, env: dict[str, str] | None = None, log=print):
        self.reg, self.interpreter, self.reads, self.logs, self.preload = reg, interpreter, reads, logs, preload
        self.jobs, self.env, self.log = jobs, env or {}, log
        self.proc: subprocess.Popen | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, kind, value, trace) -> None:
        self.close(ended=kind is None)

    def start(self) -> None:
        for directory in (self.logs, *self.reads):  # bound as they are now: a tree made in one later is seen
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self.private = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="pdevidence-engine-")))
            self.out, self._needed = self.private / "out", self.private / "preload.json"
            self.out.mkdir()
            write_atomic(self._needed, dumps(_preload_list(self.preload)))
            command = [str(self.interpreter), str(self.reg.root / "probes" / ENGINE), "--tasks", "-", "--jobs",
                       str(self.jobs), "--timeout", str(timeout_seconds()), "--scratch", str(self.private / "scratch"),
                       "--preload", str(self._needed)]
            view = sandbox.View(read=(self.reg.root / "probes", *self.reads), write=(self.private, self.logs),
                                cwd=self.logs)
            err = self._stack.enter_context(open(self.logs / "engine.log", "wb"))
            run_env = {**os.environ, **allprobes.PROBE_ENV, **self.env}
            self.launch = self._stack.enter_context(sandbox.launch(command, view, run_env, trusted=False,
                                                                   what="the probe engine kept across rounds"))
            self.launched, self._started = time.monotonic(), False
            self.proc = children.popen(self.launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                       env=self.launch.env)
        except BaseException:
            self._stack.close()
            raise

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def run(self, tasks: list[DriverTask]) -> Finished:
        """Fork these tasks in the kept engine and wait for each one's report; how each child ended."""
        submitted, reports = time.monotonic(), {}
        try:
            self.proc.stdin.write("".join(_task_line(t, self.logs) for t in tasks).encode())
            self.proc.stdin.flush()
        except BrokenPipeError:  # the engine has ended: said below
            pass
        while len(reports) < len(tasks) and (raw := self.proc.stdout.readline()):
            report = json.loads(raw)
            if not report.get("timeout") and self.launch.killed_at_memory_limit(report.get("signal")):
                report["error"] = self.launch.out_of_memory()
            reports[report["id"]] = report
            self.log(f"engine: {report['id']} done in {report['seconds']} s ({_status(report)})")
        _spent(reports.values(), submitted if self._started else self.launched, time.monotonic())
        self._started = True
        if len(reports) < len(tasks):  # the engine ended under them
            self._end()
            return self._died(tasks, reports)
        return Finished({t.id: _failure(reports.get(t.id)) for t in tasks}, self.launch.record)

    def _died(self, tasks: list[DriverTask], reports: dict) -> Finished:
        engine_log = self.logs / "engine.log"
        said = self.launch.out_of_memory() if self.launch.exited_at_memory_limit(self.proc.returncode) else None
        if not said and probe_run.raised_memory_error(engine_log):
            said = sandbox.out_of_memory(self.launch.record, killed=False)
        if not said:
            raise HarnessError(f"the probe engine exited with status {self.proc.returncode}; last output:\n"
                               f"{probe_run.tail(engine_log)}", todo=f"read {engine_log}")
        self.log(f"engine: out of memory; {', '.join(t.id for t in tasks if t.id not in reports)} unfinished")
        return Finished({t.id: _failure(reports[t.id]) if t.id in reports else said for t in tasks}, self.launch.record)

    def _end(self) -> None:
        """Wait for the engine's end (its stdin closed: it exits after its last child), killing it on any
        exception; reaped either way."""
        if self.proc is None or self.proc.returncode is not None:
            return
        children.wait(self.proc)  # communicate closes its stdin

    def close(self, ended: bool = True) -> None:
        """End the engine and keep the modules its children needed; ``ended`` False (an exception is on its
        way): kill it and everything it started instead."""
        try:
            if self.proc is not None and self.proc.returncode is None and not ended:
                children.end(self.proc)
            self._end()
            if ended and self.proc is not None and self.proc.returncode == 0:
                write_atomic(self.preload, dumps(_preload_list(self._needed)))
        finally:
            self._stack.close()


class Engines:
    """The sessions of one caller's rounds, one per closure environment and its stand-ins (an era), started
    on first use and closed together; each reads the trees under ``reads``."""

    def __init__(self, reg: Registry, *, reads: tuple[Path, ...], logs: Path, log=print):
        self.reg, self.reads, self.logs, self.log = reg, reads, logs, log
        self._sessions: dict[tuple, Session] = {}
        self._lock = threading.Lock()  # eras probe from threads of their own (warm.probe_trees)
        # bubblewrap dies with the thread that started it (--die-with-parent), and an era's thread ends with its
        # round: every engine is started from this one, alive until the last is closed.
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="kept-engine")

    def __enter__(self) -> Engines:
        return self

    def __exit__(self, kind, value, trace) -> None:
        with contextlib.ExitStack() as closing:  # every one closed, whichever fails
            closing.callback(self._starter.shutdown)
            for session in self._sessions.values():
                closing.callback(session.close, ended=kind is None)

    def sees(self, paths: list[Path]) -> bool:
        """Whether a kept engine can probe trees at ``paths`` (each under a directory it reads)."""
        return all(any(p.resolve().is_relative_to(r.resolve()) for r in self.reads) for p in paths)

    def session(self, interpreter: Path, preload: Path, env: dict[str, str] | None, jobs: int) -> Session:
        """The kept engine of this closure, started now if it has none (or its last one ended)."""
        key = (str(interpreter), str(preload), tuple(sorted((env or {}).items())))
        with self._lock:
            found = self._sessions.get(key)
            if found is not None and not found.alive:  # it ended under a round (out of memory): its sandbox goes
                found.close()
            if found is None or not found.alive:
                found = Session(self.reg, interpreter, reads=self.reads, logs=run_logs(self.logs), preload=preload,
                                jobs=jobs, env=env, log=self.log)
                self._starter.submit(found.start).result()
                self._sessions[key] = found
            return found


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
        out_dir: Path, logs: Path | None, preload: Path, jobs: int = 2, env: dict[str, str] | None = None,
        log=print, engines: Engines | None = None,
        only: dict[str, list[str]] | None = None) -> dict[str, dict[str, allprobes.Outcome]]:
    """Every experiment on every tree (``probe_all``; ``only``, per tree label: those of ``experiments`` alone), in
    one engine (``engines``' kept one for this closure, when it sees every tree; its logs are its own, ``logs`` may
    be None then); per tree label, per experiment probed, what came back. Each child is given its own tree's
    probes: an experiment a tree is not probed for is neither run nor reported. The trees share the engine's
    sandbox: pass only trees that trust each other (``warm.py``)."""
    exps = {task.label: [reg.experiment(name) for name in experiments
                         if only is None or task.label not in only or name in only[task.label]] for task in tasks}
    kept = engines.session(interpreter, preload, env, jobs) if engines and engines.sees([t.path for t in tasks]) \
        else None
    written = kept.out if kept else out_dir  # where the drivers write: a kept engine writes only its own
    driver_tasks = []
    for task in tasks:
        allprobes.clear(written / task.label, [e.name for e in exps[task.label]])
        argv = [*[str(e.probe) for e in exps[task.label]], "--out-dir", str(written / task.label),
                *allprobes.tree_argv(task.tree_args)]
        driver_tasks.append(DriverTask(task.label, task.path, argv, writes=(written / task.label,)))
    if kept:
        done, logs = kept.run(driver_tasks), kept.logs
        for task in tasks:
            if (written / task.label).is_dir():
                shutil.copytree(written / task.label, out_dir / task.label, dirs_exist_ok=True)
                shutil.rmtree(written / task.label)
    else:
        done = run_tasks(reg, interpreter, driver_tasks, logs=logs, preload=preload,
                         trusted=all(task.trusted for task in tasks), jobs=jobs, env=env, log=log)
    return {task.label: allprobes.collect(exps[task.label], out_dir / task.label, logs / f"{task.label}.log",
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
