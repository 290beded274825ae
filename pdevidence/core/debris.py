"""What killed runs leave behind, removed once it is provably abandoned: never by its age.

A run that works in a scratch directory holds an exclusive ``flock`` on a token file of its own there,
``.pdevidence-run-<token>.lock``, from when it enters the directory (``enter``) until it ends. The kernel drops
that lock when the run's process dies, even by ``kill -9``: a token whose lock is free belongs to a dead run, and
so does a token without a file (the file is made before anything named with it and removed only once its run is
dead). In that directory, then:

- a leftover named with a dead run's token goes: a temporary named by ``prefix`` (``.<name>.run-<token>.<random>``),
  or a run directory made with ``run_dir`` (``<stem>-run-<token>-<random>``) older than the newest ``keep``;
- a leftover of the shapes the caller names (the temporaries of code that names its own) carries no token: it
  goes only when no other run is in the directory;
- an unfinished build (a directory without its ``unfinished`` marker) goes when its build lock,
  ``.<name>.lock`` beside it, is free: it is only ever built under that lock.

A run is a process, or a ``run()`` block in one (a command called in-process, as the tests do). It sweeps a
directory as it enters it, before it makes anything there, holding the directory's own flock exclusively while it
looks and makes its token file: no sweep ever sees a token file not yet locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from . import children

TOKEN_FILE = ".pdevidence-run-{}.lock"
_TOKEN_FILE = re.compile(r"^\.pdevidence-run-([0-9a-f]{16})\.lock$")
_TOKENED = re.compile(r"run-([0-9a-f]{16})")
POLL_SECONDS = 0.05


@dataclass
class _Run:
    pid: int
    token: str
    held: dict[str, int] = field(default_factory=dict)  # directory -> this run's token file there, locked


_run: _Run | None = None
_entering = threading.Lock()  # the threads of one run enter one directory once


def _this_run() -> _Run:
    global _run
    if _run is None or _run.pid != os.getpid():  # a forked child is a run of its own
        _run = _Run(os.getpid(), secrets.token_hex(8))
    return _run


@contextlib.contextmanager
def run():
    """A run of its own: what the block enters, it is in until the block ends (not until the process does)."""
    global _run
    try:
        yield
    finally:
        with _entering:
            if _run is not None and _run.pid == os.getpid():
                for directory, fd in _run.held.items():
                    Path(directory, TOKEN_FILE.format(_run.token)).unlink(missing_ok=True)
                    os.close(fd)
            _run = None


def enter(directory: Path, shapes: tuple[str, ...] = (), unfinished: str | None = None) -> str:
    """Remove what dead runs left in ``directory`` (see the module's doc; ``shapes`` are glob patterns of the
    untokened leftovers, ``unfinished`` the marker of a finished build), then count this run as in it until it
    ends; once per run and directory, before the run makes anything there. This run's token."""
    run = _this_run()
    key = os.path.abspath(directory)
    with _entering:
        if key not in run.held:
            directory.mkdir(parents=True, exist_ok=True)
            with _looking(directory):
                _sweep(directory, shapes, unfinished, run.token)
                run.held[key] = _hold(directory / TOKEN_FILE.format(run.token))
    return run.token


def prefix(directory: Path, name: str) -> str:
    """The name prefix (``tempfile``'s) of a temporary for ``name`` in ``directory``: with this run's token where the
    run is in the directory, so that it goes once the run is dead; elsewhere plain (an untokened leftover)."""
    run = _this_run()
    with _entering:
        entered = os.path.abspath(directory) in run.held
    return f".{name}.run-{run.token}." if entered else f".{name}."


def run_dir(parent: Path, stem: str, *, keep: int) -> Path:
    """A new directory in ``parent`` for this run, named from ``stem`` (which sorts as the runs started); of the
    older ones, ``parent`` keeps the newest ``keep``, and the rest go once their run is dead."""
    token = enter(parent)
    made = Path(tempfile.mkdtemp(dir=parent, prefix=f"{stem}-run-{token}-"))
    with _looking(parent):
        live, dead = _runs(parent, token)
        try:
            made_so_far = sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))
            for old in made_so_far[:-keep]:
                found = _TOKENED.search(old.name)
                if (found.group(1) not in live) if found else live == {token}:
                    _remove(old)
        finally:
            _release(dead)
    return made


@contextlib.contextmanager
def _looking(directory: Path):
    """The directory's own flock, exclusive: one sweep at a time, and none while a run makes its token file.
    Polled: a thread blocked in flock would not see Ctrl-C."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while not _locked(fd):
            children.sleep(POLL_SECONDS)
        yield
    finally:
        os.close(fd)


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _hold(path: Path) -> int:
    """Lock ``path`` for the rest of this run: the descriptor stays open until the run ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh random token: no one else holds it
    return fd


def _free(path: Path) -> int | None:
    """The descriptor of ``path`` locked by this run when no one else holds it (made if missing), else None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if _locked(fd):
        return fd
    os.close(fd)
    return None


def _runs(directory: Path, own: str) -> tuple[set[str], list[tuple[Path, int]]]:
    """The tokens of the runs alive in ``directory`` (``own`` among them), and the token files of dead runs,
    locked by this run until ``_release``."""
    live, dead = {own}, []
    for path in directory.glob(TOKEN_FILE.format("*")):
        found = _TOKEN_FILE.match(path.name)
        if found is None or found.group(1) == own:
            continue
        fd = _free(path)
        if fd is None:
            live.add(found.group(1))
        else:
            dead.append((path, fd))
    return live, dead


def _release(dead: list[tuple[Path, int]]) -> None:
    """Dead runs' token files go once what they named is gone (the caller's sweep)."""
    for path, fd in dead:
        path.unlink(missing_ok=True)
        os.close(fd)


def _sweep(directory: Path, shapes: tuple[str, ...], unfinished: str | None, own: str) -> None:
    live, dead = _runs(directory, own)
    try:
        for entry in directory.iterdir():
            if not entry.name.startswith(".") or _TOKEN_FILE.match(entry.name):
                continue
            found = _TOKENED.search(entry.name)
            if (found.group(1) not in live) if found else (live == {own} and any(fnmatch(entry.name, s)
                                                                                   for s in shapes)):
                _remove(entry)
        if unfinished:
            _sweep_unfinished(directory, unfinished)
    finally:
        _release(dead)


def _sweep_unfinished(directory: Path, marker: str) -> None:
    for entry in directory.iterdir():
        if entry.name.startswith(".") or not entry.is_dir() or (entry / marker).exists():
            continue
        fd = _free(directory / f".{entry.name}.lock")
        if fd is None:  # being built
            continue
        try:
            if not (entry / marker).exists():  # not finished between the look and the lock
                _remove(entry)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    """Remove a leftover; one that cannot be removed now (its permissions) stays for the next sweep."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
