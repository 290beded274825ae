"""Inter-process locks, so two runs never share a half-built cache entry.

A lock is an ``flock`` on a file that also says who holds it (pid, command, since), so a run
that waits can say for whom, and one that gives up names the holder. Every wait is bounded
(``PDEVIDENCE_LOCK_TIMEOUT``): a stuck holder is an error that says what to do, never a hang. The
kernel drops the lock when its holder dies, even by ``kill -9``: a lock is never stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import children, settings
from .errors import HarnessError

POLL_SECONDS = 0.1


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, in words, as its holder recorded it ("" when it did not)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S", time.localtime(doc["since"]))
        return f"pid {doc['pid']} ({doc['command']}), since {since}"
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return ""


def _record(fd: int) -> None:
    """Say who holds the lock: written in place (the lock is the file's inode, never replaced)."""
    doc = {"pid": os.getpid(), "command": " ".join(sys.argv)[:200] or sys.executable, "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(doc).encode(), 0)


@contextlib.contextmanager
def exclusive(path: Path, what: str, *, timeout: float | None = None):
    """Hold an exclusive lock on ``path``; say so, and who has it, when another process has it.

    ``timeout`` (default ``PDEVIDENCE_LOCK_TIMEOUT``): give up after that many seconds with an error naming the
    holder. The wait polls rather than blocks in flock: a worker thread blocked there never sees Ctrl-C, and
    the run would hang until the other process let go.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held = False
    try:
        wait(fd, f"{what} ({path})", lambda: holder(path), timeout=timeout)
        held = True
        _record(fd)
        yield
    finally:
        if held:  # no one holds it now
            os.ftruncate(fd, 0)
        os.close(fd)


def wait(fd: int, what: str, who: Callable[[], str], *, timeout: float | None = None) -> None:
    """Lock ``fd`` exclusively, waiting for its holder (``who``: in words, "" when unknown) at most ``timeout``
    seconds (default ``PDEVIDENCE_LOCK_TIMEOUT``), then an error naming the holder and what to do."""
    if try_lock(fd):
        return
    timeout = settings.get("PDEVIDENCE_LOCK_TIMEOUT") if timeout is None else timeout
    named = who()
    print(f"waiting: another process is using {what}" + (f": {named}" if named else "")
          + f" (giving up after {timeout:g} s)", file=sys.stderr)
    deadline = time.monotonic() + timeout
    while not try_lock(fd):
        if time.monotonic() >= deadline:
            named = who() or "a process that did not say who it is"
            raise HarnessError(f"gave up after {timeout:g} s waiting for {what}, held by {named}",
                               todo="let that run finish, or stop it if it is stuck (the lock is released the "
                               "moment it exits); to wait longer, set PDEVIDENCE_LOCK_TIMEOUT=<seconds>")
        children.sleep(POLL_SECONDS)
