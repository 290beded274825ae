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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _choose_lane(config, items)
    if config.pluginmanager.hasplugin("xdist"):  # the real files first: the longest unit starts first
        items.sort(key=lambda item: "sglang" not in item.keywords and item.path.name not in REAL_FILES)


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




# The test files holding real runs (marked ``sglang``), by name; tests/test_lanes.py holds the list to a collection.
REAL_FILES = {path.name for path in (ROOT / "tests").glob("test_*.py") if "pytest.mark.sglang" in path.read_text()}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """How the workers (`-n`: pyproject.toml) share the tests: every file of real runs in one unit, handed out
    first, so one worker runs them one after another as a single process would (the session's shared runs made
    once, no two real runs beside each other in one cache); each fast file a unit of its own for the others.
    (pytest-xdist's own `loadgroup` cannot group: it renames items through an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RealRunsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "real runs" if Path(file).name in REAL_FILES else file

    return RealRunsTogether(config, log)
