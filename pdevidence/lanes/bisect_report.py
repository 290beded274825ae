"""What ``bisect`` reports: per experiment, each boundary commit (subject, date, PR) with its behaviour and its
parent's on every deciding scenario, the line walked, each step taken and the time; as text or JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import CONFIRMED, RELEASE_WATCH, worst
from ..documents.vocabulary import Behaviour
from ..sources.history import Commit
from .bisect import EXIT_OF, Answer, Boundary, Finding, Seen

SCHEMA = "pdevidence-bisect/1"


@dataclass(frozen=True)
class Line:
    """The stretch of the main line a search walked: where each end's ref meets the main line."""

    main: str  # the main line's ref (origin/main)
    start_ref: str
    start: str
    end_ref: str  # a release tag, a ref given, or the main line itself (its newest commit)
    end: str
    commits: int  # on the line, both ends included
    paths: tuple[str, ...] = ()  # the watch: only the commits changing these

    def describe(self) -> str:
        where = f", only the commits changing {', '.join(self.paths)}" if self.paths else ""
        return (f"{self.main} first-parent, {self.start[:12]} ({self.start_ref} meets it) .. {self.end[:12]} "
                f"({self.end_ref}{'' if self.end_ref == self.main else ' meets it'}){where}; {self.commits} commits")

    def to_json(self) -> dict:
        return {"main": self.main, "start_ref": self.start_ref, "start": self.start, "end_ref": self.end_ref,
                "end": self.end, "commits": self.commits, "paths": list(self.paths)}


@dataclass(frozen=True)
class Probed:
    """One commit, as one experiment's judge saw it."""

    commit: Commit
    seen: Seen
    scenarios: dict[str, Behaviour]  # every deciding scenario (and each departing control)

    def describe(self) -> str:
        found = ", ".join(f"{sid} {b.value}" for sid, b in self.scenarios.items())
        return f"{self.commit.describe()}: {self.seen.describe()}" + (f" [{found}]" if found else "")

    def to_json(self) -> dict:
        return {**self.commit.to_json(), "outcome": self.seen.outcome.value, "reason": self.seen.reason,
                "scenarios": {sid: b.value for sid, b in self.scenarios.items()}}


@dataclass(frozen=True)
class BoundaryReport:
    boundary: Boundary
    bracket: str  # where the bracket came from (the sweep's releases, the registry's, --good/--bad)
    answer: Answer
    line: Line | None = None  # None: not sought
    commit: Probed | None = None  # found: the boundary commit
    parent: Probed | None = None  # found: the commit before it on the line
    unnarrowed: tuple[Commit, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)  # commit -> why it was skipped
    newest: Commit | None = None  # outside the history: the newest commit the history has

    def lines(self) -> list[str]:
        name = {Boundary.FIX: "fix", Boundary.INTRODUCED: "introduced by"}[self.boundary]
        out = [f"  {name}: {self.answer.finding.value}" + (f": {self.answer.why}" if self.answer.why else "")]
        out.append(f"    bracket: {self.bracket}")
        if self.line:
            out.append(f"    line: {self.line.describe()}")
        if self.commit:
            out += [f"    commit: {self.commit.describe()}", f"    parent: {self.parent.describe()}"]
        out += [f"    one of: {c.describe()}" for c in self.unnarrowed]
        out += [f"    {sha[:12]} {why}" for sha, why in self.skipped.items()]
        if self.newest:
            out.append(f"    the history ends at {self.newest.describe()}")
        return out

    def to_json(self) -> dict:
        return {"boundary": self.boundary.value, "finding": self.answer.finding.value, "why": self.answer.why,
                "bracket": self.bracket, "line": self.line.to_json() if self.line else None,
                "commit": self.commit.to_json() if self.commit else None,
                "parent": self.parent.to_json() if self.parent else None,
                "unnarrowed": [c.to_json() for c in self.unnarrowed], "skipped": self.skipped,
                "newest": self.newest.to_json() if self.newest else None}


@dataclass(frozen=True)
class WatchReport:
    """``--every``: every commit changing what the probe loads, probed; each after the first fixed one that is
    not fixed is flagged."""

    line: Line
    walked: tuple[Probed, ...]
    first_fixed: Commit | None
    flagged: tuple[Probed, ...]

    def lines(self) -> list[str]:
        first = self.first_fixed.describe() if self.first_fixed else "none fixed"
        out = [f"  watch: {len(self.walked)} commits probed, first fixed {first}", f"    line: {self.line.describe()}"]
        out += [f"    {'FLAGGED ' if p in self.flagged else ''}{p.describe()}" for p in self.walked]
        return out

    def to_json(self) -> dict:
        return {"line": self.line.to_json(), "walked": [p.to_json() for p in self.walked],
                "first_fixed": self.first_fixed.to_json() if self.first_fixed else None,
                "flagged": [p.commit.sha for p in self.flagged]}


@dataclass(frozen=True)
class ExperimentReport:
    experiment: str
    pr: int
    fix: BoundaryReport
    introduced: BoundaryReport
    pinned_fix: str | None  # the registry's git pin of the fix ([experiments.<exp>.git] head); None: none
    watch: WatchReport | None = None

    @property
    def notes(self) -> list[str]:
        """Findings, not errors: where the history's answer and the registry's differ."""
        found = self.fix.commit.commit if self.fix.commit else None
        if found is None:
            return []
        notes = []
        if self.pinned_fix is None:
            notes.append(f"the registry pins no fix commit; the history's is {found.sha}")
        elif self.pinned_fix != found.sha:
            notes.append(f"the fix commit is not the registry's git pin {self.pinned_fix[:12]} "
                         f"([experiments.{self.experiment}.git] head)")
        if found.pr != self.pr:
            notes.append(f"the fix commit's subject names {f'PR #{found.pr}' if found.pr else 'no PR'}, "
                         f"the registry PR #{self.pr}")
        return notes

    @property
    def exit_code(self) -> int:
        watched = RELEASE_WATCH if self.watch and self.watch.flagged else CONFIRMED
        return worst([EXIT_OF[self.fix.answer.finding], EXIT_OF[self.introduced.answer.finding], watched])

    def lines(self) -> list[str]:
        out = [f"{self.experiment} (PR #{self.pr})", *self.fix.lines(), *self.introduced.lines()]
        out += [f"  note: {n}" for n in self.notes]
        return out + (self.watch.lines() if self.watch else [])

    def to_json(self) -> dict:
        return {"experiment": self.experiment, "pr": self.pr, "fix": self.fix.to_json(),
                "introduced": self.introduced.to_json(), "pinned_fix": self.pinned_fix, "notes": self.notes,
                "watch": self.watch.to_json() if self.watch else None, "exit_code": self.exit_code}


@dataclass(frozen=True)
class Step:
    """One round: the commits probed together (one probe process each, every experiment in it)."""

    round: int
    commits: tuple[Commit, ...]
    seconds: float
    outcomes: dict[str, dict[str, Seen]]  # commit -> experiment -> what it did

    def lines(self) -> list[str]:
        out = [f"  step {self.round} ({self.seconds:.1f} s):"]
        for c in self.commits:
            each = "; ".join(f"{exp} {seen.describe()}" for exp, seen in self.outcomes[c.sha].items())
            out.append(f"    {c.sha[:12]} {c.date[:10]} {c.subject[:60]!r}: {each}")
        return out

    def to_json(self) -> dict:
        return {"round": self.round, "seconds": round(self.seconds, 1), "commits": [
            {**c.to_json(), "outcomes": {exp: {"outcome": s.outcome.value, "reason": s.reason}
                                         for exp, s in self.outcomes[c.sha].items()}} for c in self.commits]}


@dataclass(frozen=True)
class BisectReport:
    repo: str
    main: str
    experiments: list[ExperimentReport]
    steps: list[Step]
    seconds: float
    time: str  # where the time went (phases)

    @property
    def exit_code(self) -> int:
        return worst(e.exit_code for e in self.experiments)

    def text(self) -> str:
        out = [f"bisect: {self.repo}, main line {self.main}"]
        for e in self.experiments:
            out += e.lines()
        out.append(f"steps ({sum(len(s.commits) for s in self.steps)} commits probed):")
        for s in self.steps:
            out += s.lines()
        out.append(f"time: {self.time}")
        return "\n".join(out)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "repo": self.repo, "main": self.main, "exit_code": self.exit_code,
                "experiments": [e.to_json() for e in self.experiments], "steps": [s.to_json() for s in self.steps],
                "seconds": round(self.seconds, 1)}
