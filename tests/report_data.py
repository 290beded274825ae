"""A small report dict shaped like the published one (two experiments, sweeps, mutants, PR tests).

Built here, not read from results/, so the report tests do not depend on what is published.
"""

from __future__ import annotations

import copy

from packaging.version import Version


def _keys(**pairs) -> dict:
    """key=(base, head) -> the grid's per-key entries, with compare's statuses."""
    out = {}
    for key, (base, head) in pairs.items():
        status = "unchanged" if base == head else "absent" if "absent" in (base, head) else "changed"
        out[key] = {"base": base, "head": head, "status": status}
    return out


def _scenario(**pairs) -> dict:
    keys = _keys(**pairs)
    status = "changed" if any(k["status"] == "changed" for k in keys.values()) else "unchanged"
    return {"status": status, "present": {"base": True, "head": True}, "errors": {"base": None, "head": None},
            "keys": keys}


def _pair(exp: str, pr: int, title: str, base: str, head: str, grid: dict) -> dict:
    return {
        "experiment": exp, "pr": pr, "title": title, "kind": "release",
        "cells": {side: {"cell": f"release({exp}, {side})", "file": f"{exp}.{side}.release-{version}.json"}
                  for side, version in (("base", base), ("head", head))},
        "verdict": "differential confirmed", "reasons": [], "grid": grid, "expectation_failures": [],
        "published": {side: {"file": f"{exp}.{side}.release-{v}.json", "status": "identical", "diffs": []}
                      for side, v in (("base", base), ("head", head))},
        "pins_differ": {}, "exit_code": 0,
    }


ADMISSION_TITLE = "Requests rejected at intake must not be admitted to a PD handoff"
PREFILL_TITLE = "Aborted prefill results are retired once, not cached, requeued or sent"
TITLES = {
    "A1": "1500-token request rejected at intake, offered to the prefill door",
    "A3p": "valid 16-token request, prefill door",
    "A9": "retirement of a rejected request that belongs to a streaming session",
    "B1": "final-chunk result, owned request, pending abort, bootstrap pending",
    "B2": "aborted middle-chunk result, no later chunk in flight, bootstrap pending",
    "B9": "control: normal (not aborted) final result, bootstrap done",
}


def report_dict() -> dict:
    admission = _pair("admission", 38935, ADMISSION_TITLE, "0.5.20", "0.5.21", {
        "A1": _scenario(abort_streamed=(0, 1), door_check=("absent", "present"), enqueued=(True, False),
                        finished_status=(None, 400), retired=(False, True), sender_created=(True, False)),
        "A3p": _scenario(abort_streamed=(0, 0), enqueued=(True, True), finished_status=(None, None)),
        "A9": _scenario(abort_streamed=(0, 1), retired=("absent", True), session_detached=("absent", True)),
    })
    prefill = _pair("prefill", 36988, PREFILL_TITLE, "0.5.19", "0.5.20", {
        "B1": _scenario(cached_unfinished=(1, 0), kv_chunk_sent=(0, 0), kv_released=(0, 1)),
        "B2": _scenario(release_inserts_prefix=(True, False), requeued=(1, 0)),
        "B9": _scenario(cached_unfinished=(1, 1), kv_released=(0, 0)),
    })
    upstream = {"experiment": "admission", "pr": 38935, "kind": "git", "label": "my-branch",
                "verdict": "tests fail on base, pass on head", "same_test_files": True, "changed": [],
                "sides": {
                    "base": {"file": "admission.base.git-17ba2c2e7c7b.upstream.json",
                             "totals": {"passed": 1, "failed": 2, "errors": 3, "skipped": 0, "total": 6},
                             "types": {"AttributeError": 5}},
                    "head": {"file": "admission.head.git-8f3d6944b76c.upstream.json",
                             "totals": {"passed": 6, "failed": 0, "errors": 0, "skipped": 0, "total": 6},
                             "types": {}}}}
    return {"schema": "pdevidence-report/1", "exit_code": 0, "pairs": [admission, prefill], "upstream": [upstream]}


def notes() -> dict:
    roles = {"A1": True, "A3p": False, "A9": True, "B1": True, "B2": True, "B9": False}
    declared = {"A1": ["abort_streamed", "enqueued", "finished_status", "retired", "sender_created"],
                "A3p": ["abort_streamed", "enqueued"], "A9": ["abort_streamed", "retired", "session_detached"],
                "B1": ["cached_unfinished", "kv_chunk_sent", "kv_released"], "B2": ["release_inserts_prefix", "requeued"],
                "B9": ["cached_unfinished", "kv_released"]}
    out: dict = {}
    for sid, changes in roles.items():
        exp = "admission" if sid.startswith("A") else "prefill"
        out.setdefault(exp, {})[sid] = {"title": TITLES[sid], "changes": changes, "keys": declared[sid]}
    return out


def sweep_v1() -> dict:
    """Schema 1, as published: one classification per release."""
    classes = ["pre-fix"] * 4 + ["fixed", "failed", "fixed"]
    versions = ["0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23.post1"]
    return {"schema": "pdevidence-sweep/1", "experiment": "admission", "first_fixed": "0.5.21",
            "releases": [{"version": v, "classification": c, "differing": [], "error": None}
                         for v, c in zip(versions, classes)]}


def sweep_v2() -> dict:
    """Schema 2: per-scenario classification; a release that could not be probed; a regression."""
    rows = [("0.5.17", "failed", {}), ("0.5.18", "neither", {"B1": "pre-fix", "B2": "neither"}),
            ("0.5.19", "pre-fix", {"B1": "pre-fix", "B2": "pre-fix"}),
            ("0.5.20", "fixed", {"B1": "fixed", "B2": "fixed"}),
            ("0.5.21", "partial", {"B1": "pre-fix", "B2": "fixed"}),
            ("0.5.22", "fixed", {"B1": "fixed", "B2": "fixed"})]
    return {"schema": "pdevidence-sweep/2", "experiment": "prefill", "first_fixed": "0.5.22",
            "regressions": ["0.5.21"],
            "releases": [{"version": v, "classification": c, "scenarios": s,
                          "differing": [k for k, x in s.items() if x == "neither"],
                          "error": "no wheel for this Python" if c == "failed" else None} for v, c, s in rows]}


def mutations() -> dict:
    return {"schema": "pdevidence-mutate/1", "experiment": "prefill",
            "tree": {"kind": "release", "ref": "0.5.20", "resolved": "0.5.20"},
            "score": {"killed": 2, "applicable": 3, "total": 4}, "scenarios": ["B1", "B2"],
            "mutants": [
                {"id": "M1", "title": "skip the release", "kind": "removes-fix", "target": "sglang.x:f",
                 "operator": "noop", "status": "killed", "killed_by": {"B1": ["kv_released"]}, "error": None},
                {"id": "M2", "title": "requeue again", "kind": "removes-fix", "target": "sglang.x:g",
                 "operator": "constant", "status": "killed", "killed_by": {"B2": ["requeued"]}, "error": None},
                {"id": "M3", "title": "over-broad abort", "kind": "over-broad", "target": "sglang.x:h",
                 "operator": "edit", "status": "survived", "killed_by": {}, "error": None},
                {"id": "M4", "title": "gone", "kind": "removes-fix", "target": "sglang.y:k", "operator": "swap",
                 "status": "not applicable", "killed_by": {}, "error": None},
            ]}


def sweep_v3() -> dict:
    """Schema 3: a release whose telling scenario raised, after the first fixed one: the release watch."""
    doc = sweep_v2()
    doc["releases"].append({"version": "0.5.23", "classification": "error", "scenarios": {"B1": "fixed", "B2": "error"},
                            "differing": ["B2"], "error": "B2: AttributeError: no attribute 'sender'"})
    return {**doc, "schema": "pdevidence-sweep/3", "first_fixed": "0.5.20", "flagged": ["0.5.21", "0.5.23"],
            "provenance": {"files": {"probes/probe_prefill_differential.py": "d" * 64}, "harness": "0" * 64},
            "parameters": {"explicit": False, "pre": False, "floor": "0.5.17", "references": {}}}


def sweep_v4() -> dict:
    """Schema 4: the controls judged too; a release fixed where the scenarios tell but departing from both sides
    on the control B9 (deviates), flagged by the watch."""
    doc = sweep_v3()
    doc["releases"].append({"version": "0.5.24", "classification": "deviates",
                            "scenarios": {"B1": "fixed", "B2": "fixed", "B9": "deviates"}, "differing": ["B9"],
                            "error": None, "deviations": {"B9": {"kv_released": {"tree": 1, "base": 0, "head": 0}}}})
    return {**doc, "schema": "pdevidence-sweep/4", "flagged": [*doc["flagged"], "0.5.24"]}


def sweep_v5() -> dict:
    """Schema 5: merged without an era's part (a partial table), its release that failed before the first fixed
    one flagged too."""
    doc = sweep_v4()
    return {**doc, "schema": "pdevidence-sweep/5", "flagged": ["0.5.17", *doc["flagged"]],
            "parameters": {**doc["parameters"], "missing_eras": ["torch2.7-tf4"]}}


def sweep_v6() -> dict:
    """Schema 6: a gated fix's release whose code is fixed with the gate on but whose default leaves it off
    (present but off), before the first release that turns it on by default."""
    doc = sweep_v5()
    gate = {"variable": "SGLANG_GATE", "on": "true", "state": "off"}
    off = {"version": "0.5.19.post1", "classification": "present but off", "scenarios": {"B1": "fixed", "B2": "fixed"},
           "differing": [], "error": None, "gate": gate}
    releases = sorted([*doc["releases"], off], key=lambda r: Version(r["version"]))
    return {**doc, "schema": "pdevidence-sweep/6", "releases": releases}


def full_document() -> dict:
    """What ``report.document`` makes from the dict plus everything gathered."""
    doc = copy.deepcopy(report_dict())
    doc.update(scenarios=notes(), sweeps={"admission": sweep_v1(), "prefill": sweep_v2()},
               mutations={"prefill": mutations()},
               made_by={"command": "python -m pdevidence compare --kind release",
                        "sources": ["experiments.toml", "runs/admission.base.release-0.5.20.json",
                                    "runs/sweep-admission.json"]})
    return doc


def many_experiments(experiments: int = 4, releases: int = 80, era_size: int = 8) -> dict:
    """A worst case for the timeline: four experiments over 80 releases with long labels, an era every 8
    releases, and in each experiment scenarios that stop being set aside at their own release, a fix, a
    one-release regression and a release that could not be probed, all at different releases, so that runs
    seldom line up."""
    versions = [f"0.{10 + i // 10}.{i % 10}.post{i % 3 + 1}" for i in range(releases)]
    doc: dict = {"schema": "pdevidence-report/1", "exit_code": 0, "pairs": [], "upstream": [], "scenarios": {},
                 "sweeps": {}, "eras": {v: f"era{i // era_size}" for i, v in enumerate(versions)}}
    for e in range(experiments):
        name, rows = f"fix{e}", [f"S{e}{j}" for j in range(6)]
        fixed = 52 + 5 * e
        doc["pairs"].append(_pair(name, 100 + e, f"the fix number {e}", versions[fixed - 1], versions[fixed], {}))
        doc["scenarios"][name] = {sid: {"title": sid, "changes": True, "keys": ["k"]} for sid in rows}

        def state(i: int, j: int) -> str:
            if i < 5 + 11 * j + 3 * e and j % 2:
                return "not deciding"
            return "fixed" if i >= fixed and i != fixed + 9 + e else "pre-fix"

        found = []
        for i, v in enumerate(versions):
            if i == 30 + 7 * e:
                found.append({"version": v, "classification": "failed", "differing": [], "error": "no wheel"})
                continue
            scenarios = {sid: state(i, j) for j, sid in enumerate(rows)}
            classes = set(scenarios.values()) - {"not deciding"}
            found.append({"version": v, "classification": classes.pop() if len(classes) == 1 else "partial",
                          "scenarios": scenarios, "differing": [], "error": None})
        doc["sweeps"][name] = {"schema": "pdevidence-sweep/4", "experiment": name, "first_fixed": versions[fixed],
                               "flagged": [versions[fixed + 9 + e]], "releases": found}
    return doc
