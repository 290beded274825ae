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
    if config.pluginmanager.hasplugin("xdist"):  # the real units first, the longer one first: they start at once
        items.sort(key=lambda item: _unit_rank(item.path.name))


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
# The session's shared real runs (tests/conftest.py): a worker makes each once for the files that ask for it, so
# those files are one unit; a session fixture is per worker, and two workers would make them twice.
SHARED_RUNS = ("release_matrix", "bracket_sweep")
SHARING_FILES = {name for name in REAL_FILES if any(run in (ROOT / "tests" / name).read_text() for run in SHARED_RUNS)}
UNITS = ("real runs sharing the matrix and the sweep", "real runs on their own")


def _unit_rank(name: str) -> int:
    """0 for a file of the shared runs (the longer unit), 1 for another file of real runs, 2 for a fast file."""
    return 0 if name in SHARING_FILES else 1 if name in REAL_FILES else 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """How the workers (`-n`: pyproject.toml) share the tests: the real runs in two units, handed out first, each
    on one worker as a single process would run it (the files of the session's shared runs, which make them once,
    and the rest); each fast file a unit of its own for whichever worker is free. (pytest-xdist's own `loadgroup`
    cannot group: it renames items through an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RealRunsInTwo(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            rank = _unit_rank(Path(file).name)
            return UNITS[rank] if rank < 2 else file

    return RealRunsInTwo(config, log)
