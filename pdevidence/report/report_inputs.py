"""What the report reads besides the comparison: scenario notes, sweep and mutation tables, bisect documents.

Everything here only reads files; the report renders what it is handed. Tables
are looked up in ``runs/`` first (fresh), else in ``results/`` (published).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..core.errors import HarnessError
from ..core.errors import integrity as integrity_error
from ..core.files import relative
from ..core.paths import results_dir
from ..documents import integrity
from ..documents.bisects import BisectDocument
from ..documents.bisects import file_name as bisect_file
from ..documents.corpus_table import FILE as CORPUS_FILE
from ..documents.corpus_table import CorpusTable
from ..documents.results import Result
from ..documents.tables import MutationTable, SweepTable
from ..lanes.sweep_parts import CURRENT
from ..registry import SIDES, Registry

T = TypeVar("T")

@dataclass(frozen=True)
class ReportInputs:
    """Per experiment: scenario notes ({sid: {"title", "changes", "keys"}}), sweep and mutation tables, bisect
    documents; the backport corpus table; the era each swept release runs in."""

    scenarios: dict[str, dict[str, dict]] = field(default_factory=dict)
    sweeps: dict[str, dict] = field(default_factory=dict)
    mutations: dict[str, dict] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    corpus: dict | None = None
    eras: dict[str, str] = field(default_factory=dict)
    bisects: dict[str, dict] = field(default_factory=dict)  # per experiment, its bisect document


def find_table(name: str, runs: Path, published: Path) -> Path | None:
    """A fresh table beats a published one: the report shows the newest evidence."""
    for directory in (runs, published):
        if (directory / name).is_file():
            return directory / name
    return None


def load_table(reg: Registry, path: Path, load: Callable[[Path], T]) -> T:
    """A table; a published one (under results/) must first check out against SHA256SUMS.txt.

    A published table that fails its sums or its loader is a published artifact failing
    verification (exit 5), whatever its bytes now parse as.
    """
    try:
        path.resolve().relative_to(results_dir(reg.root).resolve())
    except ValueError:
        return load(path)
    rel = path.resolve().relative_to(reg.root.resolve()).as_posix()
    todo = "restore it from git (`git checkout -- results/`) or republish it with `nox -s publish`"
    why = integrity.problem(reg.root, rel)
    if why:
        raise integrity_error(f"published table {rel} fails verification: {why}", todo=todo)
    try:
        return load(path)
    except HarnessError as exc:
        raise integrity_error(f"published table {rel} fails verification: {exc.what}", todo=todo) from None


def scenario_notes(reg: Registry, report: dict, runs: Path) -> dict[str, dict[str, dict]]:
    """Titles from the compared result documents, roles (changes or control) from the registry."""
    notes: dict[str, dict[str, dict]] = {}
    for pair in report["pairs"]:
        exp = reg.experiments.get(pair["experiment"])
        found = notes.setdefault(pair["experiment"], {})
        for sid, expectation in (exp.expect if exp else {}).items():
            found.setdefault(sid, {"title": None, "changes": expectation.changes,
                                   "keys": sorted(set(expectation.base) | set(expectation.head))})
            if expectation.beside is not None:
                found[sid]["beside"] = {"keys": list(expectation.beside.keys), "why": expectation.beside.why}
        for side in SIDES:
            cell = pair["cells"].get(side)
            path = runs / cell["file"] if cell else None
            if path is None or not path.is_file():
                continue
            try:
                scenarios = Result.load(path).scenarios
            except HarnessError:
                continue  # the comparison already reported this file; titles are decoration
            for sid, sc in scenarios.items():
                note = found.setdefault(sid, {"title": None, "changes": None, "keys": []})
                if note["title"] is None:
                    note["title"] = sc.title
    return notes


def eras(reg: Registry, sweeps: dict[str, dict]) -> dict[str, str]:
    """Swept version -> the era it runs in (``current``: no declared era): the timeline cuts its runs there."""
    versions = {r["version"] for sweep in sweeps.values() for r in sweep["releases"]}
    return {v: era.name if (era := reg.era_of(v)) else CURRENT for v in sorted(versions)}


def gather(reg: Registry, report: dict, *, runs: Path, published: Path) -> ReportInputs:
    """Everything the report shows besides ``report``, and the files it came from."""
    sweeps, mutations, bisects, sources = {}, {}, {}, [reg.root / "experiments.toml"]
    for name in sorted({p["experiment"] for p in report["pairs"]}):
        if (path := find_table(f"sweep-{name}.json", runs, published)) is not None:
            sweeps[name] = load_table(reg, path, SweepTable.load).doc
            sources.append(path)
        if (path := find_table(f"mutate.{name}.json", runs, published)) is not None:
            mutations[name] = load_table(reg, path, MutationTable.load).doc
            sources.append(path)
        if (path := find_table(bisect_file(name), runs, published)) is not None:
            bisects[name] = load_table(reg, path, BisectDocument.load).to_json()
            sources.append(path)
    corpus = None
    if (path := find_table(CORPUS_FILE, runs, published)) is not None:
        corpus = load_table(reg, path, CorpusTable.load).to_json()
        sources.append(path)
    for pair in report["pairs"]:
        sources += [runs / c["file"] for c in pair["cells"].values() if (runs / c["file"]).is_file()]
    for entry in report.get("upstream", []):
        sources += [runs / s["file"] for s in entry["sides"].values() if s and "file" in s]
    # Files read from a staged publish are named where they are published.
    shown = [results_dir(reg.root) / p.relative_to(published) if p.is_relative_to(published) else p
             for p in sources]
    return ReportInputs(scenario_notes(reg, report, runs), sweeps, mutations,
                        sorted({relative(p, reg.root) for p in shown}), corpus, eras(reg, sweeps), bisects)
