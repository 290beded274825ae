"""The one writer of results/: fresh, validated, confirmed artifacts, then the report and the sums.

Every other command writes under runs/. Publishing copies a kind's cell
results and receipts (and the optional tables other steps wrote) from runs/,
regenerates the report from the files just published, and SHA256SUMS.txt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import INCOMPLETE, HarnessError
from ..core.errors import integrity as integrity_error
from ..core.files import write_atomic
from ..core.paths import results_dir
from ..documents import integrity
from ..documents.receipts import Receipt
from ..documents.results import Result, receipt_path
from ..documents.tables import MutationTable, SweepTable
from ..judge import compare
from ..registry import SIDES, Registry
from ..report import report
from . import osv
from .advisories import load_openvex, load_osv

# Tables other steps write to runs/, published as they are when present (paths relative to runs/),
# each with the loader that must accept it first. The OSV records are not among them: publish
# writes them from the published sweep tables.
OPTIONAL_ARTIFACTS = {
    "sweep-*.json": SweepTable.load,  # the release sweep
    "mutate.*.json": MutationTable.load,  # mutation tables
    "openvex*.json": load_openvex,  # an OpenVEX example (`check ... --openvex runs/openvex-<target>.json`)
}


@dataclass
class Published:
    files: list[Path]
    summary: compare.Summary  # the comparison of the published files with themselves
    sums: Path


def cell_files(reg: Registry, runs: Path, kind: str) -> list[Path]:
    """Each experiment's fresh results and receipts for ``kind``, validated; refuses if any is missing or bad."""
    todo = [(exp, side, runs / compare.expected_file(exp, side, kind))
            for exp in reg.experiments.values() for side in SIDES]
    missing = [path.name for _, _, path in todo if not path.exists() or not receipt_path(path).exists()]
    if missing:
        raise HarnessError(f"cannot publish: no fresh result and receipt for {', '.join(missing)}", code=INCOMPLETE,
                           todo=f"run `nox -s matrix` (or the {kind} cells) first")
    files = []
    for exp, side, path in todo:
        Result.load(path, experiment=exp.name, side=side)
        receipt = Receipt.load(receipt_path(path), experiment=exp.name, side=side)
        if receipt.exit_status != 0:
            raise integrity_error(f"cannot publish {path.name}: its receipt records exit status "
                                  f"{receipt.exit_status}", todo="rerun the cell")
        files += [path, receipt_path(path)]
    return files


def optional_files(runs: Path) -> list[Path]:
    """The optional tables under ``runs``, each accepted by its loader; one that is not stops the publish."""
    found = {p: load for pattern, load in OPTIONAL_ARTIFACTS.items() for p in runs.glob(pattern) if p.is_file()}
    for path, load in sorted(found.items()):
        try:
            load(path)
        except HarnessError as exc:
            raise integrity_error(f"cannot publish: {exc.what}", expected=exc.expected,
                                  todo=f"nothing was published; {exc.todo}") from None
    return sorted(found)


def gate(reg: Registry, runs: Path, kind: str, allow_unconfirmed: bool) -> None:
    """The fresh differential (base vs head vs the registry) must be confirmed, unless explicitly allowed."""
    fresh = compare.compare_all(reg, runs=runs, published=None, kinds=[kind])
    unconfirmed = [p for p in fresh.pairs if p.verdict is not compare.Verdict.CONFIRMED]
    if unconfirmed and not allow_unconfirmed:
        lines = [f"  {p.experiment} ({p.kind}): {p.verdict.value}" + "".join(f"\n    {r}" for r in p.reasons)
                 for p in unconfirmed]
        raise HarnessError("refusing to publish: the fresh comparison is not a confirmed differential\n"
                           + "\n".join(lines), code=fresh.exit_code,
                           todo="fix what it names and rerun the cells; to publish it anyway, on the record, "
                           "pass `--allow-unconfirmed`")


def published_kinds(reg: Registry, published: Path) -> list[str]:
    """The tree kinds whose every cell is published: the published report covers each of them."""
    def complete(kind: str) -> bool:
        try:
            return all((published / compare.expected_file(exp, side, kind)).exists()
                       for exp in reg.experiments.values() for side in SIDES)
        except HarnessError:  # an experiment without release brackets has no release cells
            return False
    return [kind for kind in compare.COMPARED_KINDS if complete(kind)]


def publish(reg: Registry, runs: Path, kind: str, *, allow_unconfirmed: bool = False) -> Published:
    published = results_dir(reg.root)
    cells = cell_files(reg, runs, kind)
    extras = optional_files(runs)
    gate(reg, runs, kind, allow_unconfirmed)
    targets = {published / src.relative_to(runs): src for src in [*cells, *extras]}
    _check_untouched(reg.root, set(targets))
    for dest, src in targets.items():
        write_atomic(dest, src.read_bytes())
    osv_records = osv.write_records(reg, published)
    for record in osv_records:
        load_osv(record)
    integrity.regenerate(reg.root)
    # The published report compares the published files with themselves: the differential as published.
    summary = compare.compare_all(reg, runs=published, published=published, kinds=published_kinds(reg, published))
    written = report.write_summary(reg, summary, published, runs=published, published=published,
                                   command="python -m pdevidence publish")
    return Published(sorted([*targets, *osv_records, *written]), summary, integrity.regenerate(reg.root))


def _check_untouched(root: Path, replaced: set[Path]) -> None:
    """Published files this run does not replace must still verify: regenerating the sums would bless them."""
    bad = {rel: why for rel, why in integrity.failures(root).items()
           if rel.startswith("results/") and root / rel not in replaced
           and not Path(rel).name.startswith("report.")}
    if bad:
        raise integrity_error("refusing to publish: published files that this run does not replace fail "
                              "verification:\n" + "\n".join(f"  {rel}: {why}" for rel, why in sorted(bad.items())),
                              todo="restore them from git (`git checkout -- results/`), then publish again")
