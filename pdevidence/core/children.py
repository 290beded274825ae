"""Child processes (probe, uv, git), each in its own process group, stopped at once by SIGINT/SIGTERM.

Cells run in worker threads, but a signal reaches only the main thread. So the
handler itself kills every live child group and marks the run as stopping;
each worker then sees its child gone, raises ``Interrupted`` and writes
nothing. Without this, Ctrl-C waited for the probe and wrote its result, and
SIGTERM left the probe orphaned. Waits that are not on a child (a lock, a
download) either poll ``sleep`` or register a ``on_stop`` callback that ends
them, since a worker thread never sees the signal itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_lock = threading.RLock()  # re-entrant: the handler may run while the main thread holds it
_live: set[int] = set()  # process-group ids
_cancels: dict[int, Callable[[], None]] = {}  # what else a stop signal ends (sockets a worker blocks on)
_stopping: int | None = None  # the signal that stopped this run
_stop = threading.Event()  # set with _stopping: wakes ``sleep`` in any thread
_starting = False  # the main thread is between starting a child and registering it


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


def wait(proc: subprocess.Popen, *, timeout: float | None = None, input: bytes | str | None = None):
    """``communicate`` with the child; on timeout or any exception its whole group is killed."""
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        _kill(proc.pid)
        proc.communicate()
        raise
    finally:
        with _lock:
            _live.discard(proc.pid)
    check()  # killed by the handler: the interruption, not the child's exit status, is the outcome
    return out, err


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
