"""What the report reads besides the comparison: scenario notes, sweep and mutation tables.

Everything here only reads files; the report renders what it is handed. Tables
are looked up in ``runs/`` first (fresh), else in ``results/`` (published).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import HarnessError
from ..core.errors import integrity as integrity_error
from ..core.paths import results_dir
from ..documents import integrity
from ..registry import SIDES, Registry

SWEEP_SCHEMAS = ("pdevidence-sweep/1", "pdevidence-sweep/2")
MUTATE_SCHEMA = "pdevidence-mutate/1"


@dataclass(frozen=True)
class ReportInputs:
    """Per experiment: scenario notes ({sid: {"title", "changes", "keys"}}), sweep and mutation tables."""

    scenarios: dict[str, dict[str, dict]] = field(default_factory=dict)
    sweeps: dict[str, dict] = field(default_factory=dict)
    mutations: dict[str, dict] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


def find_table(name: str, runs: Path, published: Path) -> Path | None:
    """A fresh table beats a published one: the report shows the newest evidence."""
    for directory in (runs, published):
        if (directory / name).is_file():
            return directory / name
    return None


def _read(path: Path, schemas: tuple[str, ...], keys: set[str]) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path} is unreadable: {exc}", todo="delete it and rerun the command that wrote it") \
            from None
    if not isinstance(doc, dict) or doc.get("schema") not in schemas or not keys <= doc.keys():
        raise HarnessError(f"{path} is not a table the report can read",
                           expected=f"schema {' or '.join(schemas)} with {', '.join(sorted(keys))}",
                           todo="delete it and rerun the command that wrote it")
    return doc


def load_sweep(path: Path) -> dict:
    doc = _read(path, SWEEP_SCHEMAS, {"experiment", "first_fixed", "releases"})
    if not all(isinstance(r, dict) and {"version", "classification"} <= r.keys() for r in doc["releases"]):
        raise HarnessError(f"{path}: every release needs version and classification",
                           todo="delete it and rerun the sweep")
    return doc


def load_mutations(path: Path) -> dict:
    return _read(path, (MUTATE_SCHEMA,), {"experiment", "score", "mutants"})


def load_table(reg: Registry, path: Path, load: Callable[[Path], dict]) -> dict:
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
        for side in SIDES:
            cell = pair["cells"].get(side)
            path = runs / cell["file"] if cell else None
            if path is None or not path.is_file():
                continue
            try:
                scenarios = json.loads(path.read_text(encoding="utf-8")).get("scenarios", {})
            except (OSError, ValueError):
                continue  # the comparison already reported this file; titles are decoration
            for sid, sc in scenarios.items():
                note = found.setdefault(sid, {"title": None, "changes": None, "keys": []})
                if note["title"] is None and isinstance(sc, dict):
                    note["title"] = sc.get("title")
    return notes


def _shown(path: Path, root: Path) -> str:
    """Paths under the project are shown relative to it, so the report reads the same everywhere."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return os.fspath(path)


def gather(reg: Registry, report: dict, *, runs: Path, published: Path) -> ReportInputs:
    """Everything the report shows besides ``report``, and the files it came from."""
    sweeps, mutations, sources = {}, {}, [reg.root / "experiments.toml"]
    for name in sorted({p["experiment"] for p in report["pairs"]}):
        if (path := find_table(f"sweep-{name}.json", runs, published)) is not None:
            sweeps[name] = load_table(reg, path, load_sweep)
            sources.append(path)
        if (path := find_table(f"mutate.{name}.json", runs, published)) is not None:
            mutations[name] = load_table(reg, path, load_mutations)
            sources.append(path)
    for pair in report["pairs"]:
        sources += [runs / c["file"] for c in pair["cells"].values() if (runs / c["file"]).is_file()]
    for entry in report.get("upstream", []):
        sources += [runs / s["file"] for s in entry["sides"].values() if s and "file" in s]
    return ReportInputs(scenario_notes(reg, report, runs), sweeps, mutations,
                        sorted({_shown(p, reg.root) for p in sources}))
