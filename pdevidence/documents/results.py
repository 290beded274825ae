"""Result documents: names and the typed result.

The result is the probe's contract (docs/formats.md); the file name says
experiment, side and tree: ``<experiment>.<side>.<kind>-<ref>.json``, with the
receipt beside it as ``....receipt.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import HarnessError
from ..core.files import read_json
from .versions import Schema

RESULT_SCHEMA_PREFIX = "pd-differential-probe/"
# What the probes write (probes/_probekit.py): a newer probe bumps it here too, with an upgrade step.
RESULT_SCHEMA = Schema(RESULT_SCHEMA_PREFIX, 1)
RECEIPT_SUFFIX = ".receipt.json"


def result_name(experiment: str, side: str, tree_label: str, suffix: str = ".json") -> str:
    return f"{experiment}.{side}.{tree_label}{suffix}"


def receipt_path(result: Path) -> Path:
    return result.with_name(result.name.removesuffix(".json") + RECEIPT_SUFFIX)


def result_beside(receipt: Path) -> Path:
    return receipt.with_name(receipt.name.removesuffix(RECEIPT_SUFFIX) + ".json")


@dataclass(frozen=True)
class TreeRef:
    kind: str
    ref: str
    resolved: str


@dataclass(frozen=True)
class Scenario:
    title: str | None
    observed: dict[str, Any]
    error: dict[str, Any] | None  # what the scenario raised, or None


@dataclass(frozen=True)
class Result:
    """A validated probe result; ``doc`` keeps the document as written, for key-by-key diffs."""

    schema_version: int
    experiment: str
    side: str
    tree: TreeRef
    scenarios: dict[str, Scenario]
    doc: dict[str, Any]

    @classmethod
    def from_doc(cls, doc: Any, *, source: str, experiment: str | None = None, side: str | None = None) -> Result:
        """Check the result contract; a violation names the source and the field."""
        def bad(why: str) -> HarnessError:
            return HarnessError(f"{source} is not a valid probe result: {why}",
                                expected="the result document described in docs/formats.md",
                                todo="rerun the cell; if it persists, the probe is broken")

        if not isinstance(doc, dict):
            raise bad("not a JSON object")
        written = doc
        version, doc = RESULT_SCHEMA.read(doc, bad)
        for key in ("experiment", "side"):
            if not isinstance(doc.get(key), str):
                raise bad(f"{key} must be a string")
        if experiment and doc["experiment"] != experiment:
            raise bad(f"experiment {doc['experiment']!r}, expected {experiment!r}")
        if side and doc["side"] != side:
            raise bad(f"side {doc['side']!r}, expected {side!r}")
        tree = doc.get("tree")
        if not isinstance(tree, dict) or not all(isinstance(tree.get(k), str) for k in ("kind", "ref", "resolved")):
            raise bad("tree must have kind, ref and resolved (strings)")
        scenarios = doc.get("scenarios")
        if not isinstance(scenarios, dict) or not scenarios:
            raise bad("no scenarios")
        parsed = {}
        for sid, sc in scenarios.items():
            if not isinstance(sc, dict) or not isinstance(sc.get("observed"), dict) or "error" not in sc:
                raise bad(f"scenario {sid} must have observed and error")
            if not (sc["error"] is None or isinstance(sc["error"], dict)):
                raise bad(f"scenario {sid}: error must be null or an object")
            title = sc.get("title")
            if not (title is None or isinstance(title, str)):
                raise bad(f"scenario {sid}: title must be a string")
            parsed[sid] = Scenario(title, sc["observed"], sc["error"])
        return cls(version, doc["experiment"], doc["side"],
                   TreeRef(tree["kind"], tree["ref"], tree["resolved"]), parsed, written)

    @classmethod
    def load(cls, path: Path, *, experiment: str | None = None, side: str | None = None) -> Result:
        doc = read_json(path, "result", todo="run its cell (`nox -l` lists the cells); rerun it if the file is corrupt")
        return cls.from_doc(doc, source=str(path), experiment=experiment, side=side)


def validate(doc: object, *, source: str, experiment: str | None = None, side: str | None = None) -> dict:
    """The document, once ``Result.from_doc`` accepts it (for callers that work on the JSON)."""
    return Result.from_doc(doc, source=source, experiment=experiment, side=side).doc


def load(path: Path, *, experiment: str | None = None, side: str | None = None) -> dict:
    """The document, once ``Result.load`` accepts it (for callers that work on the JSON)."""
    return Result.load(path, experiment=experiment, side=side).doc
