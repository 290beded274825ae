"""OSV records (schema 1.6) from the published sweep tables: one per experiment.

Pure functions from (registry experiment, sweep table, evidence hashes, bisect
document) to an OSV dict: the PyPI range from the sweep, a GIT range from the
bisection (the commits it found); ``publish`` writes them to ``results/osv/``.

A gated fix (the registry's ``gate``: it runs only where the server's environment turns it on) is
judged as each release ships: a scanner reads a ``fixed`` event as "upgrade and you are safe", so a
release that carries the fix off by default (the sweep's "present but off") is affected and closes
nothing, and the first release whose own default turns it on is the fixed event. ``details`` and
``database_specific.gate`` name the variable and the releases that carry the fix off. The fix's commit
closes no GIT range: it brought the fix in off, and no bisection finds where a default turned it on. A gate
that holds only off some platforms (``gate.platforms``: a fix on by default on CUDA only) does not decide
the record, which answers for CUDA: ``details`` and ``database_specific.gate`` say where else it runs only
behind the variable.

Everything in a record comes from its inputs, except that ``publish`` sets ``modified`` to when the
record's content last changed: the previous record's when nothing else did.
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from ..core import clock
from ..core.arguments import DEFAULT_PLATFORM
from ..core.errors import HarnessError
from ..core.files import dumps, relative, sha256_file, write_atomic
from ..core.paths import results_dir
from ..documents.bisects import BisectDocument
from ..documents.bisects import file_name as bisect_file
from ..documents.tables import ReleaseOutcome, SweepTable, first_carrying
from ..documents.vocabulary import LACKS_FIX, Boundary, Classification, Finding
from ..registry import Experiment, Registry

SCHEMA_VERSION = "1.6.0"
# No CVE or GHSA names these fixes, so this database mints its own ids: a prefix, the
# year of the fixes (not of the run) and the PR number, which names the fix and never
# changes, so a rerun or a new release updates the same record instead of minting another.
ID_PREFIX = "PDEVIDENCE-2026-"
PR_URL = "https://github.com/sgl-project/sglang/pull/{pr}"
PACKAGE = {"ecosystem": "PyPI", "name": "sglang", "purl": "pkg:pypi/sglang"}
REPO = "https://github.com/sgl-project/sglang"  # the commits a bisection finds are upstream's
OSV_DIR = "osv"


def vuln_id(exp: Experiment) -> str:
    return f"{ID_PREFIX}{exp.pr}"


def events(releases: list[ReleaseOutcome], pd_first: str | None = None) -> list[dict]:
    """ECOSYSTEM range events from the classified releases, then every switch.

    The range opens where the sweep observed the vulnerable path arrive: at the first release that
    behaves pre-fix after a release observed not affected (it lacks the path), or when the sweep
    probed ``pd_first`` (the first release with PD disaggregation: none before it has a PD handoff)
    at the first pre-fix release from there. Without either the sweep cannot say when the flaw
    arrived, and the range opens at 0. A release that is pre-fix (or partly so, or carries a gated fix
    off by default) lacks the fix: after a fixed one it re-opens the range, a regression. Releases
    that matched neither side, raised or failed say nothing and change nothing.
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


def git_range(bisected: BisectDocument, *, gated: bool = False) -> dict | None:
    """The GIT range of the boundaries the bisection found (an introduction not found opens it at 0, as OSV
    allows); None when it found neither. A boundary not found is left out: ``git_said`` says why. A gated fix's
    commit closes nothing (the module's docstring says why)."""
    fix, introduced = bisected.fix, bisected.introduced
    if Finding.FOUND not in (fix.finding, introduced.finding):
        return None
    opened = introduced.commit.commit.sha if introduced.finding is Finding.FOUND else "0"
    found = [{"introduced": opened}]
    if fix.finding is Finding.FOUND and not gated:
        found.append({"fixed": fix.commit.commit.sha})
    return {"type": "GIT", "repo": REPO, "events": found}


def git_said(bisected: BisectDocument) -> dict:
    """Per boundary, what the bisection found: the commit, or why it is not in the GIT range."""
    said = {}
    for boundary in Boundary:
        found = bisected.boundary(boundary)
        said[boundary.value] = ({"finding": found.finding.value, "commit": found.commit.commit.sha,
                                 "pr": found.commit.commit.pr} if found.finding is Finding.FOUND else
                                {"finding": found.finding.value, "why": found.why})
    return said


def _git_details(bisected: BisectDocument) -> str:
    parts = []
    for boundary, name in ((Boundary.FIX, "fixed by"), (Boundary.INTRODUCED, "introduced by")):
        found = bisected.boundary(boundary)
        parts.append(f"{name} {found.commit.commit.describe()}" if found.finding is Finding.FOUND else
                     f"{name}: {found.finding.value} ({found.why})")
    return (f"Bisected by behaviour on upstream's history (`python -m pdevidence bisect {bisected.experiment}`): "
            f"{'; '.join(parts)}. The GIT range holds only the commits found.")


def modified(table: SweepTable) -> str:
    """The sweep's as-of date (the newest release's upload time), to the second, in UTC."""
    as_of = table.as_of
    if not as_of:
        raise HarnessError(f"the sweep table of {table.experiment} has no as_of date",
                           todo="rerun the sweep (`nox -s sweep`), which records it, and publish it")
    return as_of.split(".")[0].removesuffix("Z") + "Z"


def record(exp: Experiment, table: SweepTable, hashes: dict[str, str], pd_first: str | None = None,
           bisected: BisectDocument | None = None) -> dict:
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
    found_db: dict = {}
    if exp.gate is not None and not exp.gate.decides_on(DEFAULT_PLATFORM):
        details.insert(2, f"On {', '.join(exp.gate.platforms)} the fix runs by default, and these ranges are "
                       f"for {DEFAULT_PLATFORM}. Elsewhere it runs only where the server's environment sets "
                       f"{exp.gate.variable}={exp.gate.on} ({exp.gate.why}): `python -m pdevidence check "
                       f"--server-platform <platform>` answers for a server's platform and environment.")
        found_db["gate"] = {"variable": exp.gate.variable, "on": exp.gate.on, "why": exp.gate.why,
                            "platforms": list(exp.gate.platforms)}
    elif exp.gate is not None:
        off = [r.version for r in releases if r.classification is Classification.PRESENT_OFF]
        details.insert(2, f"The fix runs only where the server's environment sets {exp.gate.variable}="
                       f"{exp.gate.on} ({exp.gate.why}). The releases that carry it off by default "
                       f"({', '.join(off) or 'none'}) are listed as affected: with their defaults they are, and "
                       f"`python -m pdevidence check --server-env {exp.gate.variable}={exp.gate.on}` answers fixed "
                       f"for them. A release is fixed where its own default turns the fix on: "
                       f"{fixed or 'none yet'}.")
        found_db["gate"] = {"variable": exp.gate.variable, "on": exp.gate.on, "why": exp.gate.why,
                            "first_carrying": first_carrying(releases), "present_but_off": off}
    ranges = [{"type": "ECOSYSTEM", "events": events(releases, pd_first)}]
    if bisected is not None:
        details.append(_git_details(bisected))
        found_db["bisect"] = git_said(bisected)
        gated = exp.gate is not None and exp.gate.decides_on(DEFAULT_PLATFORM)
        if (found := git_range(bisected, gated=gated)) is not None:
            ranges.append(found)
    return {
        "schema_version": SCHEMA_VERSION,
        "id": vuln_id(exp),
        "modified": modified(table),
        "summary": exp.title,
        "details": "\n\n".join(details),
        "affected": [{
            "package": dict(PACKAGE),
            "ranges": ranges,
            "versions": seen,
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
    """The hashes of one experiment's files: its sweep table, bisect document, results and receipts."""
    return {path: digest for path, digest in hashes.items()
            if Path(path).name.startswith(f"{name}.") or Path(path).name in (f"sweep-{name}.json", bisect_file(name))}


def records(registry: Registry, sweep_docs: dict[str, SweepTable], hashes: dict[str, str],
            bisected: dict[str, BisectDocument] | None = None) -> dict[str, dict]:
    """File name -> OSV record, for every experiment with a sweep table (and its bisection's GIT range, if any)."""
    bisected = bisected or {}
    return {f"{vuln_id(exp)}.json": record(exp, sweep_docs[name], evidence_of(name, hashes),
                                           registry.pd_first_release, bisected.get(name))
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
    tables, bisected = {}, {}
    for name in reg.experiments:
        path = published / f"sweep-{name}.json"
        if path.exists():
            tables[name] = SweepTable.load(path)
        if (path := published / bisect_file(name)).exists():
            bisected[name] = BisectDocument.load(path)
    shown = results_dir(reg.root)
    hashes = {relative(shown / p.name, reg.root): sha256_file(p) for p in sorted(published.glob("*.json"))
              if not p.name.startswith("report.")}
    written, now = [], clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    for filename, rec in records(reg, tables, hashes, bisected).items():
        if previous is not None:
            rec = keep_modified(rec, previous / OSV_DIR / filename, now)
        write_atomic(published / OSV_DIR / filename, dumps(rec))
        written.append(published / OSV_DIR / filename)
    return written
