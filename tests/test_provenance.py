"""Verdicts that cannot lie: evidence records what made it, publish is a transaction over a declared set,
and references are verified before anything is judged by them."""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from synthetic import (
    MUTATIONS,
    OPENVEX,
    REGISTRY,
    make_project,
    mutations_doc,
    sweep_doc,
    write_cell,
    write_sweep,
    write_table,
)

from pdevidence import cli, registry
from pdevidence.core import clock, errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity, provenance
from pdevidence.documents.receipts import Receipt
from pdevidence.documents.tables import MutationTable, SweepTable
from pdevidence.documents.references import references
from pdevidence.publish import publish

# The demo registry with what a full publish declares besides cells and sweep: a mutant and an OpenVEX example.
FULL = REGISTRY.replace('release_floor = "1.0.0"', 'release_floor = "1.0.0"\nopenvex_example = "1.1.0"') + """
[experiments.demo.mutants.M1]
title = "drop the door check"
kind = "removes-fix"
target = "sglang:retire"
operator = "noop"
"""


def fresh_set(project: Path) -> None:
    """Everything the full registry declares, fresh in runs/, as the republish sequence leaves it."""
    for side in ("base", "head"):
        write_cell(project / "runs", side)
    write_sweep(project / "runs" / "sweep-demo.json")
    write_table(project / "runs" / "mutate.demo.json", mutations_doc(project))
    write_table(project / "runs" / "openvex-sglang-1.1.0.json", OPENVEX)


@pytest.fixture
def project(tmp_path):
    project = make_project(tmp_path / "project", FULL)
    fresh_set(project)
    return project


def run(project: Path, *argv: str) -> int:
    return cli.main(["--root", str(project), *argv])


def snapshot(project: Path) -> dict[str, bytes]:
    files = [p for p in (project / "results").rglob("*") if p.is_file()] + [project / integrity.SUMS_FILE]
    return {p.relative_to(project).as_posix(): p.read_bytes() for p in files if p.exists()}


# ---------------------------------------------------------------- provenance, recorded and cross-checked


def test_a_receipt_records_what_made_it_and_names_each_input_that_changed(project):
    receipt = Receipt.load(project / "runs" / "demo.base.release-1.0.0.receipt.json")
    assert set(receipt.provenance.files) == {"probes/probe_demo.py", "probes/_probekit.py", "experiments.toml",
                                             "constraints/cells.txt"}
    assert receipt.stale(project) == []
    (project / "probes" / "probe_demo.py").write_text("print('a comment changed')\n")
    (project / "probes" / "_probekit.py").write_text("# another kit\n")
    why = receipt.stale(project)
    assert [line.split(":")[0] for line in why] == ["probes/_probekit.py", "probes/probe_demo.py"]
    assert "made by another probe" in why[1] and "made by another probe kit" in why[0]


def test_a_digest_is_read_once_per_process_while_its_file_stays_as_it_was(tmp_path, monkeypatch):
    reads = []
    monkeypatch.setattr(provenance, "sha256_file", lambda path: reads.append(path) or path.read_text())
    monkeypatch.setattr(provenance, "_digests", {})
    monkeypatch.setattr(provenance, "RECENT_NS", 0)  # as if written long ago
    probe = tmp_path / "probe.py"
    probe.write_text("one")
    assert provenance.file_digest(probe) == provenance.file_digest(probe) == "one" and len(reads) == 1
    probe.write_text("three")
    assert provenance.file_digest(probe) == "three" and len(reads) == 2


def test_a_file_changed_just_now_is_read_again_even_when_its_stat_looks_the_same(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("observed = True\n")
    stat = probe.stat()
    before = provenance.file_digest(probe)
    probe.write_text("observed = Fals\n")  # same size
    os.utime(probe, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: only the recent change tells
    assert provenance.file_digest(probe) != before


def test_another_harness_makes_every_document_stale(project, monkeypatch):
    receipt = Receipt.load(project / "runs" / "demo.base.release-1.0.0.receipt.json")
    monkeypatch.setattr(provenance, "harness_digest", lambda shaped, package=None: "1" * 64)
    assert receipt.stale(project) == [f"made by another harness: {provenance.harness_name(provenance.Shaped.RESULT)} "
                                      f"recorded {receipt.provenance.harness[:12]}, this checkout 111111111111"]


# ---------------------------------------------------------------- which harness modules shape a document


def test_the_declared_modules_exist_and_a_table_is_shaped_by_what_shapes_a_result_and_the_judge():
    for modules in provenance.SHAPING.values():
        missing = [rel for rel in modules if not (provenance.HARNESS / rel).is_file()]
        assert not missing, f"declared in provenance.SHAPING but not in the package: {missing}"
        assert len(set(modules)) == len(modules)
    assert set(provenance.RESULT_MODULES) < set(provenance.TABLE_MODULES) < set(provenance.CORPUS_MODULES)
    judge = {p.relative_to(provenance.HARNESS).as_posix() for p in (provenance.HARNESS / "judge").glob("*.py")
             if p.name != "__init__.py"}
    assert judge <= set(provenance.TABLE_MODULES) - set(provenance.RESULT_MODULES)
    # A bisect document is shaped by what shapes a result, check's judge, and the search and its lines.
    bisecting = {p.relative_to(provenance.HARNESS).as_posix()
                 for p in (provenance.HARNESS / "lanes").glob("bisect*.py")}
    assert set(provenance.RESULT_MODULES) | bisecting | {"lanes/check.py", "judge/classify.py"} <= \
        set(provenance.BISECT_MODULES)


def edit(package: Path, rel: str) -> None:
    with open(package / rel, "a", encoding="utf-8") as fh:
        fh.write("# an edit\n")


@pytest.fixture
def harness_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the running package standing in for it: what the digests read."""
    package = tmp_path / "harness" / "pdevidence"
    shutil.copytree(provenance.HARNESS, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "HARNESS", package)
    return package


def test_editing_a_module_that_shapes_nothing_leaves_every_document_current(project, harness_copy):
    receipt = Receipt.load(project / "runs" / "demo.base.release-1.0.0.receipt.json")
    sweep = SweepTable.load(project / "runs" / "sweep-demo.json")
    mutations = MutationTable.load(project / "runs" / "mutate.demo.json")
    shaping = set(provenance.TABLE_MODULES)
    outside = sorted(p.relative_to(harness_copy).as_posix() for p in harness_copy.rglob("*.py"))
    outside = [rel for rel in outside if rel not in shaping]
    assert {"cli.py", "sources/fetch.py", "core/errors.py", "report/report.py", "lanes/check.py"} <= set(outside)
    for rel in outside:  # a comment, a log line, a refactor: in every module that decides no document's content
        edit(harness_copy, rel)
    assert receipt.stale(project) == []
    assert sweep.stale(project, "probes/probe_demo.py") == []
    assert mutations.stale(project, "probes/probe_demo.py") == []


@pytest.mark.parametrize("rel", provenance.TABLE_MODULES)
def test_editing_a_module_that_shapes_a_document_makes_it_stale(project, harness_copy, rel):
    receipt = Receipt.load(project / "runs" / "demo.base.release-1.0.0.receipt.json")
    sweep = SweepTable.load(project / "runs" / "sweep-demo.json")
    edit(harness_copy, rel)
    result_stale = receipt.stale(project)
    assert bool(result_stale) == (rel in provenance.RESULT_MODULES)
    if result_stale:
        assert result_stale[0].startswith("made by another harness: the harness modules that shape a result")
    assert sweep.stale(project, "probes/probe_demo.py")[0].startswith(
        "made by another harness: the harness modules that shape a table")


@pytest.mark.parametrize("rel", sorted(set(provenance.CORPUS_MODULES) | set(provenance.BISECT_MODULES)))
def test_a_module_changes_the_harness_digest_of_exactly_the_kinds_of_document_it_shapes(harness_copy, rel):
    before = {shaped: provenance.harness_digest(shaped) for shaped in provenance.Shaped}
    edit(harness_copy, rel)
    changed = {shaped for shaped in provenance.Shaped if provenance.harness_digest(shaped) != before[shaped]}
    assert changed == {shaped for shaped, modules in provenance.SHAPING.items() if rel in modules}


def test_the_published_evidence_is_as_current_after_an_edit_outside_the_declared_set(harness_copy):
    """The checkout's own published documents: what an edit of the command line or fetch code does to them."""
    before = integrity.stale_documents(PROJECT)
    edit(harness_copy, "cli.py")
    edit(harness_copy, "sources/fetch.py")
    assert integrity.stale_documents(PROJECT) == before
    edit(harness_copy, "judge/classify.py")
    after = integrity.stale_documents(PROJECT)
    tables = [rel for rel in after if not rel.endswith(".receipt.json")]
    assert tables and all("made by another harness: the harness modules that shape a" in "; ".join(after[rel])
                          and after[rel] != before.get(rel) for rel in tables)
    assert {rel: why for rel, why in after.items() if rel.endswith(".receipt.json")} == \
        {rel: why for rel, why in before.items() if rel.endswith(".receipt.json")}


def test_the_digest_is_of_paths_in_the_package_and_bytes_wherever_the_package_is(harness_copy, tmp_path):
    elsewhere = tmp_path / "site-packages" / "pdevidence"
    shutil.copytree(harness_copy, elsewhere)
    for shaped in provenance.Shaped:
        assert provenance.harness_digest(shaped) == provenance.harness_digest(shaped, elsewhere)


def test_old_documents_load_through_their_upgrade_steps_and_are_stale(project):
    old = json.loads((project / "runs" / "demo.base.release-1.0.0.receipt.json").read_text())
    old["schema"] = "pdevidence-receipt/2"
    del old["provenance"]
    receipt = Receipt.from_doc(old, source="old")
    assert receipt.provenance is None and receipt.stale(project) == [
        "it records no provenance (written before documents recorded what made them)"]
    table = MutationTable.from_doc(MUTATIONS, source="old")
    assert (table.provenance, table.parameters) == (None, None)
    assert table.stale(project, "probes/probe_demo.py")


def test_a_current_table_must_record_what_made_it(project):
    doc = sweep_doc(project)
    del doc["provenance"]
    with pytest.raises(errors.HarnessError, match="missing 'provenance'"):
        SweepTable.from_doc(doc, source="t")


def test_the_issue_a_changed_probe_is_never_blessed_by_checksums(project, capsys):
    """Change a probe (even a comment), run checksums as the error suggests: verify must still refuse."""
    assert run(project, "publish") == errors.CONFIRMED
    (project / "probes" / "probe_demo.py").write_text("print('demo probe')  # a comment\n")
    sums = (project / integrity.SUMS_FILE).read_bytes()
    assert run(project, "checksums") == errors.STALE
    err = capsys.readouterr().err
    assert "results/demo.base.release-1.0.0.receipt.json" in err and "made by another probe" in err
    assert "nox -s publish" in err
    assert (project / integrity.SUMS_FILE).read_bytes() == sums
    (project / integrity.SUMS_FILE).write_text(integrity.render(project))  # blessed by hand
    assert run(project, "verify") == errors.STALE
    assert run(project, "compare") == errors.STALE


def test_a_tampered_published_file_is_5_before_it_is_stale(project, capsys):
    assert run(project, "publish") == errors.CONFIRMED
    (project / "probes" / "probe_demo.py").write_text("print('changed')\n")
    (project / "results" / "sweep-demo.json").write_text("{}\n")
    assert run(project, "verify") == errors.INTEGRITY
    assert "results/sweep-demo.json" in capsys.readouterr().err


def test_compare_refuses_fresh_cells_made_by_another_probe(project, capsys):
    (project / "probes" / "probe_demo.py").write_text("print('changed')\n")
    assert run(project, "compare") == errors.STALE
    assert "runs/demo.base.release-1.0.0.receipt.json" in capsys.readouterr().err


# ---------------------------------------------------------------- references verified before use


@pytest.fixture
def published(project):
    assert run(project, "publish") == errors.CONFIRMED
    return registry.load(project)


def test_the_published_references_are_verified_before_use(published):
    refs = references(published, published.experiment("demo"), published.root / "results")
    assert refs.base["side"] == "base" and set(refs.digests) == {"demo.base.release-1.0.0.json",
                                                                 "demo.head.release-1.1.0.json"}


def test_a_tampered_reference_is_5_naming_it(published):
    path = published.root / "results" / "demo.head.release-1.1.0.json"
    doc = json.loads(path.read_text())
    doc["scenarios"]["D1"]["observed"]["retired"] = False
    path.write_text(json.dumps(doc))
    with pytest.raises(errors.HarnessError, match="results/demo.head.release-1.1.0.json") as caught:
        references(published, published.experiment("demo"), published.root / "results")
    assert caught.value.code == errors.INTEGRITY


def test_a_stale_reference_is_8_naming_it(published):
    (published.root / "probes" / "probe_demo.py").write_text("print('changed')\n")
    with pytest.raises(errors.HarnessError, match="results/demo.base.release-1.0.0.receipt.json") as caught:
        references(published, published.experiment("demo"), published.root / "results")
    assert caught.value.code == errors.STALE
    assert "--references fresh" in caught.value.todo


@pytest.mark.parametrize("command", [["check", "--python", sys.executable], ["sweep", "1.1.0"]])
def test_check_and_sweep_refuse_a_tampered_or_stale_reference_before_running_anything(published, capsys, command):
    root = published.root
    receipt = root / "results" / "demo.head.release-1.1.0.receipt.json"
    receipt.write_text(receipt.read_text().replace('"exit_status": 0', '"exit_status": 0 '))
    assert run(root, *command) == errors.INTEGRITY
    assert "results/demo.head.release-1.1.0.receipt.json" in capsys.readouterr().err
    (root / integrity.SUMS_FILE).write_text(integrity.render(root))
    (root / "experiments.toml").write_text(FULL + "\n# a comment\n")
    (root / integrity.SUMS_FILE).write_text(integrity.render(root))  # even blessed: made by another registry
    assert run(root, *command) == errors.STALE
    assert "experiments.toml: made by another registry" in capsys.readouterr().err
    assert not (root / "runs" / "check").exists() and not (root / "runs" / "sweep").exists()


def test_fresh_references_need_no_sums_but_must_be_current(project):
    reg = registry.load(project)
    refs = references(reg, reg.experiment("demo"), project / "runs", fresh=True)
    assert refs.head["side"] == "head"
    (project / "experiments.toml").write_text(FULL + "\n# a comment\n")
    reg = registry.load(project)
    with pytest.raises(errors.HarnessError, match="made by another registry") as caught:
        references(reg, reg.experiment("demo"), project / "runs", fresh=True)
    assert caught.value.code == errors.STALE


# ---------------------------------------------------------------- publish: a declared set


def test_publish_publishes_exactly_the_declared_set(project):
    (project / "runs" / "openvex-python-0123456789ab.json").write_text(json.dumps(OPENVEX))  # a private check
    (project / "runs" / "sweep").mkdir()
    (project / "runs" / "sweep" / "demo.sweep.release-1.0.1.json").write_text("{}\n")
    assert run(project, "publish") == errors.CONFIRMED
    top = project / "results"
    assert sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file()) == [
        "demo.base.release-1.0.0.json", "demo.base.release-1.0.0.receipt.json",
        "demo.head.release-1.1.0.json", "demo.head.release-1.1.0.receipt.json",
        "mutate.demo.json", "openvex-sglang-1.1.0.json", "osv/PDEVIDENCE-2026-1.json",
        "report.json", "report.md", "report.svg", "sweep-demo.json"]
    integrity.verify(project)
    assert "results/sweep-demo.json" in json.loads((top / "report.json").read_text())["made_by"]["sources"]


@pytest.mark.parametrize("name", ["sweep-demo.json", "mutate.demo.json", "openvex-sglang-1.1.0.json"])
def test_a_declared_file_neither_fresh_nor_published_is_incomplete(project, capsys, name):
    (project / "runs" / name).unlink()
    assert run(project, "publish") == errors.INCOMPLETE
    assert name in capsys.readouterr().err
    assert not any((project / "results").iterdir())


def test_a_declared_file_not_rerun_is_kept_as_published(project):
    assert run(project, "publish") == errors.CONFIRMED
    kept = (project / "results" / "mutate.demo.json").read_bytes()
    (project / "runs" / "mutate.demo.json").unlink()
    assert run(project, "publish") == errors.CONFIRMED
    assert (project / "results" / "mutate.demo.json").read_bytes() == kept


@pytest.mark.parametrize(("name", "drop"), [("sweep-demo.json", "releases"), ("mutate.demo.json", "score"),
                                            ("openvex-sglang-1.1.0.json", "@context")])
def test_a_malformed_declared_file_is_refused_by_name_before_anything_is_published(project, capsys, name, drop):
    path = project / "runs" / name
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != drop}))
    assert run(project, "publish") == errors.INTEGRITY
    assert f"runs/{name}" in capsys.readouterr().err
    assert not any((project / "results").rglob("*")) and not (project / integrity.SUMS_FILE).exists()


def test_a_sweep_table_made_by_another_driver_is_refused(project, capsys):
    (project / "probes" / "engine.py").write_text("# another engine\n")
    assert run(project, "publish") == errors.STALE
    err = capsys.readouterr().err
    assert "runs/sweep-demo.json" in err and "probes/engine.py: made by another driver" in err


def test_a_partial_sweep_is_refused(project, capsys):
    write_sweep(project / "runs" / "sweep-demo.json", explicit=True)
    assert run(project, "publish") == errors.INCOMPLETE
    assert "partial sweep" in capsys.readouterr().err


def test_a_sweep_merged_without_an_era_part_is_refused(project, capsys):
    write_sweep(project / "runs" / "sweep-demo.json", missing_eras=["torch2.7-tf4"])
    assert run(project, "publish") == errors.INCOMPLETE
    assert "a partial sweep (merged with --partial, no part for era torch2.7-tf4)" in capsys.readouterr().err
    assert not any((project / "results").iterdir())


def test_a_sweep_covering_fewer_releases_than_the_published_one_is_refused(project, capsys):
    doc = sweep_doc(project)
    doc["releases"] = [{"version": "0.9.0", "classification": "pre-fix", "scenarios": {"D1": "pre-fix"},
                        "differing": [], "error": None}, *doc["releases"]]
    write_table(project / "runs" / "sweep-demo.json", doc)
    assert run(project, "publish") == errors.CONFIRMED
    write_sweep(project / "runs" / "sweep-demo.json")  # only 1.0.0 and 1.1.0
    assert run(project, "publish") == errors.INCOMPLETE
    assert "fewer releases than the published one (missing 0.9.0)" in capsys.readouterr().err


def test_a_sweep_judged_against_other_results_than_those_published_is_refused(project, capsys):
    write_sweep(project / "runs" / "sweep-demo.json")
    doc = json.loads((project / "runs" / "demo.head.release-1.1.0.json").read_text())
    doc["scenarios"]["D2"]["title"] = "retitled"
    write_cell(project / "runs", "head", doc)
    assert run(project, "publish") == errors.STALE
    assert "judged against another demo.head.release-1.1.0.json" in capsys.readouterr().err


def test_an_openvex_document_of_another_product_is_refused(project, capsys):
    private = {**OPENVEX, "statements": [{"status": "fixed", "products": [
        {"@id": "pkg:pypi/sglang@1.1.0?interpreter=%2Fhome%2Fme%2Fvenv%2Fbin%2Fpython"}]}]}
    write_table(project / "runs" / "openvex-sglang-1.1.0.json", private)
    assert run(project, "publish") == errors.INTEGRITY
    assert "not the documented example pkg:pypi/sglang@1.1.0" in capsys.readouterr().err


# ---------------------------------------------------------------- publish: a transaction


class Crash(Exception):
    pass


def test_a_crash_at_any_step_leaves_results_as_it_was(project, tmp_path, monkeypatch):
    monkeypatch.setattr(clock, "now", lambda: datetime(2026, 11, 1, tzinfo=timezone.utc))
    assert run(project, "publish") == errors.CONFIRMED
    doc = sweep_doc(project)
    doc["as_of"] = "2026-10-02T00:00:00Z"
    write_table(project / "runs" / "sweep-demo.json", doc)
    before = snapshot(project)

    calls: list[str] = []
    real = {"replace": os.replace, "rename": os.rename, "rmtree": shutil.rmtree}

    def arm(at: int | None) -> None:
        def wrap(name):
            def step(*args, **kwargs):
                calls.append(f"{name} {args[-1] if name != 'rmtree' else args[0]}")
                if at is not None and len(calls) - 1 == at:
                    raise Crash(calls[-1])
                return real[name](*args, **kwargs)
            return step
        calls.clear()
        monkeypatch.setattr(os, "replace", wrap("replace"))
        monkeypatch.setattr(os, "rename", wrap("rename"))
        monkeypatch.setattr(shutil, "rmtree", wrap("rmtree"))

    def disarm() -> None:
        for name, fn in real.items():
            monkeypatch.setattr(shutil if name == "rmtree" else os, name, fn)

    reg = registry.load(project)
    copies = tmp_path / "copies"
    shutil.copytree(project, copies / "template")
    arm(None)
    publish.publish(reg, project / "runs", "release")
    disarm()
    steps, after = list(calls), snapshot(project)
    commit = next(i for i, c in enumerate(steps) if c.startswith("replace") and c.endswith(integrity.SUMS_FILE))
    assert after != before
    for at in range(len(steps)):
        root = copies / str(at)
        shutil.copytree(copies / "template", root)
        arm(at)
        with pytest.raises(Crash):
            publish.publish(registry.load(root), root / "runs", "release")
        disarm()
        publish.recover(root)
        got = snapshot(root)
        assert got == (after if at > commit else before), f"crash at step {at}: {steps[at]}"
        integrity.verify(root)
        assert not (root / publish.STAGING).exists() and not (root / publish.OLD).exists()
        shutil.rmtree(root)


def test_osv_modified_is_when_the_record_last_changed(project, monkeypatch):
    monkeypatch.setattr(clock, "now", lambda: datetime(2026, 11, 1, tzinfo=timezone.utc))
    assert run(project, "publish") == errors.CONFIRMED
    record = project / "results" / "osv" / "PDEVIDENCE-2026-1.json"
    assert json.loads(record.read_text())["modified"] == "2026-11-01T00:00:00Z"
    monkeypatch.setattr(clock, "now", lambda: datetime(2026, 12, 1, tzinfo=timezone.utc))
    assert run(project, "publish") == errors.CONFIRMED  # the same evidence: the record did not change
    assert json.loads(record.read_text())["modified"] == "2026-11-01T00:00:00Z"
    doc = sweep_doc(project)
    doc["as_of"] = "2026-11-15T00:00:00Z"
    doc["releases"].append({**doc["releases"][-1], "version": "1.2.0"})
    write_table(project / "runs" / "sweep-demo.json", doc)
    assert run(project, "publish") == errors.CONFIRMED
    assert json.loads(record.read_text())["modified"] == "2026-12-01T00:00:00Z"
