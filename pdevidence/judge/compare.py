"""Aggregate cell results: base vs head, vs the registry's expectations, vs published.

Reads result files only; it never runs a probe. One ``PairReport`` per
experiment and tree kind carries the verdict and everything behind it.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..cells.cells import Cell
from ..core.errors import (
    INTEGRITY,
    HarnessError,
    usage,
    worst,
)
from ..core.files import relative
from ..documents import integrity
from ..documents.provenance import stale_error
from ..documents.receipts import Receipt
from ..documents.references import expected_file
from ..documents.reports import REPORT_SCHEMA
from ..documents.results import Result, receipt_path
from ..documents.vocabulary import KeyStatus, PublishedStatus, Verdict
from ..registry import SIDES, Experiment, Registry

COMPARED_KINDS = ("release", "git")
MISSING = "<missing>"
ABSENT = "absent"  # what a probe records for code that does not exist on a tree


@dataclass
class PairReport:
    experiment: str
    pr: int
    title: str
    kind: str
    cells: dict[str, dict[str, Any]]
    verdict: Verdict = Verdict.CONFIRMED
    reasons: list[str] = field(default_factory=list)
    grid: dict[str, dict[str, Any]] = field(default_factory=dict)
    expectation_failures: list[dict[str, Any]] = field(default_factory=list)
    published: dict[str, dict[str, Any]] = field(default_factory=dict)
    pins_differ: dict[str, list[str]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


@dataclass
class Summary:
    pairs: list[PairReport]
    upstream: list[dict] = field(default_factory=list)  # the PRs' own tests; informational
    # Published files (results/...) that fail verification, with why: any of them fails the comparison.
    published_failures: dict[str, str] = field(default_factory=dict)
    # The references a publish took in although the fresh comparison did not confirm them (--allow-unconfirmed):
    # experiment, kind, verdict, reasons each.
    unconfirmed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return worst([*(p.exit_code for p in self.pairs), *([INTEGRITY] if self.published_failures else [])])

    def to_json(self) -> dict:
        doc = {"schema": REPORT_SCHEMA, "exit_code": self.exit_code,
               "pairs": [{**asdict(p), "exit_code": p.exit_code} for p in self.pairs], "upstream": self.upstream,
               "published_failures": self.published_failures, "unconfirmed": self.unconfirmed}
        return json.loads(json.dumps(doc))  # enum members become their plain string values


def key_status(base: Any, head: Any) -> KeyStatus:
    """A value only one tree can have (a function that does not exist there) is absent, not a change."""
    if same(base, head):
        return KeyStatus.UNCHANGED
    if any(isinstance(v, str) and v in (MISSING, ABSENT) for v in (base, head)):
        return KeyStatus.ABSENT
    return KeyStatus.CHANGED


def same(a: Any, b: Any) -> bool:
    """Equal as JSON: ``1`` and ``true`` are different observations."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def diff_observations(base: dict, head: dict) -> dict[str, dict[str, Any]]:
    """Scenario by scenario, key by key (of two result documents): unchanged, changed or absent on one side."""
    grid = {}
    for sid in sorted(set(base["scenarios"]) | set(head["scenarios"]), key=_scenario_order):
        sides = {"base": base["scenarios"].get(sid), "head": head["scenarios"].get(sid)}
        keys = {}
        names = set()
        for sc in sides.values():
            names |= set((sc or {}).get("observed", {}))
        for key in sorted(names):
            values = {s: (sc or {}).get("observed", {}).get(key, MISSING) for s, sc in sides.items()}
            keys[key] = {**values, "status": key_status(values["base"], values["head"])}
        errors = {s: (sc or {}).get("error") for s, sc in sides.items()}
        present = {s: sc is not None for s, sc in sides.items()}
        if not all(present.values()):
            status = KeyStatus.ABSENT
        elif any(k["status"] is KeyStatus.CHANGED for k in keys.values()) or errors["base"] != errors["head"]:
            status = KeyStatus.CHANGED
        else:
            status = KeyStatus.UNCHANGED
        grid[sid] = {"status": status, "present": present, "errors": errors, "keys": keys}
    return grid


def _scenario_order(sid: str):
    head = sid.rstrip("abcdefghijklmnopqrstuvwxyz")
    digits = "".join(ch for ch in head if ch.isdigit())
    return (head.rstrip("0123456789"), int(digits or 0), sid)


def check_expected_keys(exp: Experiment, docs: dict[str, Result]) -> None:
    """An expected key no side observes is a registry typo, not a behaviour: say which and what is near."""
    for sid, expectation in sorted(exp.expect.items(), key=lambda kv: _scenario_order(kv[0])):
        ran = [docs[side].scenarios[sid] for side in SIDES
               if sid in docs[side].scenarios and docs[side].scenarios[sid].error is None]
        if not ran:
            continue  # the scenario is missing or raised on both sides: check_expectations says so
        observed = sorted(set().union(*(sc.observed for sc in ran)))
        tables = {"base": expectation.base, "head": expectation.head} if expectation.changes \
            else {"keys": expectation.base}
        if expectation.beside is not None:
            tables["beside.keys"] = dict.fromkeys(expectation.beside.keys)
        for table, values in tables.items():
            for key in sorted(values):
                if key not in observed:
                    near = difflib.get_close_matches(key, observed, n=1, cutoff=0.5)
                    hint = f"did you mean {near[0]!r}?" if near else f"it observes: {', '.join(observed)}"
                    raise usage(f"experiments.{exp.name}.expect.{sid}.{key}: scenario {sid} observes no key "
                                f"{key!r} on either side (declared in expect.{sid}.{table}); {hint}",
                                todo="fix the key in experiments.toml")


def check_expectations(exp: Experiment, docs: dict[str, Result]) -> list[dict[str, Any]]:
    """Every registry expectation against what each side observed."""
    failures = []
    for sid, expectation in sorted(exp.expect.items(), key=lambda kv: _scenario_order(kv[0])):
        for side in SIDES:
            sc = docs[side].scenarios.get(sid)
            if sc is None:
                failures.append({"scenario": sid, "side": side, "key": None,
                                 "expected": "scenario present", "observed": MISSING})
                continue
            if sc.error is not None:
                failures.append({"scenario": sid, "side": side, "key": None,
                                 "expected": "no error", "observed": sc.error})
            wanted = expectation.base if side == "base" else expectation.head
            for key, value in sorted(wanted.items()):
                got = sc.observed.get(key, MISSING)
                if not same(got, value):
                    failures.append({"scenario": sid, "side": side, "key": key,
                                     "expected": value, "observed": got})
    return failures


def _key_diffs(fresh: dict, published: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(fresh) | set(published)):
        a, b = fresh.get(key, MISSING), published.get(key, MISSING)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _key_diffs(a, b, f"{prefix}{key}.")
        elif not same(a, b):
            diffs.append(f"{prefix}{key}: published {_show(b)}, now {_show(a)}")
    return diffs


def _show(value) -> str:
    return MISSING if value == MISSING else json.dumps(value)


def _fresh_cells(reg: Registry, exp: Experiment, report: PairReport,
                 runs: Path) -> dict[str, tuple[Result, Receipt]] | None:
    """Both sides' fresh result and receipt, validated and current (else exit 8); None (and the report
    incomplete) if any is missing."""
    missing = []
    for side in SIDES:
        name, result = report.cells[side]["cell"], runs / report.cells[side]["file"]
        if not result.exists():
            missing.append(f"no result for {name}: run `nox -s \"{name}\"`")
        elif not receipt_path(result).exists():
            missing.append(f"no receipt for {name} beside {result.name}: rerun it with `nox -s \"{name}\" -- --force`")
    if missing:
        report.verdict, report.reasons = Verdict.INCOMPLETE, missing
        return None
    found = {side: (Result.load(runs / report.cells[side]["file"], experiment=exp.name, side=side),
                    Receipt.load(receipt_path(runs / report.cells[side]["file"]), experiment=exp.name, side=side))
             for side in SIDES}
    stale = {relative(receipt_path(runs / report.cells[side]["file"]), reg.root): why
             for side in SIDES if (why := found[side][1].stale(reg.root))}
    if stale:
        raise stale_error(stale, reg, what="cell results")
    return found


def compare_pair(reg: Registry, exp: Experiment, kind: str, runs: Path, published: Path | None,
                 bad_published: dict[str, str]) -> PairReport:
    """One experiment on one tree kind; ``published=None`` leaves the published artifacts out."""
    names = {side: expected_file(exp, side, kind) for side in SIDES}
    report = PairReport(exp.name, exp.pr, exp.title, kind,
                        cells={side: {"cell": Cell(exp.name, side, kind).name, "file": names[side]}
                               for side in SIDES})
    fresh = _fresh_cells(reg, exp, report, runs)
    if fresh is None:
        return report
    docs = {side: fresh[side][0] for side in SIDES}
    report.grid = diff_observations(docs["base"].doc, docs["head"].doc)
    check_expected_keys(exp, docs)
    report.expectation_failures = check_expectations(exp, docs)
    if not exp.expect:
        report.reasons.append(f"the registry declares no expected differential for {exp.name}")

    failed: list[str] = []
    for side in SIDES if published is not None else ():
        entry, pub_receipt, why = _against_published(runs / names[side], published / names[side], reg.root,
                                                     bad_published)
        report.published[side] = entry
        failed += why
        if pub_receipt is not None:
            differing = fresh[side][1].differing_pins(pub_receipt)
            if differing:
                report.pins_differ[side] = differing

    failing = sorted({f["scenario"] for f in report.expectation_failures}, key=_scenario_order)
    differs = [p["file"] for p in report.published.values() if p["status"] is PublishedStatus.DIFFERS]
    if failed:
        report.verdict = Verdict.INTEGRITY
        report.reasons += [f"{why}; refusing to compare against it" for why in failed]
    elif failing or not exp.expect:
        report.verdict = Verdict.NOT_REPRODUCED
        report.reasons.append("scenarios not as expected: " + ", ".join(failing) if failing else
                              "nothing to check the differential against")
    elif differs:
        report.verdict = Verdict.PUBLISHED_DIFFERS
        report.reasons += [f"{f} differs from the published results/{f}" for f in differs]
    elif report.pins_differ:
        report.verdict = Verdict.ENVIRONMENT_DIFFERS
        report.reasons += [f"{side}: {', '.join(keys)}" for side, keys in report.pins_differ.items()]
    return report


def _against_published(fresh: Path, published: Path, root: Path,
                       bad: dict[str, str]) -> tuple[dict[str, Any], Receipt | None, list[str]]:
    """The published status of one cell, its verified receipt, and why it failed verification (if it did)."""
    entry: dict[str, Any] = {"file": published.name}
    receipt = receipt_path(published)
    failed = [f"{relative(p, root)} fails verification ({bad[relative(p, root)]})"
              for p in (published, receipt) if relative(p, root) in bad]
    if not failed and not published.exists() and not receipt.exists():
        return {**entry, "status": PublishedStatus.UNPUBLISHED, "diffs": []}, None, []
    pub_receipt = None
    if not failed:
        try:
            pub_receipt = Receipt.load(receipt)
            Result.load(published)
        except HarnessError as exc:
            failed = [f"{relative(receipt if pub_receipt is None else published, root)} fails verification "
                      f"({exc.what})"]
    if failed:
        return {**entry, "status": PublishedStatus.FAILED, "diffs": failed}, None, failed
    if fresh.read_bytes() == published.read_bytes():
        return {**entry, "status": PublishedStatus.IDENTICAL, "diffs": []}, pub_receipt, []
    diffs = _key_diffs(Result.load(fresh).doc, Result.load(published).doc)
    return ({**entry, "status": PublishedStatus.DIFFERS, "diffs": diffs or ["same data, different bytes (formatting)"]},
            pub_receipt, [])


def compare_all(reg: Registry, *, runs: Path, published: Path | None, kinds: list[str]) -> Summary:
    """Every experiment on every kind; ``published=None`` compares base with head and the registry only.

    Published files that fail verification are reported (exit 5); published evidence other inputs made
    (and fresh results that are stale) are refused (exit 8): a comparison with them would mean nothing.
    """
    bad = integrity.failures(reg.root) if published is not None else {}
    prefix = f"{relative(published, reg.root)}/" if published is not None else None
    if published is not None and not any(rel.startswith(prefix) for rel in bad):
        integrity.check_current(reg.root, "published evidence", published)
    pairs = []
    for exp in reg.experiments.values():
        for kind in kinds:
            if kind == "git" and not exp.git:  # no pinned commits: no pinned-commit cells to compare
                continue
            try:
                pairs.append(compare_pair(reg, exp, kind, runs, published, bad))
            except HarnessError as exc:
                # An experiment without release brackets yet has no release cells to compare.
                if kind != "release" or all(exp.releases.values()):
                    raise
                pairs.append(PairReport(exp.name, exp.pr, exp.title, kind, cells={}, verdict=Verdict.INCOMPLETE,
                                        reasons=[str(exc)]))
    return Summary(pairs, published_failures={rel: why for rel, why in bad.items()
                                              if prefix and rel.startswith(prefix)})
