"""The JSON Schemas shipped in pdevidence/documents/schemas/, as validators for the tests."""

from __future__ import annotations

import json
from functools import cache

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from pdevidence.documents import SCHEMAS_DIR


@cache
def shipped() -> Registry:
    """Every shipped schema by its $id: one may refer to another's definitions (the bisect run to the document)."""
    found = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(SCHEMAS_DIR.glob("*.json"))]
    return Registry().with_resources((doc["$id"], Resource.from_contents(doc)) for doc in found if "$id" in doc)


@cache
def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=shipped())


def problems(name: str, doc: object) -> list[str]:
    """Every violation of schema ``name`` in ``doc``, as ``path: message`` (empty: valid)."""
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(doc))
