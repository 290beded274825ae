"""The search itself, over "probe this commit -> which side": no git, no probe, unit-testable alone.

A boundary is where a line of commits (oldest first) passes from one behaviour to another: the fix, from
pre-fix to fixed; the bug's introduction, from not affected to pre-fix. ``Search`` bisects as ``git
bisect`` does: both ends first (the start must behave as the old side, the end as the new one), then the
middle of the narrowest bracket; a commit that behaves as neither side (its probe cannot run, it matches
neither, it is partial) is skipped, the next commit tried is then the one farthest from every commit
tried (a run of skipped commits is jumped over, not walked), and a bracket left with only skipped commits
inside is the range it could not narrow. Unlike git bisect, it stops once ``SKIP_LIMIT`` commits inside the
bracket were skipped: a run of thousands of commits no probe can judge (an era the probe cannot drive) is
named as the range, not probed commit by commit. A commit that deviates (fixed on every deciding scenario, a
control departing from both sides) is the fixed side, its controls named. It assumes one change of
behaviour in the line, as git bisect does: where a fix was reverted and reapplied it names one commit
whose behaviour differs from the commit before it, not necessarily the first; ``watch`` (every commit
probed) names the first and flags every commit after it that is not fixed or deviates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, INCOMPLETE
from ..documents.bisects import Seen
from ..documents.vocabulary import Boundary, Finding
from ..documents.vocabulary import CommitOutcome as Outcome


EXIT_OF = {Finding.FOUND: CONFIRMED, Finding.NOT_NARROWED: INCOMPLETE, Finding.ENDS_DIFFER: BEHAVIOUR_DIFFERS,
           Finding.OUTSIDE_HISTORY: INCOMPLETE, Finding.NOT_SOUGHT: CONFIRMED}


# Skipped commits inside one bracket before its search stops: probed farthest from every commit tried, they are
# spread evenly over it, so a stretch of judgeable commits wider than 1/SKIP_LIMIT of the bracket is met first.
SKIP_LIMIT = 32


@dataclass(frozen=True)
class Answer:
    finding: Finding
    commit: str | None = None  # found: the first commit of the new side
    parent: str | None = None  # found: the commit before it on the line (of the old side)
    unnarrowed: tuple[str, ...] = ()  # not narrowed: the commits one of which is the boundary, oldest first
    why: str = ""


class Search:
    """One boundary on one line. ``next()`` names the commit to probe (None: done); ``record`` what it did."""

    def __init__(self, boundary: Boundary, line: list[str], history_ends: bool = False,
                 skip_limit: int = SKIP_LIMIT):
        if not line:  # one commit may be both ends: a release cut from the newest commit of the history
            raise ValueError("a line to search needs a commit")
        self.boundary = boundary
        self.line = line
        self.history_ends = history_ends  # the line's end is the newest commit the history has
        self.skip_limit = skip_limit
        self.seen: dict[str, Seen] = {}

    def record(self, commit: str, seen: Seen) -> None:
        self.seen[commit] = seen

    def _is(self, index: int, outcome: Outcome) -> bool:
        found = self.seen.get(self.line[index])
        return found is not None and found.outcome is outcome

    def _bracket(self) -> tuple[int, int] | None:
        """(last old, first new after it): None until both ends are probed and behave as they should."""
        old, new = self.boundary.sides
        if not (self._is(0, old) and self._is(-1, new)):
            return None
        hi = next(i for i in range(len(self.line)) if self._is(i, new))
        lo = max(i for i in range(hi) if self._is(i, old))
        return lo, hi

    def next(self) -> str | None:
        for end in (self.line[-1], self.line[0]):
            if end not in self.seen:
                return end
        bracket = self._bracket()
        if bracket is None:
            return None
        lo, hi = bracket
        untried = [i for i in range(lo + 1, hi) if self.line[i] not in self.seen]
        if not untried or hi - lo - 1 - len(untried) >= self.skip_limit:
            return None
        tried = [i for i in range(lo, hi + 1) if self.line[i] in self.seen]
        middle = (lo + hi) / 2
        return self.line[max(untried, key=lambda i: (min(abs(i - t) for t in tried), -abs(i - middle), -i))]

    def upcoming(self, pending: list[str]) -> list[str]:
        """The commits ``next()`` may name once the commits of ``pending`` it asks for are recorded, whichever side
        each shows (a skipped one is not foreseen): what a bisection can make ready while they are probed."""
        found: list[str] = []

        def walk(seen: dict[str, Seen]) -> None:
            trial = Search(self.boundary, self.line, self.history_ends, self.skip_limit)
            trial.seen = seen
            sha = trial.next()
            if sha is None or sha in found:
                return
            if sha not in pending:
                found.append(sha)
                return
            for side in self.boundary.sides:
                walk({**seen, sha: Seen(side)})

        walk(dict(self.seen))
        return found

    def answer(self) -> Answer:
        old, new = self.boundary.sides
        start, end = (self.seen.get(self.line[i]) for i in (0, -1))
        if start is None or end is None:
            raise ValueError("the search is not done: an end is not probed")
        if end.outcome is not new:
            if self.history_ends:
                return Answer(Finding.OUTSIDE_HISTORY, why=f"the newest commit of the history, {self.line[-1][:12]}, "
                              f"is {end.describe()}, not {new.value}: the {self.boundary.value} is not in it")
            return Answer(Finding.ENDS_DIFFER, why=f"the end {self.line[-1][:12]} is {end.describe()}, not {new.value}")
        if start.outcome is not old:
            return Answer(Finding.ENDS_DIFFER,
                          why=f"the start {self.line[0][:12]} is {start.describe()}, not {old.value}")
        lo, hi = self._bracket()
        if hi == lo + 1:
            return Answer(Finding.FOUND, self.line[hi], self.line[lo])
        between = tuple(self.line[lo + 1:hi + 1])
        skipped = sum(1 for sha in between[:-1] if sha in self.seen)
        were = "were skipped" if skipped == hi - lo - 1 else \
            (f"{skipped} skipped, {hi - lo - 1 - skipped} not probed (a search stops at {self.skip_limit} skipped "
             f"in its bracket)")
        return Answer(Finding.NOT_NARROWED, unnarrowed=between,
                      why=f"{hi - lo - 1} commit(s) between {self.line[lo][:12]} ({old.value}) and "
                      f"{self.line[hi][:12]} ({new.value}) {were}: the {self.boundary.value} is one of "
                      f"{len(between)} commits")


@dataclass(frozen=True)
class Watched:
    """Every commit of a line probed: the first fixed one, and each after it that is not fixed (or deviates)."""

    first_fixed: str | None
    flagged: tuple[str, ...]


def watch(line: list[str], seen: dict[str, Seen]) -> Watched:
    fixed = next((i for i, sha in enumerate(line) if seen[sha].outcome is Outcome.FIXED), None)
    if fixed is None:
        return Watched(None, ())
    return Watched(line[fixed], tuple(sha for sha in line[fixed + 1:]
                                      if seen[sha].outcome is not Outcome.FIXED or seen[sha].deviates))
