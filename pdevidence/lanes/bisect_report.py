"""What ``bisect`` reports: per experiment its document (``documents/bisects.py``: each boundary commit with its
behaviour and its parent's on every deciding scenario, the line walked, each commit probed), and the run's rounds
and time; as text or JSON."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import CONFIRMED, INCOMPLETE, RELEASE_WATCH, worst
from ..documents.bisects import BisectDocument, BoundaryReport, Seen
from ..registry import Gate
from ..sources.history import Commit
from .bisect import EXIT_OF

# What `bisect --json` prints and the run's receipt (runs/bisect.run.json) holds: the documents' findings, and
# where the run was and how long each round took.
SCHEMA = "pdevidence-bisect-run/1"
RECEIPT = "bisect.run.json"
SHOWN = 4  # commits named beside the controls they deviate on


def notes(experiment: str, pr: int, fix: BoundaryReport, pinned_fix: str | None,
          gate: Gate | None = None) -> tuple[str, ...]:
    """Findings, not errors: where the history's answer and the registry's differ; for a gated fix, that every
    commit was judged with its gate on."""
    said = [] if gate is None else [
        f"judged with the fix's gate on ({gate.variable}={gate.on}, as its probe runs it): the fix commit is the one "
        f"that brings its code in; a server whose environment leaves the gate off (its default) runs the code as "
        f"before the fix"]
    found = fix.commit.commit if fix.commit else None
    if found is None:
        return tuple(said)
    if pinned_fix is None:
        said.append(f"the registry pins no fix commit; the history's is {found.sha}")
    elif pinned_fix != found.sha:
        said.append(f"the fix commit is not the registry's git pin {pinned_fix[:12]} "
                    f"([experiments.{experiment}.git] head)")
    if found.pr != pr:
        said.append(f"the fix commit's subject names {f'PR #{found.pr}' if found.pr else 'no PR'}, "
                    f"the registry PR #{pr}")
    return tuple(said)


@dataclass(frozen=True)
class ExperimentReport:
    """One experiment's document, and what the run adds to it: why the watch did not run, the exit code."""

    document: BisectDocument
    watch_not_run: str | None = None  # --every, and the watch could not run: why

    @property
    def exit_code(self) -> int:
        doc = self.document
        watched = RELEASE_WATCH if doc.watch and doc.watch.flagged else CONFIRMED
        unwatched = INCOMPLETE if self.watch_not_run else CONFIRMED
        return worst([EXIT_OF[doc.fix.finding], EXIT_OF[doc.introduced.finding], watched, unwatched])

    def lines(self) -> list[str]:
        doc = self.document
        out = [f"{doc.experiment} (PR #{doc.pr})", *doc.fix.lines(), *doc.introduced.lines()]
        out += [f"  note: {n}" for n in doc.notes]
        for controls, commits in doc.deviating().items():
            shown = ", ".join(c.sha[:12] for c in commits[:SHOWN]) + (", ..." if len(commits) > SHOWN else "")
            out.append(f"  deviating: {', '.join(controls)} depart from both sides on {len(commits)} commit(s) "
                       f"probed ({shown}): fixed where it tells, so the fixed side")
        if self.watch_not_run:
            out.append(f"  watch: not run: {self.watch_not_run}")
        return out + (doc.watch.lines() if doc.watch else [])

    def to_json(self) -> dict:
        found = {key: value for key, value in self.document.to_json().items() if key not in ("schema", "provenance")}
        return {**found, "watch_not_run": self.watch_not_run, "exit_code": self.exit_code}


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
