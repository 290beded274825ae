"""Where things live: the project's files, the user's cache and state, fresh runs.

The project's files (registry, in-cell probes, closures, tree lock, published evidence) are a
checkout's top level, or, in an installed wheel, the copy of them it carries under
``pdevidence/project/`` (pyproject.toml maps them there at build time). A checkout keeps its
scratch beside it (``.cells/``, ``runs/``) as ever; an installed copy never writes where it is
installed: its environments, trees and cached outcomes go to the user's cache directory, its runs
to the user's state directory (``platformdirs``; ``PDEVIDENCE_CACHE``, ``PDEVIDENCE_WORK`` and
``PDEVIDENCE_RUNS`` override them).
"""

from __future__ import annotations

import os
import datetime
from pathlib import Path

import platformdirs

from . import debris, settings

APP = "pdevidence"
REGISTRY = "experiments.toml"
PACKAGE = Path(__file__).resolve().parents[1]
BUNDLE = PACKAGE / "project"  # where a wheel carries the project's files
CHECKOUT = PACKAGE.parent
LOG_RUNS = 20  # run log directories kept per kind of run


def _project() -> Path:
    """The installed wheel's own files when it carries them, else the checkout this package is in."""
    return BUNDLE if (BUNDLE / REGISTRY).is_file() else CHECKOUT


PROJECT = _project()


def bundled(root: Path) -> bool:
    """Is ``root`` the copy an installed wheel carries (read-only: nothing is written under it)?"""
    try:
        return root.resolve() == BUNDLE.resolve()
    except OSError:
        return False


def cache_dir() -> Path:
    """Content-addressed downloads and extracted trees, shared by all cells (and an installed copy's work)."""
    return settings.get("PDEVIDENCE_CACHE") or platformdirs.user_cache_path(APP)


def state_dir() -> Path:
    """What an installed copy keeps between runs that is not a cache: its runs."""
    return platformdirs.user_state_path(APP)


def work_dir(root: Path) -> Path:
    """Cell environments, logs, locks, cached outcomes: beside a checkout, in the user's cache when installed."""
    return settings.get("PDEVIDENCE_WORK") or (cache_dir() / "work" if bundled(root) else root / ".cells")


def runs_dir(root: Path) -> Path:
    """Fresh cell results and receipts (the published ones live in results/)."""
    return settings.get("PDEVIDENCE_RUNS") or (state_dir() / "runs" if bundled(root) else root / "runs")


def run_logs(parent: Path) -> Path:
    """A new directory under ``parent`` for one run's logs, named by when it started: runs at once never share
    a log, and what an error message points at stays what that run wrote. ``parent`` keeps the newest
    ``LOG_RUNS``; an older one goes once its run has ended."""
    # To the microsecond: runs started in one second sort as they started, not by their random tokens.
    return debris.run_dir(parent, datetime.datetime.now().strftime("%Y%m%d-%H%M%S.%f"), keep=LOG_RUNS)


def bytecode_beside_sources(root: Path) -> None:
    """Every process the harness starts reads bytecode beside its sources, where each environment and tree was
    compiled as it was built: a contained probe sees nothing else (a PYTHONPYCACHEPREFIX, the user's or one
    set here, points where the sandbox shows nothing, so every probe would compile torch again). With an
    installed copy's files, no process writes bytecode either, not beside the in-cell files it carries in
    site-packages (a build's compiler writes all the same)."""
    os.environ.pop("PYTHONPYCACHEPREFIX", None)
    if bundled(root):
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


def results_dir(root: Path) -> Path:
    return root / "results"


def tree_lock_file(root: Path) -> Path:
    return root / "constraints" / "trees.lock.json"
