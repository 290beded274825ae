"""Result documents: names, validation, atomic writes.

The result is the probe's contract (see the README); the file name says
experiment, side and tree: ``<experiment>.<side>.<kind>-<ref>.json``, with the
receipt beside it as ``....receipt.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import INCOMPLETE, HarnessError

RESULT_SCHEMA_PREFIX = "pd-differential-probe/"
RECEIPT_SUFFIX = ".receipt.json"


def result_name(experiment: str, side: str, tree_label: str, suffix: str = ".json") -> str:
    return f"{experiment}.{side}.{tree_label}{suffix}"


def receipt_path(result: Path) -> Path:
    return result.with_name(result.name.removesuffix(".json") + RECEIPT_SUFFIX)


def dumps(doc: dict) -> str:
    """The one serialization every result and receipt uses: stable bytes for stable data."""
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a temporary file in the same directory, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8") if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def validate(doc: object, *, source: str, experiment: str | None = None, side: str | None = None) -> dict:
    """Check the result contract; a violation names the file and the field."""
    def bad(why: str) -> HarnessError:
        return HarnessError(f"{source} is not a valid probe result: {why}",
                            expected="the result document described in the README",
                            todo="rerun the cell; if it persists, the probe is broken")

    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    if not str(doc.get("schema", "")).startswith(RESULT_SCHEMA_PREFIX):
        raise bad(f"schema {doc.get('schema')!r}")
    if experiment and doc.get("experiment") != experiment:
        raise bad(f"experiment {doc.get('experiment')!r}, expected {experiment!r}")
    if side and doc.get("side") != side:
        raise bad(f"side {doc.get('side')!r}, expected {side!r}")
    tree = doc.get("tree")
    if not isinstance(tree, dict) or not {"kind", "ref", "resolved"} <= tree.keys():
        raise bad("tree must have kind, ref and resolved")
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, dict) or not scenarios:
        raise bad("no scenarios")
    for sid, sc in scenarios.items():
        if not isinstance(sc, dict) or not isinstance(sc.get("observed"), dict) or "error" not in sc:
            raise bad(f"scenario {sid} must have observed and error")
    return doc


def load(path: Path, **expect) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessError(f"no result at {path}", code=INCOMPLETE,
                           todo="run its cell first (`nox -l` lists the cells)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HarnessError(f"{path} is corrupt: {exc}", todo="delete it and rerun its cell") from None
    return validate(doc, source=str(path), **expect)
