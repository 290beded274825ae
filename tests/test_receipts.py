"""Receipts: what the loader accepts (both schemas), what it refuses, and which pins compare."""

from __future__ import annotations

import copy
import json

import pytest
from synthetic import CONTAINED, make_project, receipt_doc, write_cell

from pdevidence import registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity
from pdevidence.documents.receipts import RECEIPT_SCHEMA, Receipt
from pdevidence.judge import compare


def v1(doc: dict) -> dict:
    """A receipt as schema /1 wrote it: no interpreter identity, no torch override."""
    doc = copy.deepcopy(doc)
    doc["schema"] = "pdevidence-receipt/1"
    for key in ("implementation", "identity"):
        del doc["python"][key]
    del doc["torch"]["override"]
    doc["torch"]["requested"] = "auto"
    return doc


def with_result(doc: dict) -> dict:
    return {**doc, "result": {"file": "r.json", "sha256": "a" * 64}}


@pytest.mark.parametrize("path", sorted((PROJECT / "results").glob("*.receipt.json")), ids=lambda p: p.name)
def test_every_published_receipt_loads_whichever_schema_wrote_it(path):
    receipt = Receipt.load(path)
    recorded = (receipt.python_implementation, receipt.python_identity)
    # /1 (the first publish) did not record the interpreter; /2 always does.
    assert recorded == (None, None) if receipt.schema_version == 1 else all(recorded)
    assert receipt.pins()["torch-channel"] == registry.load(PROJECT).torch_channel.value


def test_a_current_receipt_records_the_interpreter_the_override_and_what_made_it():
    doc = with_result(receipt_doc(channel="cpu", override="cpu"))
    receipt = Receipt.from_doc(doc, source="r")
    assert doc["schema"] == RECEIPT_SCHEMA
    assert (receipt.schema_version, receipt.python_implementation, receipt.python_identity) == \
        (4, "cpython", "cpython-3.12.3")
    assert receipt.provenance is not None
    assert receipt.containment == CONTAINED
    assert (receipt.torch_channel, receipt.torch_override) == ("cpu", "cpu")


@pytest.mark.parametrize(("table", "key", "why"), [
    ("python", "implementation", "python.implementation is missing"),
    ("python", "identity", "python.identity is missing"),
    ("torch", "override", "torch.override is missing"),
])
def test_a_schema_2_receipt_without_a_field_it_adds_is_refused_naming_it(table, key, why):
    doc = with_result(receipt_doc())
    del doc[table][key]
    with pytest.raises(errors.HarnessError, match=why) as caught:
        Receipt.from_doc(doc, source="fresh.receipt.json")
    assert caught.value.code == errors.INTEGRITY and "fresh.receipt.json" in caught.value.what


@pytest.mark.parametrize(("field", "value", "why"), [
    ("identity", "pypy-3.12.3", "is not cpython-<version>"),
    ("identity", "cpython-twelve", "is not cpython-<version>"),
    ("implementation", 3, "python.implementation must be a string"),
])
def test_an_identity_that_is_not_the_implementation_and_a_version_is_refused(field, value, why):
    doc = with_result(receipt_doc())
    doc["python"][field] = value
    with pytest.raises(errors.HarnessError, match=why):
        Receipt.from_doc(doc, source="r")


@pytest.mark.parametrize("schema", ["pdevidence-receipt/5", "pdevidence-receipt/", None])
def test_an_unknown_receipt_schema_is_refused(schema):
    doc = with_result(receipt_doc())
    doc["schema"] = schema
    with pytest.raises(errors.HarnessError, match=r"expected pdevidence-receipt/<1\|2\|3\|4>"):
        Receipt.from_doc(doc, source="r")


def test_a_schema_3_receipt_loads_with_its_containment_unknown():
    doc = with_result(receipt_doc())
    doc["schema"] = "pdevidence-receipt/3"
    del doc["containment"]
    receipt = Receipt.from_doc(doc, source="r")
    assert (receipt.schema_version, receipt.containment) == (3, None)
    assert "containment" not in receipt.doc  # the document as written


@pytest.mark.parametrize(("change", "why"), [
    (lambda doc: doc.pop("containment"), "containment is missing"),
    (lambda doc: doc.update(containment=None), "containment must be an object"),
    (lambda doc: doc["containment"].update(tool="chroot"), "tool 'chroot' is not one of"),
    (lambda doc: doc["containment"].update(version=None), "names its tool's version"),
    (lambda doc: doc["containment"].update(tool="none", version=None), "an uncontained one why_not"),
    (lambda doc: doc["containment"].update(allowed_by="--allow-uncontained"), "allowed_by"),
    (lambda doc: doc["containment"]["limits"].update(processes="many"), "limits.processes has the wrong type"),
])
def test_a_schema_4_receipt_must_say_how_its_probe_was_contained(change, why):
    doc = with_result(receipt_doc())
    change(doc)
    with pytest.raises(errors.HarnessError, match=why) as caught:
        Receipt.from_doc(doc, source="r")
    assert caught.value.code == errors.INTEGRITY


def test_a_pin_that_a_schema_1_receipt_did_not_record_is_not_compared():
    fresh = Receipt.from_doc(with_result(receipt_doc()), source="fresh")
    published = Receipt.from_doc(with_result(v1(receipt_doc())), source="published")
    assert fresh.differing_pins(published) == published.differing_pins(fresh) == []
    pypy = with_result(receipt_doc())
    pypy["python"].update(implementation="pypy", identity="pypy-3.12.3")
    assert fresh.differing_pins(Receipt.from_doc(pypy, source="pypy")) == ["python-implementation"]


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "project")


def compare_with_published(project, fresh_receipt: dict, published_receipt: dict | None = None):
    for side in ("base", "head"):
        write_cell(project / "runs", side, receipt=fresh_receipt if side == "head" else None)
        write_cell(project / "results", side, receipt=published_receipt)
    integrity.regenerate(project)
    return compare.compare_all(registry.load(project), runs=project / "runs", published=project / "results",
                               kinds=["release"])


def test_another_torch_channel_than_the_published_one_is_environment_differs(project):
    summary = compare_with_published(project, receipt_doc(channel="cpu", override="cpu"))
    (pair,) = summary.pairs
    assert pair.verdict is compare.Verdict.ENVIRONMENT_DIFFERS and summary.exit_code == errors.ENVIRONMENT_DIFFERS
    assert pair.pins_differ == {"head": ["torch-channel"]}


def test_an_override_naming_the_published_channel_is_the_same_environment(project):
    (pair,) = compare_with_published(project, receipt_doc(override="pypi")).pairs
    assert pair.verdict is compare.Verdict.CONFIRMED, pair.reasons


def test_fresh_schema_2_receipts_match_published_schema_1_receipts_on_the_same_pins(project):
    (pair,) = compare_with_published(project, receipt_doc(), v1(receipt_doc())).pairs
    assert pair.verdict is compare.Verdict.CONFIRMED, pair.reasons
    published = json.loads((project / "results" / "demo.head.release-1.1.0.receipt.json").read_text())
    assert published["schema"] == "pdevidence-receipt/1"
