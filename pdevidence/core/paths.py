"""Where things live: the project tree, the user cache, fresh runs."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Content-addressed downloads and extracted trees, shared by all cells."""
    env = os.environ.get("PDEVIDENCE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pdevidence"


def work_dir(root: Path) -> Path:
    """Per-checkout scratch: cell environments, logs, probe stderr."""
    return Path(os.environ.get("PDEVIDENCE_WORK", root / ".cells"))


def runs_dir(root: Path) -> Path:
    """Fresh cell results and receipts (the published ones live in results/)."""
    return Path(os.environ.get("PDEVIDENCE_RUNS", root / "runs"))


def results_dir(root: Path) -> Path:
    return root / "results"


def tree_lock_file(root: Path) -> Path:
    return root / "constraints" / "trees.lock.json"
