"""The bisect document (``pdevidence-bisect/1``, ``bisect-<experiment>.json``): by behaviour, the commit that fixed
an experiment's bug and the one that brought it in, on a clone of SGLang's history.

Per boundary (the fix, the introduction): what was found, the line of the main line walked, the boundary commit
and its parent with their behaviour on every deciding scenario, each commit the search probed in order (its
steps), what it skipped, and, when the history cannot hold the boundary, its newest commit; ``--every`` adds the
watch. Commits are named by their SHA (content addresses of the history probed); the document holds no time and
no path, so a rerun on the same history gives the same bytes (the run's receipt, ``runs/bisect.run.json``, keeps
the rounds and their times). It records what made it (``provenance``) and how it was asked for (``parameters``:
the refs given and the base, head and sweep files it was bracketed and judged by); ``stale`` compares the first
with the checkout. ``BisectDocument.load`` is its one reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import HarnessError
from ..core.files import read_json
from ..registry import REGISTRY_FILE
from ..sources.history import Commit
from .provenance import KIT, SWEEP_DRIVERS, Provenance, Shaped, stale_why
from .versions import Schema
from .vocabulary import Behaviour, Boundary, CommitOutcome, Finding

BISECT_SCHEMA = Schema("pdevidence-bisect/", 1)
BISECT_TODO = "rerun `python -m pdevidence bisect <experiment>` (SGLANG_REPO names the clone) and publish it"
FILE_PREFIX = "bisect-"
# A range not narrowed is named commit by commit up to this many; a longer one (thousands of commits of an era no
# probe can drive) by its first and last commit and how many it holds: the document stays small.
UNNARROWED_NAMED = 64
ENDS_SHOWN = 5  # of a range named commit by commit, the text shows the first and last few


def file_name(experiment: str) -> str:
    return f"{FILE_PREFIX}{experiment}.json"


@dataclass(frozen=True)
class Seen:
    """How one commit behaved for one experiment: its side, or why it was skipped."""

    outcome: CommitOutcome
    reason: str | None = None  # skipped: why (the classification, or why the probe could not run)
    # Fixed on every deciding scenario, but these controls depart from both sides (check's "deviates"): the
    # fixed side for the search, flagged by the watch.
    deviates: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.deviates:  # the controls are named once per experiment (``BisectDocument.deviating``)
            many = len(self.deviates) > 1
            return f"{self.outcome.value} ({len(self.deviates) if many else 'a'} control{'s' if many else ''} " \
                f"deviate{'' if many else 's'})"
        return f"{self.outcome.value} ({self.reason})" if self.reason else self.outcome.value


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
    left_out: int = 0  # the watch: the commits of the line changing none of ``paths``, not probed

    def describe(self) -> str:
        where = (f", only the commits changing {', '.join(self.paths)} ({self.left_out} other commits of the line "
                 "change none of them: not probed)") if self.paths else ""
        return (f"{self.main} first-parent, {self.start[:12]} ({self.start_ref} meets it) .. {self.end[:12]} "
                f"({self.end_ref}{'' if self.end_ref == self.main else ' meets it'}){where}; {self.commits} commits")

    def to_json(self) -> dict:
        return {"main": self.main, "start_ref": self.start_ref, "start": self.start, "end_ref": self.end_ref,
                "end": self.end, "commits": self.commits, "paths": list(self.paths), "left_out": self.left_out}

    @classmethod
    def from_doc(cls, doc: dict) -> Line:
        found = cls(doc["main"], doc["start_ref"], doc["start"], doc["end_ref"], doc["end"], doc["commits"],
                    tuple(doc["paths"]), doc["left_out"])
        if not (all(isinstance(v, str) for v in (found.main, found.start_ref, found.start, found.end_ref, found.end,
                                                 *found.paths))
                and isinstance(found.commits, int) and found.commits >= 1 and isinstance(found.left_out, int)):
            raise TypeError(f"line {doc!r}")
        return found


def _commit(doc: dict) -> Commit:
    found = Commit(doc["sha"], doc["subject"], doc["date"], doc["pr"])
    if not (all(isinstance(v, str) for v in (found.sha, found.subject, found.date))
            and isinstance(found.pr, (int, type(None)))):
        raise TypeError(f"commit {doc!r}")
    return found


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
                "deviates": list(self.seen.deviates), "scenarios": {sid: b.value for sid, b in self.scenarios.items()}}

    @classmethod
    def from_doc(cls, doc: dict) -> Probed:
        found = cls(_commit(doc), Seen(CommitOutcome(doc["outcome"]), doc["reason"], tuple(doc["deviates"])),
                    {sid: Behaviour(b) for sid, b in doc["scenarios"].items()})
        seen = found.seen
        if not isinstance(seen.reason, (str, type(None))) or not all(isinstance(d, str) for d in seen.deviates):
            raise TypeError(f"commit {found.commit.sha!r}: reason must be a string or null, deviates scenario ids")
        return found


@dataclass(frozen=True)
class BoundaryReport:
    """What the search found of one boundary, and each commit it probed on the way."""

    boundary: Boundary
    bracket: str  # where the bracket came from (the sweep's releases, the registry's, --good/--bad)
    finding: Finding
    why: str = ""
    line: Line | None = None  # None: not sought
    commit: Probed | None = None  # found: the boundary commit
    parent: Probed | None = None  # found: the commit before it on the line
    unnarrowed: tuple[Commit, ...] = ()  # not narrowed: each commit of the range, or its first and last (see below)
    skipped: dict[str, str] = field(default_factory=dict)  # commit -> why it was skipped
    newest: Commit | None = None  # outside the history: the newest commit the history has
    steps: tuple[Probed, ...] = ()  # every commit the search probed, in the order it asked for them
    unnarrowed_commits: int = 0  # how many the range holds: more than UNNARROWED_NAMED, ``unnarrowed`` its ends

    @property
    def range_by_ends(self) -> bool:
        return self.unnarrowed_commits > len(self.unnarrowed)

    def lines(self) -> list[str]:
        name = {Boundary.FIX: "fix", Boundary.INTRODUCED: "introduced by"}[self.boundary]
        out = [f"  {name}: {self.finding.value}" + (f": {self.why}" if self.why else "")]
        out.append(f"    bracket: {self.bracket}")
        if self.line:
            out.append(f"    line: {self.line.describe()}")
        if self.commit:
            out += [f"    commit: {self.commit.describe()}", f"    parent: {self.parent.describe()}"]
        if self.range_by_ends:
            first, last = self.unnarrowed
            out += [f"    one of the {self.unnarrowed_commits} commits from: {first.describe()}",
                    f"      to: {last.describe()}"]
        else:
            shown = self.unnarrowed if len(self.unnarrowed) <= 2 * ENDS_SHOWN else \
                (*self.unnarrowed[:ENDS_SHOWN], None, *self.unnarrowed[-ENDS_SHOWN:])
            out += [f"    one of: {c.describe()}" if c else f"    ... {len(self.unnarrowed) - 2 * ENDS_SHOWN} more"
                    for c in shown]
        out += [f"    {sha[:12]} {why}" for sha, why in self.skipped.items()]
        if self.newest:
            out.append(f"    the history ends at {self.newest.describe()}")
        return out

    def to_json(self) -> dict:
        return {"boundary": self.boundary.value, "finding": self.finding.value, "why": self.why,
                "bracket": self.bracket, "line": self.line.to_json() if self.line else None,
                "commit": self.commit.to_json() if self.commit else None,
                "parent": self.parent.to_json() if self.parent else None,
                "unnarrowed": [c.to_json() for c in self.unnarrowed], "unnarrowed_commits": self.unnarrowed_commits,
                "skipped": self.skipped,
                "newest": self.newest.to_json() if self.newest else None,
                "steps": [p.to_json() for p in self.steps]}

    @classmethod
    def from_doc(cls, doc: dict) -> BoundaryReport:
        found = cls(Boundary(doc["boundary"]), doc["bracket"], Finding(doc["finding"]), doc["why"],
                    Line.from_doc(doc["line"]) if doc["line"] is not None else None,
                    Probed.from_doc(doc["commit"]) if doc["commit"] is not None else None,
                    Probed.from_doc(doc["parent"]) if doc["parent"] is not None else None,
                    tuple(_commit(c) for c in doc["unnarrowed"]), dict(doc["skipped"]),
                    _commit(doc["newest"]) if doc["newest"] is not None else None,
                    tuple(Probed.from_doc(p) for p in doc["steps"]), doc["unnarrowed_commits"])
        named = len(found.unnarrowed)
        if not isinstance(found.unnarrowed_commits, int) or not (
                found.unnarrowed_commits == named <= UNNARROWED_NAMED
                or (named == 2 and found.unnarrowed_commits > UNNARROWED_NAMED)):
            raise ValueError(f"unnarrowed names {named} commit(s) of a range of {found.unnarrowed_commits!r}: each "
                             f"commit up to {UNNARROWED_NAMED}, else its first and last")
        if (found.finding is Finding.FOUND) != (found.commit is not None and found.parent is not None):
            raise ValueError(f"the {found.boundary.value} is {found.finding.value}, so it names "
                             f"{'its commit and parent' if found.finding is Finding.FOUND else 'no commit'}")
        return found


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

    @classmethod
    def from_doc(cls, doc: dict) -> WatchReport:
        walked = tuple(Probed.from_doc(p) for p in doc["walked"])
        by_sha = {p.commit.sha: p for p in walked}
        if not set(doc["flagged"]) <= set(by_sha):
            raise ValueError("the watch flags a commit it did not walk")
        return cls(Line.from_doc(doc["line"]), walked,
                   _commit(doc["first_fixed"]) if doc["first_fixed"] is not None else None,
                   tuple(by_sha[sha] for sha in doc["flagged"]))


@dataclass(frozen=True)
class BisectParameters:
    """How the bisection was asked for: the main line, the refs overriding the fix's bracket, the watch, and the
    files (base and head results, the sweep table) it was bracketed and judged by, with their SHA-256."""

    main: str
    good: str | None
    bad: str | None
    every: bool
    references: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"main": self.main, "good": self.good, "bad": self.bad, "every": self.every,
                "references": dict(sorted(self.references.items()))}

    @classmethod
    def from_doc(cls, doc: dict) -> BisectParameters:
        found = cls(doc["main"], doc["good"], doc["bad"], doc["every"], dict(doc["references"]))
        if not (isinstance(found.main, str) and isinstance(found.every, bool)
                and all(isinstance(r, (str, type(None))) for r in (found.good, found.bad))
                and all(isinstance(v, str) for v in found.references.values())):
            raise TypeError("parameters: main (a ref), good and bad (refs or null), every (a boolean), "
                            "references (file -> SHA-256)")
        return found


@dataclass(frozen=True)
class BisectDocument:
    experiment: str
    pr: int
    pinned_fix: str | None  # the registry's git pin of the fix ([experiments.<exp>.git] head); None: none
    fix: BoundaryReport
    introduced: BoundaryReport
    notes: tuple[str, ...]  # findings, not errors: where the history's answer and the registry's differ
    watch: WatchReport | None
    parameters: BisectParameters
    provenance: Provenance

    def stale(self, root: Path, probe: str) -> list[str]:
        """How this checkout differs from what made the document (``probe``: the experiment's, in the checkout)."""
        return stale_why(self.provenance, root, [probe, KIT, *SWEEP_DRIVERS, REGISTRY_FILE], Shaped.BISECT)

    def boundary(self, which: Boundary) -> BoundaryReport:
        return self.fix if which is Boundary.FIX else self.introduced

    def deviating(self) -> dict[tuple[str, ...], list[Commit]]:
        """The commits probed that deviate (fixed where it tells, controls departing from both sides), by the
        controls they depart on, each commit once, in the order probed."""
        probed = [*self.fix.steps, *self.introduced.steps, *(self.watch.walked if self.watch else ())]
        found: dict[tuple[str, ...], list[Commit]] = {}
        for p in probed:
            if p.seen.deviates and p.commit not in found.get(p.seen.deviates, []):
                found.setdefault(p.seen.deviates, []).append(p.commit)
        return found

    def to_json(self) -> dict[str, Any]:
        return {"schema": BISECT_SCHEMA.name, "experiment": self.experiment, "pr": self.pr,
                "pinned_fix": self.pinned_fix, "fix": self.fix.to_json(), "introduced": self.introduced.to_json(),
                "notes": list(self.notes), "watch": self.watch.to_json() if self.watch else None,
                "parameters": self.parameters.to_json(), "provenance": self.provenance.to_json()}

    @classmethod
    def from_doc(cls, doc: Any, *, source: str) -> BisectDocument:
        """Check a bisect document; a bad one names the source and what is wrong."""
        def bad(why: str) -> HarnessError:
            return HarnessError(f"{source} is not a bisect document: {why}",
                                expected=f"a {BISECT_SCHEMA.readable} document", todo=BISECT_TODO)

        _, doc = BISECT_SCHEMA.read(doc, bad)
        try:
            found = cls(doc["experiment"], doc["pr"], doc["pinned_fix"], BoundaryReport.from_doc(doc["fix"]),
                        BoundaryReport.from_doc(doc["introduced"]), tuple(doc["notes"]),
                        WatchReport.from_doc(doc["watch"]) if doc["watch"] is not None else None,
                        BisectParameters.from_doc(doc["parameters"]), Provenance.from_doc(doc["provenance"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad(f"{type(exc).__name__}: {exc}") from None
        if not (isinstance(found.experiment, str) and isinstance(found.pr, int)
                and isinstance(found.pinned_fix, (str, type(None))) and all(isinstance(n, str) for n in found.notes)):
            raise bad("experiment must be a name, pr a number, pinned_fix a commit or null, notes strings")
        if (found.fix.boundary, found.introduced.boundary) != (Boundary.FIX, Boundary.INTRODUCED):
            raise bad("fix and introduced must hold the fix's and the introduction's boundary")
        return found

    @classmethod
    def load(cls, path: Path) -> BisectDocument:
        return cls.from_doc(read_json(path, "bisect document", todo=BISECT_TODO), source=str(path))
