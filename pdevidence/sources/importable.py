"""A tree as a directory that holds ``sglang/``: what the warm engine puts on a child's path.

A wheel is unpacked once per digest (a wheel is a zip laid out as site-packages), in the
user's cache where every checkout and the installed tool find it, and compiled to
bytecode before it is renamed into place, by the interpreter the probes run: the probes see the tree read-only and often with ``PYTHONDONTWRITEBYTECODE`` set,
so whatever is not compiled here is compiled again by every probe process. A commit
exported into the cache is compiled where it lies, once. An operator's own source
tree's ``python/`` directory is used as it is and never written to. Nothing is built
or installed: the probes need SGLang's Python code only, and compiling runs none of it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ..core import archives, children, debris, faults, inuse
from ..core.errors import HarnessError, integrity
from ..core.files import read_marker, write_marker
from ..core.locking import exclusive
from ..core.paths import cache_dir
from .trees import Tree

COMPILE_SECONDS = 600
PACKAGE = "sglang"
_DIST_INFO = re.compile(r"sglang-[^-/]+\.dist-info", re.IGNORECASE)
COMPILED = ".pdevidence-bytecode.json"  # in a cached commit's tree: compiled for these interpreters
# A module that does not compile (a template, a file for another Python) is left to fail where it is imported,
# if it ever is: the compiler's verdict on the tree is not ours to give.
_COMPILE = "import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2, workers=0); print('compiled')"


def importable_dir(tree: Tree, python: Path | str) -> Path:
    """Where ``tree``'s ``sglang/`` is, compiled for ``python`` unless it is the operator's own directory."""
    if tree.install_target.is_dir():
        if tree.kind == "git":  # exported into the cache by trees.py: ours to compile
            _compile_in_place(tree.install_target, python)
        return tree.install_target
    dest = cache_dir() / "unpacked" / f"{tree.label()}.{(tree.digest or 'nodigest')[:12]}"
    inuse.use(dest)
    if dest.is_dir():  # renamed into place only once complete
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Two runs unpacking one wheel: the second waits, then uses the first one's tree.
    with exclusive(dest.parent / f".{dest.name}.lock", f"the unpacked tree {dest.name}"):
        if not dest.is_dir():
            for left in dest.parent.glob(f".{dest.name}.*.unpack"):  # a killed run's: no one else unpacks here
                shutil.rmtree(left, ignore_errors=True)
            _unpack(tree, dest, python)
    return dest


def _unpack(tree: Tree, dest: Path, python: Path | str) -> None:
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=debris.prefix(dest.parent, dest.name), suffix=".unpack"))
    try:
        try:
            with zipfile.ZipFile(tree.install_target) as wheel:
                wanted = _loadable(wheel, tree.install_target.name, staging)
                wheel.extractall(staging, members=wanted)
        except zipfile.BadZipFile as exc:
            raise integrity(f"{tree.install_target.name} is not a readable wheel: {exc}",
                            todo="delete it from the cache and fetch again") from None
        compile_bytecode(staging, python)
        faults.point("unpack")
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _loadable(wheel: zipfile.ZipFile, name: str, staging: Path) -> list[zipfile.ZipInfo]:
    """What a probe can load of the wheel: the files of its ``sglang/`` package and its dist-info, each within
    the archive limits (a zip member's size is what extracting it writes) and none escaping ``staging``."""
    budget, wanted = archives.Budget(f"the wheel {name}"), []
    for member in wheel.infolist():
        budget.member(member.filename)
        target = (staging / member.filename).resolve()
        if not target.is_relative_to(staging.resolve()):
            raise integrity(f"refusing to unpack {name}: member {member.filename!r} escapes",
                            todo="the wheel is not a plain SGLang wheel; do not use it")
        top = member.filename.split("/", 1)[0]
        if member.is_dir() or not (top == PACKAGE or _DIST_INFO.fullmatch(top)):
            continue
        budget.extract(member.filename, member.file_size)
        wanted.append(member)
    return wanted


def _compile_in_place(directory: Path, python: Path | str) -> None:
    identity = str(python)
    marker = directory / COMPILED
    done = read_marker(marker, "interpreters")
    if done is not None and identity in done["interpreters"]:
        return
    with exclusive(directory.parent / f".{directory.name}.compile.lock", f"compiling {directory.name}"):
        done = read_marker(marker, "interpreters") or {"interpreters": []}
        if identity not in done["interpreters"]:
            compile_bytecode(directory, python)
            write_marker(marker, {"interpreters": sorted({*done["interpreters"], identity})})


def compile_bytecode(directory: Path, python: Path | str) -> None:
    """Compile every module under ``directory`` with ``python`` (what is current already is skipped).

    Isolated and without site: only the standard library's compiler runs, never a line of the tree."""
    command = [str(python), "-I", "-S", "-c", _COMPILE, str(directory)]
    try:
        done = children.run(command, capture_output=True, text=True, timeout=COMPILE_SECONDS)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"compiling {directory} to bytecode took over {COMPILE_SECONDS} s",
                           todo="the machine may be overloaded; run again") from None
    if done.returncode != 0 or done.stdout.strip() != "compiled":
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        raise HarnessError(f"compiling {directory} to bytecode with {python} failed "
                           f"(exit {done.returncode}):\n{tail}".rstrip(),
                           todo="check that the interpreter runs; delete the directory to unpack it again")
