"""`check`: classification, exit codes, the interpreter gate, the probe driver and OpenVEX, on synthetic data.

The driver tests run probes/probe_all.py for real, with this interpreter and
stand-in probe files (no SGLang): what it writes, and that it writes nothing
inside the environment it runs in.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from schemas import problems
from synthetic import TWO_DOORS, make_project, result_doc, wheel_bytes, write_cell

from pdevidence import cli, registry
from pdevidence.cells import allprobes
from pdevidence.core import errors
from pdevidence.lanes import check
from pdevidence.lanes.check import Status
from pdevidence.lanes.sweep import Behaviour
from pdevidence.publish import openvex
from pdevidence.sources import trees

ROOT = Path(__file__).resolve().parent.parent
BEFORE = {"D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}, "D3": {"receiver_created": True}}
AFTER = {"D1": {"enqueued": False, "retired": True}, "D2": {"enqueued": True}, "D3": {"receiver_created": False}}


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", TWO_DOORS)
    write_cell(root / "results", "base", result_doc("base", "1.0.0", BEFORE))
    write_cell(root / "results", "head", result_doc("head", "1.1.0", AFTER))
    return registry.load(root)


def judged(reg, observed, errors_=None):
    exp = reg.experiment("demo")
    outcome = allprobes.Outcome("demo", result_doc("check", "9.9.9", observed, errors_), "f" * 64)
    return check.judge(exp, outcome, result_doc("base", "1.0.0", BEFORE), result_doc("head", "1.1.0", AFTER))


def test_a_build_is_fixed_affected_or_partial_by_its_telling_scenarios(project):
    fixed, affected = judged(project, AFTER), judged(project, BEFORE)
    assert (fixed.status, fixed.deciding) == (Status.FIXED, ["D1", "D3"])
    assert (affected.status, affected.deciding) == (Status.AFFECTED, ["D1", "D3"])
    partial = judged(project, {**AFTER, "D3": {"receiver_created": True}})
    assert partial.status is Status.PARTIAL
    assert partial.scenarios == {"D1": Behaviour.FIXED, "D3": Behaviour.PRE_FIX}
    assert partial.deciding == ["D3"]
    assert partial.result_sha256 == "f" * 64


def test_a_build_matching_neither_side_or_raising_is_unknown_and_names_the_scenarios(project):
    odd = judged(project, {**AFTER, "D1": {"enqueued": True, "retired": True}})
    assert (odd.status, odd.deciding) == (Status.UNKNOWN, ["D1"])
    raised = judged(project, AFTER, {"D3": {"type": "AttributeError", "message": "no attribute 'kv'"}})
    assert (raised.status, raised.deciding) == (Status.UNKNOWN, ["D3"])
    assert raised.scenarios["D3"] is Behaviour.ERROR and "AttributeError" in raised.error


def test_a_build_fixed_where_the_scenarios_tell_that_departs_on_a_control_deviates_and_names_it(project):
    over_broad = judged(project, {**AFTER, "D2": {"enqueued": False}})
    assert (over_broad.status, over_broad.deciding) == (Status.DEVIATES, ["D2"])
    assert over_broad.scenarios == {"D1": Behaviour.FIXED, "D3": Behaviour.FIXED, "D2": Behaviour.DEVIATES}
    assert over_broad.to_json()["explain"] == {"D2": {"enqueued": {"tree": False, "base": True, "head": True}}}
    assert check.EXIT_OF[Status.DEVIATES] == errors.BEHAVIOUR_DIFFERS
    assert judged(project, AFTER).explain == {}


def test_what_kept_a_build_from_fixed_is_shown_key_by_key_beside_base_and_head(project):
    odd = judged(project, {**AFTER, "D1": {"enqueued": True, "retired": True}})
    assert odd.status is Status.UNKNOWN
    assert odd.to_json()["explain"] == {"D1": {"enqueued": {"tree": True, "base": True, "head": False}}}
    partial = judged(project, {**AFTER, "D3": {"receiver_created": True}})
    assert partial.to_json()["explain"] == {"D3": {"receiver_created": {"tree": True, "base": True, "head": False}}}
    result = check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [odd, partial])
    lines = check.table(result, verbose=True).splitlines()
    assert lines[1].split()[:2] == ["demo", "unknown"] and lines[1].endswith("matches neither side: D1")
    assert lines[2].split() == ["D1:", "enqueued", "true", "(base", "true,", "head", "false)"]
    assert lines[3].split()[:2] == ["demo", "partial"] and lines[4].split()[:2] == ["D3:", "receiver_created"]
    # By default a scenario matching neither side keeps its reason; a pre-fix one is named on the line alone.
    lines = check.table(result).splitlines()
    assert lines[2].split() == ["D1:", "enqueued", "true", "(base", "true,", "head", "false)"]
    assert lines[3].split()[:2] == ["demo", "partial"] and lines[4].split()[0] == "ran"


def test_the_default_table_gives_one_key_per_surprise_preferring_one_that_departs_from_both_sides(project):
    odd = judged(project, {**AFTER, "D1": {"enqueued": True, "retired": 2}, "D2": {"enqueued": False}})
    assert odd.status is Status.UNKNOWN and set(odd.explain) == {"D1", "D2"}
    lines = check.table(check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [odd])).splitlines()
    assert lines[1].endswith("matches neither side: D1; departs from both sides on the controls: D2")
    assert lines[2].strip() == "D1: retired 2 (base false, head true); 1 more key"
    assert lines[3].strip() == "D2: enqueued false (base true, head true)"


THREE_DOORS = TWO_DOORS + """
[experiments.demo.expect.D4]
changes = true
base = { sent = 1 }
head = { sent = 0 }
"""


def test_some_scenarios_fixed_and_others_pre_fix_is_partial_whatever_else_matched_neither_or_raised(tmp_path):
    exp = registry.load(make_project(tmp_path, THREE_DOORS)).experiment("demo")
    before, after = {**BEFORE, "D4": {"sent": 1}}, {**AFTER, "D4": {"sent": 0}}

    def one(observed, errors_=None):
        outcome = allprobes.Outcome("demo", result_doc("check", "9.9.9", observed, errors_), "f" * 64)
        return check.judge(exp, outcome, result_doc("base", "1.0.0", before), result_doc("head", "1.1.0", after))

    mixed = one({**after, "D3": {"receiver_created": True}, "D4": {"sent": 2}})
    assert (mixed.status, mixed.deciding) == (Status.PARTIAL, ["D3"])
    assert mixed.scenarios["D4"] is Behaviour.NEITHER and set(mixed.explain) == {"D3", "D4"}
    raised = one({**after, "D3": {"receiver_created": True}, "D4": {}},
                 {"D4": {"type": "AttributeError", "message": "no attribute 'sender'"}})
    assert raised.status is Status.PARTIAL and raised.error == "D4: AttributeError: no attribute 'sender'"
    line = check.table(check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [raised])).splitlines()[1]
    assert line.endswith("pre-fix: D3; fixed: D1; raised: D4: AttributeError: no attribute 'sender'")


def test_an_affected_answer_names_the_scenarios_that_behave_as_base_and_keeps_every_key(project):
    found = judged(project, BEFORE)
    result = check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [found])
    lines = check.table(result).splitlines()
    assert lines[1].split()[:2] == ["demo", "affected"] and lines[1].endswith("pre-fix: D1, D3")
    assert lines[2].split()[0] == "ran"
    # Each key beside base's and head's, with --verbose and in the --json document.
    lines = check.table(result, verbose=True).splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["D1:", "D3:"]
    assert "enqueued true (base true, head false); retired false (base false, head true)" in lines[2]
    doc = found.to_json()
    assert {sid: b for sid, b in doc["scenarios"].items() if b == "pre-fix"} == {"D1": "pre-fix", "D3": "pre-fix"}
    assert {sid: set(keys) for sid, keys in doc["explain"].items()} == {"D1": {"enqueued", "retired"},
                                                                      "D3": {"receiver_created"}}


def test_the_command_prints_every_key_with_verbose_and_in_json_whatever_the_flag(project, capsys, monkeypatch):
    found = check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [judged(project, BEFORE)])
    monkeypatch.setattr(check, "resolve", lambda reg, **kw: (found.target, None))
    monkeypatch.setattr(check, "run_all", lambda reg, targets, **kw: [found])
    for flags, every_key in (([], False), (["-v"], True), (["--verbose"], True)):
        assert cli.main(["--root", str(ROOT), "check", "--version", "1.0.0", *flags]) == errors.BEHAVIOUR_DIFFERS
        assert ("D1: enqueued true" in capsys.readouterr().out) is every_key
    assert cli.main(["--root", str(ROOT), "check", "--version", "1.0.0", "--json"]) == errors.BEHAVIOUR_DIFFERS
    assert set(json.loads(capsys.readouterr().out)["experiments"][0]["explain"]) == {"D1", "D3"}


def test_an_error_is_named_whatever_the_status(project):
    raised = judged(project, BEFORE, {"D2": {"type": "KeyError", "message": "'queue'"}})
    assert (raised.status, raised.error) == (Status.AFFECTED, "D2: KeyError: 'queue'")  # a control raised
    line = check.table(check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [raised])).splitlines()[1]
    assert line.endswith("pre-fix: D1, D3; raised: D2: KeyError: 'queue'")
    assert judged(project, AFTER, {"D2": {"type": "KeyError", "message": "'queue'"}}).status is Status.UNKNOWN


def test_a_probe_that_could_not_set_up_is_cannot_run_with_its_error(project):
    outcome = allprobes.Outcome("demo", error="ImportError: cannot import name 'Req'")
    got = check.judge(project.experiment("demo"), outcome, {}, {})
    assert (got.status, got.error, got.result_sha256) == (Status.CANNOT_RUN, "ImportError: cannot import name 'Req'",
                                                          None)


@pytest.mark.parametrize(("statuses", "code"), [
    ([Status.FIXED, Status.FIXED], errors.CONFIRMED),
    ([Status.FIXED, Status.AFFECTED], errors.BEHAVIOUR_DIFFERS),
    ([Status.PARTIAL, Status.FIXED], errors.BEHAVIOUR_DIFFERS),
    ([Status.UNKNOWN, Status.FIXED], errors.BEHAVIOUR_DIFFERS),
    ([Status.AFFECTED, Status.CANNOT_RUN], errors.ENVIRONMENT),
])
def test_exit_codes(statuses, code):
    result = check.CheckResult(check.Target("release", "1.0.0", "1.0.0"),
                               [check.ExperimentCheck(f"e{i}", i, s) for i, s in enumerate(statuses)])
    assert result.exit_code == code
    assert result.to_json()["exit_code"] == code


def test_the_table_says_each_status_and_its_scenarios(project):
    result = check.CheckResult(check.Target("release", "1.0.0", "1.0.0"), [
        judged(project, {**AFTER, "D3": {"receiver_created": True}}),
        check.ExperimentCheck("other", 7, Status.CANNOT_RUN, error="ModuleNotFoundError: No module named 'sglang'"),
    ])
    lines = check.table(result).splitlines()
    assert lines[0] == "sglang check: release 1.0.0"
    assert lines[1].split()[:2] == ["demo", "partial"] and "pre-fix: D3; fixed: D1" in lines[1]
    assert "cannot run" in lines[2] and "No module named 'sglang'" in lines[2]
    assert check.table(result, verbose=True).splitlines()[2].split()[0] == "D3:"  # what kept it from fixed


def _vex_result(project, status_observed):
    target = check.Target("release", "1.0.0", "1.0.0", "a" * 64)
    return check.CheckResult(target, [judged(project, status_observed)])


@pytest.mark.parametrize(("observed", "status"), [
    (AFTER, "fixed"), (BEFORE, "affected"), ({**AFTER, "D3": {"receiver_created": True}}, "under_investigation"),
    ({**AFTER, "D2": {"enqueued": False}}, "under_investigation")])
def test_openvex_has_one_statement_per_experiment_with_its_evidence(project, observed, status):
    doc = openvex.document(project, _vex_result(project, observed), "2026-11-30T00:00:00Z")
    assert problems("openvex-0.2.0", doc) == []
    assert doc["@context"] == "https://openvex.dev/ns/v0.2.0"
    assert {"@id", "author", "timestamp", "version", "statements"} <= doc.keys()
    (statement,) = doc["statements"]
    assert statement["status"] == status
    assert statement["vulnerability"]["name"] == "PDEVIDENCE-2026-1"
    assert statement["products"] == [{"@id": "pkg:pypi/sglang@1.0.0", "identifiers": {"purl": "pkg:pypi/sglang@1.0.0"},
                                      "hashes": {"sha-256": "a" * 64}}]
    assert "f" * 64 in statement["status_notes"]
    if observed["D2"] == AFTER["D2"]:
        assert "D3" in statement["status_notes"]
    else:  # deviates: the controls and their values are the reason
        assert "pdevidence check: deviates; deciding scenarios: D2; not the fixed code: it departs from both the " \
               "pre-fix and the fixed release on the controls D2: enqueued false (base true, head true)" \
               in statement["status_notes"]
    # OpenVEX requires an action statement for affected products.
    assert ("action_statement" in statement) == (status == "affected")


def test_openvex_id_is_a_hash_of_the_content(project):
    result = _vex_result(project, AFTER)
    one = openvex.document(project, result, "2026-11-30T00:00:00Z")
    assert one == openvex.document(project, result, "2026-11-30T00:00:00Z")
    assert one["@id"] != openvex.document(project, result, "2026-12-01T00:00:00Z")["@id"]
    assert one["@id"] != openvex.document(project, _vex_result(project, BEFORE), "2026-11-30T00:00:00Z")["@id"]


@pytest.mark.parametrize(("target", "purl"), [
    (check.Target("wheel", "sglang-0.5.21+fork-py3-none-any.whl", "0.5.21+fork"), "pkg:pypi/sglang@0.5.21%2Bfork"),
    (check.Target("git", "a" * 40, "a" * 40),
     "pkg:pypi/sglang?vcs_url=git%2Bhttps%3A%2F%2Fgithub.com%2Fsgl-project%2Fsglang%40" + "a" * 40),
    (check.Target("path", "/src/sglang", "local"), "pkg:pypi/sglang?path=%2Fsrc%2Fsglang"),
    (check.Target("python", "/opt/venv/bin/python", "0.5.20"),
     "pkg:pypi/sglang@0.5.20?interpreter=%2Fopt%2Fvenv%2Fbin%2Fpython"),
])
def test_the_product_is_the_build_checked(target, purl):
    assert openvex.purl(target) == purl


def test_the_probes_parse_with_the_oldest_python_check_accepts():
    for probe in sorted((ROOT / "probes").glob("*.py")):
        ast.parse(probe.read_text(encoding="utf-8"), filename=str(probe), feature_version=check.MIN_PYTHON)


def test_an_interpreter_older_than_the_probes_is_refused_before_anything_runs(tmp_path, capsys):
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3 9\n")
    old.chmod(0o755)
    code = cli.main(["--root", str(ROOT), "check", "--python", str(old)])
    assert code == errors.USAGE
    assert "Python 3.9; the probes need Python 3.10 or newer" in capsys.readouterr().err


def test_a_missing_or_broken_interpreter_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["--root", str(ROOT), "check", "--python", str(tmp_path / "nope")]) == errors.USAGE
    assert f"argument --python: '{tmp_path / 'nope'}' is not an existing Python interpreter" in capsys.readouterr().err
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries: libpython3.12.so' >&2\nexit 127\n")
    broken.chmod(0o755)
    assert cli.main(["--root", str(ROOT), "check", "--python", str(broken)]) == errors.USAGE
    assert (f"--python '{broken}': {broken} is not a working Python interpreter: error while loading shared "
            "libraries") in capsys.readouterr().err


def snapshot(directory: Path) -> dict[str, int]:
    """Every path below ``directory`` with its mtime: what changed, appeared or vanished."""
    return {str(p.relative_to(directory)): p.lstat().st_mtime_ns for p in sorted(directory.rglob("*"))}


def test_an_environment_whose_sglang_cannot_import_is_cannot_run_and_left_untouched(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PDEVIDENCE_WORK", str(tmp_path / "work"))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # check must set it itself
    env = tmp_path / "serving-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = next(env.glob("lib/python*/site-packages"))
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    before, probes = snapshot(env), snapshot(ROOT / "probes")
    code = cli.main(["--root", str(ROOT), "check", "--python", str(env / "bin" / "python"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == errors.ENVIRONMENT
    assert {e["experiment"]: e["status"] for e in doc["experiments"]} == {
        name: "cannot run" for name in registry.load(ROOT).experiments}
    assert all("ImportError: libcuda.so.1" in e["error"] for e in doc["experiments"])
    assert snapshot(env) == before  # no __pycache__, nothing else
    assert snapshot(ROOT / "probes") == probes  # the probes' own bytecode neither


STANDIN_OK = """
from _probekit import ScenarioSet
SET = ScenarioSet("alpha")

def prepare():
    return "1.2.3"

@SET.scenario("X1", "a scenario")
def x1(observed):
    observed["seen"] = True
"""
STANDIN_BROKEN = """
from _probekit import ScenarioSet
SCENARIOS = ScenarioSet("beta")

def prepare():
    from sglang.srt.managers.schedule_batch import Req  # noqa: F401
    return "never"
"""


def run_driver(tmp_path, *probes):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "probes" / "probe_all.py"), *map(str, probes), "--out-dir",
                           str(out), "--tree-kind", "wheel", "--side", "check"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return proc, out


def test_the_driver_runs_each_probe_and_records_the_one_that_cannot_set_up(tmp_path):
    (tmp_path / "probe_alpha_differential.py").write_text(STANDIN_OK)
    (tmp_path / "probe_beta_differential.py").write_text(STANDIN_BROKEN)
    proc, out = run_driver(tmp_path, tmp_path / "probe_beta_differential.py", tmp_path / "probe_alpha_differential.py")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "alpha.json").read_text())
    assert doc["tree"] == {"kind": "wheel", "ref": "1.2.3", "resolved": "1.2.3"}
    assert doc["scenarios"]["X1"] == {"title": "a scenario", "observed": {"seen": True}, "error": None}
    broken = json.loads((out / "beta.cannot-run.json").read_text())
    assert broken["error"]["type"] == "ModuleNotFoundError" and "sglang" in broken["error"]["message"]
    assert not (out / "beta.json").exists()


# A package whose import fails after a submodule of it imported: Python drops only the package, the submodule
# stays, so a second attempt meets the state the first left (its claim already taken) and fails otherwise.
FAILING_SGLANG = {
    "sglang/__init__.py": "from sglang import claims\nclaims.CLAIMS.pop('sglang')\n"
                          "raise ImportError('libcuda.so.1: cannot open shared object file')\n",
    "sglang/claims.py": "CLAIMS = {'sglang': object()}\n",
}
IMPORTS_SGLANG = """
from _probekit import ScenarioSet
SET = ScenarioSet("{name}")

def prepare():
    import sglang
    return sglang.__version__

@SET.scenario("X1", "a scenario")
def x1(observed):
    observed["seen"] = True
"""


def test_every_probe_of_the_driver_reports_sglangs_failed_import_as_itself(tmp_path, monkeypatch):
    for rel, text in FAILING_SGLANG.items():
        (tmp_path / "tree" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / rel).write_text(text)
    probes = []
    for name in ("alpha", "beta", "gamma"):
        probes.append(tmp_path / f"probe_{name}_differential.py")
        probes[-1].write_text(IMPORTS_SGLANG.format(name=name))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "tree"))
    proc, out = run_driver(tmp_path, *probes)
    assert proc.returncode == 3, proc.stderr
    for name in ("alpha", "beta", "gamma"):
        error = json.loads((out / f"{name}.cannot-run.json").read_text())["error"]
        assert error == {"type": "ImportError", "message": "libcuda.so.1: cannot open shared object file"}, name


def test_the_driver_exits_3_when_no_experiment_can_run(tmp_path):
    (tmp_path / "probe_beta_differential.py").write_text(STANDIN_BROKEN)
    proc, out = run_driver(tmp_path, tmp_path / "probe_beta_differential.py")
    assert proc.returncode == 3
    assert (out / "beta.cannot-run.json").exists()


def test_a_wheel_target_must_be_an_sglang_wheel_for_the_cells_python(tmp_path):
    good = tmp_path / "sglang-0.5.21.post1-py3-none-any.whl"
    good.write_bytes(wheel_bytes("0.5.21.post1", ""))
    tree = trees.wheel_tree(good, "3.12")
    assert tree.digest == __import__("hashlib").sha256(good.read_bytes()).hexdigest()
    # Two wheels may carry one version (a release, a vendor's rebuild): the file's digest is in the name.
    assert (tree.kind, tree.resolved) == ("wheel", "0.5.21.post1")
    assert tree.label() == f"wheel-0.5.21.post1-{tree.digest[:12]}"
    other = tmp_path / "vllm-1.0-py3-none-any.whl"
    other.write_bytes(wheel_bytes("1.0", "", project="vllm"))
    foreign = tmp_path / "sglang-0.5.21-cp311-cp311-win_amd64.whl"
    foreign.write_bytes(b"")
    for path, message in [(other, "not sglang"), (foreign, "does not install on Python 3.12"),
                          (tmp_path / "sglang.zip", "no wheel at")]:
        with pytest.raises(errors.HarnessError, match=message) as info:
            trees.wheel_tree(path, "3.12")
        assert info.value.code == errors.USAGE


def test_targets_resolve_to_the_tree_checked_with_its_provenance(project, tmp_path):
    source = tmp_path / "my-sglang"
    (source / "python" / "sglang").mkdir(parents=True)
    (source / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\n')
    target, tree = check.resolve(project, path=source)
    content = trees.content_digest(source / "python")
    assert target.to_json() == {
        "kind": "path", "ref": str(source), "resolved": f"local-{content[:12]}", "sha256": content, "era": None,
        "era_chosen_by": {"basis": "none", "evidence": "no version told and no pyproject.toml pin of torch, "
                          "transformers or the kernel: today's closure", "version_set_aside": None},
        "source_version": None, "source_pins": None}
    assert target.label() == tree.label() == f"path-local-{content[:12]}"
    assert tree.install_target == source / "python"
    wheel = tmp_path / "sglang-0.5.20+backport-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes("0.5.20+backport", ""))
    target, tree = check.resolve(project, wheel=wheel)
    assert (target.kind, target.ref, target.resolved) == ("wheel", wheel.name, "0.5.20+backport")
    assert target.sha256 == tree.digest and len(target.sha256) == 64
    assert target.label() == tree.label() == f"wheel-0.5.20+backport-{tree.digest[:12]}"
    with pytest.raises(errors.HarnessError, match="check needs a target"):
        check.resolve(project)


NO_DOOR = """
[experiments.demo.not_affected.no_decode_door]
scenario = "D3"
key = "receiver_created"
value = "absent"
justification = "vulnerable_code_not_present"
why = "this tree has no decode door to admit a rejected request"
"""


def test_a_build_without_the_vulnerable_path_is_not_affected_naming_the_observation(tmp_path):
    root = make_project(tmp_path / "project", TWO_DOORS + NO_DOOR)
    reg = registry.load(root)
    old = {**BEFORE, "D3": {"receiver_created": "absent"}}
    found = judged(reg, old)
    assert (found.status, found.deciding, found.justification) == (
        Status.NOT_AFFECTED, ["D3"], "vulnerable_code_not_present")
    assert found.evidence == ["D3.receiver_created = 'absent': this tree has no decode door to admit a rejected "
                              "request (vulnerable_code_not_present)"]
    assert check.EXIT_OF[found.status] == errors.CONFIRMED
    assert judged(reg, BEFORE).status is Status.AFFECTED  # the rule holds on its observation only
    line = check.table(check.CheckResult(check.Target("release", "0.1.0", "0.1.0"), [found])).splitlines()[1]
    assert "not affected" in line and "no decode door" in line
    doc = openvex.document(reg, check.CheckResult(check.Target("release", "0.1.0", "0.1.0"), [found]), "2026-11-30T00:00:00Z")
    assert problems("openvex-0.2.0", doc) == []
    (statement,) = doc["statements"]
    assert (statement["status"], statement["justification"]) == ("not_affected", "vulnerable_code_not_present")
    assert "no decode door" in statement["impact_statement"]


def test_the_sweep_classifies_such_a_release_not_affected_with_its_evidence(tmp_path):
    from pdevidence.documents.vocabulary import Behaviour, Classification
    from pdevidence.judge import classify
    from pdevidence.report import timeline

    reg = registry.load(make_project(tmp_path / "project", TWO_DOORS + NO_DOOR))
    outcome = classify.classify(result_doc("sweep", "0.1.0", {**BEFORE, "D3": {"receiver_created": "absent"}}),
                                result_doc("base", "1.0.0", BEFORE), result_doc("head", "1.1.0", AFTER),
                                reg.experiment("demo"))
    assert outcome.classification is Classification.NOT_AFFECTED and outcome.evidence
    assert outcome.to_json()["evidence"] == outcome.evidence
    assert timeline.release_state(outcome.to_json(), "D1") is Behaviour.NOT_AFFECTED


def test_a_key_the_build_never_recorded_is_unknown_and_named_in_the_table_and_the_document(project):
    found = judged(project, {**AFTER, "D3": {}})
    assert (found.status, found.deciding, found.unobserved) == (Status.UNKNOWN, ["D3"], ["D3.receiver_created"])
    result = check.CheckResult(check.Target("release", "0.1.0", "0.1.0"), [found])
    assert "not observed: D3.receiver_created" in check.table(result).splitlines()[1]
    doc = result.to_json()
    assert doc["experiments"][0]["unobserved"] == ["D3.receiver_created"] and problems("check", doc) == []
    assert "unobserved" not in judged(project, AFTER).to_json()  # a build that recorded everything keeps its bytes


def test_a_not_affected_observation_from_a_scenario_that_raised_is_unknown_naming_the_rule(tmp_path):
    reg = registry.load(make_project(tmp_path / "project", TWO_DOORS + NO_DOOR))
    found = judged(reg, {**BEFORE, "D3": {"receiver_created": "absent"}},
                   {"D3": {"type": "KeyError", "message": "'kv'"}})
    assert (found.status, found.evidence, found.justification) == (Status.UNKNOWN, [], None)
    assert found.error == "D3: KeyError: 'kv'; rule no_decode_door not applied: D3 raised KeyError: 'kv'"
    assert check.EXIT_OF[found.status] == errors.BEHAVIOUR_DIFFERS
