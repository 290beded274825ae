"""Run a probe in a cell's interpreter, contained, with a timeout, keeping its stderr.

The probe writes to a temporary path; only a run that exits 0 with a valid
document gets its result renamed into place, so a crash, a kill or a hang
leaves no result file. Every process that imports a tree starts here or in the
warm engine (engine.py), inside the sandbox ``core/sandbox.py`` builds.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core import children, sandbox, settings
from ..core.errors import HarnessError
from ..core.files import move_atomic, read_json
from ..documents import results

STDERR_TAIL_LINES = 25
MEMORY_ERROR = "MemoryError"  # what a probe process raises at its memory limit per process (RLIMIT_DATA)


@dataclass
class ProbeRun:
    command: list[str]
    exit_status: int
    log: Path
    containment: dict  # how it ran (sandbox.Containment.record)


@dataclass
class Ran:
    status: int
    containment: dict
    memory_killed: str | None = None  # killed by the kernel for memory: what it ran into (Launch.out_of_memory)


def timeout_seconds() -> float:
    return settings.get("PDEVIDENCE_PROBE_TIMEOUT")


def tail(log: Path) -> str:
    """The last lines of a log, for an error message."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def run_killable(command: list[str], log: Path, *, timeout: float, env: dict, what: str, view: sandbox.View,
                 trusted: bool) -> Ran:
    """Run ``command`` contained (it sees ``view``; ``trusted``: a pinned tree, which may run where nothing
    contains it), its output in ``log``; kill it and everything it started on timeout or on SIGINT/SIGTERM
    (``children.Interrupted``)."""
    with open(log, "wb") as out, sandbox.launch(command, view, env, trusted=trusted, what=what) as launch:
        proc = children.popen(launch.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              env=launch.env, cwd=view.cwd)
        try:
            children.wait(proc, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HarnessError(
                f"{what} did not finish within {timeout:.0f} s and was killed; no result written.\n"
                f"last output:\n{tail(log)}",
                todo=f"look for a hang in {log}; PDEVIDENCE_PROBE_TIMEOUT raises the limit",
            ) from None
        return Ran(proc.returncode, launch.record,
                   launch.out_of_memory() if launch.exited_at_memory_limit(proc.returncode) else None)


def raised_memory_error(log: Path) -> bool:
    """Whether a process's output ends with a traceback's last line for ``MemoryError`` (in its last lines)."""
    try:
        lines = tail(log).splitlines()
    except OSError:
        return False
    return any(line == MEMORY_ERROR or line.startswith(f"{MEMORY_ERROR}:") for line in lines)


def memory_error_scenario(doc: dict) -> str | None:
    """The first scenario of a result document that raised ``MemoryError`` (it observed nothing of the tree), or
    None."""
    for scenario_id, scenario in sorted(doc.get("scenarios", {}).items()):
        if isinstance(scenario, dict) and (scenario.get("error") or {}).get("type") == MEMORY_ERROR:
            return scenario_id
    return None


def partial_path(dest: Path) -> Path:
    """Where a probe writes before its result is checked; never read as a result."""
    return dest.with_name(f".{dest.name}.partial")


def run_probe(interpreter: Path, probe: Path, args: list[str], dest: Path, log: Path, *,
              experiment: str, side: str, trusted: bool = False, timeout: float | None = None,
              env: dict | None = None) -> ProbeRun:
    """Run the probe; on success ``dest`` holds its validated result, else nothing is at ``dest``."""
    timeout = timeout_seconds() if timeout is None else timeout
    partial = partial_path(dest)
    partial.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [str(interpreter), str(probe), *args, "--out", str(partial)]
    run_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0", **(env or {})}
    try:
        ran = run_killable(command, log, timeout=timeout, env=run_env, what=f"probe {probe.name}",
                           view=sandbox.View(read=(probe.parent,), write=(dest.parent,)), trusted=trusted)
        status = ran.status
        if ran.memory_killed:
            raise HarnessError(f"probe {probe.name} {ran.memory_killed}; no result "
                               f"written.\nlast output:\n{tail(log)}", todo=f"full log: {log}")
        if status != 0:
            raise HarnessError(
                f"probe {probe.name} exited with status {status}; no result written.\nlast output:\n{tail(log)}",
                todo=f"full log: {log}",
            )
        try:
            doc = read_json(partial, "result", todo=f"full log: {log}")
        except HarnessError as exc:
            raise HarnessError(f"probe {probe.name} exited 0 but wrote no readable result: {exc.what}",
                               todo=exc.todo) from None
        results.validate(doc, source=f"output of {probe.name}", experiment=experiment, side=side)
        short = memory_error_scenario(doc)
        if short:
            raise HarnessError(f"probe {probe.name}: MemoryError in scenario {short}: the probe process "
                               f"{sandbox.out_of_memory(ran.containment, killed=False)}; no result written",
                               todo=f"full log: {log}")
        move_atomic(partial, dest)
        return ProbeRun(command, status, log, ran.containment)
    finally:
        partial.unlink(missing_ok=True)
