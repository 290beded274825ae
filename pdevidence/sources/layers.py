"""Image layers: streamed, stacked by the OCI changeset rules, and parts of the result extracted.

A layer is a tar (gzip-, zstd-, or not compressed) of what changed: read once, front to back,
never unpacked. ``Filesystem`` keeps the names the stacked layers leave (which layer's member
gives each file its content), applying each layer as the OCI image spec's layer section says:
its whiteouts first, whatever their place in the tar (``.wh.<name>`` deletes ``<name>`` from the
layers below, ``.wh..wh..opq`` everything below in its directory), then its entries in order,
each replacing what was at its path (a directory over a directory merges). ``extract`` then
writes chosen subtrees of the result, reading only the layers that hold their files.
"""

from __future__ import annotations

import bz2
import contextlib
import enum
import gzip
import hashlib
import io
import lzma
import os
import posixpath
import shutil
import sys
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..core import archives
from ..core.errors import ENVIRONMENT, HarnessError, integrity
from ..core.files import sha256_file


class Kind(enum.Enum):
    DIR = "dir"
    FILE = "file"
    SYMLINK = "symlink"
    OTHER = "other"  # a device, a FIFO: nothing a Python package holds


WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
CHUNK = 1 << 20
MAX_SYMLINKS = 40  # as Linux allows in one path lookup
ZSTD_EXTRA = "zstd"  # the optional dependency's extra in pyproject.toml

Parts = tuple[str, ...]
Source = tuple[int, int, str]  # a layer, the ordinal of a member in its tar, and the member's path


def parts(name: str, what: str) -> Parts:
    """A member's path as its components, relative to the image root; '..' would climb out of it."""
    found = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in found:
        raise integrity(f"{what}: member {name!r} climbs out of the image root",
                        todo="the image is not one a container runtime would run: do not trust it")
    return found


def _zstd_reader(stream: BinaryIO, what: str):
    try:
        import zstandard
    except ImportError:
        raise HarnessError(f"{what} is zstd-compressed, and Python's standard library cannot read zstd "
                           "(the optional zstandard module is not installed)",
                           expected="zstandard importable where pdevidence runs",
                           todo=f"install it (`pip install 'pdevidence[{ZSTD_EXTRA}]'` or `pip install zstandard`), "
                           "or save the image with gzip layers", code=ENVIRONMENT) from None
    return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True, closefd=False)


def decompressed(stream: io.BufferedReader, what: str) -> BinaryIO:
    """The stream decompressed by what its first bytes say it is (gzip, zstd, bzip2, xz), else as it is."""
    found = archives.compression(stream.peek(archives.HEAD))
    if found == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if found == "zstd":
        return _zstd_reader(stream, what)
    if found == "bzip2":
        return bz2.BZ2File(stream)
    if found == "xz":
        return lzma.LZMAFile(stream)
    return stream


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a damaged stream raises while it is read: tar, the decompressors (zstandard's if loaded), I/O."""
    found: list[type[BaseException]] = [tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError]
    zstd = sys.modules.get("zstandard")
    if zstd is not None:
        found.append(zstd.ZstdError)
    return tuple(found)


@contextlib.contextmanager
def reading(what: str):
    """Any error reading a damaged stream becomes one integrity error naming it."""
    try:
        yield
    except HarnessError:
        raise
    except _read_errors() as exc:
        raise integrity(f"{what} cannot be read: {type(exc).__name__}: {exc}",
                        todo="the archive is truncated or damaged: save the image again") from None


class _Digesting(io.RawIOBase):
    """Passes a stream through, hashing what goes by."""

    def __init__(self, raw: BinaryIO, algorithm: str = "sha256"):
        self.raw = raw
        self.algorithm = algorithm
        self.hash = hashlib.new(algorithm)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        self.hash.update(data)
        return len(data)

    def drain(self) -> str:
        """The digest of the whole stream: what is left is read first."""
        while data := self.raw.read(CHUNK):
            self.hash.update(data)
        return f"{self.algorithm}:{self.hash.hexdigest()}"


def members(raw: BinaryIO, what: str, *, digest: str | None, diff_id: str | None
            ) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The layer's members in order, streamed (read a member's content before the next); once all are
    read, the blob is checked against ``digest`` and its uncompressed tar against ``diff_id``."""
    algorithm = digest.split(":", 1)[0] if digest else "sha256"
    blob = _Digesting(raw, algorithm)
    with reading(what):
        stored = io.BufferedReader(blob, CHUNK)
        data = decompressed(stored, what)
        # An uncompressed layer is its own tar: one hash serves both digests.
        tar_bytes = blob if data is stored and algorithm == "sha256" else _Digesting(data)
        tar = tarfile.open(fileobj=stored if tar_bytes is blob else io.BufferedReader(tar_bytes, CHUNK), mode="r|")
    budget = archives.Budget(what)  # a layer of hostile size is refused while its names are read
    while True:
        with reading(what):
            member = tar.next()
        if member is None:
            break
        budget.member(member.name)
        yield tar, member
    with reading(what):
        found = {"diff_id": tar_bytes.drain(), "digest": blob.drain()}
    for name, expected in (("digest", digest), ("diff_id", diff_id)):
        if expected is not None and found[name] != expected:
            raise integrity(f"{what} does not match its {name}", expected=f"{expected}, read {found[name]}",
                            todo="the archive is damaged or was altered: save the image again")


@dataclass(eq=False, slots=True)  # one per name in the image: hundreds of thousands
class Node:
    kind: Kind
    source: Source | None = None  # a file: the member whose content it has (a hard link's target's)
    link: str | None = None  # a symbolic link: its target; a file whose hard link named no earlier file: that name
    children: dict[str, Node] | None = field(default=None)
    data: bytes | None = None  # a small file the names pass was asked to keep (``Filesystem(keep=...)``)

    def __post_init__(self):
        if self.kind is Kind.DIR and self.children is None:
            self.children = {}


KEEP_BYTES = 64 << 10  # a kept file larger than this is kept without its content


class Filesystem:
    """The names the layers applied so far leave, and where each file's content is; the content of the small
    files ``keep`` names (a .pth, a pyvenv.cfg), read as the layer streams by."""

    def __init__(self, keep: Callable[[Parts], bool] = lambda path: False) -> None:
        self.root = Node(Kind.DIR)
        self.keep = keep

    def apply(self, index: int, layer: Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]], what: str) -> int:
        """Layer ``index`` on top; the number of its entries."""
        whiteouts, entries = [], []
        for ordinal, (tar, member) in enumerate(layer):
            path = parts(member.name, what)
            if not path:
                continue
            if path[-1].startswith(WHITEOUT):
                if path[-1] == OPAQUE:
                    whiteouts.append((path[:-1], None))
                elif not path[-1].startswith(WHITEOUT + WHITEOUT):  # .wh..wh.* other than opaque: aufs' own
                    whiteouts.append((path[:-1], path[-1][len(WHITEOUT):]))
                continue
            data = None
            if member.isreg() and member.size <= KEEP_BYTES and self.keep(path):
                with reading(what), tar.extractfile(member) as fh:
                    data = fh.read()
            entries.append((path, ordinal, member.type, member.linkname, data))
        for directory, name in whiteouts:  # only what the layers below put there
            parent = self.find(directory)
            if parent is not None and parent.kind is Kind.DIR:
                if name is None:
                    parent.children.clear()
                else:
                    parent.children.pop(name, None)
        for path, ordinal, kind, linkname, data in entries:
            self._add((index, ordinal, "/".join(path)), path, kind, linkname, what)
            if data is not None:
                self.find(path).data = data
        return len(whiteouts) + len(entries)

    def _add(self, source: Source, path: Parts, kind: bytes, linkname: str, what: str) -> None:
        parent = self.root
        for name in path[:-1]:  # a parent the tar does not list is a directory all the same
            child = parent.children.get(name)
            if child is None or child.kind is not Kind.DIR:
                child = parent.children[name] = Node(Kind.DIR)
            parent = child
        name, existing = path[-1], parent.children.get(path[-1])
        if kind == tarfile.DIRTYPE:
            if existing is None or existing.kind is not Kind.DIR:
                parent.children[name] = Node(Kind.DIR)
        elif kind == tarfile.LNKTYPE:  # the content of the file at that name now: this layer's, else below
            target = self.find(parts(linkname, what))
            found = target is not None and target.kind is Kind.FILE and target.source is not None
            parent.children[name] = Node(Kind.FILE, target.source if found else None, None if found else linkname)
        elif kind == tarfile.SYMTYPE:
            parent.children[name] = Node(Kind.SYMLINK, link=linkname)
        elif kind in tarfile.REGULAR_TYPES:
            parent.children[name] = Node(Kind.FILE, source)
        else:
            parent.children[name] = Node(Kind.OTHER)

    def find(self, path: Parts, *, follow: bool = False) -> Node | None:
        """The node at ``path``; with ``follow``, symbolic links on the way resolved inside the image."""
        found = self.locate(path, follow=follow)
        return found[1] if found else None

    def locate(self, path: Parts, *, follow: bool = True) -> tuple[Parts, Node] | None:
        """The path ``path`` names once its symbolic links are resolved (with ``follow``), and the node there."""
        node, todo, hops, where = self.root, list(path), 0, []
        while todo:
            name = todo.pop(0)
            if node.kind is not Kind.DIR:
                return None
            child = node.children.get(name)
            if child is None:
                return None
            if follow and child.kind is Kind.SYMLINK:
                hops += 1
                if hops > MAX_SYMLINKS:
                    return None
                base = [] if child.link.startswith("/") else where
                resolved = posixpath.normpath("/" + "/".join([*base, child.link])).strip("/")
                todo = [p for p in resolved.split("/") if p] + todo
                node, where = self.root, []
                continue
            node, where = child, [*where, name]
        return tuple(where), node

    def directories(self, names: tuple[str, ...]) -> list[tuple[Parts, Node]]:
        """Every directory named one of ``names``, in path order (symbolic links not followed)."""
        found, stack = [], [((), self.root)]
        while stack:
            path, node = stack.pop()
            for name, child in node.children.items():
                if child.kind is Kind.DIR:
                    if name in names:
                        found.append(((*path, name), child))
                    stack.append(((*path, name), child))
        return sorted(found, key=lambda item: item[0])


@dataclass
class Plan:
    """What to write: directories, files by the member that holds their content, symbolic links."""
    directories: list[Path] = field(default_factory=list)
    files: dict[int, dict[int, tuple[str, list[Path]]]] = field(default_factory=dict)  # layer: ordinal: (name, dests)
    links: list[tuple[Path, str, Path]] = field(default_factory=list)  # (where, target, the tree it must stay in)

    def add(self, node: Node, dest: Path, image_path: str, root: Path | None = None) -> None:
        """The subtree at ``node`` (``image_path`` in the image), to be written at ``dest``."""
        root = root or dest
        if node.kind is Kind.DIR:
            self.directories.append(dest)
            for name, child in sorted(node.children.items()):
                self.add(child, dest / name, f"{image_path}/{name}", root)
        elif node.kind is Kind.FILE:
            if node.source is None:
                raise integrity(f"{image_path} is a hard link to {node.link}, which no layer holds",
                                todo="the image is damaged: save it again")
            layer, ordinal, member = node.source
            self.files.setdefault(layer, {}).setdefault(ordinal, (member, []))[1].append(dest)
        elif node.kind is Kind.SYMLINK:
            self.links.append((dest, node.link, root))


def extract(plan: Plan, layer: Callable[[int], Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]],
            what: Callable[[int], str], budget: archives.Budget) -> None:
    """Write the plan, reading each layer that holds one of its files up to the last member it needs (the
    names pass read each layer whole and checked its digests); each file's size is taken from ``budget``
    before it is written."""
    for directory in plan.directories:
        directory.mkdir(parents=True, exist_ok=True)
    for index in sorted(plan.files):
        wanted, last = plan.files[index], max(plan.files[index])
        for ordinal, (tar, member) in enumerate(layer(index)):
            if ordinal in wanted:
                name, (first, *others) = wanted[ordinal]
                if not member.isreg() or "/".join(parts(member.name, what(index))) != name:
                    raise integrity(f"{what(index)} changed while it was read: member {ordinal} is no longer {name}",
                                    todo="run again on an archive nothing writes to")
                for dest in (first, *others):
                    budget.extract(f"{name} (layer {index + 1})", member.size)
                with reading(what(index)):
                    with tar.extractfile(member) as source, open(first, "wb") as out:
                        shutil.copyfileobj(source, out, CHUNK)
                mode = 0o755 if member.mode & 0o111 else 0o644
                os.chmod(first, mode)
                for other in others:
                    shutil.copyfile(first, other)
                    os.chmod(other, mode)
            if ordinal == last:
                break
        else:
            raise integrity(f"{what(index)} changed while it was read: it ends before member {last}",
                            todo="run again on an archive nothing writes to")
    for dest, target, root in plan.links:
        inside = (dest.parent / target).resolve() if not target.startswith("/") else None
        if inside is None or not inside.is_relative_to(root.resolve()):
            raise integrity(f"refusing to extract {dest.relative_to(root.parent)}: its symbolic link to {target} "
                            "leaves the package", todo="check that SGLang installation with --python inside the "
                            "container instead")
        os.symlink(target, dest)


def tree_digest(root: Path) -> str:
    """SHA-256 of a directory's names, kinds, executable bits, file contents and link targets."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_dir():
            digest.update(f"D {rel}\n".encode())
        else:
            executable = "x" if path.stat().st_mode & 0o111 else "-"
            digest.update(f"F {rel} {executable} {sha256_file(path)}\n".encode())
    return digest.hexdigest()
