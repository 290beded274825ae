"""A bisection's trees made ahead of the rounds that probe them, in one thread beside the probing.

A round's probing keeps one core busy (the engine's child) and the bisection's own process waiting. Meanwhile
this thread exports and compiles the commits the searches may ask next, whichever side the commits being
probed show (``Search.upcoming``): one of each pair is asked, so the next round finds its tree ready. Each
round says what it needs now and what may come after (``plan``); a commit planned and no longer wanted is
dropped unless its making has begun. Whatever fails while made ahead fails again where the round asks for it
(``tree``), and nowhere else: a commit no round asks for is never an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from ..sources.trees import Tree


class Ahead:
    """Trees made by ``make`` (a commit's SHA -> its tree), in one background thread, in the order planned."""

    def __init__(self, make: Callable[[str], Tree]):
        self._make = make
        self._queue: list[str] = []  # planned, not begun, first made first
        self._made: dict[str, Future] = {}  # begun or planned
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="bisect-ahead", daemon=True)
        self._thread.start()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, kind, value, trace) -> None:
        self.close()

    def plan(self, needed: Iterable[str], maybe: Iterable[str] = ()) -> None:
        """Make ``needed`` first, then ``maybe``; drop every other commit planned and not begun."""
        with self._changed:
            wanted = list(dict.fromkeys([*needed, *maybe]))
            for sha in self._queue:
                if sha not in wanted:
                    self._made.pop(sha).cancel()
            self._queue = [sha for sha in wanted if sha not in self._made or sha in self._queue]
            for sha in self._queue:
                self._made.setdefault(sha, Future())
            self._changed.notify()

    def tree(self, sha: str) -> Tree:
        """The tree of ``sha``, waiting for it (first in line if it was not planned); its making's error, raised."""
        with self._changed:
            if self._closed:
                raise RuntimeError("the trees made ahead were closed")
            made = self._made.setdefault(sha, Future())
            if not (made.running() or made.done()):  # planned or not: made next
                self._queue = [sha, *(queued for queued in self._queue if queued != sha)]
                self._changed.notify()
        return made.result()

    def close(self) -> None:
        """Drop what is planned, and wait for the making that has begun (it leaves no half tree)."""
        with self._changed:
            self._closed = True
            for sha in self._queue:
                self._made.pop(sha).cancel()
            self._queue = []
            self._changed.notify()
        self._thread.join()

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                sha = self._queue.pop(0)
                made = self._made[sha]
                made.set_running_or_notify_cancel()
            try:
                made.set_result(self._make(sha))
            except BaseException as exc:  # kept for the round that asks for it
                made.set_exception(exc)
