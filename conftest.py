"""pytest configuration for the whole project.

Fast tests run by default. Tests marked ``sglang`` build real cell
environments and run the probes on SGLang releases from PyPI (minutes, needs
the network to PyPI and Python 3.12): select them with ``--sglang``.
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang: runs real SGLang releases in cell environments (slow; --sglang)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--sglang"):
        return
    skip = pytest.mark.skip(reason="real SGLang cell: run with --sglang")
    for item in items:
        if "sglang" in item.keywords:
            item.add_marker(skip)
