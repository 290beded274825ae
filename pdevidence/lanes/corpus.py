"""Does ``check`` see each fix in every tree that carries it? The backport corpus, checked.

For each release with a declared backport (``backports/``), three trees go through the
same judge as ``check``, in one call (one warm engine per era): the release as published
(``pristine``), with every fix ported (``backport``), and with each port left incomplete
(``partial``). Each fix is expected to read ``affected``, ``fixed`` and ``partial`` on them
(``fixed`` throughout where the release already carries it; ``fixed`` on the partial tree too where the fix is one
clause and its port declares that no partial port exists, ``partial = []``: that tree carries the whole port). A
gated fix is ported behind its gate, off by
default as the fix is: the corpus judges every tree with every gate on (``GATES_ON``), so a port reads as its
code does, and a release the sweep finds ``present but off`` reads ``fixed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import environments
from ..core.arguments import ServerEnvironment
from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, usage
from ..core.files import relative
from ..core.paths import results_dir, runs_dir, tree_lock_file, work_dir
from ..documents import provenance
from ..documents.corpus_table import CorpusAnswer, CorpusTable
from ..documents.provenance import Provenance
from ..documents.references import references
from ..documents import tables
from ..documents.vocabulary import CheckStatus, Classification
from ..registry import Registry
from ..sources import backports, era_choice, trees
from ..sources.backports import Backport, Variant
from ..sources.importable import importable_dir
from . import check

EXPECTED = {Variant.PRISTINE: CheckStatus.AFFECTED, Variant.BACKPORT: CheckStatus.FIXED,
            Variant.PARTIAL: CheckStatus.PARTIAL}


# What check answers, every gate on, on a release the sweep classified so.
AS_CLASSIFIED = {Classification.PRE_FIX: CheckStatus.AFFECTED, Classification.FIXED: CheckStatus.FIXED,
                 Classification.PARTIAL: CheckStatus.PARTIAL, Classification.NOT_AFFECTED: CheckStatus.NOT_AFFECTED,
                 Classification.DEVIATES: CheckStatus.DEVIATES, Classification.PRESENT_OFF: CheckStatus.FIXED}
GATES_ON = "the corpus: every gated fix turned on"


def gates_on(reg: Registry) -> ServerEnvironment | None:
    """The server environment the corpus checks with: each gate's variable at its ``on`` value (None: no gate)."""
    found = tuple((exp.gate.variable, exp.gate.on) for exp in reg.experiments.values() if exp.gate is not None)
    return ServerEnvironment(tuple(dict(found).items()), GATES_ON) if found else None


def expected(backport: Backport, experiment: str, variant: Variant,
             unported: dict[str, dict[str, CheckStatus]]) -> CheckStatus:
    """A ported fix reads as its variant says; a fix the file does not port reads on all three trees what the
    release reads in the sweep (``unported``: per experiment, per release): porting one fix must not move
    another's answer, unless a port declares it does (``moves``, with why)."""
    if experiment in backport.ports:
        if variant is Variant.PARTIAL and not backport.ports[experiment].has_partial:
            return CheckStatus.FIXED  # no partial port exists: the partial tree carries the whole port
        return EXPECTED[variant]
    moved = [port.moves[experiment] for port in backport.ports.values() if experiment in port.moves]
    if moved and variant is not Variant.PRISTINE:
        return CheckStatus(moved[0].status(variant))
    return unported[experiment][backport.release]


def _check_moves(backport: Backport, names: list[str]) -> None:
    """A declared move names an experiment this file does not port and a status check answers."""
    statuses = {s.value for s in CheckStatus}
    for port in backport.ports.values():
        for other, move in port.moves.items():
            where = f"{backport.path.name}: {port.experiment}.moves.{other}"
            if other not in names or other in backport.ports:
                raise usage(f"{where}: {other!r} is not an experiment this file leaves unported",
                            expected=f"one of: {', '.join(n for n in names if n not in backport.ports)}")
            bad = [s for s in (move.backport, move.partial) if s not in statuses]
            if bad:
                raise usage(f"{where}: {', '.join(bad)} is not a check status",
                            expected=f"one of: {', '.join(sorted(statuses))}")


def as_released(directory: Path, experiment: str, releases: list[str]) -> dict[str, CheckStatus]:
    """Per release, what check answers on it as released, from the sweep table in ``directory``."""
    path = directory / f"sweep-{experiment}.json"
    if not path.is_file():
        raise usage(f"the corpus needs {path} to know what {experiment} reads on the releases no backport ports it "
                    "into", todo="run the sweep first (`nox -s sweep`, with `-- --references fresh` when republishing)")
    found = {o.version: AS_CLASSIFIED.get(o.classification, CheckStatus.UNKNOWN)
             for o in tables.SweepTable.load(path).releases}
    missing = [r for r in releases if r not in found]
    if missing:
        raise usage(f"{path} classifies no {', '.join(missing)}", todo="sweep those releases, then run the corpus")
    return {r: found[r] for r in releases}


@dataclass(frozen=True)
class Corpus:
    table: CorpusTable
    results: dict[tuple[str, Variant], check.CheckResult]  # each tree's whole check, for what went wrong
    # (release, fix) whose port declares no partial port (partial = []): its partial tree carries the whole port.
    whole_on_partial: frozenset[tuple[str, str]] = frozenset()

    @property
    def exit_code(self) -> int:
        return CONFIRMED if self.table.as_expected else BEHAVIOUR_DIFFERS


def made_by(reg: Registry, files: list) -> Provenance:
    """What makes the table: what makes a sweep's (probes, kit, engine and driver, registry, every closure,
    harness) and the backport files."""
    closures = [environments.closure(reg), *(era.constraints for era in reg.eras.values())]
    return provenance.record(reg.root, [*provenance.inputs(reg, list(reg.experiments), provenance.SWEEP_DRIVERS,
                                                           closures), *files], provenance.Shaped.CORPUS)


def run(reg: Registry, releases: list[str] | None = None, *, fresh_references: bool = False, log=print) -> Corpus:
    """Every declared release's three trees, checked in one call."""
    names = list(reg.experiments)
    declared = backports.load_all(reg.root, names, releases)
    made = made_by(reg, [b.path for b in declared])  # before anything runs: what a change during the run must not pass for
    if not declared:
        raise usage(f"no backport is declared under {backports.DIRECTORY}/",
                    todo=f"declare one in {backports.DIRECTORY}/{backports.FILE_PREFIX}<release>.toml")
    for backport in declared:
        _check_moves(backport, names)
    lock = trees.LockFile(tree_lock_file(reg.root))
    work = work_dir(reg.root)
    python = environments.find_python(reg.python).path  # compiles the unpacked trees' bytecode
    targets, asked = [], []
    for backport in declared:
        release = trees.release_tree(backport.release, reg.python, lock)
        pristine = importable_dir(release, python)
        for variant in Variant:
            try:
                tree = backports.materialize(release, pristine, variant, backport, work, python)
            except backports.EditDoesNotApply as exc:
                raise usage(f"{backport.path.name}: {exc}", expected="each edit's old text exactly once in the "
                            f"pristine sglang {backport.release} (after the edits before it)",
                            todo="fix the backport file's edit") from None
            choice = era_choice.choose(reg, tree)
            targets.append((check.Target(tree.kind, tree.ref, tree.resolved, tree.digest, tree.version, choice.name,
                                         choice, tree.pins), tree))
            asked.append((backport, variant, choice.name))
    directory = runs_dir(reg.root) if fresh_references else results_dir(reg.root)
    digests = {name: sha for exp in reg.experiments.values()
               for name, sha in references(reg, exp, directory, fresh=fresh_references).digests.items()}
    unported = {name: as_released(directory, name, [b.release for b in declared if name not in b.ports])
                for name in names if any(name not in b.ports for b in declared)}
    found = check.run_all(reg, targets, fresh_references=fresh_references, log=log, server_env=gates_on(reg))
    answers, results = [], {}
    for (backport, variant, era), result in zip(asked, found):
        results[(backport.release, variant)] = result
        answers += [CorpusAnswer(backport.release, era, variant, e.experiment, e.pr, e.status,
                                 expected(backport, e.experiment, variant, unported), e.deciding, e.result_sha256)
                    for e in result.experiments]
    table = CorpusTable(answers, made, digests, [relative(b.path, reg.root) for b in declared])
    whole = frozenset((b.release, name) for b in declared for name, port in b.ports.items() if not port.has_partial)
    return Corpus(table, results, whole)


def table(corpus: Corpus) -> str:
    """Release x fix, one column per tree; an answer that is not the expected one says what was, and a partial
    tree's answer for a fix no partial port exists of says so."""
    answers = corpus.table.answers
    whole = corpus.whole_on_partial
    width = max([len("fix"), *(len(a.experiment) for a in answers)])
    lines = [f"{'release':<9} {'era':<26} {'fix':<{width}} " + " ".join(f"{v.value:<24}" for v in Variant)]
    rows: dict[tuple[str, str], dict[Variant, CorpusAnswer]] = {}
    for a in answers:
        rows.setdefault((a.release, a.experiment), {})[a.variant] = a
    for (release, experiment), cells in rows.items():
        era = next(iter(cells.values())).era or "current"
        shown = [cells[v].status.value + ("" if cells[v].as_expected else f" (expected {cells[v].expected.value})")
                 + (" (no partial port)" if v is Variant.PARTIAL and (release, experiment) in whole else "")
                 for v in Variant]
        lines.append(f"{release:<9} {era:<26} {experiment:<{width}} " + " ".join(f"{s:<24}" for s in shown))
    good = sum(a.as_expected for a in answers)
    lines.append(f"corpus: {good} of {len(answers)} answers as expected")
    wrong = {(a.release, a.variant) for a in answers if not a.as_expected}
    for release, variant in sorted(wrong, key=lambda rv: (trees.parse_version(rv[0]), rv[1].value)):
        # An unexpected answer is a backport or a probe to debug: every key.
        lines += ["", f"{release} {variant.value}:", check.table(corpus.results[(release, variant)], verbose=True)]
    return "\n".join(lines)
