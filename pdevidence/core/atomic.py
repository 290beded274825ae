"""Atomic 0644 writes for the stages below ``documents`` (environment and tree markers, tree locks).

A marker is a small JSON object that says a directory is complete; one that is
missing, truncated or not an object reads as None, which means "rebuild".
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

FILE_MODE = 0o644  # read by everyone, as every document the harness writes; mkstemp alone gives 0600


def write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_marker(path: Path, doc: dict) -> None:
    write_text(path, json.dumps(doc, sort_keys=True) + "\n")


def read_marker(path: Path, *keys: str) -> dict | None:
    """The marker, or None when it is missing, unreadable or lacks one of ``keys``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or any(key not in doc for key in keys):
        return None
    return doc
