"""The one writer of results/: a declared set, staged, validated, then swapped in whole.

Every other command writes under runs/. ``manifest`` declares what results/
holds: per experiment its release-bracket cells (and its git cells, once
published), its full sweep table, its mutation table, its bisect document (when
a bisection was run: kept, never required), and the registry's OpenVEX example.
A publish takes the cells of one tree kind fresh from runs/, each other declared
file fresh from runs/ when there is one, else as already published
(verified), and nothing else. It stages them beside results/, writes the OSV
records, the report and the sums there, validates the lot (loaders, provenance,
the sweep's references), and then swaps the staged directory in. A crash at any
step leaves results/ as it was: the next publish (or verify) rolls an
interrupted swap back, or finishes one that had committed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..core import faults
from ..core.errors import INCOMPLETE, INTEGRITY, STALE, HarnessError
from ..core.errors import integrity as integrity_error
from ..core.files import relative, sha256_file, write_atomic
from ..core.locking import exclusive
from ..core.paths import results_dir
from ..documents import integrity
from ..documents.bisects import BisectDocument
from ..documents.bisects import file_name as bisect_file
from ..documents.provenance import republish_steps, stale_error
from ..documents.receipts import Receipt
from ..documents.results import Result, receipt_path
from ..documents.corpus_table import FILE as CORPUS_FILE
from ..documents.corpus_table import CorpusTable
from ..documents.tables import MutationTable, SweepTable
from ..judge import compare
from ..registry import SIDES, Registry
from ..sources import backports
from ..sources.backports import Variant
from ..report import report
from . import osv
from .advisories import load_openvex, load_osv
from .openvex import purl_of_release

STAGING = ".results.staging"  # beside results/: the same filesystem, so the swap is two renames
OLD = ".results.old"
LOCK = ".results.lock"  # held by a publish from its recovery to its commit: two never interleave
SUMS_NEW = f".{integrity.SUMS_FILE}.new"  # the staged sums; replacing SHA256SUMS.txt with it commits


@dataclass
class Published:
    files: list[Path]
    summary: compare.Summary  # the comparison of the published files with themselves
    sums: Path


@dataclass(frozen=True)
class Declared:
    """One file results/ holds, and how to take it in."""

    name: str  # relative to results/ (and to runs/)
    check: Callable[[Registry, Path], Any]  # loader plus whatever this kind of file must satisfy; raises
    fresh_required: bool = False  # a cell of the kind being published: only a fresh one will do
    optional: bool = False  # a cell of another kind: kept when published, never required


def manifest(reg: Registry, kind: str) -> list[Declared]:
    """Everything results/ holds after publishing ``kind``'s cells."""
    declared = []
    for exp in reg.experiments.values():
        for cell_kind in compare.COMPARED_KINDS:
            if cell_kind == "release" and not all(exp.releases.values()):
                continue
            for side in SIDES:
                if cell_kind == "git" and side not in exp.git:  # no pinned commit: no such cell
                    continue
                name = compare.expected_file(exp, side, cell_kind)
                checks = dict(fresh_required=cell_kind == kind, optional=cell_kind != kind)
                declared += [Declared(name, _check_result, **checks),
                             Declared(receipt_path(Path(name)).name, _check_receipt, **checks)]
        declared.append(Declared(f"sweep-{exp.name}.json", _check_sweep))
        if exp.mutants:
            declared.append(Declared(f"mutate.{exp.name}.json", _check_mutations))
        # A bisection needs a clone of SGLang's history, which not every publisher has: kept, never required.
        declared.append(Declared(bisect_file(exp.name), _check_bisect, optional=True))
    if reg.openvex_example:
        declared.append(Declared(openvex_example_name(reg), _check_openvex))
    if backports.files(reg.root):
        declared.append(Declared(CORPUS_FILE, _check_corpus))
    return declared


def openvex_example_name(reg: Registry) -> str:
    return f"openvex-sglang-{reg.openvex_example}.json"


# ---------------------------------------------------------------- what each declared file must satisfy


def _check_result(reg: Registry, path: Path) -> None:
    Result.load(path)


def _check_receipt(reg: Registry, path: Path) -> None:
    receipt = Receipt.load(path)
    if receipt.exit_status != 0:
        raise integrity_error(f"cannot publish {path.name}: its receipt records exit status {receipt.exit_status}",
                              todo="rerun the cell")
    if why := receipt.stale(reg.root):
        raise stale_error({path.name: why}, reg)


def _check_sweep(reg: Registry, path: Path) -> None:
    table = SweepTable.load(path)
    exp = reg.experiment(table.experiment)
    if why := table.stale(reg.root, relative(exp.probe, reg.root)):
        raise stale_error({path.name: why}, reg)
    if table.parameters.explicit:
        raise HarnessError(f"refusing to publish {path.name}: a partial sweep (releases named on the command line)",
                           expected=f"every release from the floor {reg.floor(exp.name)} up",
                           todo="rerun `nox -s sweep -- --references fresh` without naming versions",
                           code=INCOMPLETE)
    if table.parameters.missing_eras:
        raise HarnessError(f"refusing to publish {path.name}: a partial sweep (merged with --partial, no part for "
                           f"era {', '.join(table.parameters.missing_eras)})",
                           expected="a part of every era of the registry",
                           todo="run the missing era jobs (`nox -s \"sweep_era(<era>)\"`), then `sweep-merge` "
                           "without --partial", code=INCOMPLETE)
    published = results_dir(reg.root) / path.name
    if published != path and published.exists() and not integrity.problem(reg.root, relative(published, reg.root)):
        had = {r.version for r in SweepTable.load(published).releases}
        lost = sorted(had - {r.version for r in table.releases}, key=Version)
        if lost:
            raise HarnessError(f"refusing to publish {path.name}: it covers fewer releases than the published one "
                               f"(missing {', '.join(lost)})", todo="rerun the full `nox -s sweep`",
                               code=INCOMPLETE)


def _check_mutations(reg: Registry, path: Path) -> None:
    table = MutationTable.load(path)
    exp = reg.experiment(table.experiment)
    if why := table.stale(reg.root, relative(exp.probe, reg.root)):
        raise stale_error({path.name: why}, reg)
    if table.parameters.mutants != list(exp.mutants):
        raise stale_error({path.name: ["ran other mutants than the registry declares"]}, reg)


def _check_bisect(reg: Registry, path: Path) -> None:
    doc = BisectDocument.load(path)
    exp = reg.experiments.get(doc.experiment)
    if exp is None or path.name != bisect_file(doc.experiment):
        raise integrity_error(f"refusing to publish {path.name}: it is the bisect document of "
                              f"{doc.experiment!r}", expected=f"{bisect_file('<experiment>')} of an experiment of "
                              "the registry, under its own name", todo="rerun `python -m pdevidence bisect`")
    if why := doc.stale(reg.root, relative(exp.probe, reg.root)):
        raise stale_error({path.name: why}, reg)


def _check_corpus(reg: Registry, path: Path) -> None:
    """Current, and whole: every declared backport's three trees, each fix it ports, all answered."""
    table = CorpusTable.load(path)
    if why := table.stale(reg.root, [relative(exp.probe, reg.root) for exp in reg.experiments.values()]):
        raise stale_error({path.name: why}, reg)
    answered = {(a.release, a.experiment, a.variant) for a in table.answers}
    missing = [f"{b.release} {name} {variant.value}" for b in backports.load_all(reg.root, list(reg.experiments))
               for name in reg.experiments for variant in Variant if (b.release, name, variant) not in answered]
    if missing:
        raise HarnessError(f"refusing to publish {path.name}: a partial corpus (no answer for {', '.join(missing)})",
                           todo="rerun `python -m pdevidence corpus --references fresh` without --release",
                           code=INCOMPLETE)


def _check_openvex(reg: Registry, path: Path) -> None:
    doc = load_openvex(path)
    want = purl_of_release(reg.openvex_example)
    products = {p.get("@id") for s in doc["statements"] if isinstance(s, dict) for p in s.get("products", [])
                if isinstance(p, dict)}
    if products != {want}:
        raise integrity_error(f"refusing to publish {path.name}: its product is {', '.join(sorted(map(str, products)))}"
                              f", not the documented example {want}",
                              todo=f"write it with `python -m pdevidence check --references fresh --release "
                              f"{reg.openvex_example} --openvex runs/{path.name}`")


def _check_references(reg: Registry, staged: Path) -> None:
    """Each staged sweep table, and the corpus table, was judged against the base and head results being
    published."""
    stale = {}
    for path in sorted(staged.glob("sweep-*.json")):
        table = SweepTable.load(path)
        exp = reg.experiment(table.experiment)
        for side in SIDES:
            name = compare.expected_file(exp, side, "release")
            judged, now = table.parameters.references.get(name), sha256_file(staged / name)
            if judged != now:
                stale.setdefault(path.name, []).append(
                    f"judged against another {name} ({(judged or 'none')[:12]}, published {now[:12]}): "
                    "rerun `nox -s sweep -- --references fresh`")
    for path in sorted(staged.glob(bisect_file("*"))):  # bracketed by the sweep, judged by the results, published
        for name, judged in BisectDocument.load(path).parameters.references.items():
            now = sha256_file(staged / name) if (staged / name).is_file() else "none"
            if judged != now:
                stale.setdefault(path.name, []).append(
                    f"bracketed and judged by another {name} ({judged[:12]}, published {now[:12]}): rerun "
                    "`python -m pdevidence bisect` (with `--references fresh` when republishing)")
    corpus = staged / CORPUS_FILE
    if corpus.is_file():
        judged = CorpusTable.load(corpus).references
        for exp in reg.experiments.values():
            for side in SIDES:
                name = compare.expected_file(exp, side, "release")
                if judged.get(name) != sha256_file(staged / name):
                    stale.setdefault(corpus.name, []).append(
                        f"judged against another {name}: rerun `python -m pdevidence corpus --references fresh`")
    if stale:
        raise stale_error(stale, reg, what="sweep and corpus tables and bisect documents")


# ---------------------------------------------------------------- choosing, staging, swapping


def _choose(reg: Registry, runs: Path, kind: str) -> dict[str, Path]:
    """Each declared file's source: fresh from runs/, or as published (verified); refuses what is missing."""
    published = results_dir(reg.root)
    chosen, missing = {}, []
    for item in manifest(reg, kind):
        fresh, old = runs / item.name, published / item.name
        if fresh.is_file():
            chosen[item] = fresh
        elif item.fresh_required:
            missing.append(f"{item.name} (run `nox -s matrix`, or the {kind} cells)")
        elif old.is_file():
            chosen[item] = old
        elif not item.optional:
            missing.append(f"{item.name} ({_how_to_make(reg, item.name)})")
    if missing:
        raise HarnessError("cannot publish: the declared set is incomplete; missing " + "; ".join(missing),
                           code=INCOMPLETE, todo=republish_steps(reg))
    for item, source in chosen.items():
        if source.parent == published and (why := integrity.problem(reg.root, relative(source, reg.root))):
            raise integrity_error(f"refusing to publish: the published {relative(source, reg.root)}, which this "
                                  f"run would keep, fails verification: {why}",
                                  todo="restore it from git (`git checkout -- results/`), then publish again")
        try:
            item.check(reg, source)
        except HarnessError as exc:
            # A cell keeps its own code (a malformed fresh result is the probe's problem); a table or
            # document that does not load is an integrity failure.
            code = exc.code if exc.code in (STALE, INCOMPLETE, INTEGRITY) or item.fresh_required else INTEGRITY
            raise HarnessError(f"cannot publish {relative(source, reg.root)}: {exc.what}", expected=exc.expected,
                               todo=f"nothing was published; {exc.todo}", code=code) from None
    return {item.name: source for item, source in chosen.items()}


def _how_to_make(reg: Registry, name: str) -> str:
    if name.startswith("sweep-"):
        return "run `nox -s sweep -- --references fresh`"
    if name.startswith("mutate."):
        return f"run `nox -s \"mutate({name.split('.')[1]})\"`"
    if name == CORPUS_FILE:
        return "run `python -m pdevidence corpus --references fresh`"
    return (f"run `python -m pdevidence check --references fresh --release {reg.openvex_example} "
            f"--openvex runs/{name}`")


def gate(reg: Registry, runs: Path, kind: str, allow_unconfirmed: bool) -> list[dict]:
    """The fresh differential (base vs head vs the registry) must be confirmed, unless explicitly allowed: then
    what was not confirmed, for the published report to say (empty when every pair was)."""
    fresh = compare.compare_all(reg, runs=runs, published=None, kinds=[kind])
    unconfirmed = [p for p in fresh.pairs if p.verdict is not compare.Verdict.CONFIRMED]
    if unconfirmed and not allow_unconfirmed:
        lines = [f"  {p.experiment} ({p.kind}): {p.verdict.value}" + "".join(f"\n    {r}" for r in p.reasons)
                 for p in unconfirmed]
        raise HarnessError("refusing to publish: the fresh comparison is not a confirmed differential\n"
                           + "\n".join(lines), code=fresh.exit_code,
                           todo="fix what it names and rerun the cells; to publish it anyway, on the record, "
                           "pass `--allow-unconfirmed`")
    return [{"experiment": p.experiment, "kind": p.kind, "verdict": p.verdict.value, "reasons": list(p.reasons)}
            for p in unconfirmed]


def published_kinds(reg: Registry, published: Path) -> list[str]:
    """The tree kinds whose every cell is published: the published report covers each of them."""
    def complete(kind: str) -> bool:
        try:
            return all((published / compare.expected_file(exp, side, kind)).exists()
                       for exp in reg.experiments.values() for side in SIDES)
        except HarnessError:  # an experiment without release brackets has no release cells
            return False
    return [kind for kind in compare.COMPARED_KINDS if complete(kind)]


def recover(root: Path) -> None:
    """Finish what an interrupted publish left: roll back a swap that had not committed, drop the rest."""
    published, old, sums_new = results_dir(root), root / OLD, root / SUMS_NEW
    if sums_new.exists():  # not committed: results/ goes back to what it was
        if old.exists():
            if published.exists():
                shutil.rmtree(published)
            os.rename(old, published)
        sums_new.unlink()
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(root / STAGING, ignore_errors=True)


def _stage(reg: Registry, chosen: dict[str, Path], staged: Path,
           unconfirmed: list[dict]) -> tuple[list[Path], compare.Summary]:
    """The declared files, the OSV records and the report (saying which references were ``unconfirmed``), in
    ``staged``; validated there."""
    for name, source in chosen.items():
        write_atomic(staged / name, source.read_bytes())
    problems = integrity.document_problems(reg.root, staged)
    if problems:
        raise integrity_error("refusing to publish: staged files are not valid:\n"
                              + "\n".join(f"  {rel}: {why}" for rel, why in sorted(problems.items())))
    integrity.check_current(reg.root, "staged evidence", staged)
    _check_references(reg, staged)
    records = osv.write_records(reg, staged, previous=results_dir(reg.root))
    for record in records:
        load_osv(record)
    # The published report compares the published files with themselves: the differential as published.
    summary = compare.compare_all(reg, runs=staged, published=staged, kinds=published_kinds(reg, staged))
    summary.unconfirmed = unconfirmed
    written = report.write_summary(reg, summary, staged, runs=staged, published=staged,
                                   command="python -m pdevidence publish")
    return [*records, *written], summary


def _swap(root: Path, staged: Path) -> None:
    """results/ becomes ``staged``; committed when the new sums replace the old ones."""
    published = results_dir(root)
    write_atomic(root / SUMS_NEW, integrity.render(root, staged))
    published.mkdir(exist_ok=True)
    os.rename(published, root / OLD)
    faults.point("publish")
    os.rename(staged, published)
    os.replace(root / SUMS_NEW, root / integrity.SUMS_FILE)  # the commit
    shutil.rmtree(root / OLD)


def publish(reg: Registry, runs: Path, kind: str, *, allow_unconfirmed: bool = False) -> Published:
    root = reg.root
    # Beside results/, not in the work directory: runs with another PDEVIDENCE_WORK publish here too.
    with exclusive(root / LOCK, "results/ (another publish)"):
        recover(root)
        chosen = _choose(reg, runs, kind)
        unconfirmed = gate(reg, runs, kind, allow_unconfirmed)
        staged = root / STAGING
        staged.mkdir()
        try:
            extra, summary = _stage(reg, chosen, staged, unconfirmed)
            _swap(root, staged)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    published = results_dir(root)
    files = [published / name for name in chosen] + [published / p.relative_to(staged) for p in extra]
    return Published(sorted(files), summary, root / integrity.SUMS_FILE)
