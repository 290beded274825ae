"""A warm probe engine: import a closure once, fork one child per SGLang tree.

Every SGLang import pays for the closure under it (torch, transformers, ...), which
is the same for every tree of an era. The engine runs in a closure environment that
holds no SGLang; it reads one task per line from a file, forks a child per task, and the
child puts that task's tree first on ``sys.path`` and runs the task's in-cell driver on
it (``probe_all``: every probe; ``probe_mutants``: one probe under each mutant), exactly
as that driver runs in a fresh process, so each child imports its own SGLang into a
fresh copy of the warm parent. The parent never imports SGLang: a child's
registrations and patches die with it.

What the parent preloads is not a list written here: after each child, while a task
is still waiting for its fork, the engine imports the third-party modules that child
had loaded (nothing of the tree's), so the next child starts warmer; past the last
fork an import would only delay the engine's end. A module that fails to preload is simply left to the
children.

    task (--tasks):  {"id": "0.5.21", "path": "<dir with sglang/>", "log": "<file>", "argv": [driver args],
                      "driver": "probe_all"}   (default probe_all; or probe_mutants)
    report (stdout, its own: anything else printed there goes to stderr):
                     {"id": "0.5.21", "status": 0, "signal": null, "seconds": 7.1, "at": 5021.402}
                     (at: the fork on the monotonic clock, which the harness shares, so it can place the
                     child among other engines)
                     {"id": ..., "status": null, "signal": 9, "timeout": true}  killed past --timeout
                     {"id": ..., "status": null, "signal": null, "error": "could not fork: ..."}

Each child leads a process group of its own; whatever it started and left behind is
killed when it ends, so one tree's processes never outlive it into the next tree's time.

Children run at most ``--jobs`` at a time; the engine exits when every child has been
reported, after writing the modules the children needed back to ``--preload``. With ``--tasks -`` it reads
task lines from stdin as they come instead (a caller probing round after round keeps one engine, its
closure imported once), forks each as it arrives, reports each as above, and exits once stdin has ended
and its last child has been reported. Standard library only: it runs inside the cell.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _standins  # noqa: E402
import probe_all  # noqa: E402
from _probekit import quiet_environment  # noqa: E402

EXIT_INTERNAL = 70  # the child died outside its driver's own exit codes (EX_SOFTWARE)
EXIT_USAGE = 2
DRIVERS = ("probe_all", "probe_mutants")  # the in-cell drivers a task may run, each a module beside this file


def _third_party(tree: str) -> list[str]:
    """Modules loaded now that neither the standard library nor ``tree`` (nor the probes) provide."""
    stdlib = sys.stdlib_module_names
    own = (tree, str(HERE))
    found = []
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if top in stdlib or top.startswith("_") or top in ("sglang", "pdprobe", "probe_all", "_probekit"):
            continue
        path = getattr(module, "__file__", None) or ""
        if not path or path.startswith(own) or name.startswith("pdprobe_"):
            continue
        found.append(name)
    return found


def _child(task: dict, modules_file: Path) -> int:
    """In the forked child: this tree first on the path, the task's driver, the modules it needed."""
    os.setpgid(0, 0)
    _Reports.close_in_child()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the engine's task stream (--tasks -) is not the child's
    log = os.open(task["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    driver = importlib.import_module(task.get("driver", "probe_all"))  # from here, before the tree goes first
    sys.path.insert(0, task["path"])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = driver.main(task["argv"])
    sys.stdout.flush()
    sys.stderr.flush()
    modules_file.write_text(json.dumps(_third_party(task["path"])), encoding="utf-8")
    return code


def _preload(names: list[str], done: set[str]) -> None:
    for name in names:
        if name in done or name in sys.modules:
            continue
        done.add(name)
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # noqa: BLE001 - a module the child can still import itself (and fail)
            continue  # Ctrl-C, though, stops the engine


class _Stream:
    """Task lines from stdin (``--tasks -``), taken as they come; ``open`` until stdin ends."""

    def __init__(self, fd: int):
        self.fd, self.open, self.partial = fd, True, b""

    def wait(self, seconds: float) -> list[dict]:
        """The tasks that arrived within ``seconds`` (returning as soon as any did)."""
        if not self.open:
            time.sleep(seconds)
            return []
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if not ready:
            return []
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.open, lines, self.partial = False, [self.partial], b""
        else:
            *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def _unknown_driver(task: dict) -> dict | None:
    """The report refusing a streamed task whose driver is not one of ``DRIVERS`` (None: it is known)."""
    driver = task.get("driver", "probe_all")
    if driver in DRIVERS:
        return None
    return {"id": task["id"], "status": None, "signal": None, "timeout": False, "seconds": 0.0,
            "at": round(time.monotonic(), 3), "error": f"names the unknown driver {driver!r}; known: {', '.join(DRIVERS)}"}


class _Reports:
    """The report channel: the stdout the engine was started with, kept apart. fd 1 then goes to stderr (the
    engine's log), so what a preloaded module prints at import (vLLM 0.6's logger writes to stdout) never
    lands among the reports, one JSON line each, that the harness reads."""

    stream = None

    @classmethod
    def open(cls) -> None:
        sys.stdout.flush()
        cls.stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)

    @classmethod
    def close_in_child(cls) -> None:
        """A child writes no report: it holds the channel no longer than the fork."""
        if cls.stream is not None:
            os.close(cls.stream.fileno())


def _report(line: dict) -> None:
    stream = _Reports.stream or sys.stdout
    stream.write(json.dumps(line, sort_keys=True) + "\n")
    stream.flush()


def _fork(task: dict, modules_file: Path) -> int | str:
    """The child's pid, or why there is none (the sandbox's process limit, say)."""
    sys.stdout.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        return f"could not fork: {exc}"
    if pid == 0:
        try:
            code = _child(task, modules_file)
        except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the loop
            traceback.print_exc()
            code = EXIT_INTERNAL
        os._exit(code)
    return pid


def _end_group(pid: int) -> None:
    """Kill what a child left behind in its process group."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _status(status: int) -> tuple[int | None, int | None]:
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status), None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fork one probe child per SGLang tree from a warm closure.")
    parser.add_argument("--tasks", type=Path, required=True,
                        help="one JSON task per line; -: read them from stdin as they come, until it ends")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    parser.add_argument("--scratch", type=Path, required=True, help="where children leave their module lists")
    parser.add_argument("--preload", type=Path, required=True,
                        help="modules to import before the first child; updated with what the children needed")
    args = parser.parse_args(argv)
    args.scratch.mkdir(parents=True, exist_ok=True)
    _Reports.open()
    quiet_environment()
    _standins.install()  # the children inherit them; preloading must not import the real ones
    stream = _Stream(sys.stdin.fileno()) if str(args.tasks) == "-" else None
    pending = [] if stream else [json.loads(line) for line in args.tasks.read_text(encoding="utf-8").splitlines()
                                 if line.strip()]
    unknown = sorted({t.get("driver", "probe_all") for t in pending} - set(DRIVERS))
    if unknown:
        print(f"tasks name unknown drivers {unknown}; known: {', '.join(DRIVERS)}", file=sys.stderr)
        return EXIT_USAGE
    needed: list[str] = json.loads(args.preload.read_text(encoding="utf-8")) if args.preload.exists() else []
    preloaded: set[str] = set()
    _preload(needed, preloaded)
    running: dict[int, tuple[dict, float, Path]] = {}
    while pending or running or (stream and stream.open):
        while pending and len(running) < max(1, args.jobs):
            task = pending.pop(0)
            if stream and (refused := _unknown_driver(task)):
                _report(refused)
                continue
            modules_file = args.scratch / f"modules.{task['id']}.json"
            child = _fork(task, modules_file)
            if isinstance(child, str):
                _report({"id": task["id"], "status": None, "signal": None, "timeout": False, "seconds": 0.0,
                         "at": round(time.monotonic(), 3), "error": child})
                continue
            running[child] = (task, time.monotonic(), modules_file)
        if stream:
            pending.extend(stream.wait(0.05))
        else:
            time.sleep(0.05)
        for pid, (task, forked, modules_file) in list(running.items()):
            seconds = round(time.monotonic() - forked, 1)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0 and seconds <= args.timeout:
                continue
            if done == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            _end_group(pid)
            del running[pid]
            code, killed_by = (None, signal.SIGKILL) if done == 0 else _status(status)
            _report({"id": task["id"], "status": code, "signal": killed_by, "timeout": done == 0,
                     "seconds": seconds, "at": round(forked, 3)})
            if modules_file.exists():
                found = json.loads(modules_file.read_text(encoding="utf-8"))
                modules_file.unlink()
                needed.extend(name for name in found if name not in needed)
                if pending or (stream and stream.open):  # else no child is left to fork: it would only import
                    _preload(found, preloaded)
    tmp = args.preload.with_name(f".{args.preload.name}.tmp")
    tmp.write_text(json.dumps(needed), encoding="utf-8")
    os.replace(tmp, args.preload)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    if _Reports.stream is not None:
        _Reports.stream.flush()
    os._exit(code)  # not the interpreter's teardown of the preloaded closure (seconds of torch): nothing is left to write
