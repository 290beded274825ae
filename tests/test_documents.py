"""The document layer: old schema versions are read through explicit upgrade steps, never guessed."""

from __future__ import annotations

import pytest
from report_data import sweep_v1

from pdevidence.core.errors import HarnessError
from pdevidence.documents import receipts
from pdevidence.documents.tables import SweepTable
from pdevidence.documents.versions import Schema
from pdevidence.documents.vocabulary import Behaviour, Classification


def test_a_schema_reads_each_version_it_has_an_upgrade_step_for_and_no_other():
    steps = Schema("demo/", 3, {1: lambda d: {**d, "b": 1}, 2: lambda d: {**d, "c": d["b"] + 1}})
    doc = {"schema": "demo/1", "a": 0}
    assert [steps.version_of({"schema": f"demo/{v}"}) for v in (0, 1, 2, 3, 4)] == [None, 1, 2, 3, None]
    assert steps.upgrade(doc, 1) == {"schema": "demo/3", "a": 0, "b": 1, "c": 2}
    assert doc == {"schema": "demo/1", "a": 0}  # the document as written is left alone
    assert steps.readable == "demo/<1|2|3>" and steps.name == "demo/3"
    with pytest.raises(AssertionError):
        Schema("demo/", 3, {1: lambda d: d})  # a version without its step


def test_a_schema_1_sweep_table_upgrades_to_the_current_form():
    doc = {**sweep_v1(), "releases": [*sweep_v1()["releases"], {"version": "0.5.24", "classification": "partial"}]}
    table = SweepTable.from_doc(doc, source="v1")
    assert table.schema_version == 1 and table.doc is doc and "regressions" not in doc
    assert table.regressions == ["0.5.24"]  # derived by the rule schema 2 records
    assert table.flagged == ["0.5.22", "0.5.24"]  # and the release watch by the rule schema 3 records
    assert table.as_of is None and all(r.scenarios == {} for r in table.releases)
    assert table.releases[0].classification is Classification.PRE_FIX


def test_a_schema_2_sweep_table_is_typed():
    doc = {"schema": "pdevidence-sweep/2", "experiment": "demo", "first_fixed": "1.1", "regressions": [],
           "releases": [{"version": "1.1", "classification": "fixed", "scenarios": {"D1": "fixed"},
                         "differing": [], "error": None}]}
    (release,) = SweepTable.from_doc(doc, source="v2").releases
    assert release.scenarios == {"D1": Behaviour.FIXED}
    assert SweepTable.from_doc(doc, source="v2").flagged == []
    for bad in ({**doc, "schema": "pdevidence-sweep/4"}, {**doc, "regressions": "none"},
                {**doc, "releases": [{**doc["releases"][0], "scenarios": {"D1": "maybe"}}]}):
        with pytest.raises(HarnessError, match="is not a sweep table"):
            SweepTable.from_doc(bad, source="t.json")


def test_a_schema_1_receipt_upgrades_with_what_it_did_not_record_unknown():
    step = receipts.SCHEMA.upgrades[1]
    upgraded = step({"python": {"version": "3.12.1"}, "torch": {"channel": "pypi"}})
    assert upgraded["python"] == {"version": "3.12.1", "implementation": None, "identity": None}
    assert upgraded["torch"] == {"channel": "pypi", "override": None}


def test_children_run_honours_check_as_subprocess_run_does():
    import subprocess
    import sys

    from pdevidence.core import children

    assert children.run([sys.executable, "-c", "raise SystemExit(3)"]).returncode == 3
    with pytest.raises(subprocess.CalledProcessError) as err:
        children.run([sys.executable, "-c", "raise SystemExit(3)"], check=True)
    assert err.value.returncode == 3


def test_a_failed_atomic_write_leaves_nothing_behind(tmp_path):
    from pdevidence.core.files import write_atomic

    (tmp_path / "a.json").mkdir()  # the rename onto a directory fails after the temporary is written
    with pytest.raises(OSError):
        write_atomic(tmp_path / "a.json", "{}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
