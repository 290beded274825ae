"""OSV records (schema 1.6) from the published sweep tables: one per experiment.

Pure functions from (registry experiment, sweep table, evidence hashes) to an
OSV dict; ``publish`` writes them to ``results/osv/``. A gated fix (the registry's
``gate``: it runs only where the server's environment turns it on, off by default) closes
no range: a scanner reads a ``fixed`` event as "upgrade and you are safe", which the
default environment does not make true. Its range stays open, the releases that carry the
fix are listed as affected, and ``details`` and ``database_specific.gate`` name the first
of them and the variable. Everything in a record
comes from its inputs, except that ``publish`` sets ``modified`` to when the
record's content last changed: the previous record's when nothing else did.
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from ..core import clock
from ..core.errors import HarnessError
from ..core.files import dumps, relative, sha256_file, write_atomic
from ..core.paths import results_dir
from ..documents.tables import ReleaseOutcome, SweepTable
from ..documents.vocabulary import LACKS_FIX, Classification
from ..registry import Experiment, Registry

SCHEMA_VERSION = "1.6.0"
# No CVE or GHSA names these fixes, so this database mints its own ids: a prefix, the
# year of the fixes (not of the run) and the PR number, which names the fix and never
# changes, so a rerun or a new release updates the same record instead of minting another.
ID_PREFIX = "PDEVIDENCE-2026-"
PR_URL = "https://github.com/sgl-project/sglang/pull/{pr}"
PACKAGE = {"ecosystem": "PyPI", "name": "sglang", "purl": "pkg:pypi/sglang"}
OSV_DIR = "osv"


def vuln_id(exp: Experiment) -> str:
    return f"{ID_PREFIX}{exp.pr}"


def events(releases: list[ReleaseOutcome], pd_first: str | None = None) -> list[dict]:
    """ECOSYSTEM range events from the classified releases, then every switch.

    The range opens where the sweep observed the vulnerable path arrive: at the first release that
    behaves pre-fix after a release observed not affected (it lacks the path), or when the sweep
    probed ``pd_first`` (the first release with PD disaggregation: none before it has a PD handoff)
    at the first pre-fix release from there. Without either the sweep cannot say when the flaw
    arrived, and the range opens at 0. A release that is pre-fix (or partly so) after a fixed one
    re-opens the range: a regression. Releases that matched neither side, raised or failed say
    nothing and change nothing.
    """
    ordered = sorted(releases, key=lambda r: Version(r.version))
    found, affected = [], False
    absent_seen = pd_first is not None and any(r.version == pd_first for r in ordered)
    for entry in ordered:
        if entry.classification is Classification.NOT_AFFECTED and not found:
            absent_seen = True
        elif entry.classification in LACKS_FIX and not affected:
            found.append({"introduced": entry.version if found or absent_seen else "0"})
            affected = True
        elif entry.classification is Classification.FIXED and affected:
            found.append({"fixed": entry.version})
            affected = False
    return found


def modified(table: SweepTable) -> str:
    """The sweep's as-of date (the newest release's upload time), to the second, in UTC."""
    as_of = table.as_of
    if not as_of:
        raise HarnessError(f"the sweep table of {table.experiment} has no as_of date",
                           todo="rerun the sweep (`nox -s sweep`), which records it, and publish it")
    return as_of.split(".")[0].removesuffix("Z") + "Z"


def record(exp: Experiment, table: SweepTable, hashes: dict[str, str], pd_first: str | None = None) -> dict:
    releases = table.releases
    seen = [r.version for r in releases if r.classification in LACKS_FIX]
    if not seen:
        raise HarnessError(f"no release of the sweep behaves pre-fix for {exp.name}: an OSV record would name "
                           "no affected range", todo="check the sweep table; publish needs a release observed "
                           "to lack the fix")
    not_affected = [r.version for r in releases if r.classification is Classification.NOT_AFFECTED]
    probed = [r.version for r in releases]
    fixed = table.first_fixed
    details = [
        f"SGLang PR #{exp.pr} ({PR_URL.format(pr=exp.pr)}): {exp.title}.",
        f"Decided by running the `{exp.name}` CPU differential probe on every SGLang release from "
        f"{probed[0]} to {probed[-1]} and comparing what the real code did with the published base and "
        "head results, not by version numbers.",
        f"First release that behaves as fixed: {fixed or 'none yet'}."
        + (f" Releases that behave as pre-fix again after it (regressions): {', '.join(table.regressions)}."
           if table.regressions else ""),
        (f"The range opens at {seen[0]}, the first release observed to behave pre-fix after releases that "
         f"lack the vulnerable path ({', '.join(not_affected)}: the sweep names the observation that shows it). "
         if not_affected and Version(not_affected[0]) < Version(seen[0]) else
         f"The range opens at {seen[0]}, the first release observed to behave pre-fix: the sweep probed every "
         f"release from {pd_first}, the first with PD disaggregation (no older release has a PD handoff). "
         if pd_first in probed else
         f"Releases before {probed[0]} were not probed, and none of those probed lacks the vulnerable path, so "
         "the range opens at 0: the sweep did not observe when the flaw arrived. ")
        + "Backports, forks and source builds can differ from their version number: "
        "`python -m pdevidence check` runs the probes on the build you have.",
    ]
    versions, ranges = seen, events(releases, pd_first)
    found_db: dict = {}
    if exp.gate is not None:
        carrying = [r.version for r in releases if r.classification is Classification.FIXED]
        versions = sorted({*seen, *carrying}, key=Version)
        ranges = ranges[:1]  # opened once, never closed: with the defaults, no release is fixed
        details.insert(2, f"The fix runs only where the server's environment sets {exp.gate.variable}="
                       f"{exp.gate.on} ({exp.gate.why}). The releases that carry it ({', '.join(carrying) or 'none yet'}"
                       ") behave as fixed only with it on, so the range is left open (no fixed event) and they are "
                       f"listed as affected: with the defaults they are. `python -m pdevidence check --server-env "
                       f"{exp.gate.variable}={exp.gate.on}` answers fixed for them.")
        found_db["gate"] = {"variable": exp.gate.variable, "on": exp.gate.on, "why": exp.gate.why,
                            "first_carrying": fixed}
    return {
        "schema_version": SCHEMA_VERSION,
        "id": vuln_id(exp),
        "modified": modified(table),
        "summary": exp.title,
        "details": "\n\n".join(details),
        "affected": [{
            "package": dict(PACKAGE),
            "ranges": [{"type": "ECOSYSTEM", "events": ranges}],
            "versions": versions,
            "database_specific": {"classification": {r.version: r.classification.value for r in releases}},
        }],
        "references": [{"type": "FIX", "url": PR_URL.format(pr=exp.pr)},
                       {"type": "PACKAGE", "url": "https://pypi.org/project/sglang/"}],
        "database_specific": {
            "experiment": exp.name,
            "first_fixed": fixed,
            "regressions": list(table.regressions),
            "evidence_sha256": dict(sorted(hashes.items())),
            **found_db,
        },
    }


def evidence_of(name: str, hashes: dict[str, str]) -> dict[str, str]:
    """The hashes of one experiment's files: its sweep table, results and receipts."""
    return {path: digest for path, digest in hashes.items()
            if Path(path).name.startswith(f"{name}.") or Path(path).name == f"sweep-{name}.json"}


def records(registry: Registry, sweep_docs: dict[str, SweepTable], hashes: dict[str, str]) -> dict[str, dict]:
    """File name -> OSV record, for every experiment with a sweep table."""
    return {f"{vuln_id(exp)}.json": record(exp, sweep_docs[name], evidence_of(name, hashes),
                                           registry.pd_first_release)
            for name, exp in registry.experiments.items() if name in sweep_docs}


def keep_modified(rec: dict, before: Path, now: str) -> dict:
    """``modified`` is when the record's content last changed: the previous record's when nothing else did,
    else ``now``."""
    try:
        old = json.loads(before.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and isinstance(old.get("modified"), str) and \
            {**old, "modified": None} == {**rec, "modified": None}:
        return {**rec, "modified": old["modified"]}
    return {**rec, "modified": now}


def write_records(reg: Registry, published: Path, previous: Path | None = None) -> list[Path]:
    """An OSV record per sweep table in ``published``, into its ``osv/``, with that evidence's hashes.

    The hashes name the files as published (results/...). With ``previous`` (the results/ being
    replaced), a record whose content equals the one there keeps its ``modified``; any other is
    modified now.
    """
    tables = {}
    for name in reg.experiments:
        path = published / f"sweep-{name}.json"
        if path.exists():
            tables[name] = SweepTable.load(path)
    shown = results_dir(reg.root)
    hashes = {relative(shown / p.name, reg.root): sha256_file(p) for p in sorted(published.glob("*.json"))
              if not p.name.startswith("report.")}
    written, now = [], clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    for filename, rec in records(reg, tables, hashes).items():
        if previous is not None:
            rec = keep_modified(rec, previous / OSV_DIR / filename, now)
        write_atomic(published / OSV_DIR / filename, dumps(rec))
        written.append(published / OSV_DIR / filename)
    return written
