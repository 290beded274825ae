"""Drift lane: does the evidence still hold on newer torch (and transformers)?

Recompiles the cell closure with newer pins, reruns a release-backed cell in
its own directory and compares its observations with the pinned cell's
published result (verified first, as check and sweep verify theirs).
Advisory: it never touches results/ and a change is a finding, not a failure.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cells import cells
from ..core import children
from ..core.errors import HarnessError, usage
from ..documents.references import references
from ..documents.results import Result
from ..documents.vocabulary import KeyStatus
from ..environments import uv_executable
from ..judge.compare import diff_observations
from ..registry import Registry

LATEST = "latest"


@dataclass
class DriftReport:
    experiment: str
    side: str
    pins: dict[str, str]
    status: str  # unchanged | changed | cannot run
    changed: list[str] = field(default_factory=list)  # scenario.key that moved
    error: str | None = None
    packages: dict[str, str] = field(default_factory=dict)


def drift_inputs(source: str, pins: dict[str, str]) -> str:
    """``cells.in`` with each named package re-pinned (``latest`` drops the pin)."""
    lines = []
    for line in source.splitlines():
        name = re.split(r"[=<>!~ \[;]", line.strip(), maxsplit=1)[0].lower()
        if name in pins:
            version = pins[name]
            line = name if version == LATEST else f"{name}=={version}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def compile_constraints(reg: Registry, pins: dict[str, str], dest: Path) -> Path:
    if reg.constraints_input is None:
        raise usage("the registry names no constraints_input to recompile for the drift lane")
    unknown = set(pins) - {"torch", "torchvision", "transformers"}
    if unknown:
        raise usage(f"the drift lane moves torch, torchvision and transformers, not {', '.join(sorted(unknown))}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = dest.with_suffix(".in")
    source.write_text(drift_inputs(reg.constraints_input.read_text(), pins))
    done = children.run([uv_executable(), "pip", "compile", "--quiet", "--no-header", "--generate-hashes",
                         "--python-version", reg.python, str(source), "-o", str(dest)],
                        capture_output=True, text=True)
    if done.returncode != 0:
        raise HarnessError(f"cannot resolve the drift pins {pins}: {done.stderr.strip()[-800:]}",
                           todo="pick versions that exist together on PyPI")
    return dest


def run(reg: Registry, experiment: str, side: str, pins: dict[str, str], *, published: Path,
        work: Path, log=print) -> DriftReport:
    # The published result, verified as check and sweep verify theirs: sums, loaders, made by this checkout.
    pinned = references(reg, reg.experiment(experiment), published, sides=(side,)).docs[side]
    constraints = compile_constraints(reg, pins, work / "drift" / f"{experiment}.{side}.txt")
    resolved = {m.group(1): m.group(2) for m in re.finditer(r"^(torch|torchvision|transformers)==(\S+)",
                                                            constraints.read_text(), re.M)}
    try:
        outcome = cells.run_cell(reg, cells.Cell(experiment, side, "release"), out_dir=work / "drift" / "runs",
                                 constraints=constraints, log=log)
    except HarnessError as exc:
        # SGLang failing to import on newer pins is exactly what this lane exists to find.
        return DriftReport(experiment, side, pins, "cannot run", error=str(exc), packages=resolved)
    fresh = Result.load(outcome.result, experiment=experiment, side=side)
    grid = diff_observations(pinned, fresh.doc)
    changed = [f"{sid}.{key}" for sid, sc in grid.items() for key, k in sc["keys"].items()
               if k["status"] is not KeyStatus.UNCHANGED]
    return DriftReport(experiment, side, pins, "changed" if changed else "unchanged", changed, packages=resolved)


def summary(report: DriftReport) -> str:
    moved = ", ".join(f"{k} {v}" for k, v in report.packages.items())
    lines = [f"drift ({report.experiment}, {report.side}) on {moved}: {report.status} (advisory)"]
    if report.changed:
        lines.append("  observations that moved against the pinned cell: " + ", ".join(report.changed))
    if report.error:
        lines += ["  " + line for line in report.error.splitlines()[:20]]
    return "\n".join(lines)


def document(report: DriftReport) -> dict:
    return {"schema": "pdevidence-drift/1", **asdict(report)}
