"""Child processes (probe, uv, git), each in its own process group, stopped at once by SIGINT/SIGTERM.

Cells run in worker threads, but a signal reaches only the main thread. So the
handler itself kills every live child group and marks the run as stopping;
each worker then sees its child gone, raises ``Interrupted`` and writes
nothing. Without this, Ctrl-C waited for the probe and wrote its result, and
SIGTERM left the probe orphaned. Waits that are not on a child (a lock, a
download) either poll ``sleep`` or register a ``on_stop`` callback that ends
them, since a worker thread never sees the signal itself.

The harness is a child subreaper (``become_subreaper``): what a killed child leaves
behind (a sandbox's init, orphaned when its bubblewrap parent dies) is reparented to
the harness, not to PID 1, which on some machines never reaps it. Each time a child
ends, ``wait`` reaps those orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_lock = threading.RLock()  # re-entrant: the handler may run while the main thread holds it
_live: set[int] = set()  # process-group ids
_cancels: dict[int, Callable[[], None]] = {}  # what else a stop signal ends (sockets a worker blocks on)
_stopping: int | None = None  # the signal that stopped this run
_stop = threading.Event()  # set with _stopping: wakes ``sleep`` in any thread
_starting = False  # the main thread is between starting a child and registering it
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
ORPHAN_GRACE_SECONDS = 2.0  # how long an ended child's orphans get to die (a sandbox's init on its parent's death)


class Interrupted(BaseException):
    """SIGINT or SIGTERM: not an error of the cell, so not an ``Exception`` either."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


def check() -> None:
    """Raise ``Interrupted`` if a stop signal arrived (for long loops outside a child)."""
    if _stopping is not None:
        raise Interrupted(_stopping)


def _kill(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sleep(seconds: float) -> None:
    """Wait, but raise ``Interrupted`` at once when a stop signal arrives (in any thread)."""
    _stop.wait(seconds)
    check()


@contextlib.contextmanager
def on_stop(cancel: Callable[[], None]):
    """While inside, a stop signal also calls ``cancel`` (from the main thread)."""
    with _lock:
        check()
        _cancels[id(cancel)] = cancel
    try:
        yield
    finally:
        with _lock:
            _cancels.pop(id(cancel), None)


def workers(count: int, name: str = "") -> ThreadPoolExecutor:
    """The pool of worker threads that cells, trees or eras run in.

    sysconfig fills its table unlocked on first use (CPython before 3.13): two workers asking at once (uv's
    lookup of itself, a wheel's tags) could read it half-filled, ``None`` for what it holds. It is filled here,
    before any worker starts."""
    sysconfig.get_config_vars()
    return ThreadPoolExecutor(max_workers=max(1, count), thread_name_prefix=name)


def popen(command: list[str], **kw) -> subprocess.Popen:
    """Start a child in its own process group, registered before a stop signal can miss it."""
    global _starting
    main = threading.current_thread() is threading.main_thread()
    with _lock:  # a handler running meanwhile (main thread) sees _starting and defers its raise
        check()
        _starting = main
        try:
            proc = subprocess.Popen(command, start_new_session=True, **kw)
            _live.add(proc.pid)
        finally:
            _starting = False
    if _stopping is not None:  # the signal landed while the child started: it is registered, stop it
        _kill(proc.pid)
        with _lock:
            _live.discard(proc.pid)
        proc.wait()
        raise Interrupted(_stopping)
    return proc


def end(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s whole group now and reap it (a child kept across calls whose caller is failing)."""
    _kill(proc.pid)
    wait(proc)


def wait(proc: subprocess.Popen, *, timeout: float | None = None, input: bytes | str | None = None):
    """``communicate`` with the child; on timeout or any exception its whole group is killed; then what it
    left behind and is dying is reaped (``reap_orphans``)."""
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        _kill(proc.pid)
        proc.communicate()
        raise
    finally:
        with _lock:
            _live.discard(proc.pid)
        reap_orphans(proc.pid)
    check()  # killed by the handler: the interruption, not the child's exit status, is the outcome
    return out, err


_subreaper = False


def become_subreaper() -> None:
    """Make this process the one that orphaned descendants are reparented to (Linux; elsewhere nothing)."""
    global _subreaper
    if _subreaper or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    # Refused (a seccomp filter, say): orphans go to PID 1 as before, and nothing here has any to reap.
    _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _orphans() -> list[tuple[int, str, int, int]]:
    """(pid, state, session, depth of its PID namespace) of every child of this process it did not start here:
    not a live ``popen`` child and not in this process's session (what ``subprocess`` starts elsewhere, whose
    exit status is its caller's to collect)."""
    me, session = str(os.getpid()), os.getsid(0)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in _live:
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        # stat is "pid (comm) state ppid pgrp session ...", and comm may hold spaces or parentheses.
        state, ppid, _pgrp, sid = stat[stat.rindex(")") + 2:].split()[:4]
        if ppid != me or int(sid) == session:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        found.append((int(entry.name), state, int(sid), len(nspid)))
    return found


def reap_orphans(ended: int | None = None) -> None:
    """Collect the exit status of orphans that have exited (zombies), so none is left behind. After the
    child ``ended``, its own orphans still dying (in its session, or a sandbox's init in a PID namespace of
    its own) are waited for a little; anything else still running is left alone."""
    if not _subreaper:
        return
    depth = len(next((line.split()[1:] for line in Path("/proc/self/status").read_text().splitlines()
                      if line.startswith("NSpid:")), []))
    deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
    while True:
        with _lock:  # a ``popen`` child is registered under the lock: never mistaken for an orphan
            dying = False
            for pid, state, sid, nsdepth in _orphans():
                if state in ("Z", "X"):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                elif ended is not None and (sid == ended or nsdepth > depth):
                    dying = True
        if not dying or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def run(command: list[str], *, timeout: float | None = None, input=None, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a stoppable process group; ``capture_output``, ``text`` and ``check`` as there."""
    check = kw.pop("check", False)
    if kw.pop("capture_output", False):
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    proc = popen(command, **kw)
    out, err = wait(proc, timeout=timeout, input=input)
    done = subprocess.CompletedProcess(command, proc.returncode, out, err)
    if check:
        done.check_returncode()  # CalledProcessError, as subprocess.run(check=True) raises
    return done


def _handler(signum, frame) -> None:
    global _stopping
    with _lock:
        _stopping = signum
        _stop.set()
        for pgid in list(_live):
            _kill(pgid)
        for cancel in list(_cancels.values()):
            cancel()
    if not _starting:  # else popen raises once its child is registered, and stops it
        raise Interrupted(signum)


@contextlib.contextmanager
def stop_on_signals():
    """While inside, SIGINT/SIGTERM kill every child group and raise ``Interrupted`` here."""
    global _stopping
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stopping = None
        _stop.clear()
