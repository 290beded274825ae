"""The advisory documents publish copies beside the results: OSV records and OpenVEX.

Checked for the shape a reader of that format relies on (the fields below,
with their types), not against the full specification.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import HarnessError
from ..core.files import read_json

# Per format: the fields every document has, and their JSON types.
OSV_FIELDS = {"id": str, "modified": str, "schema_version": str, "affected": list}
OPENVEX_FIELDS = {"@context": str, "@id": str, "statements": list}


def _load(path: Path, what: str, fields: dict[str, type]) -> dict:
    todo = "rerun the step that wrote it, or delete it"
    doc = read_json(path, what, todo=todo)
    if not isinstance(doc, dict):
        raise HarnessError(f"{path} is not an {what}: not a JSON object", todo=todo)
    wrong = [f"{key} ({kind.__name__})" for key, kind in fields.items() if not isinstance(doc.get(key), kind)]
    if wrong:
        raise HarnessError(f"{path} is not an {what}: missing or mistyped {', '.join(wrong)}",
                           expected=", ".join(f"{key} ({kind.__name__})" for key, kind in fields.items()),
                           todo=todo)
    return doc


def load_osv(path: Path) -> dict:
    return _load(path, "OSV record", OSV_FIELDS)


def load_openvex(path: Path) -> dict:
    return _load(path, "OpenVEX document", OPENVEX_FIELDS)
