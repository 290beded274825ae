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



def _share_out(items: list[pytest.Item]) -> None:
    """How the workers (`-n`, pytest-xdist with `--dist loadgroup`: pyproject.toml) share the tests: every file of
    real runs is one unit, handed out first, so one worker runs them one after another, as a single process would
    (the session's shared runs made once, no two real runs beside each other in one cache); each fast file is a
    unit of its own, for the other workers."""
    real = {item.path for item in items if "sglang" in item.keywords}
    for item in items:
        item.add_marker(pytest.mark.xdist_group("real-runs" if item.path in real else item.path.name))
    items.sort(key=lambda item: item.path not in real)
