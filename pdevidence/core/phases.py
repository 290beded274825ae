"""Where a run's time goes: named phases, added up while a ``recording()`` is open.

A many-target ``check`` spends its time setting up (environments, unpacking trees,
engine starts) or probing; the stages that do each add their share here, and the
command that opened the recording prints the sums. Outside a recording nothing is kept.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

ENVIRONMENTS = "environments"  # closure environments made ready (built, or found built)
TREES = "trees"  # trees fetched, verified, unpacked and compiled
ENGINE_START = "engine start"  # an engine launched, until its first child forks (the closure's import)
PROBING = "probing"  # from an engine's first child forking to its last child's end
ORDER = (ENVIRONMENTS, TREES, ENGINE_START, PROBING)

_open: list[dict[str, float]] = []


@contextlib.contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Sum the phases of everything run inside; the dict is filled as they end."""
    sums: dict[str, float] = {}
    _open.append(sums)
    try:
        yield sums
    finally:
        _open.remove(sums)


def add(name: str, seconds: float) -> None:
    for sums in _open:
        sums[name] = sums.get(name, 0.0) + seconds


@contextlib.contextmanager
def measure(name: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        add(name, time.monotonic() - started)


def describe(sums: dict[str, float], total: float) -> str:
    """One line: each phase's seconds and share of ``total``, the rest as other."""
    parts = [f"{name} {sums[name]:.1f} s" for name in ORDER if name in sums]
    other = total - sum(sums.values())
    if other > 0.05:
        parts.append(f"other {other:.1f} s")
    return f"{total:.1f} s: " + ", ".join(parts)
