"""Files: the one atomic write, hash, JSON serialization and reader, markers, and how a path is shown.

Every file the harness writes goes through ``write_atomic``: readers never see
half a file, a failure leaves nothing behind, and the mode is 0644 whatever the
umask gives a temporary file (published files are read by everyone). A file made
whole elsewhere (a probe's output, a download, a staged result) gets its name
through ``move_atomic``, the rename ``write_atomic`` ends with: on disk, then named.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from . import debris, faults
from .errors import INCOMPLETE, HarnessError

FILE_MODE = 0o644  # mkstemp alone gives 0600
CHUNK = 1 << 20
# CPython before 3.13 keeps ast.parse's recursion depth in state that threads share: two parses at once (the
# matrix's cells, a check's trees) can fail with "SystemError: AST constructor recursion depth mismatch".
_PARSING = threading.Lock()


def dumps(doc: Any) -> str:
    """The one serialization every document uses: stable bytes for stable data."""
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def disk_error(exc: OSError, path: Path) -> HarnessError | None:
    """A full disk or a file-size limit while writing ``path``: the environment's problem, named; else None."""
    if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return None
    return HarnessError(f"cannot write {path}: {os.strerror(exc.errno)}",
                        expected="room on its file system (and no file-size or quota limit in the way)",
                        todo=f"free space where {path.parent} is (or raise the limit), then run again; "
                        "nothing half-written was left")


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a temporary file in the same directory, renamed into place once complete (``move_atomic``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8") if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=debris.prefix(path.parent, path.name), suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        faults.point("write")
        move_atomic(Path(tmp), path)
    except BaseException as exc:
        os.unlink(tmp)
        found = disk_error(exc, path) if isinstance(exc, OSError) else None
        if found:
            raise found from None
        raise


def move_atomic(source: Path, dest: Path) -> None:
    """Give the complete file ``source`` the name ``dest`` (same file system), replacing what had it: its bytes
    reach the disk first, so a power cut leaves the old file or this one, never a named empty one."""
    fd = os.open(source, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        found = disk_error(exc, dest)
        if found:
            raise found from None
        raise
    finally:
        os.close(fd)
    os.replace(source, dest)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    hash_into(digest, path)
    return digest.hexdigest()


def hash_into(digest: Any, path: Path) -> None:
    """Feed ``path``'s bytes to ``digest`` a chunk at a time: a file is never read whole (a wheel, an archive)."""
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)


def parse_python(path: Path) -> ast.Module:
    """``path``'s syntax tree, one parse at a time in this process (``_PARSING``)."""
    text = path.read_text(encoding="utf-8")
    with _PARSING:
        return ast.parse(text)


def read_json(path: Path, what: str, *, todo: str) -> Any:
    """A JSON file, or one error naming it: missing (incomplete) or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessError(f"no {what} at {path}", code=INCOMPLETE, todo=todo) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HarnessError(f"{path} is not a readable {what}: {exc}", todo=todo) from None


def write_marker(path: Path, doc: dict) -> None:
    """A marker: a small JSON object saying a directory is complete."""
    write_atomic(path, json.dumps(doc, sort_keys=True) + "\n")


def read_marker(path: Path, *keys: str) -> dict | None:
    """The marker, or None when it is missing, truncated, not an object or lacks one of ``keys``:
    all of which mean "rebuild"."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or any(key not in doc for key in keys):
        return None
    return doc


def relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (POSIX separators) when it is under it, else as given:
    what documents and reports record, so they read the same on every checkout."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return os.fspath(path)
