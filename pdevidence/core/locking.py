"""Inter-process locks, so two runs of one cell never share a half-built cache entry."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def exclusive(path: Path, what: str):
    """Hold an exclusive lock on ``path``; say so when another process has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting: another process is using {what} ({path})", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
