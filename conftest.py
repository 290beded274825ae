"""pytest configuration for the whole project.

Fast tests run by default. Tests marked ``sglang`` build real cell
environments and run the probes on SGLang releases from PyPI (minutes, needs
the network to PyPI and Python 3.12): select them with ``--sglang``. Those also
marked ``scheduled`` are the scheduled lane (every era, every backport, every
mutant): ``--scheduled`` runs them alone, ``--sglang --scheduled`` everything.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

collect_ignore_glob = [".cells/*", "runs/*", ".nox/*"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sglang", action="store_true", default=False,
                     help="also run the real SGLang release-backed cells (slow)")
    parser.addoption("--scheduled", action="store_true", default=False,
                     help="run the scheduled lane: the real runs --sglang leaves out (every era, every backport, "
                          "every mutant); with --sglang, everything")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang: runs real SGLang releases in cell environments (slow; --sglang)")
    config.addinivalue_line("markers", "scheduled: a real run of the scheduled lane, left out of --sglang "
                                       "(every era, every backport, every mutant; --scheduled)")


@pytest.hookimpl(tryfirst=True)  # the groups are set before pytest-xdist reads them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _choose_lane(config, items)
    if config.pluginmanager.hasplugin("xdist"):
        _share_out(items)


def _choose_lane(config: pytest.Config, items: list[pytest.Item]) -> None:
    real, scheduled = config.getoption("--sglang"), config.getoption("--scheduled")
    if scheduled and not real:  # the weekly lane: what the default run leaves out, nothing else
        kept = [item for item in items if "scheduled" in item.keywords]
        config.hook.pytest_deselected(items=[item for item in items if "scheduled" not in item.keywords])
        items[:] = kept
        return
    for item in items:
        if "scheduled" in item.keywords and not scheduled:
            item.add_marker(pytest.mark.skip(reason="scheduled lane: run with --scheduled"))
        elif "sglang" in item.keywords and not real:
            item.add_marker(pytest.mark.skip(reason="real SGLang cell: run with --sglang"))


# The real runs a whole session shares (tests/conftest.py): each is made once per worker that asks for it.
SHARED_RUNS = {"release_matrix", "bracket_sweep"}


def _share_out(items: list[pytest.Item]) -> None:
    """How the workers (`-n`, pytest-xdist with `--dist loadgroup`: pyproject.toml) share the tests. Each file is
    one unit of work, so a module's fixtures are made once; the files that read a shared run are one unit, so that
    run is made once. Units are handed out in this order, each to the next free worker: that unit first, then the
    other files of real runs, then the fast files, so the longest work starts while the other worker takes the rest."""
    shared = {item.path for item in items if SHARED_RUNS & set(item.fixturenames)}
    real = {item.path for item in items if "sglang" in item.keywords}
    for item in items:
        item.add_marker(pytest.mark.xdist_group("shared-runs" if item.path in shared else item.path.name))
    items.sort(key=lambda item: (item.path not in shared, item.path not in real))
