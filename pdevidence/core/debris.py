"""What killed runs leave behind, removed once it is provably abandoned: never by its age.

A run that works in a scratch root (the cache, the work directory, the runs) holds an exclusive ``flock`` on a
token file of its own at the root's top, ``.pdevidence-run-<token>.lock``, from when it enters the root
(``enter``) until it ends. The kernel drops that lock when the run's process dies, even by ``kill -9``: a token
whose lock is free belongs to a dead run, and so does a token without a file (the file is made before anything
named with it and removed only once its run is dead). In a directory of that root, then:

- a leftover named with a dead run's token goes: a temporary named by ``prefix`` (``.<name>.run-<token>.<random>``),
  or a run directory made with ``run_dir`` (``<stem>-run-<token>-<random>``) older than the newest ``keep``; its
  run's token file is looked for in every directory above the leftover, whichever root the run was in;
- a leftover of the shapes the caller names (the temporaries of code that names its own) carries no token: it
  goes only when no other run is in the root;
- an unfinished build (a directory without its ``unfinished`` marker) goes when its build lock,
  ``.<name>.lock`` beside it, is free: it is only ever built under that lock;
- a directory set aside (``set_aside``: ``.<name>.aside-<random>``) goes once no run uses it.

A directory that runs use in place while others may replace it (an environment) holds an ``IN_USE`` file: each run
that uses it holds a shared ``flock`` on that file until it ends (``use``). Replacing it renames it aside first, so
that no run loses what it is reading; it is removed once that lock can be taken exclusively.

A run is a process, or a ``run()`` block in one (a command called in-process, as the tests do). It sweeps as it
enters a root, before it makes anything there, holding the root's own flock exclusively while it looks and makes
its token file: no sweep ever sees a token file not yet locked.
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from . import inuse
from .locking import try_lock, wait

TOKEN_FILE = ".pdevidence-run-{}.lock"
IN_USE = ".pdevidence-in-use.lock"
_ASIDE = re.compile(r"^\..+\.aside-[0-9a-f]{8}$")
_TOKEN_FILE = re.compile(r"^\.pdevidence-run-([0-9a-f]{16})\.lock$")
_TOKENED = re.compile(r"run-([0-9a-f]{16})")


@dataclass(frozen=True)
class Place:
    """A directory of a scratch root, and what a killed run may leave there without a token."""

    directory: Path
    shapes: tuple[str, ...] = ()  # glob patterns of the untokened leftovers
    unfinished: str | None = None  # the marker a finished build holds


@dataclass
class _Run:
    pid: int
    token: str
    held: dict[str, int] = field(default_factory=dict)  # root -> this run's token file there, locked
    used: dict[tuple[int, int], int] = field(default_factory=dict)  # IN_USE file (device, inode) -> held shared


_run: _Run | None = None
_entering = threading.Lock()  # the threads of one run enter one root once


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
                for root, fd in _run.held.items():
                    Path(root, TOKEN_FILE.format(_run.token)).unlink(missing_ok=True)
                    os.close(fd)
                for fd in _run.used.values():
                    os.close(fd)
            _run = None
        inuse.release()  # the cache entries it used: a prune may take them now


@contextlib.contextmanager
def alone(root: Path) -> Iterator[bool]:
    """Whether no run but this one is in ``root``; through the block, no run enters it (its lock held, as ``enter``
    takes it): what the block removes there, no run has begun to use."""
    with _looking(root):
        tokens = _runs(root, _this_run().token)
        try:
            yield tokens.alone
        finally:
            tokens.release()


def enter(root: Path, places: Iterable[Place] = ()) -> str:
    """Remove what dead runs left in the ``places`` of ``root`` (see the module's doc), then count this run as in
    the root (made if missing) until it ends; once per run and root, before the run makes anything there. This
    run's token."""
    run = _this_run()
    key = os.path.abspath(root)
    with _entering:
        if key not in run.held:
            root.mkdir(parents=True, exist_ok=True)
            with _looking(root):
                tokens = _runs(root, run.token)
                try:
                    for place in places:
                        if place.directory.is_dir():
                            _sweep(place, tokens)
                finally:
                    tokens.release()
                run.held[key] = _hold(root / TOKEN_FILE.format(run.token))
    return run.token


def prefix(directory: Path, name: str) -> str:
    """The name prefix (``tempfile``'s) of a temporary for ``name`` in ``directory``: with this run's token where the
    directory is in a root the run is in, so that it goes once the run is dead; elsewhere plain (untokened)."""
    run = _this_run()
    with _entering:
        entered = _root_of(run, directory) is not None
    return f".{name}.run-{run.token}." if entered else f".{name}."


def run_dir(parent: Path, stem: str, *, keep: int) -> Path:
    """A new directory in ``parent`` for this run, named from ``stem`` (which sorts as the runs started); of the
    older ones, ``parent`` keeps the newest ``keep``, and the rest go once their run is dead. Outside the roots this
    run is in, ``parent`` is a root of its own."""
    run = _this_run()
    with _entering:
        root = _root_of(run, parent)
    if root is None:
        enter(parent)
        root = parent
    parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(dir=parent, prefix=f"{stem}-run-{run.token}-"))
    with _looking(root):
        tokens = _runs(root, run.token)
        try:
            # This run's own directory is never among the older ones, wherever its name sorts.
            older = sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".") and p != made)
            for old in older[:max(len(older) - (keep - 1), 0)]:
                found = _TOKENED.search(old.name)
                if not tokens.alive(found.group(1), parent) if found else tokens.alone:
                    _remove(old)
        finally:
            tokens.release()
    return made


def use(directory: Path, ready: Callable[[Path], bool]) -> bool:
    """Count this run as using ``directory`` until it ends (a shared lock on its ``IN_USE`` file), when it is
    ``ready``: False, holding nothing, when it has no such file, is being removed or set aside, or is not ready."""
    try:
        fd = os.open(directory / IN_USE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        # Checked after ``ready``: still at its name then, it was there all along (a directory set aside never
        # comes back), so what ``ready`` read is what this lock holds.
        if ready(directory) and _same_file(fd, directory / IN_USE):
            found = os.fstat(fd)
            run = _this_run()
            with _entering:
                if (found.st_dev, found.st_ino) not in run.used:
                    run.used[found.st_dev, found.st_ino] = fd
                    with contextlib.suppress(OSError):  # its last use, as `cache info` and `cache prune` read it
                        os.utime(fd)
                    fd = -1
            return True
    except BlockingIOError:  # being removed
        pass
    finally:
        if fd >= 0:
            os.close(fd)
    return False


@contextlib.contextmanager
def unused(directory: Path):
    """Whether no run uses ``directory`` (``use``); while True, none can start to (its ``IN_USE`` lock is held
    exclusively through the block). One without that file was never finished, so never used."""
    try:
        fd = os.open(directory / IN_USE, os.O_RDONLY)
    except FileNotFoundError:
        yield True
        return
    try:
        yield try_lock(fd)
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = path.stat()
    except OSError:
        return False
    found = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (found.st_dev, found.st_ino)


def set_aside(directory: Path) -> None:
    """Take ``directory`` (with an ``IN_USE`` file once finished) out of its name, and remove it unless a run still
    uses it; then the sweep of a later run removes it, once none does."""
    aside = directory.with_name(f".{directory.name}.aside-{secrets.token_hex(4)}")
    try:
        os.rename(directory, aside)
    except FileNotFoundError:
        return
    _remove_unused(aside)


def _remove_unused(aside: Path) -> None:
    try:
        fd = os.open(aside / IN_USE, os.O_RDONLY)
    except FileNotFoundError:  # never finished, so never used
        _remove(aside)
        return
    except OSError:
        return
    try:
        if try_lock(fd):  # held while it goes: a run that opened it before it was set aside cannot use it
            _remove(aside)
    finally:
        os.close(fd)


def _root_of(run: _Run, directory: Path) -> Path | None:
    """The innermost root this run is in that holds ``directory``; None: none does."""
    path = os.path.abspath(directory)
    inside = [root for root in run.held if os.path.commonpath([root, path]) == root]
    return Path(max(inside, key=len)) if inside else None


@contextlib.contextmanager
def _looking(root: Path):
    """The root's own flock, exclusive: one sweep at a time, and none while a run makes its token file.
    Polled: a thread blocked in flock would not see Ctrl-C."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # A sweep takes moments: a long wait is a run stopped mid-sweep (^Z, a debugger).
        wait(fd, f"{root} (a run sweeping what dead runs left there)", lambda: "", timeout=None)
        yield
    finally:
        os.close(fd)


def _hold(path: Path) -> int:
    """Lock ``path`` for the rest of this run: the descriptor stays open until the run ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh random token: no one else holds it
    return fd


def _free(path: Path) -> int | None:
    """The descriptor of ``path`` locked by this run when no one else holds it (made if missing), else None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if try_lock(fd):
        return fd
    os.close(fd)
    return None


@dataclass
class _Tokens:
    """The runs of one root, as a sweep found them: their tokens, and the token files of the dead ones, which the
    sweep keeps locked (no run can take a dead token back) until ``release``."""

    own: str
    live: set[str]
    dead: dict[str, tuple[Path, int]]

    @property
    def alone(self) -> bool:
        return self.live == {self.own}

    def alive(self, token: str, directory: Path) -> bool:
        """Whether the run of ``token`` is alive. Its token file is in a root it is in that holds ``directory``: in
        it or above it, and locked while the run lives."""
        if token in self.live or token in self.dead:
            return token in self.live
        for above in (directory, *directory.parents):
            try:
                fd = os.open(above / TOKEN_FILE.format(token), os.O_RDWR)
            except OSError:  # none here
                continue
            try:
                if not try_lock(fd):
                    return True
            finally:
                os.close(fd)
        return False

    def release(self) -> None:
        """Dead runs' token files go (what they named goes whether or not their file is there)."""
        for path, fd in self.dead.values():
            path.unlink(missing_ok=True)
            os.close(fd)


def _runs(root: Path, own: str) -> _Tokens:
    found = _Tokens(own, {own}, {})
    for path in root.glob(TOKEN_FILE.format("*")):
        named = _TOKEN_FILE.match(path.name)
        if named is None or named.group(1) == own:
            continue
        fd = _free(path)
        if fd is None:
            found.live.add(named.group(1))
        else:
            found.dead[named.group(1)] = (path, fd)
    return found


def _sweep(place: Place, tokens: _Tokens) -> None:
    for entry in place.directory.iterdir():
        if not entry.name.startswith(".") or _TOKEN_FILE.match(entry.name):
            continue
        if _ASIDE.match(entry.name) and entry.is_dir():
            _remove_unused(entry)
            continue
        found = _TOKENED.search(entry.name)
        if not tokens.alive(found.group(1), place.directory) if found else (
                tokens.alone and any(fnmatch(entry.name, s) for s in place.shapes)):
            _remove(entry)
    if place.unfinished:
        _sweep_unfinished(place.directory, place.unfinished)


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
