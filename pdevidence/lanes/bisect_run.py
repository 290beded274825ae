"""``bisect``: find by behaviour the commit that fixed each bug, and the one that brought it in.

Each experiment's brackets come from its published sweep table (the last release it calls pre-fix and
the first fixed one; the last not affected and the first pre-fix), else the registry's releases;
``--good``/``--bad`` override the fix's. A release's tag may sit on a release branch off the main line,
so each end is where its tag meets the main line (their merge base), and the search walks the main
line's first-parent chain between them; a release the history has no tag of is left out (the newest
commit of the main line stands in for a fixed release after the history's end). Each commit probed is
exported from the clone (what the probes read, its unchanged files linked from the exports before it:
``sources/trees.py``) and run like ``check --git`` (the warm engine, in the era its own version or pins choose,
nothing built, the experiments bisected alone in one probe process, outcomes cached by what made them) and
judged by check's judge; every search asks its next commit each round, so one probe serves all of them. Each era's
engine is kept across the rounds (``engine.Engines``): its closure is imported once per bisection, not once a
round; the commits of the one clone share it, as they share a history. The commits the searches may ask next are
exported and compiled while a round probes (``bisect_ahead``).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from .. import environments
from ..cells import engine, warm
from ..core import phases
from ..core.errors import usage
from ..core.files import sha256_file
from ..core.paths import cache_dir, results_dir, runs_dir, tree_lock_file, work_dir
from ..documents import provenance, tables
from ..documents.bisects import (UNNARROWED_NAMED, BisectDocument, BisectParameters, BoundaryReport, Line, Probed,
                                 Seen, WatchReport)
from ..documents.references import expected_file
from ..documents.vocabulary import Classification
from ..documents.vocabulary import CheckStatus as Status
from ..registry import SIDES, Experiment, Registry
from ..sources import trees
from ..sources.history import Clone, Commit
from . import check
from .bisect import Answer, Boundary, Finding, Outcome, Search, watch
from .bisect_ahead import Ahead
from .bisect_report import BisectReport, ExperimentReport, Step, notes

REASON_CHARS = 160
OUTCOME_OF = {Status.FIXED: Outcome.FIXED, Status.AFFECTED: Outcome.PRE_FIX, Status.NOT_AFFECTED: Outcome.NOT_AFFECTED}


@dataclass(frozen=True)
class Bracket:
    boundary: Boundary
    source: str  # where it comes from, said in the report
    start: str | None = None  # a ref of the clone (a release tag, --good); None: not sought
    end: str | None = None  # None: the newest commit of the main line
    why_not: Answer | None = None  # not sought, or outside the history: why


def tag(version: str) -> str:
    return f"v{version}"


def _sweep_file(reg: Registry, exp: Experiment, fresh: bool) -> Path:
    """The sweep table the brackets come from: published, or (republishing) fresh in runs/."""
    return (runs_dir(reg.root) if fresh else results_dir(reg.root)) / f"sweep-{exp.name}.json"


def _sweep(reg: Registry, exp: Experiment, fresh: bool) -> list[tables.ReleaseOutcome] | None:
    path = _sweep_file(reg, exp, fresh)
    if not path.is_file():
        return None
    return sorted(tables.SweepTable.load(path).releases, key=lambda o: Version(o.version))


def _tagged(clone: Clone, versions: list[str]) -> list[str]:
    return [v for v in versions if clone.resolve(tag(v))]


def fix_bracket(reg: Registry, exp: Experiment, clone: Clone, main: str, good: str | None, bad: str | None,
                fresh: bool = False) -> Bracket:
    """From the last pre-fix release the history has a tag of, to the first fixed release that meets the main
    line after it (or the main line's newest commit, when the history has no tag of one); ``good``/``bad``
    override either end. A fixed post-release cut where the last pre-fix release was got the fix off the main
    line (a cherry-pick): the next fixed release stands for it."""
    releases = _sweep(reg, exp, fresh)
    if releases is not None:
        first_fixed = tables.first_carrying(releases)  # a gated fix's commit brought it in off by default
        before = [o.version for o in releases if o.classification is Classification.PRE_FIX
                  and (first_fixed is None or Version(o.version) < Version(first_fixed))]
        fixed = [o.version for o in releases if first_fixed and Version(o.version) >= Version(first_fixed)
                 and o.classification in (Classification.FIXED, Classification.PRESENT_OFF)]
        source = f"sweep-{exp.name}.json"
    else:
        before, fixed = [v for v in [exp.releases["base"]] if v], [v for v in [exp.releases["head"]] if v]
        source = f"the registry's releases of {exp.name}"
    pre_fix, has_fixed = _tagged(clone, before), _tagged(clone, fixed)
    start = good or (tag(pre_fix[-1]) if pre_fix else None)
    off_main = []
    if start and has_fixed and not bad:
        meet = clone.on_main(start, main)
        off_main = list(itertools.takewhile(lambda v: clone.on_main(tag(v), main) == meet, has_fixed))
        has_fixed = has_fixed[len(off_main):]
    end = bad or (tag(has_fixed[0]) if has_fixed else None)
    said = f"{source}: last pre-fix {before[-1] if before else 'none'}, first fixed {fixed[0] if fixed else 'none'}"
    if good or bad:
        said = f"--good {start}, --bad {end or 'the main line'} (over {said})"
    elif off_main:
        said += (f" ({', '.join(off_main)} meet{'s' if len(off_main) == 1 else ''} the main line where "
                 f"{pre_fix[-1]} does: the fix came off it; "
                 + (f"{has_fixed[0]} stands for it)" if has_fixed else "the main line's newest commit stands in)"))
    elif fixed and not has_fixed:
        said += f" (no tag {tag(fixed[0])} in the history: its newest commit stands in)"
    if start is None:
        why = ("no release before the first fixed one is pre-fix" if not before else
               f"the history has no tag of any pre-fix release ({', '.join(before[-3:])}...)")
        return Bracket(Boundary.FIX, said, why_not=Answer(Finding.NOT_SOUGHT if not before
                                                          else Finding.OUTSIDE_HISTORY, why=why))
    return Bracket(Boundary.FIX, said, start, end)


def introduced_bracket(reg: Registry, exp: Experiment, clone: Clone, fresh: bool = False) -> Bracket:
    """From the last release the sweep calls not affected to the first it calls pre-fix (both tagged here)."""
    releases = _sweep(reg, exp, fresh)
    if releases is None:
        return Bracket(Boundary.INTRODUCED, "no sweep table", why_not=Answer(
            Finding.NOT_SOUGHT, why=f"only the sweep says which releases are not affected (sweep-{exp.name}.json)"))
    first = next((i for i, o in enumerate(releases) if o.classification is Classification.PRE_FIX), None)
    if first is None:
        return Bracket(Boundary.INTRODUCED, f"sweep-{exp.name}.json", why_not=Answer(
            Finding.NOT_SOUGHT, why="the sweep calls no release pre-fix"))
    clean = [o.version for o in releases[:first] if o.classification is Classification.NOT_AFFECTED]
    said = f"sweep-{exp.name}.json: last not affected {clean[-1] if clean else 'none'}, " \
        f"first pre-fix {releases[first].version}"
    if not clean:
        return Bracket(Boundary.INTRODUCED, said, why_not=Answer(Finding.NOT_SOUGHT, why=(
            f"the sweep calls no release before {releases[first].version} not affected: the bug is as old as the "
            f"sweep's floor")))
    tagged_clean = _tagged(clone, clean)
    tagged_bug = _tagged(clone, [o.version for o in releases[first:] if o.classification is Classification.PRE_FIX])
    if not tagged_clean or not tagged_bug:
        return Bracket(Boundary.INTRODUCED, said, why_not=Answer(Finding.OUTSIDE_HISTORY, why=(
            f"the history has no tag of {'a not affected' if not tagged_clean else 'a pre-fix'} release: it does "
            "not reach that far")))
    return Bracket(Boundary.INTRODUCED, said, tag(tagged_clean[-1]), tag(tagged_bug[0]))


class Prober:
    """Commits through check's warm path, each probed once (the experiments bisected in its one probe process),
    their trees made ahead while the round before probes (a context: its trees' thread ends with it)."""

    def __init__(self, reg: Registry, clone: Clone, experiments: list[str], *, fresh_references: bool, force: bool,
                 log, engines: engine.Engines | None = None):
        # check judges every experiment of the registry it is given: given these alone, it probes these alone.
        self.reg = dataclasses.replace(reg, experiments={name: reg.experiment(name) for name in experiments})
        self.clone, self.log, self.engines = clone, log, engines
        self.fresh, self.force = fresh_references, force
        self.lock = trees.LockFile(tree_lock_file(reg.root))
        self.judged: dict[str, dict[str, check.ExperimentCheck]] = {}  # commit -> experiment -> check's answer
        self.commits: dict[str, Commit] = {}
        self.steps: list[Step] = []
        self.ahead = Ahead(self._tree)
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="bisect-engine")
        self._started: dict[str, Future] = {}  # era name ("": the registry's closure) -> its engine's start

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, kind, value, trace) -> None:
        self.ahead.close()
        self._starter.shutdown()

    def _tree(self, sha: str) -> trees.Tree:
        tree = trees.git_tree(sha, self.lock, clone=self.clone.path)
        era = environments.era_of(self.reg, tree)
        if self.engines is not None and (name := era.name if era else "") not in self._started:
            # Its era's engine imports its closure while this tree compiles and the round's others are made.
            self._started[name] = self._starter.submit(warm.start_kept_engine, self.reg, tree, self.engines)
        warm.compile_ahead(self.reg, tree)
        return tree

    def commit(self, sha: str) -> Commit:
        return self.named([sha])[0]

    def named(self, shas: list[str]) -> list[Commit]:
        """Each commit with its subject and date, read from the clone once."""
        unread = [sha for sha in dict.fromkeys(shas) if sha not in self.commits]
        self.commits.update(zip(unread, self.clone.commits(unread)))
        return [self.commits[sha] for sha in shas]

    def seen(self, sha: str, experiment: str) -> Seen:
        found = self.judged[sha][experiment]
        # A gated fix is sought where its code comes in, judged as its probe runs it: gate on (the notes say the
        # gate; check answers affected for a server left at its default, off).
        status = found.gate.code_status if found.gated_off else found.status
        if status is Status.DEVIATES:  # fixed on every deciding scenario: the fixed side, its controls named
            return Seen(Outcome.FIXED, deviates=tuple(found.deviations))
        outcome = OUTCOME_OF.get(status)
        if outcome is not None:
            return Seen(outcome)
        detail = found.error or ", ".join(found.deciding)
        if len(detail) > REASON_CHARS:  # every scenario raising alike says the same thing many times
            detail = detail[:REASON_CHARS] + "..."
        return Seen(Outcome.SKIPPED, status.value + (f": {detail}" if detail else ""))

    def probed(self, sha: str, experiment: str) -> Probed:
        return Probed(self.commit(sha), self.seen(sha, experiment), dict(self.judged[sha][experiment].scenarios))

    def probe(self, shas: list[str], maybe_next: Iterable[str] = ()) -> None:
        """Probe ``shas`` (one round), making ``maybe_next`` (what the next round may ask) meanwhile."""
        started = time.monotonic()
        self.ahead.plan(shas, maybe_next)
        with phases.measure(phases.TREES):
            targets = [(check.target_of(self.reg, tree), tree) for tree in map(self.ahead.tree, shas)]
        for start in self._started.values():
            start.result()  # a failure said here, not lost
        found = check.run_all(self.reg, targets, fresh_references=self.fresh, force=self.force, log=self.log,
                              engines=self.engines)
        for sha, result in zip(shas, found):
            self.judged[sha] = {e.experiment: e for e in result.experiments}
        self.steps.append(Step(len(self.steps) + 1, tuple(self.commit(sha) for sha in shas),
                               time.monotonic() - started,
                               {sha: {name: self.seen(sha, name) for name in self.judged[sha]} for sha in shas}))
        for line in self.steps[-1].lines():
            self.log(line)


def line_between(clone: Clone, main: str, start_ref: str, end_ref: str | None, tip: str,
          paths: tuple[str, ...] = ()) -> tuple[Line, list[str]]:
    start = clone.on_main(start_ref, main)
    end = clone.on_main(end_ref, main) if end_ref else tip
    commits = clone.line(start, end, paths)
    left_out = len(clone.line(start, end)) - len(commits) if paths else 0  # the watch says what it leaves out
    return Line(main, start_ref, start, end_ref or main, end, len(commits), paths, left_out), commits


def made_by(reg: Registry, experiments: list[str]) -> provenance.Provenance:
    """What makes a bisect document: the probes of the experiments bisected (each commit runs them in one
    process), the kit, the engine and driver, the registry, every era's closure, and the harness."""
    closures = [environments.closure(reg), *(era.constraints for era in reg.eras.values())]
    return provenance.record(reg.root, provenance.inputs(reg, experiments, provenance.SWEEP_DRIVERS, closures),
                             provenance.Shaped.BISECT)


def judged_by(reg: Registry, exp: Experiment, fresh: bool) -> dict[str, str]:
    """The files an experiment's bisection rests on, by name: its base and head results (check's judge) and the
    sweep table its brackets come from (when there is one)."""
    directory = runs_dir(reg.root) if fresh else results_dir(reg.root)
    files = [directory / expected_file(exp, side, "release") for side in SIDES] + [_sweep_file(reg, exp, fresh)]
    return {path.name: sha256_file(path) for path in files if path.is_file()}  # check verifies the results


def run(reg: Registry, clone: Clone, experiments: list[str], *, main: str | None = None, good: str | None = None,
        bad: str | None = None, every: bool = False, fresh_references: bool = False, force: bool = False,
        log=print) -> BisectReport:
    started = time.monotonic()
    made = made_by(reg, experiments)  # before anything runs: what a change during the run must not pass for
    main = clone.main(main)
    tip = clone.tip(main)
    exps = [reg.experiment(name) for name in experiments]
    for ref, option in ((good, "--good"), (bad, "--bad")):
        if ref and clone.resolve(ref) is None:
            raise usage(f"{option} {ref!r} names no commit in {clone.path}",
                        todo=f"check it with `git -C {clone.path} rev-parse {ref}`")
    if every:
        undeclared = [exp.name for exp in exps if not exp.loads]
        if undeclared:
            raise usage(f"--every needs the files each probe loads; {', '.join(undeclared)} declares none",
                        expected="[experiments.<name>] loads = [\"python/sglang/...\"] in experiments.toml")
    parameters = {exp.name: BisectParameters(main, good, bad, every, judged_by(reg, exp, fresh_references))
                  for exp in exps}
    brackets = {(exp.name, b.boundary): b for exp in exps
                for b in (fix_bracket(reg, exp, clone, main, good, bad, fresh_references),
                          introduced_bracket(reg, exp, clone, fresh_references))}
    searches, lines = {}, {}
    for key, bracket in brackets.items():
        if bracket.why_not is None:
            lines[key], commits = line_between(clone, main, bracket.start, bracket.end, tip)
            searches[key] = Search(bracket.boundary, commits, history_ends=commits[-1] == tip)
    watched, unwatched = {}, {}
    if every:  # from the fix's start to the newest commit (or --bad): every commit changing what the probe loads
        for exp in exps:
            fix = brackets[(exp.name, Boundary.FIX)]
            if fix.start is not None:
                watched[exp.name] = line_between(clone, main, fix.start, bad, tip, exp.loads)
            else:
                unwatched[exp.name] = (f"the watch starts where the fix's bracket does, and it has none "
                                       f"({fix.why_not.why})")
    with phases.recording() as spent, kept_engines(reg, log) as engines, \
            Prober(reg, clone, experiments, fresh_references=fresh_references, force=force, log=log,
                   engines=engines) as prober:
        # The first round: every watched commit and both ends of every line; then each search's next commit.
        pending = [*(sha for _, commits in watched.values() for sha in commits),
                   *(sha for search in searches.values() for sha in (search.line[-1], search.line[0]))]
        while pending := list(dict.fromkeys(pending)):
            log(f"bisect: probing {len(pending)} commit(s): {', '.join(s[:12] for s in pending)}")
            prober.probe(pending, upcoming(searches, pending))
            pending = next_commits(searches, prober)
    reports = [ExperimentReport(_document(exp, brackets, searches, lines, watched.get(exp.name), prober, clone, tip,
                                          parameters[exp.name], made), unwatched.get(exp.name)) for exp in exps]
    total = time.monotonic() - started
    return BisectReport(str(clone.path), main, reports, prober.steps, total, phases.describe(spent, total))


def kept_engines(reg: Registry, log) -> engine.Engines:
    """One engine per era for a bisection's rounds, seeing every commit exported from the clone."""
    return engine.Engines(reg, reads=(cache_dir() / "trees",), logs=work_dir(reg.root) / "logs" / "engine", log=log)


def upcoming(searches: dict[tuple[str, Boundary], Search], pending: list[str]) -> list[str]:
    """The commits the searches may ask once ``pending`` is probed, whichever side each commit shows."""
    return list(dict.fromkeys(sha for search in searches.values() for sha in search.upcoming(pending)))


def next_commits(searches: dict[tuple[str, Boundary], Search], prober: Prober) -> list[str]:
    """Each search's next commit not yet probed, every commit already probed recorded on the way."""
    wanted = []
    for (name, _), search in searches.items():
        while (sha := search.next()) in prober.judged:
            search.record(sha, prober.seen(sha, name))
        if sha is not None:
            wanted.append(sha)
    return wanted


def _document(exp: Experiment, brackets, searches, lines, watched, prober: Prober, clone: Clone, tip: str,
              parameters: BisectParameters, made: provenance.Provenance) -> BisectDocument:
    found = {}
    for boundary in Boundary:
        key, bracket = (exp.name, boundary), brackets[(exp.name, boundary)]
        if bracket.why_not is not None:
            newest = clone.commit(tip) if bracket.why_not.finding is Finding.OUTSIDE_HISTORY else None
            found[boundary] = BoundaryReport(boundary, bracket.source, bracket.why_not.finding, bracket.why_not.why,
                                             newest=newest)
            continue
        search = searches[key]
        answer = search.answer()
        skipped = {sha: search.seen[sha].describe() for sha in search.line
                   if sha in search.seen and search.seen[sha].outcome not in boundary.sides}
        between = list(answer.unnarrowed)
        named = between if len(between) <= UNNARROWED_NAMED else [between[0], between[-1]]
        found[boundary] = BoundaryReport(
            boundary, bracket.source, answer.finding, answer.why, lines[key],
            prober.probed(answer.commit, exp.name) if answer.commit else None,
            prober.probed(answer.parent, exp.name) if answer.parent else None,
            tuple(prober.named(named)), skipped,
            clone.commit(tip) if answer.finding is Finding.OUTSIDE_HISTORY else None,
            # In the order the search asked for them: the same whichever experiments were bisected beside it.
            tuple(prober.probed(sha, exp.name) for sha in search.seen), len(between))
    report = None
    if watched is not None:
        line, commits = watched
        seen = {sha: prober.seen(sha, exp.name) for sha in commits}
        result = watch(commits, seen)
        walked = tuple(prober.probed(sha, exp.name) for sha in commits)
        report = WatchReport(line, walked, prober.commit(result.first_fixed) if result.first_fixed else None,
                             tuple(p for p in walked if p.commit.sha in result.flagged))
    pinned = exp.git.get("head")
    said = notes(exp.name, exp.pr, found[Boundary.FIX], pinned, exp.gate)
    if found[Boundary.FIX].finding is Finding.OUTSIDE_HISTORY and pinned and clone.resolve(pinned) \
            and not clone.is_ancestor(pinned, tip):
        said += (f"the registry's git pin {pinned[:12]} is in the clone, but not on {parameters.main}'s line: "
                 f"--main <a ref whose first-parent line holds it> walks to it",)
    return BisectDocument(exp.name, exp.pr, pinned, found[Boundary.FIX], found[Boundary.INTRODUCED], said, report,
                          parameters, made)
