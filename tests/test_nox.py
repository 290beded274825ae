"""nox runs what was selected: exit codes, several sessions, Ctrl-C and SIGTERM, through nox itself.

Runs `python -m nox` in a subprocess on the fixture project of test_cells (its
"SGLang" is a fixture package, its probe can hang on request), so the
noxfile's handling of the harness's exit codes is exercised as users meet it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEMO_HANGING as HANGING
from test_cells import run_cell

from pdevidence.core import errors
from pdevidence.core.paths import PROJECT

BASE, HEAD = "release(demo, base)", "release(demo, head)"


def nox_command(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "nox", "-f", str(root / "noxfile.py"), *args]


def nox(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(nox_command(root, *args), cwd=root, env={**os.environ, "PYTHONPATH": str(PROJECT)},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def no_github(monkeypatch, unreachable_url):
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}.tar.gz")
    monkeypatch.delenv("SGLANG_REPO", raising=False)


@pytest.mark.parametrize(("sessions", "posargs", "code"), [
    (["probe(demo, base)"], [], errors.ENVIRONMENT),  # the tree cannot be fetched
    ([BASE], ["--bogus"], errors.USAGE),  # argparse's error, not nox's end
    ([BASE], [], errors.CONFIRMED),
])
def test_one_selected_session_exits_with_the_documented_code(demo_project, no_github, sessions, posargs, code):
    done = nox(demo_project, "-s", *sessions, *(["--", *posargs] if posargs else []))

    assert done.returncode == code, done.stdout + done.stderr
    assert "Ran " not in done.stderr  # one session: no summary


def test_a_usage_error_from_the_environment_keeps_its_code(demo_project, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_TORCH", "auto")  # the old network probe is gone: a usage error now
    done = nox(demo_project, "-s", BASE)
    assert done.returncode == errors.USAGE, done.stderr
    assert "PDEVIDENCE_TORCH='auto' is not a valid setting" in done.stderr


def test_several_sessions_all_run_and_a_failure_fails_only_its_own(demo_project, no_github):
    done = nox(demo_project, "-s", "probe(demo, base)", BASE)

    assert done.returncode == 1, done.stdout + done.stderr  # nox's own failure code
    assert "Ran 2 sessions" in done.stderr
    assert "* probe(demo, base): aborted" in done.stderr and f"* {BASE}: success" in done.stderr
    assert f"Session probe(demo, base) aborted: exit {errors.ENVIRONMENT}: environment problem" in done.stderr
    assert (demo_project / "runs" / "demo.base.release-1.0.0.json").exists()  # the second one ran


def test_several_sessions_with_a_usage_error_each_report_it(demo_project):
    done = nox(demo_project, "-s", BASE, HEAD, "--", "--bogus")

    assert done.returncode == 1, done.stdout + done.stderr
    for session in (BASE, HEAD):
        assert f"Session {session} aborted: exit {errors.USAGE}: usage error" in done.stderr


@pytest.mark.parametrize(("argv", "environ", "alone"), [
    ([], {}, True),  # bare nox: the noxfile's default, matrix
    (["-s", "release(admission, base)"], {}, True),
    (["--session", "matrix", "--", "--kind", "git", "-s", "x"], {}, True),  # after --: the session's arguments
    (["-f", "noxfile.py", "-e", "check"], {}, True),
    ([], {"NOXSESSION": "verify"}, True),
    (["-s", "release"], {}, False),  # every cell
    (["-s", "matrix", "compare"], {}, False),
    (["-s", "matrix", "-s", "compare"], {}, False),
    ([], {"NOXSESSION": "matrix,compare"}, False),
    (["-s", "release(admission, base)", "-k", "base"], {}, False),
    (["-t", "cell"], {}, False),
    (["-s", "mutate(admission)"], {}, True),
])
def test_the_noxfile_reads_from_noxs_own_command_line_whether_one_session_runs(noxfile, argv, environ,
                                                                              alone):
    assert noxfile._names_one_session(argv, environ) is alone


def test_every_parametrized_session_is_known_to_the_selection(noxfile):
    """A session the noxfile takes for one but nox runs many of would end the run at its first failure."""
    noxfile = noxfile
    listed = subprocess.run([sys.executable, "-m", "nox", "-f", str(PROJECT / "noxfile.py"), "--list", "--json",
                             "-k", "matrix or not matrix"], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    sessions = json.loads(listed.stdout)
    parametrized = {s["name"] for s in sessions if s["session"] != s["name"]}
    assert parametrized == set(noxfile.PARAMETRIZED)
    assert all(noxfile._names_one_session(["-s", s["session"]], {}) for s in sessions)


def wait_for_probe(root: Path, timeout: float = 120) -> int:
    """The host pid of the demo probe, once its log says it hangs inside the probe (it runs contained,
    in a PID namespace of its own: its own pid is not the host's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list((root / ".cells" / "logs").glob("*.log"))
        if any(HANGING in log.read_text(errors="replace") for log in logs):
            probes = [pid for pid in probe_processes(str(root / "runs")) if _is_probe(pid)]
            if probes:
                return probes[0]
        time.sleep(0.1)
    raise AssertionError(f"the probe never started (no {HANGING!r} in {root / '.cells' / 'logs'})")


def _is_probe(pid: int) -> bool:
    """The probe's own interpreter, not the sandbox around it."""
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and argv[1].endswith(b"probe_demo.py")


def probe_processes(marker: str) -> list[int]:
    """Pids whose command line mentions ``marker`` (our own runs directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.parametrize(("command", "sig", "code"), [
    (lambda root: nox_command(root, "-s", BASE, "--", "--force"), signal.SIGINT, 130),
    (lambda root: nox_command(root, "-s", BASE, "--", "--force"), signal.SIGTERM, 143),
    (lambda root: [sys.executable, "-m", "pdevidence", "--root", str(root), "cell", "release", "demo", "base",
                   "--force"], signal.SIGTERM, 143),
    # Two cells in worker threads: the signal reaches neither thread, the handler kills both probes.
    (lambda root: [sys.executable, "-m", "pdevidence", "--root", str(root), "matrix", "--force"], signal.SIGINT, 130),
], ids=["nox-SIGINT", "nox-SIGTERM", "cli-SIGTERM", "cli-matrix-SIGINT"])
def test_a_signal_stops_the_probe_at_once_and_keeps_the_previous_result(demo_project, tmp_path, monkeypatch,
                                                                         command, sig, code, gone):
    previous = run_cell(demo_project)
    before = {p.name: p.read_bytes() for p in (previous.result, previous.receipt)}
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "DEMO_PROBE_MODE": "hang"}
    harness = subprocess.Popen(command(demo_project), cwd=demo_project, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        probe = wait_for_probe(demo_project)
        started = time.monotonic()
        harness.send_signal(sig)
        out, err = harness.communicate(timeout=30)
    finally:
        if harness.poll() is None:
            harness.kill()
    assert harness.returncode == code, out + err
    assert time.monotonic() - started < 10  # at once, not after the probe's 60 s
    runs = demo_project / "runs"
    assert gone(probe) and probe_processes(str(runs)) == []
    assert f"interrupted by {sig.name}" in err
    assert {p.name: p.read_bytes() for p in runs.iterdir()} == before  # byte-identical, no .partial


@pytest.mark.sglang
def test_sigint_during_a_forced_real_cell_keeps_its_result_and_leaves_no_probe(tmp_path, gone):
    """Alone proves: Ctrl-C during a real forced cell under nox (`nox -s "release(admission, head)" -- --force`,
    while the probe imports SGLang) exits 130, leaves no probe process and keeps the cell's earlier result byte
    for byte. One cell stands for all: every release cell is interrupted the same way."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PDEVIDENCE_RUNS": str(runs)}
    env.pop("PDEVIDENCE_TORCH", None)
    session = "release(admission, head)"
    first = subprocess.run(nox_command(PROJECT, "-s", session), cwd=PROJECT, env=env, capture_output=True,
                           text=True, timeout=1800)
    assert first.returncode == errors.CONFIRMED, first.stdout + first.stderr
    before = {p.name: p.read_bytes() for p in runs.iterdir()}
    assert sorted(before) == ["admission.head.release-0.5.21.json", "admission.head.release-0.5.21.receipt.json"]

    harness = subprocess.Popen(nox_command(PROJECT, "-s", session, "--", "--force"), cwd=PROJECT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (probes := [p for p in probe_processes(str(runs)) if p != harness.pid]):
            assert time.monotonic() < deadline and harness.poll() is None, "the probe never started"
            time.sleep(0.2)
        time.sleep(3)  # well inside SGLang's ~25 s import
        harness.send_signal(signal.SIGINT)
        out, err = harness.communicate(timeout=30)
    finally:
        if harness.poll() is None:
            harness.kill()
    assert harness.returncode == 130, out + err
    assert all(gone(pid) for pid in probes) and probe_processes(str(runs)) == []
    assert {p.name: p.read_bytes() for p in runs.iterdir()} == before  # byte-identical, no .partial
