"""Releases the registry declares cannot be probed on a CPU (``[cannot_probe]``): still probed, set aside by the
release watch where they fail as declared, flagged where they answer (a stale declaration) or fail otherwise."""

from __future__ import annotations

import json
import re

import pytest
from synthetic import REGISTRY, make_project, result_doc

from pdevidence import cli, registry
from pdevidence.cells import allprobes
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import provenance
from pdevidence.documents.tables import SweepParameters, SweepTable
from pdevidence.judge import classify
from pdevidence.lanes import sweep

C, B = sweep.Classification, sweep.Behaviour
RAISES = "module 'torch' has no attribute 'hip'"
DECLARED = REGISTRY + f"""
[cannot_probe."1.0.5"]
why = "its scheduler does not import without a GPU"
raises = "{RAISES}"
"""
WHEELS = [{"filename": f"sglang-{v}-py3-none-any.whl", "upload-time": f"2026-01-0{i}T00:00:00Z"}
          for i, v in enumerate(("1.0.0", "1.0.5", "1.1.0"), 1)]


def load(tmp_path, text: str = DECLARED) -> registry.Registry:
    return registry.load(make_project(tmp_path / "project", text))


def test_the_project_declares_the_releases_known_not_probeable_on_a_cpu():
    reg = registry.load(PROJECT)
    assert reg.declared("0.4.0.post1", "war_barrier").raises == RAISES
    for version in ("0.5.8", "0.5.8.post1"):
        assert reg.declared(version, "swa_free") is not None and reg.declared(version, "swa_tail") is not None
        assert reg.declared(version, "admission") is None  # the other experiments run there
    assert reg.declared("0.5.9", "swa_free") is None


def probe_with(monkeypatch, outcomes):
    """The sweep's engine stood in for: ``outcomes(version, name)`` is what each experiment's probe left."""
    asked = {}

    def warm(reg, versions, wanted, lock, out_dir, jobs, force, log):
        asked.update({v: wanted[v] for v in versions})
        return {v: ({name: outcomes(v, name) for name in wanted[v]}, None) for v in versions}

    monkeypatch.setattr(sweep.trees, "index_files", lambda project: WHEELS)
    monkeypatch.setattr(sweep.trees, "release_tree", lambda version, python, lock: version)
    monkeypatch.setattr(sweep, "references", lambda reg, exp, published, fresh=False: sweep.References(
        {"base": result_doc("base", "1.0.0"), "head": result_doc("head", "1.1.0")}, {}))
    monkeypatch.setattr(sweep, "_warm", warm)
    return asked


def side(version: str) -> str:
    return "head" if version == "1.1.0" else "base"


def import_fails(version, name):
    if version == "1.0.5":
        return allprobes.Outcome(name, error=f"AttributeError: {RAISES}")
    return allprobes.Outcome(name, result_doc(side(version), version))


def test_a_declared_release_that_fails_as_declared_cannot_run_and_the_watch_sets_it_aside(tmp_path, monkeypatch):
    reg = load(tmp_path)
    asked = probe_with(monkeypatch, import_fails)
    found, _, _ = sweep.sweep(reg, ["demo"], published=tmp_path, out_dir=tmp_path)
    assert list(asked) == ["1.0.0", "1.0.5", "1.1.0"]  # still probed: a declaration that became wrong is noticed
    declared = found["demo"][1]
    assert (declared.classification, declared.declared) == (C.CANNOT_RUN, "its scheduler does not import without "
                                                                          "a GPU")
    assert declared.error == f"AttributeError: {RAISES}"  # what it raised is kept
    assert sweep.flagged(found["demo"]) == [] and classify.watch_exit(found["demo"]) == errors.CONFIRMED
    text = sweep.table("demo", found["demo"], {"head": "1.1.0"})
    assert "1.0.5        cannot run on a CPU, as the registry declares: its scheduler does not import without a " \
           "GPU\n" in text
    assert "set aside by the release watch (cannot run on a CPU, as declared): 1.0.5" in text
    assert "WATCH" not in text and "release watch:" not in text


def test_the_same_failure_undeclared_is_still_flagged(tmp_path, monkeypatch):
    reg = load(tmp_path, REGISTRY)
    probe_with(monkeypatch, import_fails)
    found, _, _ = sweep.sweep(reg, ["demo"], published=tmp_path, out_dir=tmp_path)
    assert found["demo"][1].classification is C.FAILED and found["demo"][1].declared is None
    assert sweep.flagged(found["demo"]) == ["1.0.5"] and classify.watch_exit(found["demo"]) == errors.RELEASE_WATCH


def test_a_declared_release_that_probes_fine_is_a_stale_declaration_and_exits_9(tmp_path, monkeypatch, capsys):
    project = make_project(tmp_path / "project", DECLARED)
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    probe_with(monkeypatch, lambda version, name: allprobes.Outcome(name, result_doc(side(version), version)))
    assert cli.main(["--root", str(project), "sweep"]) == errors.RELEASE_WATCH
    out = capsys.readouterr().out
    assert "1.0.5        pre-fix (declared cannot run on a CPU: its scheduler does not import without a GPU)  " \
           "WATCH: declared cannot run, but it answers: remove the declaration" in out
    assert ('release watch: declared cannot be probed on a CPU, but probed: 1.0.5 (pre-fix); the declaration is '
            'stale: remove [cannot_probe."1.0.5"] from experiments.toml') in out
    written = json.loads((tmp_path / "runs" / "sweep-demo.json").read_text())
    assert written["flagged"] == ["1.0.5"] and written["schema"] == "pdevidence-sweep/7"
    assert written["releases"][1]["declared"] == "its scheduler does not import without a GPU"


def test_a_declared_release_that_fails_otherwise_than_declared_is_flagged(tmp_path, monkeypatch):
    reg = load(tmp_path)
    probe_with(monkeypatch, lambda version, name: allprobes.Outcome(name, error="no wheel for this machine")
               if version == "1.0.5" else allprobes.Outcome(name, result_doc(side(version), version)))
    found, _, _ = sweep.sweep(reg, ["demo"], published=tmp_path, out_dir=tmp_path)
    assert found["demo"][1].classification is C.FAILED and found["demo"][1].failed_otherwise
    assert sweep.flagged(found["demo"]) == ["1.0.5"]
    text = sweep.table("demo", found["demo"], {"head": "1.1.0"})
    assert "release watch: declared cannot be probed on a CPU, but it failed otherwise than declared: 1.0.5 " \
           "(failed)" in text
    assert "not probed (the first fixed" not in text


@pytest.mark.parametrize("raised, expected", [
    ({"D1": RAISES}, C.CANNOT_RUN),  # every raise as declared (the control D2 ran): cannot run
    ({"D1": RAISES, "D2": "KeyError: 'kv'"}, C.ERROR),  # one raise the declaration does not cover
])
def test_an_erroring_release_cannot_run_only_where_every_raise_is_the_declared_one(raised, expected):
    doc = result_doc("base", "1.0.5", errors={sid: {"type": "AttributeError", "message": message}
                                              for sid, message in raised.items()})
    outcome = classify.classify(doc, result_doc("base", "1.0.0"), result_doc("head", "1.1.0"))
    assert outcome.classification is C.ERROR
    found = classify.as_declared(outcome, registry.CannotProbe("1.0.5", "no GPU", RAISES), doc)
    assert found.classification is expected and found.declared == "no GPU"
    assert sweep.flagged([found]) == ([] if expected is C.CANNOT_RUN else ["1.0.5"])


def test_a_cannot_run_release_after_the_first_fixed_one_is_set_aside_too_and_reads_back_as_written():
    outcomes = [sweep.ReleaseOutcome("0.1", C.PRE_FIX), sweep.ReleaseOutcome("0.2", C.FIXED),
                sweep.ReleaseOutcome("0.3", C.CANNOT_RUN, error="CannotRunOnCpu: a kernel", declared="a kernel"),
                sweep.ReleaseOutcome("0.4", C.FIXED)]
    assert sweep.flagged(outcomes) == [] and classify.watch_exit(outcomes) == errors.CONFIRMED
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    doc = sweep.document("demo", outcomes, None, made, SweepParameters(explicit=False, pre=False, floor="0.1",
                                                                       references={}))
    assert SweepTable.from_doc(doc, source="test").releases == outcomes
    doc["releases"][2].pop("declared")
    with pytest.raises(errors.HarnessError, match="cannot run only where the registry declares it"):
        SweepTable.from_doc(doc, source="test")


def test_a_table_of_schema_6_loads_as_written():
    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    outcomes = [sweep.ReleaseOutcome("0.1", C.ERROR), sweep.ReleaseOutcome("0.2", C.FIXED)]
    doc = sweep.document("demo", outcomes, None, made, SweepParameters(explicit=False, pre=False, floor="0.1",
                                                                       references={}))
    doc["schema"] = "pdevidence-sweep/6"
    table = SweepTable.from_doc(doc, source="v6.json")
    assert (table.schema_version, table.flagged, table.releases) == (6, [], outcomes)


@pytest.mark.parametrize("declaration, message", [
    ('[cannot_probe."one.two"]\nwhy = "x"\nraises = "y"',
     'cannot_probe."one.two": \'one.two\' is not a PEP 440 version'),
    ('[cannot_probe."1.0.5"]\nwhy = " "\nraises = "y"', 'cannot_probe."1.0.5".why: empty'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = ""', 'cannot_probe."1.0.5".raises: empty'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"', "cannot_probe.\"1.0.5\": missing key 'raises'"),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\nexperiments = ["demo", "dmeo"]',
     'cannot_probe."1.0.5".experiments: dmeo is not an experiment (one of: demo)'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\nexperiments = []', 'cannot_probe."1.0.5".experiments: empty'),
    ('[cannot_probe."0.9"]\nwhy = "x"\nraises = "y"\nexperiments = ["demo"]',
     'cannot_probe."0.9".experiments: demo is not swept on 0.9 (below its release floor)'),
    ('[cannot_probe."0.9"]\nwhy = "x"\nraises = "y"',
     'cannot_probe."0.9": 0.9 is below every experiment\'s release floor'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\ncause = "z"', "unknown key cannot_probe.\"1.0.5\".cause"),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\n[cannot_probe."1.0.5.0"]\nwhy = "x"\nraises = "y"',
     'cannot_probe."1.0.5.0": the release \'1.0.5\' is declared already'),
])
def test_a_bad_declaration_is_a_registry_error_naming_it(tmp_path, declaration, message):
    with pytest.raises(errors.HarnessError, match=re.escape(message)) as err:
        load(tmp_path, REGISTRY + "\n" + declaration + "\n")
    assert err.value.code == errors.USAGE


def test_the_report_names_the_declared_cause_and_a_stale_declaration():
    from pdevidence.report.narrative import sweep_text

    made = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)
    outcomes = [sweep.ReleaseOutcome("0.1", C.CANNOT_RUN, error=f"AttributeError: {RAISES}", declared="no GPU"),
                sweep.ReleaseOutcome("0.2", C.PRE_FIX, declared="a kernel"), sweep.ReleaseOutcome("0.3", C.FIXED)]
    doc = sweep.document("demo", outcomes, None, made, SweepParameters(explicit=False, pre=False, floor="0.1",
                                                                       references={}))
    text = sweep_text(doc)
    assert "0.1 cannot run, 0.2 pre-fix, 0.3 fixed; first fixed 0.3" in text
    assert "release watch, declared cannot be probed on a CPU but did not fail as declared: 0.2 (pre-fix)" in text
    assert "not probed" not in text
    assert "cannot run on a CPU, as the registry declares: 0.1 (no GPU)" in text
