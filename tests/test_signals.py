"""Ctrl-C and SIGTERM stop at once wherever they land: starting a child, waiting on a lock, a download."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pdevidence.core import children
from pdevidence.core.paths import PROJECT


def test_a_signal_while_a_child_starts_still_stops_that_child(monkeypatch, gone):
    """The signal lands after the child exists and before it is registered: it must not survive."""
    started = []
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kw):
        proc = real_popen(*args, **kw)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, before popen registers the child
        return proc

    monkeypatch.setattr(children.subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(children.Interrupted), children.stop_on_signals():
            children.popen(["sleep", "60"])
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                pytest.fail("the child started during the signal is still running")
    assert started and gone(started[0].pid)


def cell_command(root) -> list[str]:
    return [sys.executable, "-m", "pdevidence", "--root", str(root), "cell", "release", "demo", "base"]


def interrupt_when(harness: subprocess.Popen, ready) -> tuple[str, float]:
    """SIGINT once ``ready(stderr so far)`` holds; the harness's stderr and how long it took to stop."""
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(harness.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not ready("".join(err)):
        assert harness.poll() is None and time.monotonic() < deadline, "".join(err)
        time.sleep(0.05)
    began = time.monotonic()
    harness.send_signal(signal.SIGINT)
    try:
        harness.wait(timeout=20)
    finally:
        if harness.poll() is None:
            harness.kill()
    reader.join(timeout=5)
    return "".join(err), time.monotonic() - began


def test_ctrl_c_while_a_cell_waits_on_a_lock_stops_at_once(demo_project, tmp_path):
    held = tmp_path / "cache" / "locks" / "sglang==1.0.0.lock"  # the release's lock: another run has it
    held.parent.mkdir(parents=True)
    with open(held, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        harness = subprocess.Popen(cell_command(demo_project), cwd=demo_project, text=True,
                                   env={**os.environ, "PYTHONPATH": str(PROJECT)},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err, took = interrupt_when(harness, lambda err: "waiting: another process" in err)
    assert harness.returncode == 130, err
    assert took < 10, err  # at once, not when the other run lets go
    assert "interrupted by SIGINT" in err


def test_ctrl_c_during_a_download_stops_at_once(demo_project, http_server):
    wheel = "/files/sglang-1.0.0-py3-none-any.whl"
    http_server.routes[wheel].delay = 60  # the server accepted the request and went quiet
    harness = subprocess.Popen(cell_command(demo_project), cwd=demo_project, text=True,
                               env={**os.environ, "PYTHONPATH": str(PROJECT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err, took = interrupt_when(harness, lambda err: http_server.hits(wheel) > 0)
    assert harness.returncode == 130, err
    assert took < 10, err  # at once, not after the 30 s socket timeout
    assert "interrupted by SIGINT" in err and "Traceback" not in err
    runs = demo_project / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # nothing written


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except (OSError, ValueError):
            continue
        if entry.isdigit():
            parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, todo = [], [pid]
    while todo:
        above = todo.pop()
        below = [p for p, parent in parents.items() if parent == above]
        found += below
        todo += below
    return found


def test_a_killed_childs_grandchild_is_reaped_not_left_a_zombie(gone):
    """The child's group is killed on timeout; its grandchild's parent dies with it, so the grandchild is
    reparented to the harness (a subreaper), which must collect it."""
    children.become_subreaper()
    proc = children.popen(["/bin/sh", "-c", "sleep 60 & echo $!; exec sleep 60"], stdout=subprocess.PIPE, text=True)
    grandchild = int(proc.stdout.readline())
    with pytest.raises(subprocess.TimeoutExpired):
        children.wait(proc, timeout=0.2)
    assert gone(proc.pid) and gone(grandchild)  # not a zombie either
