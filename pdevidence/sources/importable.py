"""A tree as a directory that holds ``sglang/``: what the warm engine puts on a child's path.

A wheel is unpacked once per digest (a wheel is a zip laid out as site-packages); a
source tree's ``python/`` directory is used as it is. Nothing is built or installed:
the probes need SGLang's Python code only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from ..core.errors import integrity
from .trees import Tree


def importable_dir(tree: Tree, work: Path) -> Path:
    if tree.install_target.is_dir():
        return tree.install_target
    dest = work / "trees" / f"{tree.label()}.{(tree.digest or 'nodigest')[:12]}"
    if dest.is_dir():  # renamed into place only once complete
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".unpack"))
    try:
        try:
            with zipfile.ZipFile(tree.install_target) as wheel:
                for name in wheel.namelist():
                    target = (staging / name).resolve()
                    if not target.is_relative_to(staging.resolve()):
                        raise integrity(f"refusing to unpack {tree.install_target.name}: member {name!r} escapes",
                                        todo="the wheel is not a plain SGLang wheel; do not use it")
                wheel.extractall(staging)
        except zipfile.BadZipFile as exc:
            raise integrity(f"{tree.install_target.name} is not a readable wheel: {exc}",
                            todo="delete it from the cache and fetch again") from None
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
