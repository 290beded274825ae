"""Which cache entries a live run uses, and when each was last used: what `cache prune` reads before it removes.

A run that uses an entry of the cache (an environment, a wheel, an unpacked or exported tree, an image's packages)
holds a shared ``flock`` on its marker, ``.used/<kind>/<name>`` in the entry's root (out of the listings of the
entries themselves), until the run ends, and sets that file's time to now: one
open, one lock and one ``utime`` per entry and run. A prune takes the same lock exclusively, without waiting:
an entry whose lock it cannot take is in use and stays. It renames the entry out of the way before it lets go, so
a run that asks for the entry after that finds it missing (and builds it again), never half of it.

The kernel drops a run's locks when it dies, even by ``kill -9``: an entry is never held by a dead run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from . import children
from .locking import try_lock

MARKERS = ".used"
POLL_SECONDS = 0.05

_held: dict[str, int] = {}  # entry -> this run's open, share-locked marker
_pid = os.getpid()
_guard = threading.Lock()  # a run's worker threads use entries at once


def marker(entry: Path) -> Path:
    """The file beside ``entry`` whose lock says who uses it and whose time says when it was last used."""
    return entry.parent.parent / MARKERS / entry.parent.name / entry.name


def use(entry: Path) -> None:
    """This run uses ``entry`` from now until it ends: a prune leaves it alone, and its last use is now. Waits only
    while a prune renames it away (a moment); the entry may then be missing, as if never made."""
    global _pid
    key = os.path.abspath(entry)
    with _guard:
        if _pid != os.getpid():  # a forked child holds nothing of its parent's
            _held.clear()
            _pid = os.getpid()
        if key in _held:
            return
        marker(entry).parent.mkdir(parents=True, exist_ok=True)
        _held[key] = _share(marker(entry))


def _share(path: Path) -> int:
    """A shared lock on ``path``, on the file that is there once locked (a prune may unlink it meanwhile)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:  # a prune holds it: polled, a thread blocked in flock misses Ctrl-C
                    children.sleep(POLL_SECONDS)
            if _same_file(fd, path):
                os.utime(fd)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def release() -> None:
    """The end of a run (a command run in-process, as the tests do): it uses nothing any more."""
    with _guard:
        if _pid == os.getpid():
            for fd in _held.values():
                os.close(fd)
        _held.clear()


def last_used(entry: Path) -> float | None:
    """When a run last used ``entry`` (its marker's time), else when it was made or changed; None: it is gone."""
    for path in (marker(entry), entry):
        with contextlib.suppress(OSError):
            return path.stat().st_mtime
    return None


@contextlib.contextmanager
def unused(entry: Path) -> Iterator[bool]:
    """Whether no run uses ``entry``; while True, none can start to (its marker held exclusively). The marker goes
    with the block when the entry has gone (the caller renamed it away), or when the block made it."""
    path = marker(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    made = not os.path.lexists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        free = try_lock(fd) and _same_file(fd, path)
        yield free
        if free and (made or not os.path.lexists(entry)):  # a run that waits on it checks it is still the file
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)
