"""What killed runs leave (core/debris.py): removed once their run is provably gone, never while it lives.

"Another run" is a process of its own that enters a root, makes what a run makes there and then waits,
killed by ``kill -9`` when the test has seen what it needs.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdevidence.core import debris, paths

HERE = Path(__file__).resolve().parent
SHAPES = (".*.tmp",)
MARKER = "done.json"

ANOTHER_RUN = """
import json, os, sys, tempfile, time
from pathlib import Path
from pdevidence.core import debris, paths

directory = Path(sys.argv[1])
debris.enter(directory)
fd, tokened = tempfile.mkstemp(dir=directory, prefix=debris.prefix(directory, "download"), suffix=".part")
untokened = tempfile.mkdtemp(dir=directory, prefix=".staging.", suffix=".tmp")
logs = debris.run_dir(directory / "logs", "20260101-000000", keep=1)
print(json.dumps({"tokened": tokened, "untokened": untokened, "logs": str(logs)}), flush=True)
time.sleep(60)
"""


@pytest.fixture
def another_run(tmp_path):
    """Start another run in a directory; what it made, and the process to kill."""
    started = []

    def start(directory: Path) -> tuple[dict, subprocess.Popen]:
        proc = subprocess.Popen([sys.executable, "-c", ANOTHER_RUN, str(directory)], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
        started.append(proc)
        return {k: Path(v) for k, v in json.loads(proc.stdout.readline()).items()}, proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def killed(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_what_a_live_run_makes_stays_and_goes_once_it_is_killed(tmp_path, another_run):
    made, proc = another_run(tmp_path)
    with debris.run():
        debris.enter(tmp_path, [debris.Place(tmp_path, SHAPES)])
        debris.run_dir(tmp_path / "logs", "20260101-000001", keep=1)  # the other's is the older one now
    assert all(path.exists() for path in made.values())
    killed(proc)
    with debris.run():
        debris.enter(tmp_path, [debris.Place(tmp_path, SHAPES)])
        debris.run_dir(tmp_path / "logs", "20260101-000002", keep=1)
    assert not any(path.exists() for path in made.values())
    assert [p.name for p in tmp_path.glob(".pdevidence-run-*.lock")] == []  # a dead run's token goes with its leftovers


def test_a_dead_runs_tokened_temporary_goes_while_another_run_is_alive(tmp_path, another_run):
    alive, _ = another_run(tmp_path)
    dead, proc = another_run(tmp_path)
    killed(proc)
    with debris.run():
        debris.enter(tmp_path, [debris.Place(tmp_path, SHAPES)])
    assert not dead["tokened"].exists() and alive["tokened"].exists()
    assert dead["untokened"].exists() and alive["untokened"].exists()  # whose? not provable while a run is there


def test_untokened_leftovers_of_the_shapes_named_go_only_when_no_other_run_is_in_the_root(tmp_path):
    leftover, other = tmp_path / ".result.json.x1y2.tmp", tmp_path / ".keep.json"
    leftover.write_text("half")
    other.write_text("{}")
    with debris.run():
        debris.enter(tmp_path, [debris.Place(tmp_path, SHAPES)])
    assert not leftover.exists() and other.exists()


def test_run_directories_keep_the_newest_and_an_older_one_of_a_live_run(tmp_path, another_run):
    made, proc = another_run(tmp_path)
    parent = made["logs"].parent
    for second in range(3, 8):
        with debris.run():
            newest = debris.run_dir(parent, f"20260101-00000{second}", keep=3)
    names = sorted(p.name[:15] for p in parent.iterdir() if not p.name.startswith("."))
    assert names == ["20260101-000000", "20260101-000005", "20260101-000006", "20260101-000007"]
    assert newest.name.startswith("20260101-000007-run-")
    killed(proc)
    with debris.run():
        debris.run_dir(parent, "20260101-000008", keep=3)
    assert not made["logs"].exists()


def test_a_runs_own_directory_counts_among_the_kept_wherever_its_name_sorts(tmp_path):
    for second in (5, 6, 7):
        with debris.run():
            debris.run_dir(tmp_path, f"20260101-00000{second}", keep=2)
    with debris.run():
        own = debris.run_dir(tmp_path, "20260101-000001", keep=2)  # a clock set back, or a token that sorts low
    assert sorted(p.name[:15] for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "20260101-000001", "20260101-000007"]
    assert own.exists()


def test_a_legacy_run_directory_without_a_token_goes_when_no_other_run_is_there(tmp_path):
    legacy = tmp_path / "20250101-000000-abcdefgh"
    legacy.mkdir()
    with debris.run():
        debris.run_dir(tmp_path, "20260101-000000", keep=1)
    assert not legacy.exists()


def test_an_unfinished_build_goes_only_when_its_build_lock_is_free(tmp_path):
    building, abandoned, finished = (tmp_path / name for name in ("building", "abandoned", "finished"))
    for build in (building, abandoned, finished):
        build.mkdir()
    (finished / MARKER).write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, time
fd = os.open({str(tmp_path / '.building.lock')!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with debris.run():
            debris.enter(tmp_path, [debris.Place(tmp_path, unfinished=MARKER)])
        assert building.exists() and not abandoned.exists() and finished.exists()
    finally:
        killed(holder)


def test_a_run_block_leaves_no_token_file_and_its_directories_unlocked(tmp_path):
    with debris.run():
        token = debris.enter(tmp_path)
        held = tmp_path / debris.TOKEN_FILE.format(token)
        fd = os.open(held, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    assert not held.exists()
    with debris.run():
        assert debris.enter(tmp_path) != token  # a new run, a new token


def test_a_temporary_carries_the_token_of_its_run_in_the_roots_the_run_is_in(tmp_path):
    with debris.run():
        assert debris.prefix(tmp_path / "wheels", "x.whl") == ".x.whl."  # outside them: plain
        token = debris.enter(tmp_path)
        assert debris.prefix(tmp_path / "wheels", "x.whl") == f".x.whl.run-{token}."


def test_each_kind_of_run_keeps_its_newest_twenty_log_directories(tmp_path):
    for _ in range(paths.LOG_RUNS + 2):
        with debris.run():
            paths.run_logs(tmp_path / "engine")
    assert len([p for p in (tmp_path / "engine").iterdir() if not p.name.startswith(".")]) == paths.LOG_RUNS


def test_a_scratch_root_that_cannot_be_made_is_an_environment_problem_naming_it(tmp_path, monkeypatch, capsys):
    from pdevidence import cli
    from pdevidence.core import errors

    (tmp_path / "a-file").write_text("where the user's cache directories would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    monkeypatch.delenv("PDEVIDENCE_CACHE", raising=False)
    monkeypatch.setenv("PDEVIDENCE_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    assert cli.main(["verify"]) == errors.ENVIRONMENT
    said = capsys.readouterr().err
    assert f"cannot work in {tmp_path / 'a-file' / 'pdevidence'}: Not a directory" in said
    assert "PDEVIDENCE_CACHE" in said
