"""Does ``check`` see each fix in every tree that carries it? The backport corpus, checked.

For each release with a declared backport (``backports/``), three trees go through the
same judge as ``check``, in one call (one warm engine per era): the release as published
(``pristine``), with every fix ported (``backport``), and with each port left incomplete
(``partial``). Each fix is expected to read ``affected``, ``fixed`` and ``partial`` on them
(``fixed`` throughout where the release already carries it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import environments
from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, usage
from ..core.paths import tree_lock_file, work_dir
from ..registry import Registry
from ..sources import backports, trees
from ..sources.backports import Backport, Variant
from ..sources.importable import importable_dir
from . import check

SCHEMA = "pdevidence-corpus/1"
EXPECTED = {Variant.PRISTINE: check.Status.AFFECTED, Variant.BACKPORT: check.Status.FIXED,
            Variant.PARTIAL: check.Status.PARTIAL}


def expected(backport: Backport, experiment: str, variant: Variant) -> check.Status:
    """A fix the release already carries reads fixed on all three trees; a ported one as its variant says."""
    return EXPECTED[variant] if experiment in backport.ports else check.Status.FIXED


@dataclass(frozen=True)
class Answer:
    release: str
    era: str | None
    variant: Variant
    check: check.ExperimentCheck
    expected: check.Status

    @property
    def as_expected(self) -> bool:
        return self.check.status is self.expected

    def to_json(self) -> dict:
        return {"release": self.release, "era": self.era, "variant": self.variant.value,
                "experiment": self.check.experiment, "pr": self.check.pr, "status": self.check.status.value,
                "expected": self.expected.value, "deciding": self.check.deciding,
                "result_sha256": self.check.result_sha256}


@dataclass(frozen=True)
class Corpus:
    answers: list[Answer]
    results: dict[tuple[str, Variant], check.CheckResult]  # each tree's whole check, for what went wrong

    @property
    def exit_code(self) -> int:
        return CONFIRMED if all(a.as_expected for a in self.answers) else BEHAVIOUR_DIFFERS

    def document(self) -> dict:
        return {"schema": SCHEMA, "answers": [a.to_json() for a in self.answers]}


def run(reg: Registry, releases: list[str] | None = None, *, fresh_references: bool = False, log=print) -> Corpus:
    """Every declared release's three trees, checked in one call."""
    names = list(reg.experiments)
    declared = backports.load_all(reg.root, names, releases)
    if not declared:
        raise usage(f"no backport is declared under {backports.DIRECTORY}/",
                    todo=f"declare one in {backports.DIRECTORY}/{backports.FILE_PREFIX}<release>.toml")
    lock = trees.LockFile(tree_lock_file(reg.root))
    work = work_dir(reg.root)
    targets, asked = [], []
    for backport in declared:
        release = trees.release_tree(backport.release, reg.python, lock)
        pristine = importable_dir(release, work)
        era = environments.era_of(reg, release)
        for variant in Variant:
            try:
                tree = backports.materialize(release, pristine, variant, backport, work)
            except backports.EditDoesNotApply as exc:
                raise usage(f"{backport.path.name}: {exc}", expected="each edit's old text exactly once in the "
                            f"pristine sglang {backport.release} (after the edits before it)",
                            todo="fix the backport file's edit") from None
            targets.append((check.Target(tree.kind, tree.ref, tree.resolved, tree.digest, tree.version,
                                         era.name if era else None), tree))
            asked.append((backport, variant, era.name if era else None))
    found = check.run_all(reg, targets, fresh_references=fresh_references, log=log)
    answers, results = [], {}
    for (backport, variant, era), result in zip(asked, found):
        results[(backport.release, variant)] = result
        answers += [Answer(backport.release, era, variant, e, expected(backport, e.experiment, variant))
                    for e in result.experiments]
    return Corpus(answers, results)


def table(corpus: Corpus) -> str:
    """Release x fix, one column per tree; an answer that is not the expected one says what was."""
    lines = [f"{'release':<9} {'era':<26} {'fix':<10} " + " ".join(f"{v.value:<24}" for v in Variant)]
    rows: dict[tuple[str, str], dict[Variant, Answer]] = {}
    for a in corpus.answers:
        rows.setdefault((a.release, a.check.experiment), {})[a.variant] = a
    for (release, experiment), cells in rows.items():
        era = next(iter(cells.values())).era or "current"
        shown = [cells[v].check.status.value + ("" if cells[v].as_expected else f" (expected {cells[v].expected.value})")
                 for v in Variant]
        lines.append(f"{release:<9} {era:<26} {experiment:<10} " + " ".join(f"{s:<24}" for s in shown))
    good = sum(a.as_expected for a in corpus.answers)
    lines.append(f"corpus: {good} of {len(corpus.answers)} answers as expected")
    wrong = {(a.release, a.variant) for a in corpus.answers if not a.as_expected}
    for release, variant in sorted(wrong, key=lambda rv: (trees.parse_version(rv[0]), rv[1].value)):
        lines += ["", f"{release} {variant.value}:", check.table(corpus.results[(release, variant)])]
    return "\n".join(lines)
