"""Aggregate cell results: base vs head, vs the registry's expectations, vs published.

Reads result files only; it never runs a probe. One ``PairReport`` per
experiment and tree kind carries the verdict and everything behind it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import integrity, results
from .cells import Cell
from .errors import (BEHAVIOUR_DIFFERS, CONFIRMED, ENVIRONMENT_DIFFERS, INCOMPLETE, INTEGRITY, HarnessError,
                     worst)
from .receipts import pins
from .registry import SIDES, Experiment, Registry
from .trees import tree_label

COMPARED_KINDS = ("release", "git")
REPORT_SCHEMA = "pdevidence-report/1"

CONFIRMED_V = "differential confirmed"
NOT_REPRODUCED = "not reproduced"
INCOMPLETE_V = "incomplete"
ENV_DIFFERS = "environment differs"
PUBLISHED_DIFFERS = "differs from published"
INTEGRITY_V = "published artifact failed verification"

VERDICT_CODES = {
    CONFIRMED_V: CONFIRMED,
    NOT_REPRODUCED: BEHAVIOUR_DIFFERS,
    PUBLISHED_DIFFERS: BEHAVIOUR_DIFFERS,
    INCOMPLETE_V: INCOMPLETE,
    ENV_DIFFERS: ENVIRONMENT_DIFFERS,
    INTEGRITY_V: INTEGRITY,
}
MISSING = "<missing>"
ABSENT = "absent"  # what a probe records for code that does not exist on a tree


@dataclass
class PairReport:
    experiment: str
    pr: int
    title: str
    kind: str
    cells: dict[str, dict[str, Any]]
    verdict: str = CONFIRMED_V
    reasons: list[str] = field(default_factory=list)
    grid: dict[str, dict[str, Any]] = field(default_factory=dict)
    expectation_failures: list[dict[str, Any]] = field(default_factory=list)
    published: dict[str, dict[str, Any]] = field(default_factory=dict)
    pins_differ: dict[str, list[str]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return VERDICT_CODES[self.verdict]


@dataclass
class Summary:
    pairs: list[PairReport]
    upstream: list[dict] = field(default_factory=list)  # the PRs' own tests; informational

    @property
    def exit_code(self) -> int:
        return worst(p.exit_code for p in self.pairs)

    def to_json(self) -> dict:
        return {"schema": REPORT_SCHEMA, "exit_code": self.exit_code,
                "pairs": [{**asdict(p), "exit_code": p.exit_code} for p in self.pairs], "upstream": self.upstream}


def expected_file(exp: Experiment, side: str, kind: str) -> str:
    """The result file name a registry cell produces, known without fetching anything."""
    pin = exp.release(side) if kind == "release" else exp.git[side]
    return results.result_name(exp.name, side, tree_label(kind, pin))


def key_status(base: Any, head: Any) -> str:
    """A value only one tree can have (a function that does not exist there) is absent, not a change."""
    if same(base, head):
        return "unchanged"
    if any(isinstance(v, str) and v in (MISSING, ABSENT) for v in (base, head)):
        return "absent"
    return "changed"


def same(a: Any, b: Any) -> bool:
    """Equal as JSON: ``1`` and ``true`` are different observations."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def diff_observations(base: dict, head: dict) -> dict[str, dict[str, Any]]:
    """Scenario by scenario, key by key: unchanged, changed or absent on one side."""
    grid = {}
    for sid in sorted(set(base["scenarios"]) | set(head["scenarios"]), key=_scenario_order):
        sides = {"base": base["scenarios"].get(sid), "head": head["scenarios"].get(sid)}
        keys = {}
        names = set()
        for sc in sides.values():
            names |= set((sc or {}).get("observed", {}))
        for key in sorted(names):
            values = {s: (sc or {}).get("observed", {}).get(key, MISSING) for s, sc in sides.items()}
            status = key_status(values["base"], values["head"])
            keys[key] = {**values, "status": status}
        errors = {s: (sc or {}).get("error") for s, sc in sides.items()}
        present = {s: sc is not None for s, sc in sides.items()}
        if not all(present.values()):
            status = "absent"
        elif any(k["status"] == "changed" for k in keys.values()) or errors["base"] != errors["head"]:
            status = "changed"
        else:
            status = "unchanged"
        grid[sid] = {"status": status, "present": present, "errors": errors, "keys": keys}
    return grid


def _scenario_order(sid: str):
    head = sid.rstrip("abcdefghijklmnopqrstuvwxyz")
    digits = "".join(ch for ch in head if ch.isdigit())
    return (head.rstrip("0123456789"), int(digits or 0), sid)


def check_expectations(exp: Experiment, docs: dict[str, dict]) -> list[dict[str, Any]]:
    """Every registry expectation against what each side observed."""
    failures = []
    for sid, expectation in sorted(exp.expect.items(), key=lambda kv: _scenario_order(kv[0])):
        for side in SIDES:
            sc = docs[side]["scenarios"].get(sid)
            if sc is None:
                failures.append({"scenario": sid, "side": side, "key": None,
                                 "expected": "scenario present", "observed": MISSING})
                continue
            if sc.get("error") is not None:
                failures.append({"scenario": sid, "side": side, "key": None,
                                 "expected": "no error", "observed": sc["error"]})
            wanted = expectation.base if side == "base" else expectation.head
            for key, value in sorted(wanted.items()):
                got = sc["observed"].get(key, MISSING)
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


def _receipt(path: Path) -> dict | None:
    try:
        return json.loads(results.receipt_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def compare_pair(reg: Registry, exp: Experiment, kind: str, runs: Path, published: Path,
                 bad_published: dict[str, str]) -> PairReport:
    names = {side: expected_file(exp, side, kind) for side in SIDES}
    report = PairReport(exp.name, exp.pr, exp.title, kind,
                        cells={side: {"cell": Cell(exp.name, side, kind).name, "file": names[side]}
                               for side in SIDES})
    missing = [report.cells[s]["cell"] for s in SIDES if not (runs / names[s]).exists()]
    if missing:
        report.verdict = INCOMPLETE_V
        report.reasons = [f"no result for {name}: run `nox -s \"{name}\"`" for name in missing]
        return report
    docs = {side: results.load(runs / names[side], experiment=exp.name, side=side) for side in SIDES}
    report.grid = diff_observations(docs["base"], docs["head"])
    report.expectation_failures = check_expectations(exp, docs)
    if not exp.expect:
        report.reasons.append(f"the registry declares no expected differential for {exp.name}")

    for side in SIDES:
        report.published[side] = _against_published(runs / names[side], published / names[side], bad_published)
        fresh_receipt, pub_receipt = _receipt(runs / names[side]), _receipt(published / names[side])
        if fresh_receipt and pub_receipt:
            a, b = pins(fresh_receipt), pins(pub_receipt)
            differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            if differing:
                report.pins_differ[side] = differing

    failing = sorted({f["scenario"] for f in report.expectation_failures}, key=_scenario_order)
    tampered = [p["file"] for p in report.published.values() if p["status"] == "failed verification"]
    differs = [p["file"] for p in report.published.values() if p["status"] == "differs"]
    if tampered:
        report.verdict = INTEGRITY_V
        report.reasons += [f"results/{f} fails SHA256SUMS.txt ({bad_published[f'results/{f}']}); "
                           "refusing to compare against it" for f in tampered]
    elif failing or not exp.expect:
        report.verdict = NOT_REPRODUCED
        report.reasons.append("scenarios not as expected: " + ", ".join(failing) if failing else
                              "nothing to check the differential against")
    elif differs:
        report.verdict = PUBLISHED_DIFFERS
        report.reasons += [f"{f} differs from the published results/{f}" for f in differs]
    elif report.pins_differ:
        report.verdict = ENV_DIFFERS
        report.reasons += [f"{side}: {', '.join(keys)}" for side, keys in report.pins_differ.items()]
    return report


def _against_published(fresh: Path, published: Path, bad: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": published.name}
    if f"results/{published.name}" in bad:
        return {**entry, "status": "failed verification", "diffs": [bad[f"results/{published.name}"]]}
    if not published.exists():
        return {**entry, "status": "unpublished", "diffs": []}
    if fresh.read_bytes() == published.read_bytes():
        return {**entry, "status": "identical", "diffs": []}
    try:
        diffs = _key_diffs(json.loads(fresh.read_text()), json.loads(published.read_text()))
    except ValueError as exc:
        diffs = [f"not comparable key by key: {exc}"]
    return {**entry, "status": "differs", "diffs": diffs or ["same data, different bytes (formatting)"]}


def compare_all(reg: Registry, *, runs: Path, published: Path, kinds: list[str]) -> Summary:
    bad = integrity.problems(reg.root)
    pairs = []
    for exp in reg.experiments.values():
        for kind in kinds:
            try:
                pairs.append(compare_pair(reg, exp, kind, runs, published, bad))
            except HarnessError as exc:
                if kind == "release" and not all(exp.releases.values()):
                    pairs.append(PairReport(exp.name, exp.pr, exp.title, kind, cells={}, verdict=INCOMPLETE_V,
                                            reasons=[str(exc)]))
                else:
                    raise
    return Summary(pairs)


def publish(reg: Registry, runs: Path, published: Path, kind: str) -> list[Path]:
    """Copy a kind's fresh results and receipts into results/; refuse if any is missing."""
    todo = [expected_file(exp, side, kind) for exp in reg.experiments.values() for side in SIDES]
    missing = [name for name in todo if not (runs / name).exists()]
    if missing:
        raise HarnessError(f"cannot publish: no fresh result for {', '.join(missing)}", code=INCOMPLETE,
                           todo=f"run `nox -s matrix` (or the {kind} cells) first")
    copied = []
    for name in todo:
        results.load(runs / name)
        for src in (runs / name, results.receipt_path(runs / name)):
            results.write_atomic(published / src.name, src.read_bytes())
            copied.append(published / src.name)
    return copied
