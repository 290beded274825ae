"""Verified downloads and safe archive extraction.

A download streams to a temporary file beside its destination and is renamed
into place only after its size and SHA-256 check out, so an interrupted or
tampered transfer never leaves a file that looks complete. One that fails on the
way (no connection, a server error, a cut transfer) is tried again, each wait
twice the last, before it is an error that says how many tries it had.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..core import archives, children, debris, faults, settings
from ..core.errors import HarnessError, integrity
from ..core.files import CHUNK, disk_error, move_atomic

T = TypeVar("T")


class Progress:
    """A one-line progress display on stderr, quiet when stderr is not a terminal."""

    def __init__(self, label: str, total: int | None, stream=sys.stderr):
        self.label, self.total, self.stream = label, total, stream
        self.live = stream.isatty()
        self.done = 0

    def update(self, n: int) -> None:
        self.done += n
        if self.live:
            size = f"{self.done / 1e6:.1f} MB" + (f" / {self.total / 1e6:.1f} MB" if self.total else "")
            self.stream.write(f"\r  {self.label}: {size}")
            self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
        else:
            self.stream.write(f"  {self.label}: {self.done / 1e6:.1f} MB\n")


def _recording(connection_class, opened: list):
    def connect(*args, **kw):
        conn = connection_class(*args, **kw)
        opened.append(conn)
        return conn
    return connect


def _opener(opened: list) -> urllib.request.OpenerDirector:
    """urllib's opener, remembering every HTTP(S) connection it makes (redirects too)."""
    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(_recording(http.client.HTTPConnection, opened), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(_recording(http.client.HTTPSConnection, opened), req, context=self._context)

    return urllib.request.build_opener(Http, Https)


@contextlib.contextmanager
def open_url(url: str | urllib.request.Request, *, timeout: float):
    """``urlopen`` that Ctrl-C or SIGTERM ends at once in any thread.

    The signal reaches only the main thread; a worker blocked on a socket would wait for the
    server or the timeout. The stop handler shuts the sockets down instead, and whatever the
    read then raises is reported as the interruption it is.
    """
    opened: list[http.client.HTTPConnection] = []

    def cancel() -> None:
        for conn in opened:
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    with children.on_stop(cancel):
        try:
            with _opener(opened).open(url, timeout=timeout) as resp:
                yield resp
        except BaseException:
            children.check()
            raise


class Transient(Exception):
    """A failure on the way (no connection, a server error, a cut transfer) that another try may not meet."""

    def __init__(self, error: HarnessError):
        super().__init__(error.what)
        self.error = error


def transient(exc: BaseException) -> bool:
    """Whether a request's failure is the network's or the server's passing trouble, not an answer: a refused or
    reset connection, a timeout, a 5xx, 408 or 429 (a 404 stays a 404)."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code in (408, 429)
    return isinstance(exc, (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, OSError))


def retried(attempt: Callable[[], T], what: str) -> T:
    """``attempt()``, tried again after each ``Transient`` failure: ``PDEVIDENCE_DOWNLOAD_TRIES`` tries in all, the
    waits between them doubling from ``PDEVIDENCE_DOWNLOAD_BACKOFF``; after the last, its error, saying so."""
    tries, wait = settings.get("PDEVIDENCE_DOWNLOAD_TRIES"), settings.get("PDEVIDENCE_DOWNLOAD_BACKOFF")
    for tried in range(1, tries):
        try:
            return attempt()
        except Transient as failed:
            print(f"  {what}: {failed.error.what}; trying again in {wait:g} s (try {tried + 1} of {tries})",
                  file=sys.stderr)
            children.sleep(wait)  # Ctrl-C ends the wait at once
            wait *= 2
    try:
        return attempt()
    except Transient as failed:
        error = failed.error
        raise HarnessError(f"{error.what} (tried {tries} time{'s' if tries > 1 else ''}: PDEVIDENCE_DOWNLOAD_TRIES)",
                           expected=error.expected, todo=error.todo, code=error.code) from None


def download(url: str, dest: Path, *, expected_sha256: str | None = None, timeout: float = 30.0,
             what: str = "download", todo_unreachable: str = "") -> str:
    """Fetch ``url`` to ``dest``, tried again after a failure on the way (``retried``); return its SHA-256.
    Nothing is left at ``dest`` on failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return retried(lambda: _download(url, dest, expected_sha256, timeout, what, todo_unreachable), what)


def _download(url: str, dest: Path, expected_sha256: str | None, timeout: float, what: str,
              todo_unreachable: str) -> str:
    # With this run's token where the run is in the directory (the cache's, from the command line): what a run
    # killed mid-transfer left goes as soon as a run sees it, whoever else is running.
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=debris.prefix(dest.parent, dest.name), suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, open_url(url, timeout=timeout) as resp:
                length = resp.headers.get("Content-Length")
                total = int(length) if length else None
                progress = Progress(what, total)
                for block in iter(lambda: resp.read(CHUNK), b""):
                    children.check()  # SIGINT/SIGTERM: stop now, the temporary file goes below
                    out.write(block)
                    faults.point("download")
                    digest.update(block)
                    progress.update(len(block))
                children.check()  # a stopped transfer ends early: not a truncation
                progress.close()
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError,
                http.client.HTTPException) as exc:
            full = disk_error(exc, dest) if isinstance(exc, OSError) else None
            if full:
                raise full from None
            reason = getattr(exc, "reason", exc)
            error = HarnessError(
                f"cannot fetch {what} from {url}: {reason}",
                expected="a reachable URL serving the file",
                todo=todo_unreachable or "check the network or the URL",
            )
            raise (Transient(error) if transient(exc) else error) from None
        if total is not None and progress.done != total:
            raise Transient(HarnessError(
                f"{what} from {url} is truncated: got {progress.done} of {total} bytes",
                todo="retry; if it persists the server or a proxy is cutting the transfer",
            ))
        actual = digest.hexdigest()
        if expected_sha256 and actual != expected_sha256:
            raise integrity(
                f"SHA-256 mismatch for {what} from {url}; the download was deleted",
                expected=f"{expected_sha256}, got {actual}",
                todo="do not trust this file; if the source legitimately changed, remove its entry "
                "from the lock file and fetch again",
            )
        move_atomic(tmp, dest)
        return actual
    finally:
        if tmp.exists():
            tmp.unlink()


def _unsafe_reason(member: tarfile.TarInfo, root: Path) -> str | None:
    name = member.name
    if name.startswith("/") or Path(name).is_absolute():
        return "absolute path"
    target = (root / name).resolve()
    if not target.is_relative_to(root):
        return "path escapes the tree"
    if member.issym() or member.islnk():
        link = Path(member.linkname)
        base = root if member.islnk() else (root / name).parent
        if link.is_absolute() or not (base / link).resolve().is_relative_to(root):
            return f"link to {member.linkname!r} escapes the tree"
    if member.isdev():
        return "device file"
    return None


def extract_tar(archive: Path, dest: Path, *, strip_top: bool = True) -> None:
    """Extract into a fresh directory ``dest``, refusing any member that could escape it.

    GitHub archives wrap everything in one ``<repo>-<sha>/`` directory;
    ``strip_top`` removes it so the tree's root is ``dest``.
    """
    if dest.exists():
        raise FileExistsError(dest)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=debris.prefix(dest.parent, dest.name), suffix=".extract"))
    try:
        root = staging.resolve()
        try:
            with tarfile.open(archive) as tar:
                members, budget = [], archives.Budget(f"the archive {archive.name}")
                for member in tar:  # counted as read: a hostile member count stops here, not in memory
                    members.append(member)
                    budget.member(member.name)
                    if member.isreg():  # a tar member's size is what extracting it writes
                        budget.extract(member.name, member.size)
                    reason = _unsafe_reason(member, root)
                    if reason:
                        raise integrity(
                            f"refusing to extract {archive.name}: member {member.name!r}: {reason}",
                            todo="the archive is not a plain source tree; do not use it",
                        )
                # "data", not "tar": it also checks link targets against the tree as it is
                # extracted, so a link routed through an earlier in-archive symlink cannot escape.
                tar.extractall(root, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise integrity(f"refusing to extract {archive.name}: {exc}",
                            todo="the archive is not a plain source tree; do not use it") from None
        except (tarfile.TarError, EOFError, OSError, KeyError) as exc:
            raise integrity(f"{archive.name} is not a readable tar archive: {exc}",
                            todo="delete it from the cache and fetch again") from None
        top = [p for p in root.iterdir()]
        source = top[0] if strip_top and len(top) == 1 and top[0].is_dir() else root
        os.replace(source, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
