"""Which SGLang releases ship PD disaggregation, read from each wheel's own file list.

A release ships it when its wheel holds ``sglang/srt/disaggregation/`` with both of the
doors the fixes touch (``DOORS``: the two queues' modules). The registry's
``pd_first_release`` is the first release that does; a test holds it to the wheels.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from ..core.errors import integrity
from . import trees

DOORS = ("sglang/srt/disaggregation/prefill.py", "sglang/srt/disaggregation/decode.py")


def ships_pd(wheel: Path) -> bool:
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
    except zipfile.BadZipFile as exc:
        raise integrity(f"{wheel.name} is not a readable wheel: {exc}",
                        todo="delete it from the cache and fetch again") from None
    return all(door in names for door in DOORS)


def first_pd_release(versions: list[str], python: str, lock: trees.LockFile) -> str | None:
    """The oldest of ``versions`` whose verified wheel ships PD disaggregation, or None."""
    for version in sorted(versions, key=trees.parse_version):
        if ships_pd(trees.release_tree(version, python, lock).install_target):
            return version
    return None
