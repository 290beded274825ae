"""The test lanes: what `pytest`, `pytest --sglang` and `pytest --scheduled` run.

The default lane (the README's command, `.ci/run`) is the fast tests and the real runs marked ``sglang``; the real
runs also marked ``scheduled`` (every era, every backport, every mutant) are the weekly job's, which runs them alone.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdevidence.core.paths import PROJECT

# What the scheduled lane holds, by file: the default lane keeps every experiment's bracket and every target kind.
SCHEDULED = {"tests/test_corpus_real.py", "tests/test_deferred_release_nixl_probe.py", "tests/test_eras_real.py",
             "tests/test_forks_real.py", "tests/test_hostile_real.py", "tests/test_mutate.py",
             "tests/test_sandbox_real.py", "tests/test_war_barrier_old_real.py"}


def root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", PROJECT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Item:
    name: str
    keywords: set[str]
    path: Path = Path("tests/test_x.py")
    marks: list[pytest.Mark] = field(default_factory=list)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.mark)

    @property
    def skipped(self) -> str | None:
        return next((m.kwargs["reason"] for m in self.marks if m.name == "skip"), None)


@dataclass
class Config:
    options: dict[str, bool]
    deselected: list[Item] = field(default_factory=list)
    plugins: tuple[str, ...] = ()
    workers: list[str] = field(default_factory=list)  # pytest-xdist's --tx

    def getoption(self, name: str) -> bool:
        return self.options[name]

    def getvalue(self, name: str) -> list[str]:
        assert name == "tx"
        return self.workers

    @property
    def hook(self):
        return self

    @property
    def pluginmanager(self):
        return self

    def hasplugin(self, name: str) -> bool:
        return name in self.plugins

    def pytest_deselected(self, items: list[Item]) -> None:
        self.deselected.extend(items)


def lane(sglang: bool, scheduled: bool) -> dict[str, str]:
    """What a run with these options does with a fast test, a real one and a scheduled one: run, skip (why) or
    deselect."""
    items = [Item("fast", set()), Item("real", {"sglang"}), Item("weekly", {"sglang", "scheduled"})]
    config = Config({"--sglang": sglang, "--scheduled": scheduled})
    kept = list(items)
    root_conftest().pytest_collection_modifyitems(config, kept)
    return {item.name: ("deselected" if item in config.deselected else item.skipped or "run") for item in items} \
        | {"kept": ",".join(item.name for item in kept)}


@pytest.mark.parametrize(("sglang", "scheduled", "expected"), [
    (False, False, {"fast": "run", "real": "real SGLang cell: run with --sglang",
                    "weekly": "scheduled lane: run with --scheduled"}),
    (True, False, {"fast": "run", "real": "run", "weekly": "scheduled lane: run with --scheduled"}),
    (False, True, {"fast": "deselected", "real": "deselected", "weekly": "run"}),
    (True, True, {"fast": "run", "real": "run", "weekly": "run"}),
], ids=["pytest", "pytest --sglang", "pytest --scheduled", "pytest --sglang --scheduled"])
def test_each_lane_runs_its_tests_and_says_how_to_run_the_others(sglang, scheduled, expected):
    ran = lane(sglang, scheduled)
    assert {name: ran[name] for name in expected} == expected
    assert ran["kept"] == ("weekly" if scheduled and not sglang else "fast,real,weekly")


def test_with_workers_the_real_runs_come_first_in_two_units_and_each_fast_file_is_its_own():
    conftest = root_conftest()
    fast = [Item(f"fast{i}", set(), Path("tests/test_a.py")) for i in range(2)]
    alone = Item("alone", {"sglang"}, Path("tests/test_images_real.py"))
    sharing = Item("sharing", {"sglang"}, Path("tests/test_real_releases.py"))  # reads the release matrix
    beside = Item("beside", set(), Path("tests/test_images_real.py"))  # a fast test of a file of real runs
    items = [*fast, alone, beside, sharing]
    conftest.pytest_collection_modifyitems(Config({"--sglang": True, "--scheduled": False}, plugins=("xdist",)), items)
    assert [item.name for item in items] == ["sharing", "alone", "beside", "fast0", "fast1"]
    scheduler = conftest.pytest_xdist_make_scheduler(Config({}, workers=["2*popen"]), log=None)
    units = {nodeid: scheduler._split_scope(nodeid) for nodeid in (
        "tests/test_real_releases.py::test_x", "tests/test_check_real.py::test_v",
        "tests/test_images_real.py::test_y[a::b]", "tests/test_a.py::test_z", "tests/test_a.py::TestC::test_w")}
    sharing_unit, alone_unit = conftest.UNITS
    assert units == {"tests/test_real_releases.py::test_x": sharing_unit,
                     "tests/test_check_real.py::test_v": sharing_unit,
                     "tests/test_images_real.py::test_y[a::b]": alone_unit,
                     "tests/test_a.py::test_z": "tests/test_a.py", "tests/test_a.py::TestC::test_w": "tests/test_a.py"}


def test_without_workers_the_order_is_the_files_own():
    items = [Item("fast", set()), Item("real", {"sglang"}, Path("tests/test_real_releases.py"))]
    root_conftest().pytest_collection_modifyitems(Config({"--sglang": True, "--scheduled": False}), items)
    assert [item.name for item in items] == ["fast", "real"]


def collected(*options: str) -> set[str]:
    """The test ids a run of the real suite with ``options`` collects (not running any)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *options],
                          cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def test_the_files_the_workers_keep_together_are_every_file_of_real_runs():
    assert {f"tests/{name}" for name in root_conftest().REAL_FILES} == \
        {test.split("::")[0] for test in collected("--sglang", "--scheduled", "-m", "sglang")}


def test_the_scheduled_lane_is_real_runs_of_its_files_only():
    weekly = collected("--scheduled")
    assert {test.split("::")[0] for test in weekly} == SCHEDULED
    assert not collected("-m", "scheduled and not sglang")  # a scheduled test is a real run too
