"""SGLang tree sources: a pinned git commit, a PyPI release, or a directory.

Each source turns a request into a verified, cached ``Tree`` that an
environment can install. Downloads are content-addressed in the cache and
their SHA-256 is recorded in the lock file on first use and checked after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging import tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..core import archives, children, debris, inuse, settings
from ..core.errors import HarnessError, integrity, usage
from ..core.files import hash_into, move_atomic, read_marker, sha256_file, write_atomic, write_marker
from ..core.locking import exclusive
from ..core.paths import cache_dir
from . import fetch
from . import pins as tree_pins
from .pins import TreePins
from .version import TreeVersion
from .version import read as read_version

TREE_INFO = ".pdevidence-tree.json"
KINDS = ("git", "release", "path", "wheel")
DIRTY = "-dirty"
LOCAL = "local"  # a path tree outside git: named by its content
# A path tree's content in its name: as many hex digits as a commit's name has in a label.
SHORT_DIGEST = 12
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Tree:
    kind: str  # git | release | path | wheel
    ref: str  # as asked for
    resolved: str  # full commit SHA or version; a work tree's HEAD and changes, or its content (tree_label)
    install_target: Path  # a wheel, or a source tree's directory holding sglang/ (its python/)
    digest: str | None  # SHA-256 of the archive or wheel, or of a work tree's content; None: a commit from a clone
    source: str  # github | clone | pypi | path | file
    origin: str  # URL, clone path or directory
    repo_root: Path | None = None  # whole checkout, for the upstream test files
    version: TreeVersion | None = None  # a source tree's version, read from its commit; None: not told
    pins: TreePins | None = None  # what a source tree's pyproject.toml pins of torch, transformers, the kernel
    pinned: bool = False  # its digest is pinned in the tracked lock and matched: may run where nothing contains it

    def label(self) -> str:
        return tree_label(self.kind, self.resolved, self.digest)

    def result_tree(self) -> dict[str, str]:
        return {"kind": self.kind, "ref": self.ref, "resolved": self.resolved}

    def receipt(self) -> dict:
        return {**self.result_tree(), "sha256": self.digest, "source": self.source, "origin": self.origin}


def tree_label(kind: str, resolved: str, digest: str | None = None) -> str:
    """How a tree is named in result files and run directories: one name per content.

    ``git-<12 hex>``, ``release-<version>``, ``wheel-<version>-<12 hex of the file>`` (two wheels may
    carry one version), ``path-<12 hex>`` (a clean work tree), ``path-<12 hex>-dirty-<12 hex>`` (HEAD
    and its uncommitted changes) or ``path-local-<12 hex>`` (outside git: its content)."""
    if kind == "release":
        return f"{kind}-{resolved}"
    if kind == "wheel":
        return f"{kind}-{resolved}" + (f"-{digest[:12]}" if digest else "")
    head, sep, state = resolved.partition("-")  # a commit, or "local"; then what it holds past it
    return f"{kind}-{head[:12]}{sep}{state}"


def commit_of(resolved: str) -> str | None:
    """The commit a path tree's ``resolved`` names (its HEAD, changed or not); None outside git."""
    head = resolved.partition("-")[0]
    return None if head == LOCAL else head


LOCK_SCHEMA = "pdevidence-tree-lock/2"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class LockFile:
    """The SHA-256 of every archive and wheel: pinned in the tracked file, else first seen in the cache.

    The tracked ``constraints/trees.lock.json`` pins every wheel file of each release the published
    results were made from (any machine's wheel of a pinned version verifies) and any pinned
    commit's archive. No run writes it (``python -m pdevidence lock-trees`` does): a release or
    commit it does not pin is recorded the first time it is used in ``<cache>/trees.seen.json``
    and checked against that on later runs on this machine.
    """

    def __init__(self, path: Path, seen: Path | None = None):
        self.path = path
        self.seen = seen or cache_dir() / "trees.seen.json"

    @staticmethod
    def _load(path: Path, todo: str) -> dict:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"schema": LOCK_SCHEMA, "git": {}, "release": {}}
        except (OSError, ValueError) as exc:
            raise integrity(f"{path} is not readable: {exc}", todo=todo) from None
        why = _lock_problem(doc)
        if why:
            raise integrity(f"{path} is not a {LOCK_SCHEMA} tree lock: {why}", todo=todo)
        return doc

    def _pins(self) -> dict:
        return self._load(self.path, "restore it from git (`git checkout -- constraints/trees.lock.json`)")

    def _first_seen(self) -> dict:
        return self._load(self.seen, f"delete {self.seen}: what it recorded is recorded again on the next run")

    def pinned(self, section: str, key: str) -> dict | None:
        return self._pins()[section].get(key)

    def first_seen(self, section: str, key: str) -> dict | None:
        return self._first_seen()[section].get(key)

    def pinned_keys(self, project: str) -> list[str]:
        return [key for key in self._pins()["release"] if key.startswith(f"{project}==")]

    def expected(self, section: str, key: str) -> tuple[dict | None, Path]:
        """The entry that binds ``key``, and the file it is in: the tracked pin wins."""
        pinned = self.pinned(section, key)
        return (pinned, self.path) if pinned is not None else (self.first_seen(section, key), self.seen)

    def record_seen(self, section: str, key: str, entry: dict) -> None:
        """Record what was first seen (never in the tracked file); a release's files are merged."""
        with exclusive(cache_dir() / "locks" / "trees.seen.lock", "the user's tree lock"):
            data = self._first_seen()
            if section == "release" and key in data["release"]:
                entry = {"files": {**data["release"][key]["files"], **entry["files"]}}
            data[section][key] = entry
            write_atomic(self.seen, _lock_dumps(data))

    def pin_releases(self, pins: dict[str, dict[str, str]]) -> None:
        """The maintainer's step: ``{"sglang==<version>": {file: sha256}}`` into the tracked file."""
        with exclusive(cache_dir() / "locks" / "trees.pinned.lock", "the tracked tree lock"):
            data = self._pins()
            data["release"].update({key: {"files": dict(files)} for key, files in pins.items()})
            write_atomic(self.path, _lock_dumps(data))


def _lock_dumps(data: dict) -> str:
    return json.dumps({**data, "schema": LOCK_SCHEMA}, indent=2, sort_keys=True) + "\n"


def _lock_problem(doc) -> str | None:
    """What is wrong with a tree lock document, or None."""
    if not isinstance(doc, dict) or doc.get("schema") != LOCK_SCHEMA:
        return f"schema {doc.get('schema') if isinstance(doc, dict) else None!r}"
    if set(doc) != {"schema", "git", "release"}:
        return f"keys {sorted(doc)}, expected git, release and schema"
    for sha, entry in doc["git"].items():
        if not (isinstance(entry, dict) and _HEX64.match(str(entry.get("sha256"))) and isinstance(entry.get("url"), str)):
            return f"git.{sha} must have sha256 (64 hex) and url"
    for key, entry in doc["release"].items():
        files = entry.get("files") if isinstance(entry, dict) else None
        if not (isinstance(files, dict) and files and all(isinstance(f, str) and _HEX64.match(str(h))
                                                          for f, h in files.items())):
            return f"release.{key} must have files: {{wheel file name: sha256 (64 hex)}}"
    return None


def _check_digest(expected: str | None, actual: str, what: str, lock: Path, on_mismatch) -> None:
    if expected is None or expected == actual:
        return
    on_mismatch()
    raise integrity(
        f"SHA-256 of {what} does not match the lock file {lock}",
        expected=f"{expected}, got {actual}",
        todo="the cached copy was removed; run again to refetch. If it still differs, the source "
        "changed under the same name: investigate before updating the lock entry",
    )


def resolve_ref(ref: str, clone: Path | None) -> str:
    """A commit's full 40-hex SHA: as given, or resolved by the clone (``git rev-parse``).

    A branch or tag moves, so a cell keyed on it would be cached forever under a stale name.
    """
    if _FULL_SHA.match(ref.lower()):
        return ref.lower()
    if clone is None:
        raise usage(f"--ref {ref!r} is not a full 40-hex commit SHA and there is no clone to resolve it",
                    todo="pass the full SHA, or set SGLANG_REPO=<clone> so the ref can be resolved")
    _check_clone(clone)
    found = _git(clone, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", text=True)
    if found.returncode != 0:
        raise usage(f"--ref {ref!r} does not name a commit in the clone at {clone}",
                    todo=f"check it with `git -C {clone} rev-parse {ref}`, or `git fetch` first")
    return found.stdout.strip()


def git_tree(sha: str, lock: LockFile, *, clone: Path | None = None, whole: bool = False) -> Tree:
    """The pinned commit, from a local clone if given, else GitHub's archive of it.

    From a clone, only what the probes read (``EXPORTED``) is exported, as ``commit-<sha>``, unless ``whole`` (the
    upstream lane reads the commit's test files): ``git-<sha>``, which a later slim request also reuses. ``sha`` may
    also be a ref the clone resolves (HEAD, a branch, a short SHA)."""
    sha = resolve_ref(sha, clone)
    trees = cache_dir() / "trees"
    dest = trees / f"git-{sha}"
    if not whole:
        slim = trees / f"commit-{sha}"
        inuse.use(slim)
        with exclusive(cache_dir() / "locks" / f"commit-{sha}.lock", f"the cached tree {sha[:12]}"):
            if _tree_info(slim) is not None:
                return _git_tree(sha, slim)
            built = _tree_info(dest)
            if clone is not None and (built is None or built["source"] != "clone"):
                return _slim_tree_from_clone(sha, clone, slim)
    inuse.use(dest)
    with exclusive(cache_dir() / "locks" / f"git-{sha}.lock", f"the cached tree {sha[:12]}"):
        # A tree exported from a clone is that commit (git checks its own object hashes): reuse it
        # even without the clone, and say where it came from. GitHub trees re-check their archive.
        built = _tree_info(dest)
        if built is not None and built["source"] == "clone":
            return _git_tree(sha, dest)
        if clone is not None:
            return _git_tree_from_clone(sha, clone, dest, lock)
        return _git_tree_from_github(sha, dest, lock)


def _git_tree_from_github(sha: str, dest: Path, lock: LockFile) -> Tree:
    url = settings.get("PDEVIDENCE_GIT_ARCHIVE_URL").format(sha=sha)
    entry, lock_path = lock.expected("git", sha)
    archive = cache_dir() / "archives" / f"{entry['sha256']}.tar.gz" if entry else None
    if archive is not None:
        inuse.use(archive)
    if archive is None or not archive.exists():
        tmp = _incoming(cache_dir() / "archives", f"{sha}.tar.gz")
        digest = fetch.download(
            url, tmp, expected_sha256=entry["sha256"] if entry else None, what=f"sglang@{sha[:12]}",
            todo_unreachable="GitHub is not reachable from here. Point SGLANG_REPO at a local clone "
            "that has this commit, or run the release-backed cells instead (`nox -s matrix`, "
            "`nox -s \"release(<experiment>, <side>)\"`)",
        )
        archive = cache_dir() / "archives" / f"{digest}.tar.gz"
        inuse.use(archive)
        move_atomic(tmp, archive)
    digest = sha256_file(archive)
    _check_digest(entry and entry["sha256"], digest, f"the archive of {sha[:12]}", lock_path, archive.unlink)
    info = {"source": "github", "origin": url, "sha256": digest}
    try:
        _materialize(dest, info, lambda target: fetch.extract_tar(archive, target))
    except HarnessError:
        archive.unlink(missing_ok=True)
        raise
    # Recorded only once it extracted: a truncated first download must not become the reference.
    if entry is None:
        lock.record_seen("git", sha, {"sha256": digest, "url": url})
    return dataclasses.replace(_git_tree(sha, dest), pinned=entry is not None and lock_path == lock.path)


def _git(clone: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """A git command whose exit code is an answer the caller reads (``rev-parse --verify``: is it there?)."""
    return children.run(["git", "-C", str(clone), *args], capture_output=True, **kw)


def _git_output(clone: Path, *args: str, **kw) -> str | bytes:
    """What a git command that must succeed prints; its failure is an error naming the command and git's words."""
    done = _git(clone, *args, **kw)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else done.stderr
        raise HarnessError(f"`git -C {clone} {' '.join(args)}` failed (exit {done.returncode}): "
                           f"{(said or '').strip() or 'git said nothing'}",
                           expected="a readable git checkout",
                           todo=f"run that command yourself in {clone} to see what is wrong (a damaged "
                           "repository, a lock file git left behind, permissions), fix it, then run again")
    return done.stdout


def _present(clone: Path, sha: str) -> None:
    _check_clone(clone)
    found = _git(clone, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}", text=True)
    if found.returncode != 0:
        raise HarnessError(
            f"commit {sha} is not in the clone at {clone}",
            expected="the pinned commit to be present in SGLANG_REPO",
            todo=f"run `git -C {clone} fetch origin {sha}` (or a full `git fetch`), then retry",
        )


def _check_clone(clone: Path) -> None:
    if not (clone / ".git").exists() and _git(clone, "rev-parse", "--git-dir").returncode != 0:
        raise usage(f"SGLANG_REPO={clone} is not a git checkout",
                    todo="point SGLANG_REPO at a clone of sgl-project/sglang")


def _git_tree_from_clone(sha: str, clone: Path, dest: Path, lock: LockFile) -> Tree:
    _present(clone, sha)
    tree_id = _git_output(clone, "rev-parse", f"{sha}^{{tree}}", text=True).strip()
    info = {"source": "clone", "origin": str(clone), "sha256": None, "git_tree": tree_id}

    def export(target: Path) -> None:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=debris.prefix(target.parent, target.name),
                                         suffix=".export") as tmp:  # a killed run's goes (core/debris)
            tar = Path(tmp) / "tree.tar"
            with open(tar, "wb") as out:
                done = children.run(["git", "-C", str(clone), "archive", "--format=tar", sha],
                                    stdout=out, stderr=subprocess.PIPE)
            if done.returncode != 0:
                raise HarnessError(f"git archive of {sha} failed: {done.stderr.decode(errors='replace')}")
            fetch.extract_tar(tar, target, strip_top=False)

    _materialize(dest, info, export)
    return _git_tree(sha, dest)


# What the probes read of a commit: the package they import (its version files within it) and the pyproject its era
# is chosen by (pins, a static version); its tags are read in the clone. The rest of a checkout (kernel sources,
# tests, docs) is half its size and never read.
EXPORTED = ("python/sglang", "python/pyproject.toml")
MANIFEST = ".pdevidence-files.json"  # in a slim export: {path: [mode, blob id]}, what later exports link from
DONORS = 8  # how many of the most recently used slim exports a new one looks in for its unchanged files
_SYMLINK, _EXECUTABLE = "120000", "100755"
_BYTECODE = re.compile(r"(?P<stem>[^.]+)\.[^.]+(\.opt-[12])?\.pyc")  # what compileall names for module <stem>.py


def _slim_tree_from_clone(sha: str, clone: Path, dest: Path) -> Tree:
    """The commit's ``EXPORTED`` files, each unchanged one hard-linked with its bytecode from an earlier export.

    A bisection's commits are neighbours: nearly every file is one an earlier export of the clone already holds,
    compiled. Its bytecode stays valid through the link (the same file, so the same time and size it records), so
    only the modules written are compiled (``_compile_as_donors``)."""
    _present(clone, sha)
    listed = _listing(clone, sha)
    tree_id = _git_output(clone, "rev-parse", f"{sha}^{{tree}}", text=True).strip()
    info = {"source": "clone", "origin": str(clone), "sha256": None, "git_tree": tree_id, "exported": list(EXPORTED)}
    _materialize(dest, info, lambda target: _export(clone, sha, listed, target))
    return _git_tree(sha, dest)


def _listing(clone: Path, sha: str) -> dict[str, list[str]]:
    """Each file of ``EXPORTED`` at ``sha``: its mode and blob id (a submodule is no file of it)."""
    out = _git_output(clone, "ls-tree", "-r", "-z", "--full-tree", sha, "--", *EXPORTED)
    listed = {}
    for record in filter(None, out.split(b"\0")):
        meta, _, name = record.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        path = os.fsdecode(name)
        if any(part in ("", ".", "..", ".git") for part in path.split("/")):
            raise integrity(f"commit {sha[:12]} names a file {path!r} that would land outside its export",
                            todo="the clone's history is not a plain SGLang history; do not use it")
        if kind == "blob":
            listed[path] = [mode, oid]
    return listed


def _export(clone: Path, sha: str, listed: dict[str, list[str]], target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=debris.prefix(target.parent, target.name),
                                     suffix=".export") as tmp:  # a killed run's goes (core/debris)
        staging = Path(tmp) / "tree"
        staging.mkdir()
        budget = archives.Budget(f"the export of {sha[:12]}")
        for path in listed:
            budget.member(path)
        linking = _Linking(staging)
        exports = _donors(target.parent, target)
        missing = linking.link_all(listed, exports)
        if not exports or len(missing) > FAR:  # no export, or far from each: the releases' packages may hold them
            missing = linking.link_all(missing, _release_donors(_blob_hash(listed)))
        _write(clone, sha, missing, staging, budget)
        _compile_as_donors(staging, [path for path in missing if path.endswith(".py")], linking.used)
        write_marker(staging / MANIFEST, listed)
        os.replace(staging, target)


@dataclass(frozen=True, eq=False)  # each donor is itself: an export's donors are told apart by identity
class _Donor:
    """A tree an export links its unchanged files from: ``files`` maps an export's path to its [mode, blob id]
    (``get``), each file lying at ``root`` / that path less ``strip``; ``compiled_for``: the interpreters its
    bytecode is known to be current for."""
    root: Path
    files: dict[str, list[str]] | _PackageFiles
    compiled_for: frozenset[str] = frozenset()
    strip: str = ""

    def source(self, path: str) -> str:
        return os.path.join(self.root, path[len(self.strip):])


def _donors(trees: Path, dest: Path) -> list[_Donor]:
    """The most recently used complete slim exports with their files, held (core/inuse) so no prune takes them
    while this run links from them."""
    from .importable import COMPILED  # importable reads trees: imported when used

    found = sorted((p for p in trees.glob("commit-*") if p != dest), key=lambda p: inuse.last_used(p) or 0,
                   reverse=True)
    donors = []
    for path in found[:DONORS]:
        inuse.use(path)
        files = read_marker(path / MANIFEST) if _tree_info(path) is not None else None
        if files is not None:
            marked = read_marker(path / "python" / COMPILED, "interpreters")
            donors.append(_Donor(path, files, frozenset(marked["interpreters"] if marked else ())))
    return donors


RELEASE_DONORS = 4  # how many releases' packages an export looks in for what the exports do not hold
FAR = 100  # files no export holds, past which an export looks in the releases' packages too (a neighbour: a few)


class _PackageFiles:
    """A release's ``sglang/`` package as an export of ``python/sglang`` lists its files, each read and hashed
    the first time an export asks for it (an export asks for a few thousand; the package holds more)."""

    PREFIX = EXPORTED[0] + "/"  # python/sglang/: the package's files as an export names them

    def __init__(self, package: Path, blob_hash: str):
        self.package, self.blob_hash = str(package), blob_hash
        self._known: dict[str, list[str] | None] = {}

    def get(self, path: str) -> list[str] | None:
        """The file's [mode, blob id]; None where the package holds no such file."""
        if path not in self._known:
            self._known[path] = self._read(path) if path.startswith(self.PREFIX) else None
        return self._known[path]

    def _read(self, path: str) -> list[str] | None:
        where = os.path.join(self.package, path[len(self.PREFIX):])
        try:
            found = os.lstat(where)
            if not stat.S_ISREG(found.st_mode):
                return None
            with open(where, "rb") as stream:
                body = stream.read()
        except OSError:
            return None
        blob = hashlib.new(self.blob_hash, b"blob %d\0" % len(body))
        blob.update(body)
        return [_EXECUTABLE if found.st_mode & 0o100 else "100644", blob.hexdigest()]


_RELEASE_FILES: dict[tuple[str, int, str], _PackageFiles] = {}  # (package, its mtime, blob hash): read once a process


def _release_donors(blob_hash: str) -> list[_Donor]:
    """The ``sglang/`` packages of the releases this cache holds, unpacked for the warm engine or installed in a
    release's cell environment, the most recently used first, held while linked from. Each was compiled when it
    was made, and a commit near a release shares most of its files: the first export into an empty trees cache,
    and one far from every export before it (a bisection's first steps), need not write and compile them all.
    For which interpreter their bytecode is current is not recorded: an export linking from one is compiled
    whole on its first use (what is current is skipped)."""
    cache = cache_dir()
    packages = [*cache.glob("unpacked/release-*/sglang"),
                *cache.glob("envs/tree.release-*/lib/python*/site-packages/sglang")]
    entries = {package: cache / Path(*package.relative_to(cache).parts[:2]) for package in packages}
    donors = []
    for package in sorted(packages, key=lambda p: inuse.last_used(entries[p]) or 0, reverse=True)[:RELEASE_DONORS]:
        inuse.use(entries[package])
        with contextlib.suppress(OSError):  # gone with a prune: not a donor
            key = (str(package), package.stat().st_mtime_ns, blob_hash)
            files = _RELEASE_FILES.setdefault(key, _PackageFiles(package, blob_hash))
            donors.append(_Donor(package.parent, files, strip=os.path.dirname(EXPORTED[0]) + "/"))
    return donors


def _blob_hash(listed: dict[str, list[str]]) -> str:
    """The hash the clone names its blobs by: SHA-1, or SHA-256 in a repository of that object format."""
    return "sha256" if any(len(oid) == 64 for _, oid in listed.values()) else "sha1"


class _Linking:
    """Files hard-linked into an export from its donors, with their bytecode: an export links thousands, so paths
    stay strings, each directory is made once and each ``__pycache__`` is read once."""

    def __init__(self, staging: Path):
        self.staging = str(staging)
        self.used: set[_Donor] = set()  # the donors linked from
        self._made: set[str] = set()
        self._bytecode: dict[str, dict[str, list[str]]] = {}  # a donor's __pycache__ -> module stem -> its files

    def link_all(self, files: dict[str, list[str]], donors: list[_Donor]) -> dict[str, list[str]]:
        """Link each of ``files`` (path -> [mode, blob id]) from the first donor holding it; those none holds."""
        missing = {}
        for path, entry in files.items():
            donor = None if entry[0] == _SYMLINK else self.link(path, entry, donors)
            if donor is None:
                missing[path] = entry
            else:
                self.used.add(donor)
        return missing

    def link(self, path: str, entry: list[str], donors: list[_Donor]) -> _Donor | None:
        """The donor ``path`` was linked from, with its bytecode (one holding the same blob there); None: none."""
        for donor in donors:
            if donor.files.get(path) != entry:
                continue
            source, dest = donor.source(path), os.path.join(self.staging, path)
            self._directory(os.path.dirname(dest))
            try:
                os.link(source, dest)
            except OSError:  # gone with its donor, or another file system: written from the clone instead
                continue
            if path.endswith(".py"):
                folder, name = os.path.split(source)
                cache = os.path.join(folder, "__pycache__")
                compiled = self._bytecode.get(cache)
                if compiled is None:
                    compiled = self._bytecode[cache] = _bytecode_by_module(cache)
                if name[:-3] in compiled:
                    into = os.path.join(os.path.dirname(dest), "__pycache__")
                    self._directory(into)
                    for pyc in compiled[name[:-3]]:
                        with contextlib.suppress(OSError):  # compiled again where it is missing
                            os.link(os.path.join(cache, pyc), os.path.join(into, pyc))
            return donor
        return None

    def _directory(self, path: str) -> None:
        if path not in self._made:
            os.makedirs(path, exist_ok=True)
            self._made.add(path)


def _bytecode_by_module(cache: str) -> dict[str, list[str]]:
    """The bytecode files in a ``__pycache__`` directory, by the module they compile (none where it is missing)."""
    try:
        names = os.listdir(cache)
    except OSError:
        return {}
    found: dict[str, list[str]] = {}
    for name in names:
        if matched := _BYTECODE.fullmatch(name):
            found.setdefault(matched["stem"], []).append(name)
    return found


# Each module named compiled as ``compileall.compile_dir`` compiles each module it finds (importable.py).
_COMPILE_FILES = ("import compileall, sys; [compileall.compile_file(f, quiet=2) for f in sys.argv[1:]]; "
                  "print('compiled')")


def _compile_as_donors(staging: Path, written: list[str], used: set[_Donor]) -> None:
    """Compile the modules an export wrote for every interpreter all its donors were compiled for, and mark it
    compiled for them (``importable.COMPILED``): every other module came linked with that bytecode, so compiling
    the whole tree again, as the warm engine's first use of it would, has nothing left to do. Where its donors
    share no interpreter (or it had none), nothing: that first use compiles what is not current."""
    from .importable import COMPILE_SECONDS, COMPILED

    shared = frozenset.intersection(*(donor.compiled_for for donor in used)) if used else frozenset()
    interpreters = sorted(python for python in shared if Path(python).is_file())
    for python in interpreters if written else ():
        try:
            done = children.run([python, "-I", "-S", "-c", _COMPILE_FILES, *(str(staging / p) for p in written)],
                                capture_output=True, text=True, timeout=COMPILE_SECONDS)
        except subprocess.TimeoutExpired:
            return
        if done.returncode != 0 or done.stdout.strip() != "compiled":  # left to the whole tree's compile
            return
    if interpreters:
        write_marker(staging / "python" / COMPILED, {"interpreters": interpreters})


def _write(clone: Path, sha: str, files: dict[str, list[str]], staging: Path, budget: archives.Budget) -> None:
    """The files no donor holds, from the clone's objects; symbolic links last, each checked to stay inside."""
    if not files:
        return
    out = _git_output(clone, "cat-file", "--batch", input="".join(f"{oid}\n" for _, oid in files.values()).encode())
    pos, links = 0, []
    for path, (mode, oid) in files.items():
        end = out.find(b"\n", pos)
        header = out[pos:end].decode(errors="replace").split()
        if len(header) != 3 or header[0] != oid or header[1] != "blob" or not header[2].isdigit():
            raise HarnessError(f"`git -C {clone} cat-file --batch` did not give the blob {oid} of {path} at "
                               f"{sha[:12]}: it said {' '.join(header) or 'nothing'}",
                               todo=f"check the clone with `git -C {clone} fsck`, then run again")
        size = int(header[2])
        body, pos = out[end + 1:end + 1 + size], end + 2 + size
        if mode == _SYMLINK:
            links.append((path, os.fsdecode(body)))
            continue
        budget.extract(path, size)
        dest = staging / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(body)
        if mode == _EXECUTABLE:
            dest.chmod(0o755)
    for path, points_to in links:
        where = staging / path
        if os.path.isabs(points_to) or not (where.parent / points_to).resolve().is_relative_to(staging.resolve()):
            raise integrity(f"commit {sha[:12]} has a link {path} -> {points_to} leading out of its tree",
                            todo="the clone's history is not a plain SGLang history; do not use it")
        where.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(points_to, where)


def _tree_info(dest: Path) -> dict | None:
    """A built tree's provenance; None when it is missing or truncated: the tree is rebuilt."""
    return read_marker(dest / TREE_INFO, "source", "origin")


def _materialize(dest: Path, info: dict, build) -> None:
    """Build ``dest`` once; it appears only complete, with its provenance inside."""
    if _tree_info(dest) is not None:
        return
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    build(dest)
    write_marker(dest / TREE_INFO, info)


def package_dir(root: Path) -> Path | None:
    """The directory of a source tree that holds ``sglang/``: its ``python/`` (SGLang's layout), or
    the root itself; None when neither does."""
    for candidate in (root / "python", root):
        if (candidate / "sglang").is_dir():
            return candidate
    return None


def _git_tree(sha: str, dest: Path) -> Tree:
    """The cached tree, described by the provenance stored when it was built (clone or GitHub)."""
    info = _tree_info(dest)
    python_dir = package_dir(dest)
    if python_dir is None:
        raise HarnessError(f"the tree of {sha[:12]} has no python/sglang/ package directory",
                           expected="an sgl-project/sglang checkout or a fork of it (python/sglang/)")
    # The commit's tags are in the clone it was exported from; GitHub's archive has none.
    clone = Path(info["origin"]) if info["source"] == "clone" else None
    version = read_version(python_dir, dest, repo=clone, rev=sha)
    return Tree("git", sha, sha, python_dir, info.get("sha256"), info["source"], info["origin"], dest, version,
                tree_pins.read(python_dir, dest))


def supported_tags(python: str) -> list[tags.Tag]:
    """The wheel tags a CPython ``python`` (e.g. ``3.12``) on this machine accepts, best first.

    The cell's interpreter may lack ``packaging``, so the tags are computed here for its
    version, with this machine's platforms (OS, libc and architecture): the cell runs here.
    """
    version = Version(python).release[:2]
    interpreter = f"cp{version[0]}{version[1]}"
    platforms = list(tags.platform_tags())
    return [*tags.cpython_tags(version, abis=[interpreter], platforms=platforms),
            *tags.compatible_tags(version, interpreter, platforms)]


def wheel_fits(filename: str, project: str, supported: list[tags.Tag]) -> Version | None:
    """The version of ``project``'s wheel ``filename`` if it installs on ``supported``, else None."""
    try:
        name, version, _build, wheel_tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    if name != canonicalize_name(project) or wheel_tags.isdisjoint(supported):
        return None
    return version


def index_files(project: str, index_url: str | None = None) -> list[dict]:
    """Files of a project from a PEP 691 JSON simple index."""
    index_url = index_url or settings.get("PDEVIDENCE_INDEX_URL")
    req = urllib.request.Request(f"{index_url.rstrip('/')}/{project}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})

    def ask() -> list[dict]:
        try:
            with fetch.open_url(req, timeout=30) as resp:
                # PEP 691 lets a file's url be relative to the project page.
                return [{**f, "url": urllib.parse.urljoin(resp.geturl(), f["url"])}
                        for f in json.load(resp)["files"]]
        except (urllib.error.URLError, OSError, ValueError, KeyError, http.client.HTTPException) as exc:
            error = HarnessError(f"cannot read the package index {index_url} for {project}: {exc}",
                                 todo="check that the index is reachable (PDEVIDENCE_INDEX_URL overrides it)")
            raise (fetch.Transient(error) if fetch.transient(exc) else error) from None

    return fetch.retried(ask, f"the package index for {project}")


def parse_version(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        raise usage(f"{version!r} is not a version", expected="a release version such as 0.5.21") from None


def pick_wheel(files: list[dict], project: str, version: str, python: str) -> dict:
    """The index file of ``project==version`` that installs here: the most specific tag wins."""
    supported = supported_tags(python)
    rank = {tag: i for i, tag in reversed(list(enumerate(supported)))}
    wanted = Version(version)
    candidates = []
    for f in files:
        if f.get("yanked") or not f["filename"].endswith(".whl"):
            continue
        if wheel_fits(f["filename"], project, supported) == wanted:
            best = min(rank[t] for t in parse_wheel_filename(f["filename"])[3] if t in rank)
            candidates.append((best, f["filename"], f))
    if not candidates:
        raise usage(f"no {project}=={version} wheel for {supported[0]} (or a compatible tag) in the index",
                    expected="a released version with a wheel for this Python and platform",
                    todo="check the version (`pip index versions sglang`) or the registry's python")
    return min(candidates, key=lambda c: c[:2])[2]


def _incoming(directory: Path, name: str) -> Path:
    """Where a download waits for its digest, which names its entry: hidden, as no entry of the cache is (a prune
    beside the run must not take it), and with this run's token (what a killed run left goes once it is dead)."""
    return directory / f"{debris.prefix(directory, name)}incoming"


def release_tree(version: str, python: str, lock: LockFile, project: str = "sglang") -> Tree:
    """The release's wheel for this machine, checked against the lock: a pinned version's files
    are all listed in the tracked file; another version's hash is recorded the first time."""
    key = f"{project}=={version}"
    # Read, download and record under one per-release lock: two runs must not both find no
    # entry, both download, and race on recording it.
    with exclusive(cache_dir() / "locks" / f"{key}.lock", f"the wheel of {key}"):
        entry, lock_path = lock.expected("release", key)
        known = entry["files"] if entry else {}
        wheel = _cached_wheel(known, project, version, python)
        if wheel is None:
            chosen = pick_wheel(index_files(project), project, version, python)
            name, published = chosen["filename"], chosen.get("hashes", {}).get("sha256")
            if lock_path == lock.path and name not in known:
                raise integrity(f"{name} is not among the files the lock file pins for {key}",
                                expected=f"one of: {', '.join(sorted(known))} ({lock.path})",
                                todo="the index has a file the pinned release did not have: investigate "
                                "before pinning it (`python -m pdevidence lock-trees " + version + "`)")
            if name in known and published and published != known[name]:
                raise integrity(f"the index now publishes another SHA-256 for {name}",
                                expected=f"{known[name]} (lock file {lock_path}), index says {published}",
                                todo="do not use it; investigate before updating the lock entry")
            tmp = _incoming(cache_dir() / "wheels", name)
            digest = fetch.download(chosen["url"], tmp, expected_sha256=known.get(name) or published, what=name)
            wheel = cache_dir() / "wheels" / digest / name
            inuse.use(wheel.parent)
            wheel.parent.mkdir(parents=True, exist_ok=True)
            move_atomic(tmp, wheel)
            if name not in known:
                lock.record_seen("release", key, {"files": {name: digest}})
                known = {**known, name: digest}
        digest = sha256_file(wheel)
        _check_digest(known[wheel.name], digest, wheel.name, lock_path, wheel.unlink)
    return Tree("release", version, version, wheel, digest, "pypi", wheel.name, pinned=lock_path == lock.path)


def _cached_wheel(known: dict[str, str], project: str, version: str, python: str) -> Path | None:
    """The cached copy of the best known file of the release for this machine, if there is one."""
    try:
        best = pick_wheel([{"filename": name} for name in known], project, version, python)
    except HarnessError:  # none known fits here: ask the index
        return None
    wheel = cache_dir() / "wheels" / known[best["filename"]] / best["filename"]
    inuse.use(wheel.parent)
    return wheel if wheel.exists() else None


def pinned_release_files(files: list[dict], project: str, version: str) -> dict[str, str]:
    """Every wheel file of ``project==version`` in the index, with its published SHA-256."""
    wanted = Version(version)
    found = {}
    for f in files:
        try:
            name, found_version, _build, _tags = parse_wheel_filename(f["filename"])
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if name == canonicalize_name(project) and found_version == wanted and not f.get("yanked"):
            sha = f.get("hashes", {}).get("sha256")
            if not sha:
                raise integrity(f"the index publishes no SHA-256 for {f['filename']}",
                                todo="pin from an index that publishes hashes (PEP 691)")
            found[f["filename"]] = sha
    if not found:
        raise usage(f"no {project}=={version} wheel in the index", todo="check the version")
    return found


def path_tree(directory: Path) -> Tree:
    """A work tree as it is now, named and keyed by what it holds (``_path_state``)."""
    directory = directory.resolve()
    python_dir = package_dir(directory)
    if python_dir is None:
        raise usage(f"{directory} is not an SGLang source tree: it holds no sglang/ package",
                    expected="a checkout root whose python/ holds sglang/, or a directory holding sglang/",
                    todo="pass the directory of your SGLang work tree")
    resolved, digest = _path_state(directory, python_dir)
    commit = commit_of(resolved)
    version = read_version(python_dir, directory, repo=None if commit is None else directory, rev="HEAD")
    return Tree("path", directory.name, resolved, python_dir, digest, "path", str(directory),
                directory if python_dir != directory else None, version, tree_pins.read(python_dir, directory))


def _path_state(directory: Path, python_dir: Path) -> tuple[str, str]:
    """``(resolved, content digest)``: ``<HEAD>``, ``<HEAD>-dirty-<12 hex>`` or, outside git, ``local-<12 hex>``.

    In git the digest covers HEAD, ``git diff HEAD`` and every untracked file's name and content,
    so two different edits on one HEAD never share a name or a cached result. Outside git it is
    ``content_digest`` of the package directory: everything the probes can load from the tree.
    """
    head = _git(directory, "rev-parse", "HEAD", text=True)
    if head.returncode != 0:
        digest = content_digest(python_dir)
        return f"{LOCAL}-{digest[:SHORT_DIGEST]}", digest
    sha = head.stdout.strip()
    digest = hashlib.sha256(sha.encode())
    # A failed diff or listing would make a changed tree look clean: a wrong name, a stale cached result.
    diff = _git_output(directory, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff")
    digest.update(diff)
    untracked = _git_output(directory, "ls-files", "--others", "--exclude-standard", "-z").split(b"\0")
    for name in sorted(n for n in untracked if n):  # relative to ``directory``, as git -C lists them
        digest.update(b"\0" + name + b"\0")
        path = directory / os.fsdecode(name)
        if path.is_file() and not path.is_symlink():
            hash_into(digest, path)
    dirty = bool(diff) or any(untracked)
    found = digest.hexdigest()
    return sha + (f"{DIRTY}-{found[:SHORT_DIGEST]}" if dirty else ""), found


def content_digest(directory: Path) -> str:
    """SHA-256 over every file under ``directory``: its path (relative, ``/``-separated) and its bytes.

    Bytecode caches are left out (Python rebuilds them from the sources). A symbolic link is
    followed, as an import follows it; a directory reached twice (a link loop) is read once.
    """
    digest = hashlib.sha256()
    seen: set[Path] = set()
    for here, dirs, names in os.walk(directory, followlinks=True):
        real = Path(here).resolve()
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if not n.endswith((".pyc", ".pyo"))):
            path = Path(here) / name
            if not path.is_file():  # a dangling link, a socket: nothing an import reads
                continue
            digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
            digest.update(bytes.fromhex(sha256_file(path)))
    return digest.hexdigest()


def wheel_tree(wheel: Path, python: str, project: str = "sglang") -> Tree:
    """A wheel file you have (a backport, a fork's build): checked to be ``project`` for this Python."""
    wheel = wheel.resolve()
    if not wheel.is_file():
        raise usage(f"no wheel at {wheel}", todo="pass the path of a .whl file")
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise usage(f"{wheel.name} is not a wheel file name: {exc}",
                    expected=f"{project}-<version>-<tags>.whl") from None
    if name != canonicalize_name(project):
        raise usage(f"{wheel.name} is a wheel of {name}, not {project}")
    if wheel_fits(wheel.name, project, supported_tags(python)) is None:
        raise usage(f"{wheel.name} does not install on Python {python} on this machine",
                    expected=f"a wheel for CPython {python} ({platform.machine()})",
                    todo="check it in an environment that runs it instead: `check --python <its interpreter>`")
    return Tree("wheel", wheel.name, str(version), wheel, sha256_file(wheel), "file", str(wheel))
