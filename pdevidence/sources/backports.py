"""The backport corpus: each fix ported by hand into older releases, applied at run time to the pristine tree.

``backports/sglang-<release>.toml`` declares, per experiment, the edits that port its fix
into that release in the release's own idiom (``old`` -> ``new`` in one file of the
unpacked wheel) and which of them a partial port leaves out: none (``partial = []``) where
the fix is one clause and no partial port exists, which ``partial_why`` then says (the
partial tree carries the whole port, which reads ``fixed`` there). Nothing of SGLang is kept
here: a tree is the verified release wheel, unpacked, with the declared edits applied
to a copy (files hard-linked, an edited file rewritten).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from ..core import debris
from ..core.errors import usage
from ..core.files import read_marker, write_atomic, write_marker
from ..registry import RegistryError, _strings, _table, _version
from .importable import compile_bytecode
from .trees import TREE_INFO, Tree
from .version import TreeVersion

DIRECTORY = "backports"
FILE_PREFIX = "sglang-"


class Variant(str, enum.Enum):
    """Which tree of a release: as released, with every fix ported, or with each port left incomplete."""

    PRISTINE = "pristine"
    BACKPORT = "backport"
    PARTIAL = "partial"


@dataclass(frozen=True)
class Edit:
    id: str
    file: str  # relative to the unpacked wheel: "sglang/srt/disaggregation/utils.py"
    old: str  # exactly once in the file when the edit applies
    new: str
    why: str


@dataclass(frozen=True)
class Move:
    backport: str  # a check status: what the other fix reads on the backport tree
    partial: str  # ... and on the partial tree
    why: str

    def status(self, variant: Variant) -> str:
        return self.backport if variant is Variant.BACKPORT else self.partial


@dataclass(frozen=True)
class FixPort:
    """One experiment's fix ported into one release."""

    experiment: str
    edits: tuple[Edit, ...]
    partial: tuple[str, ...]  # the edits the partial port leaves out; () where no partial port exists
    partial_why: str  # what the partial port leaves undone, or (partial = ()) why no partial port exists
    # Another fix's answer this port moves, per tree (the backport's, the partial's), with why: a fix that makes
    # another's bug reachable (a later fix's race exists only once this one is in).
    moves: dict[str, Move]

    @property
    def has_partial(self) -> bool:
        """Does a partial port exist? Not for a fix of one clause: its partial tree carries the whole port."""
        return bool(self.partial)

    def edits_for(self, variant: Variant) -> tuple[Edit, ...]:
        if variant is Variant.PRISTINE:
            return ()
        if variant is Variant.PARTIAL:
            return tuple(e for e in self.edits if e.id not in self.partial)
        return self.edits


@dataclass(frozen=True)
class Backport:
    release: str
    ports: dict[str, FixPort]  # by experiment, in the registry's order
    path: Path

    def edits(self, variant: Variant) -> tuple[Edit, ...]:
        return tuple(edit for port in self.ports.values() for edit in port.edits_for(variant))


def files(root: Path) -> list[Path]:
    return sorted((root / DIRECTORY).glob(f"{FILE_PREFIX}*.toml"))


def load_all(root: Path, experiments: list[str], releases: list[str] | None = None) -> list[Backport]:
    """Every declared backport (or those of ``releases``), validated; an unknown release is a usage error."""
    # Oldest release first, as the sweep lists them (file names sort 0.4.10 before 0.4.5).
    found = sorted((load(path, experiments) for path in files(root)), key=lambda b: Version(b.release))
    if releases:
        known = {b.release for b in found}
        missing = [r for r in releases if r not in known]
        if missing:
            raise usage(f"no backport declared for sglang {', '.join(missing)}",
                        expected=f"one of: {', '.join(sorted(known)) or '(none)'}",
                        todo=f"declare it in {DIRECTORY}/{FILE_PREFIX}<release>.toml")
        found = [b for b in found if b.release in releases]
    return found


def load(path: Path, experiments: list[str]) -> Backport:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return _parse(path, data, experiments)
    except tomllib.TOMLDecodeError as exc:
        raise usage(f"{path} is not valid TOML: {exc}", todo="fix the file") from None
    except RegistryError as exc:
        raise usage(f"{path}: {exc}", todo="fix the backport entry named above") from None


def _parse(path: Path, data: dict, experiments: list[str]) -> Backport:
    _table(data, "backport", required={"release": str}, optional={name: dict for name in experiments})
    release = _version(data["release"], "backport.release")
    if path.name != f"{FILE_PREFIX}{release}.toml":
        raise RegistryError(f"backport.release: {release!r} is not the release the file name says ({path.name})")
    ports = {name: _parse_port(name, data[name]) for name in experiments if name in data}
    if not ports:
        raise RegistryError(f"backport: ports no fix (expected a table named one of: {', '.join(experiments)})")
    return Backport(release, ports, path)


def _parse_port(name: str, table: dict) -> FixPort:
    # partial_why is required: optional here only so that its absence is told as an empty one is, below.
    _table(table, name, required={"edits": list, "partial": list}, optional={"partial_why": str, "moves": dict})
    edits = []
    for i, spec in enumerate(table["edits"]):
        where = f"{name}.edits[{i}]"
        _table(spec, where, required={"id": str, "file": str, "old": str, "new": str, "why": str}, optional={})
        if not spec["old"]:
            raise RegistryError(f"{where}.old: empty (name the lines the edit changes)")
        if spec["old"] == spec["new"]:
            raise RegistryError(f"{where}: old and new are the same")
        if Path(spec["file"]).is_absolute() or ".." in Path(spec["file"]).parts:
            raise RegistryError(f"{where}.file: {spec['file']!r} must be a path inside the unpacked wheel")
        edits.append(Edit(spec["id"], spec["file"], spec["old"], spec["new"], spec["why"]))
    if not edits:
        raise RegistryError(f"{name}.edits: empty: a port is one or more edits")
    ids = [e.id for e in edits]
    if len(set(ids)) != len(ids):
        raise RegistryError(f"{name}.edits: ids repeat: {', '.join(sorted({i for i in ids if ids.count(i) > 1}))}")
    partial = _strings(table["partial"], f"{name}.partial")
    unknown = [p for p in partial if p not in ids]
    if unknown:
        raise RegistryError(f"{name}.partial: {', '.join(unknown)}: it must name the edits the partial port leaves "
                            f"out (one or more of: {', '.join(ids)}), or none (partial = []) where no partial port "
                            "exists")
    why = table.get("partial_why")
    if why is None or not why.strip():
        raise RegistryError(f"{name}.partial_why: {'missing' if why is None else 'empty'}: " + (
            f"it must say what the partial port leaves undone (without {', '.join(partial)})" if partial else
            "partial = [] declares that no partial port exists: it must say why (\"one clause: ...\"); the "
            "partial tree then carries the whole port, expected to read fixed"))
    moves = {}
    for other, spec in table.get("moves", {}).items():
        where = f"{name}.moves.{other}"
        _table(spec, where, required={"backport": str, "partial": str, "why": str}, optional={})
        moves[other] = Move(spec["backport"], spec["partial"], spec["why"])
    return FixPort(name, tuple(edits), partial, why, moves)


class EditDoesNotApply(Exception):
    """A declared edit's ``old`` text is not in the file exactly once: the backport file is wrong for its tree."""


def apply(tree_dir: Path, edits: tuple[Edit, ...]) -> None:
    """Apply ``edits`` in order to the files under ``tree_dir`` (each rewritten, never edited through a link)."""
    for edit in edits:
        target = tree_dir / edit.file
        try:
            text = target.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise EditDoesNotApply(f"edit {edit.id!r}: {edit.file} is not in the tree") from None
        count = text.count(edit.old)
        if count != 1:
            raise EditDoesNotApply(f"edit {edit.id!r}: its old text occurs {count} times in {edit.file} "
                                   "(expected exactly once)")
        write_atomic(target, text.replace(edit.old, edit.new))


def digest(release_tree: Tree, edits: tuple[Edit, ...]) -> str:
    """What a corpus tree is: the verified wheel and the edits applied to it."""
    spec = [[e.file, e.old, e.new] for e in edits]
    return hashlib.sha256(json.dumps([release_tree.digest, spec]).encode()).hexdigest()


def materialize(release_tree: Tree, pristine_dir: Path, variant: Variant, backport: Backport, work: Path,
                python: Path | str) -> Tree:
    """The tree of ``variant``: the unpacked release (pristine), or a copy with the variant's edits applied,
    under ``work/corpus/``, renamed into place once complete."""
    if variant is Variant.PRISTINE:
        return release_tree
    edits = backport.edits(variant)
    key = digest(release_tree, edits)
    dest = work / "corpus" / f"{backport.release}-{variant.value}.{key[:12]}"
    if read_marker(dest / TREE_INFO) is None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=debris.prefix(dest.parent, dest.name), suffix=".tmp"))
        try:
            shutil.copytree(pristine_dir, staging, dirs_exist_ok=True, copy_function=os.link)
            apply(staging, edits)
            compile_bytecode(staging, python)  # the edited modules; the rest came compiled with the links
            write_marker(staging / TREE_INFO, {"release": backport.release, "variant": variant.value, "key": key})
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    told = f"{backport.release}+{variant.value}"
    # A pinned wheel with the project's own edits is as trusted as the wheel: it may run where nothing contains it.
    return Tree("path", f"sglang {told}", key, dest, key, "backport", str(backport.path.name),
                version=TreeVersion(backport.release, variant.value, backport.path.name, told),
                pinned=release_tree.pinned)
