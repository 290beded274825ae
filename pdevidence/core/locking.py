"""Inter-process locks, so two runs of one cell never share a half-built cache entry."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path

from . import children

POLL_SECONDS = 0.1


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def exclusive(path: Path, what: str):
    """Hold an exclusive lock on ``path``; say so when another process has it.

    The wait polls rather than blocks in flock: a worker thread blocked there never sees
    Ctrl-C, and the run would hang until the other process let go.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            print(f"waiting: another process is using {what} ({path})", file=sys.stderr)
            while not _try_lock(fd):
                children.sleep(POLL_SECONDS)
        yield
    finally:
        os.close(fd)
