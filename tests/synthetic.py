"""Builders for a small synthetic project: a registry, results and receipts."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

from pdevidence.documents import provenance

PROJECT_PROBES = Path(__file__).resolve().parent.parent / "probes"

PY = f"{sys.version_info.major}.{sys.version_info.minor}"  # the cells' Python in fixture projects

BASE_SHA = "a" * 40
HEAD_SHA = "b" * 40

REGISTRY = f"""
schema = 1
python = "3.12"
torch_channel = "pypi"
constraints = "constraints/cells.txt"
release_floor = "1.0.0"

[experiments.demo]
pr = 1
title = "Rejected requests are retired at the door"
probe = "probes/probe_demo.py"

[experiments.demo.git]
base = "{BASE_SHA}"
head = "{HEAD_SHA}"

[experiments.demo.releases]
base = "1.0.0"
head = "1.1.0"

[experiments.demo.expect.D1]
changes = true
base = {{ enqueued = true, retired = false }}
head = {{ enqueued = false, retired = true }}

[experiments.demo.expect.D2]
changes = false
keys = {{ enqueued = true }}
"""

# What each side observes when the fix is there: D1 changes, D2 is a control.
# Two telling scenarios (D1 a prefill-like door, D3 a decode-like door) and a control (D2).
TWO_DOORS = REGISTRY + """
[experiments.demo.expect.D3]
changes = true
base = { receiver_created = true }
head = { receiver_created = false }
"""

OBSERVED = {
    "base": {"D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}},
    "head": {"D1": {"enqueued": False, "retired": True}, "D2": {"enqueued": True}},
}


# The in-cell files besides the probe that documents record (provenance): the kit and the drivers.
IN_CELL = ("_probekit.py", "probe_all.py", "engine.py", "probe_mutants.py", "_mutants.py")


def make_project(root: Path, registry: str = REGISTRY) -> Path:
    (root / "probes").mkdir(parents=True, exist_ok=True)
    (root / "constraints").mkdir(exist_ok=True)
    (root / "results").mkdir(exist_ok=True)
    (root / "experiments.toml").write_text(registry)
    (root / "constraints" / "cells.txt").write_text("")
    (root / "probes" / "probe_demo.py").write_text("print('demo probe')\n")
    for name in IN_CELL:
        (root / "probes" / name).write_text(f"# {name}\n")
    return root


# The real in-cell files: the probe kit, the era stand-ins and the drivers a cell, the engine and the mutation lane run.
REAL_IN_CELL = ("engine.py", "probe_all.py", "_probekit.py", "_serverconfig.py", "_serverenv.py", "_standins.py",
                "probe_mutants.py", "_mutants.py")


def with_real_probes(root: Path, probe: str) -> Path:
    """``root``'s probes/ holding this checkout's real in-cell files, and ``probe`` as the demo probe."""
    for name in REAL_IN_CELL:
        (root / "probes" / name).write_bytes((PROJECT_PROBES / name).read_bytes())
    (root / "probes" / "probe_demo.py").write_text(probe)
    return root


def made_by(root: Path, drivers: tuple[str, ...] = (),
            shaped: provenance.Shaped = provenance.Shaped.RESULT) -> dict:
    """The provenance block of a demo document made now in the project at ``root``."""
    files = [root / "probes" / "probe_demo.py", root / provenance.KIT, *(root / d for d in drivers),
             root / "experiments.toml", root / "constraints" / "cells.txt"]
    return provenance.record(root, files, shaped).to_json()


def result_doc(side: str, version: str, observed: dict | None = None, errors: dict | None = None) -> dict:
    observed = copy.deepcopy(observed or OBSERVED[side])
    return {
        "schema": "pd-differential-probe/1",
        "experiment": "demo",
        "side": side,
        "tree": {"kind": "release", "ref": version, "resolved": version},
        "scenarios": {
            sid: {"title": sid, "observed": obs, "error": (errors or {}).get(sid)} for sid, obs in observed.items()
        },
    }


# A well-formed provenance block that no checkout matches.
PLACEHOLDER = {"files": {"probes/probe_demo.py": "d" * 64}, "harness": "0" * 64}
# How a probe process ran, as ``sandbox.Containment.record`` writes it.
CONTAINED = {"tool": "bubblewrap", "version": "bubblewrap 0.8.0", "why_not": None, "allowed_by": None,
             "limits": {"memory_bytes": 8 << 30, "memory_by": "rlimit", "processes": 1024, "processes_by": "rlimit",
                        "file_bytes": 4 << 30, "seconds": 900.0, "why_unlimited": None}}


def receipt_doc(torch: str = "2.14.1+cpu", packages: dict | None = None, channel: str = "pypi",
                override: str | None = None) -> dict:
    """A receipt as ``receipts.build`` writes it; ``write_cell`` fills in the cell and the result's digest."""
    return {
        "schema": "pdevidence-receipt/4",
        "cell": "",
        "experiment": "demo",
        "side": "",
        "tree": {"kind": "release", "ref": "", "resolved": "", "sha256": "e" * 64, "source": "pypi"},
        "python": {"requested": "3.12", "version": "3.12.3", "implementation": "cpython",
                   "identity": "cpython-3.12.3", "platform": "Linux", "machine": "x86_64"},
        "torch": {"build": torch, "channel": channel, "requested": override or "registry", "override": override,
                  "note": ""},
        "packages": packages or {"torch": "2.14.1", "transformers": "5.12.1"},
        "constraints": {"file": "constraints/cells.txt", "sha256": "c" * 64},
        "probe": {"file": "probes/probe_demo.py", "sha256": "d" * 64},
        "result": {"file": "", "sha256": ""},
        "environment": {"path": "/tmp/env", "reused": False},
        "commands": [["python", "probes/probe_demo.py"]],
        "started": "2026-01-01T00:00:00+00:00",
        "finished": "2026-01-01T00:00:20+00:00",
        "duration_s": 20.0,
        "exit_status": 0,
        "cache_key": "f" * 64,
        "provenance": PLACEHOLDER,  # ``write_cell`` records the project's instead
        "containment": copy.deepcopy(CONTAINED),
    }


def write_cell(directory: Path, side: str, doc: dict | None = None, receipt: dict | None = None,
               kind: str = "release", root: Path | None = None) -> Path:
    """A cell's result and its receipt (recording the result's SHA-256 and, when the receipt has none, what
    made it in the project at ``root``, by default the directory's parent), as a real run writes them."""
    ref = {"base": "1.0.0", "head": "1.1.0"}[side] if kind == "release" else {"base": BASE_SHA, "head": HEAD_SHA}[side]
    path = directory / f"demo.{side}.{kind}-{ref if kind == 'release' else ref[:12]}.json"
    directory.mkdir(parents=True, exist_ok=True)
    if doc is None:
        doc = result_doc(side, ref)
        doc["tree"]["kind"] = kind
    path.write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
    receipt = copy.deepcopy(receipt or receipt_doc())
    receipt.update(cell=f"{'release' if kind == 'release' else 'probe'}(demo, {side})", side=side,
                   result={"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    receipt["tree"].update(kind=kind, ref=ref, resolved=ref)
    if receipt.get("provenance") == PLACEHOLDER:
        receipt["provenance"] = made_by(root or directory.parent)
    path.with_name(path.name.removesuffix(".json") + ".receipt.json").write_text(
        json.dumps(receipt, sort_keys=True, indent=2) + "\n")
    return path


def wheel_bytes(version: str, module_source: str, project: str = "sglang") -> bytes:
    """A minimal installable pure-Python wheel of ``project`` with ``module_source`` as its __init__."""
    import base64
    import hashlib
    import io
    import zipfile

    dist = f"{project}-{version}.dist-info"
    files = {
        f"{project}/__init__.py": module_source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            zf.writestr(info, data)
    return buf.getvalue()


def serve_index(server, wheels: dict[str, bytes], project: str = "sglang") -> str:
    """Serve ``{filename: bytes}`` as a PEP 691 JSON simple index; return the index URL."""
    import hashlib

    files = []
    for filename, data in wheels.items():
        url = server.serve(f"/files/{filename}", data)
        files.append({"filename": filename, "url": url, "hashes": {"sha256": hashlib.sha256(data).hexdigest()}})
    server.serve(f"/simple/{project}/", json.dumps({"files": files}).encode(),
                 content_type="application/vnd.pypi.simple.v1+json")
    return server.url("/simple")


# The smallest sweep table the report and publish accept: one release, fixed (/2: no provenance).
SWEEP = {"schema": "pdevidence-sweep/2", "experiment": "demo", "first_fixed": "1.1.0", "regressions": [],
         "as_of": "2026-10-01T00:00:00Z",
         "releases": [{"version": "1.0.0", "classification": "pre-fix", "scenarios": {"D1": "pre-fix"},
                       "differing": [], "error": None},
                      {"version": "1.1.0", "classification": "fixed", "scenarios": {"D1": "fixed"},
                       "differing": [], "error": None}]}
CELLS = ("demo.base.release-1.0.0.json", "demo.head.release-1.1.0.json")


def sweep_doc(root: Path, references: Path | None = None, **parameters) -> dict:
    """``SWEEP`` as the current sweep writes it in the project at ``root``: judged against the release cells in
    ``references`` (default runs/, else results/)."""
    if references is None:
        references = root / "runs" if (root / "runs" / CELLS[0]).exists() else root / "results"
    digests = {name: hashlib.sha256((references / name).read_bytes()).hexdigest()
               for name in CELLS if (references / name).exists()}
    return {**copy.deepcopy(SWEEP), "schema": "pdevidence-sweep/5",
            "flagged": [], "provenance": made_by(root, provenance.SWEEP_DRIVERS, provenance.Shaped.TABLE),
            "parameters": {"explicit": False, "pre": False, "floor": "1.0.0", "references": digests,
                           "missing_eras": [], **parameters}}


def write_sweep(path: Path, **parameters) -> None:
    """A current sweep table at ``path`` (in ``<project>/runs`` or ``<project>/results``)."""
    write_table(path, sweep_doc(path.parent.parent, **parameters))


# The smallest mutation table (/1: no provenance) and OpenVEX document publish accepts.
MUTATIONS = {"schema": "pdevidence-mutate/1", "experiment": "demo",
             "tree": {"kind": "release", "ref": "1.1.0", "resolved": "1.1.0"},
             "score": {"killed": 1, "applicable": 1, "total": 1}, "scenarios": ["D1"],
             "mutants": [{"id": "M1", "title": "drop the door check", "kind": "removes-fix",
                          "target": "sglang:retire", "operator": "noop", "status": "killed",
                          "killed_by": {"D1": ["retired"]}, "error": None}]}
OPENVEX = {"@context": "https://openvex.dev/ns/v0.2.0", "@id": "https://example.invalid/vex/1",
           "statements": [{"status": "fixed", "products": [{"@id": "pkg:pypi/sglang@1.1.0"}]}]}


def mutations_doc(root: Path) -> dict:
    """``MUTATIONS`` as the current lane writes it in the project at ``root``."""
    return {**copy.deepcopy(MUTATIONS), "schema": "pdevidence-mutate/2",
            "score": {"killed": 1, "by_observation": 1, "only_raising": 0, "applicable": 1, "total": 1},
            "provenance": made_by(root, provenance.MUTATION_DRIVERS, provenance.Shaped.TABLE),
            "parameters": {"mutants": ["M1"]}}


def write_table(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def publishable_project(root: Path) -> Path:
    """A demo project with fresh cells and a full, current sweep table in runs/: the smallest declared set."""
    project = make_project(root)
    for side in ("base", "head"):
        write_cell(project / "runs", side)
    write_sweep(project / "runs" / "sweep-demo.json")
    return project
