"""Where a run's time goes: named phases, recorded while a ``recording()`` is open.

A many-target ``check`` spends its time setting up (environments, unpacking trees,
engine starts) or probing; the stages that do each record when they ran here, and the
command that opened the recording prints each phase's wall time. Eras run side by side
(``cells/warm.py``), so phases overlap: a phase's time is the union of its spans (what
a clock on the wall saw), and the shares can add up to more than the whole.
Outside a recording nothing is kept.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

ENVIRONMENTS = "environments"  # closure environments made ready (built, or found built)
TREES = "trees"  # trees fetched, verified, unpacked and compiled
ENGINE_START = "engine start"  # an engine launched, until its first child forks (the closure's import)
PROBING = "probing"  # from an engine's first child forking to its last child's end
ORDER = (ENVIRONMENTS, TREES, ENGINE_START, PROBING)


class Spans(dict[str, list[tuple[float, float]]]):
    """Per phase, its ``(start, end)`` spans on the monotonic clock."""

    def seconds(self, name: str) -> float:
        return _union(self.get(name, []))

    def busy(self) -> float:
        """Wall time in which any phase ran."""
        return _union([span for spans in self.values() for span in spans])


_open: list[Spans] = []
_lock = threading.Lock()  # eras' threads record at once


@contextlib.contextmanager
def recording() -> Iterator[Spans]:
    """Record the phases of everything run inside; filled as they end."""
    spans = Spans()
    _open.append(spans)
    try:
        yield spans
    finally:
        _open.remove(spans)


def add(name: str, start: float, end: float) -> None:
    """A span of ``name``, from ``start`` to ``end`` (``time.monotonic()``)."""
    with _lock:
        for spans in _open:
            spans.setdefault(name, []).append((start, end))


@contextlib.contextmanager
def measure(name: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        add(name, started, time.monotonic())


def describe(spans: Spans, total: float) -> str:
    """One line: each phase's wall seconds, the rest (no phase running) as other."""
    parts = [f"{name} {spans.seconds(name):.1f} s" for name in ORDER if name in spans]
    other = total - spans.busy()
    if other > 0.05:
        parts.append(f"other {other:.1f} s")
    return f"{total:.1f} s: " + ", ".join(parts)


def _union(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
