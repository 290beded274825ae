"""Upstream test runs: source resolution, pytest in a scratch copy, JUnit classification,
result + receipt, and the base/head summary. No SGLang, no network: the "upstream tests"
are the fixture suite in tests/fixtures/upstream_suite/, run with this interpreter."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdevidence import cells, cli, environments, registry, results, trees, upstream
from pdevidence.errors import ENVIRONMENT, USAGE, HarnessError

from synthetic import REGISTRY, make_project

SUITE = Path(__file__).parent / "fixtures" / "upstream_suite"
RELS = ["test/unit/suite_upstream.py", "test/unit/suite_import_error.py"]
UP = "test/unit/suite_upstream.py"
IMP = "test/unit/suite_import_error.py"

# What the fixture suite must give, in pytest's order (collection errors first).
EXPECTED_TESTS = [
    {"nodeid": IMP, "outcome": "error", "phase": "collection", "type": "ImportError"},
    {"nodeid": f"{UP}::test_passes", "outcome": "passed", "phase": None, "type": None},
    {"nodeid": f"{UP}::test_assertion_fails", "outcome": "failed", "phase": "call", "type": "AssertionError"},
    {"nodeid": f"{UP}::test_attribute_error", "outcome": "failed", "phase": "call", "type": "AttributeError"},
    {"nodeid": f"{UP}::test_value_error", "outcome": "failed", "phase": "call", "type": "ValueError"},
    {"nodeid": f"{UP}::TestGrouped::test_skipped", "outcome": "skipped", "phase": None, "type": "pytest.skip"},
]
EXPECTED_TOTALS = {"passed": 1, "failed": 3, "errors": 1, "skipped": 1, "total": 6}
EXPECTED_TYPES = {"AssertionError": 1, "AttributeError": 1, "ImportError": 1, "ValueError": 1}
UPSTREAM_REGISTRY = REGISTRY.replace('probe = "probes/probe_demo.py"\n',
                                     'probe = "probes/probe_demo.py"\n'
                                     f'upstream_tests = {json.dumps(RELS)}\n', 1)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in (upstream.TESTS_ENV, "SGLANG_REPO", "SGLANG_TREE", "PDEVIDENCE_WORK", "PDEVIDENCE_RUNS",
                 "PDEVIDENCE_PROBE_TIMEOUT", "PDEVIDENCE_GIT_ARCHIVE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PDEVIDENCE_CACHE", str(tmp_path / "cache"))
    # The fixture suite needs no plugin; this interpreter's (hypothesis, ...) cost ~1 s per run.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def project(tmp_path):
    return registry.load(make_project(tmp_path / "project", UPSTREAM_REGISTRY))


# --- running and classifying -------------------------------------------------------------------


def test_each_outcome_and_exception_type_is_recorded(tmp_path):
    source = upstream.local_source(SUITE, RELS)
    log = tmp_path / "logs" / "suite.log"
    run = upstream.run_suite(Path(sys.executable), source.files, log)

    assert run.exit_status == 1  # failing tests are data: pytest's "some tests failed"
    assert run.tests == EXPECTED_TESTS
    assert upstream.totals(run.tests) == EXPECTED_TOTALS
    assert upstream.type_counts(run.tests) == EXPECTED_TYPES
    assert run.log == log and run.log_sha256 == sha256(log)
    assert "suite_upstream.py" in log.read_text()
    assert "-p" in run.command and "no:cacheprovider" in run.command
    assert any(a.startswith("--junitxml=") for a in run.command)
    collection = next(m for m in run.messages if m["phase"] == "collection")
    assert collection["message"].startswith("ImportError: cannot import name 'a_name_this_tree_does_not_have'")


def test_the_checkouts_conftest_and_pytest_config_do_not_apply(tmp_path):
    checkout = tmp_path / "sglang"
    (checkout / "test" / "unit").mkdir(parents=True)
    (checkout / "test" / "unit" / "suite_upstream.py").write_bytes((SUITE / UP).read_bytes())
    poison = "raise RuntimeError('the checkout conftest must not be loaded')\n"
    (checkout / "conftest.py").write_text(poison)
    (checkout / "test" / "conftest.py").write_text(poison)
    (checkout / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    source = upstream.local_source(checkout, [UP])
    run = upstream.run_suite(Path(sys.executable), source.files, tmp_path / "log")
    assert run.tests == EXPECTED_TESTS[1:]


def test_a_bare_file_name_in_the_directory_stands_for_its_repository_path(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "suite_upstream.py").write_bytes((SUITE / UP).read_bytes())
    (only,) = upstream.local_source(flat, [UP]).files
    assert only.rel == UP and only.origin == flat / "suite_upstream.py"
    assert only.sha256 == sha256(SUITE / UP)


@pytest.mark.parametrize(("text", "expected"), [
    # a call failure: the long report ends with "path:line: Type"
    ('<failure message="x">def t():\n&gt;  boom()\nE   pkg.mod.CustomError: no\n\nt.py:3: CustomError</failure>',
     "CustomError"),
    # a collection error: only the E line names it
    ('<error message="collection failure">Traceback:\nt.py:1: in &lt;module&gt;\n    import x\n'
     "E   ModuleNotFoundError: No module named 'x'</error>", "ModuleNotFoundError"),
    # an exception without a message
    ('<failure message="RuntimeError">E   RuntimeError</failure>', "RuntimeError"),
    # nothing in the text: the setup message
    ('<error message="failed on setup with &quot;KeyError: \'k\'&quot;"></error>', "KeyError"),
    # a type attribute wins
    ('<failure type="builtins.OSError" message="m">t.py:3: ValueError</failure>', "OSError"),
])
def test_exception_type_from_a_junit_element(text, expected):
    import xml.etree.ElementTree as ET

    assert upstream.exception_type(ET.fromstring(text)) == expected


def test_setup_and_teardown_errors_get_their_phase():
    xml = ('<testsuites><testsuite>'
           '<testcase classname="test.unit.suite" name="t1">'
           '<failure message="ValueError: v">t.py:1: ValueError</failure>'
           '<error message="failed on teardown with &quot;OSError: o&quot;">t.py:9: OSError</error></testcase>'
           '<testcase classname="test.unit.suite.TestC" name="t2[1.5-a.b]">'
           '<error message="failed on setup with &quot;KeyError: k&quot;">t.py:5: KeyError</error></testcase>'
           '</testsuite></testsuites>')
    tests, _ = upstream.parse_junit(xml, ["test/unit/suite.py"])
    assert tests == [
        {"nodeid": "test/unit/suite.py::t1", "outcome": "failed", "phase": "call", "type": "ValueError"},
        {"nodeid": "test/unit/suite.py::t1", "outcome": "error", "phase": "teardown", "type": "OSError"},
        {"nodeid": "test/unit/suite.py::TestC::t2[1.5-a.b]", "outcome": "error", "phase": "setup",
         "type": "KeyError"},
    ]
    assert upstream.totals(tests) == {"passed": 0, "failed": 1, "errors": 2, "skipped": 0, "total": 3}


def fake_interpreter(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fakepython"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_pytest_that_cannot_run_is_an_environment_problem(tmp_path):
    python = fake_interpreter(tmp_path, "echo 'ERROR: usage: unrecognized arguments' >&2; exit 4")
    with pytest.raises(HarnessError) as err:
        upstream.run_suite(python, upstream.local_source(SUITE, RELS).files, tmp_path / "log")
    assert err.value.code == ENVIRONMENT
    assert "status 4" in str(err.value) and "unrecognized arguments" in str(err.value)


def test_a_hanging_run_is_killed(tmp_path):
    python = fake_interpreter(tmp_path, "sleep 30")
    began = time.monotonic()
    with pytest.raises(HarnessError, match="did not finish within") as err:
        upstream.run_suite(python, upstream.local_source(SUITE, RELS).files, tmp_path / "log", timeout=0.3)
    assert err.value.code == ENVIRONMENT and time.monotonic() - began < 10


# --- where the tests come from ------------------------------------------------------------------


def test_no_test_source_is_a_usage_error_naming_both_ways_out(project, monkeypatch, unreachable_url):
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}")
    with pytest.raises(HarnessError) as err:
        upstream.resolve_source(project, project.experiment("demo"))
    assert err.value.code == USAGE
    assert upstream.TESTS_ENV in str(err.value) and "SGLANG_REPO" in str(err.value)


def test_a_test_file_missing_from_the_directory_is_a_usage_error(project, tmp_path, monkeypatch):
    monkeypatch.setenv(upstream.TESTS_ENV, str(tmp_path))
    with pytest.raises(HarnessError, match="not found") as err:
        upstream.resolve_source(project, project.experiment("demo"))
    assert err.value.code == USAGE
    with pytest.raises(HarnessError, match="does not exist") as err:
        upstream.resolve_source(project, project.experiment("demo"), tmp_path / "nowhere")
    assert err.value.code == USAGE


def test_an_experiment_without_upstream_tests_is_a_usage_error(tmp_path):
    reg = registry.load(make_project(tmp_path / "bare"))
    with pytest.raises(HarnessError, match="lists no upstream_tests") as err:
        upstream.resolve_source(reg, reg.experiment("demo"), SUITE)
    assert err.value.code == USAGE


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_the_tests_come_from_the_head_commit_of_a_clone(tmp_path, monkeypatch):
    clone = tmp_path / "clone"
    (clone / "python").mkdir(parents=True)
    (clone / "python" / "pyproject.toml").write_text("[project]\nname = 'sglang'\n")
    for rel in RELS:
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_bytes((SUITE / rel).read_bytes())
    git(clone, "init", "-q")
    git(clone, "add", ".")
    git(clone, "commit", "-q", "-m", "head")
    head = git(clone, "rev-parse", "HEAD")
    reg = registry.load(make_project(tmp_path / "p", UPSTREAM_REGISTRY.replace("b" * 40, head)))
    monkeypatch.setenv("SGLANG_REPO", str(clone))
    source = upstream.resolve_source(reg, reg.experiment("demo"))
    assert source.kind == "head-tree" and source.details["head"] == head
    assert [(f.rel, f.sha256) for f in source.files] == [(rel, sha256(SUITE / rel)) for rel in RELS]


# --- the session end to end, through the CLI -----------------------------------------------------


@pytest.fixture
def fake_cell(project, tmp_path, monkeypatch):
    """The side's tree and environment stand in: this interpreter, with pytest, as the cell's."""
    env_dir = tmp_path / "env"
    (env_dir / "bin").mkdir(parents=True)
    # A wrapper, not a symlink: a symlinked venv interpreter would lose its venv (and pytest).
    wrapper = env_dir / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    tree = trees.Tree("release", "1.0.0", "1.0.0", tmp_path / "sglang-1.0.0.whl", "e" * 64, "pypi", "x.whl")
    seen = {}

    def environment(reg, tree_, slug, constraints=None):
        seen["slug"] = slug
        return environments.CellEnvironment(env_dir, reg.python, environments.TorchChoice("cpu", "cpu"),
                                            reused=True)

    monkeypatch.setattr(cells, "resolve_tree", lambda reg, cell: tree)
    monkeypatch.setattr(cells, "cell_environment", environment)
    monkeypatch.setattr(environments.CellEnvironment, "packages", lambda self: {"pytest": "9"})
    return project, seen


def test_the_session_writes_a_deterministic_result_and_a_receipt(fake_cell, capsys):
    reg, seen = fake_cell
    argv = ["--root", str(reg.root), "upstream", "demo", "base", "--kind", "release", "--tests", str(SUITE)]
    assert cli.main(argv) == 0  # failing upstream tests are the data, not a harness failure
    assert seen["slug"] == "demo.base.release-1.0.0"  # the probe cell's environment
    result = reg.root / "runs" / "demo.base.release-1.0.0.upstream.json"
    receipt = reg.root / "runs" / "demo.base.release-1.0.0.upstream.receipt.json"
    doc = json.loads(result.read_text())
    assert doc == {
        "schema": upstream.RESULT_SCHEMA, "experiment": "demo", "side": "base",
        "tree": {"kind": "release", "ref": "1.0.0", "resolved": "1.0.0"},
        "files": {rel: sha256(SUITE / rel) for rel in RELS},
        "tests": EXPECTED_TESTS, "totals": EXPECTED_TOTALS, "types": EXPECTED_TYPES,
    }
    assert result.read_text() == results.dumps(doc)
    rec = json.loads(receipt.read_text())
    log = reg.root / ".cells" / "logs" / "demo.base.release-1.0.0.upstream.log"
    assert rec["log"] == {"file": str(log), "sha256": sha256(log)}
    assert rec["result"] == {"file": result.name, "sha256": sha256(result)}
    assert rec["pytest_exit_status"] == 1 and rec["environment"]["reused"] is True
    assert rec["tests_source"]["kind"] == "local" and rec["tests_source"]["path"] == str(SUITE.resolve())
    assert [f["sha256"] for f in rec["tests_source"]["files"]] == [sha256(SUITE / rel) for rel in RELS]
    assert rec["command"][1:3] == ["-m", "pytest"]
    assert "1 passed, 3 failed, 1 errors, 1 skipped" in capsys.readouterr().out

    first = result.read_bytes()
    assert cli.main(argv) == 0
    assert result.read_bytes() == first  # same tree, same tests, same environment: same bytes


def test_the_session_without_a_test_source_exits_with_the_usage_code(fake_cell, monkeypatch, unreachable_url,
                                                                      capsys):
    reg, seen = fake_cell
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}")
    assert cli.main(["--root", str(reg.root), "upstream", "demo", "head", "--kind", "release"]) == USAGE
    assert upstream.TESTS_ENV in capsys.readouterr().err
    assert "slug" not in seen  # nothing was built


# --- base vs head ---------------------------------------------------------------------------------


def write_upstream(runs: Path, side: str, version: str, tests: list[dict]) -> None:
    doc = {"schema": upstream.RESULT_SCHEMA, "experiment": "demo", "side": side,
           "tree": {"kind": "release", "ref": version, "resolved": version}, "files": {UP: "f" * 64},
           "tests": tests, "totals": upstream.totals(tests), "types": upstream.type_counts(tests)}
    results.write_atomic(runs / upstream.result_name("demo", side, f"release-{version}"), results.dumps(doc))


def test_summarize_pairs_base_and_head(project, tmp_path):
    runs = tmp_path / "runs"
    passed = {"outcome": "passed", "phase": None, "type": None}
    write_upstream(runs, "base", "1.0.0", [
        {"nodeid": f"{UP}::a", **passed},
        {"nodeid": f"{UP}::b", "outcome": "failed", "phase": "call", "type": "AttributeError"},
    ])
    (entry,) = upstream.summarize(runs, project)
    assert entry["verdict"] == upstream.INCOMPLETE and entry["sides"]["head"] is None

    write_upstream(runs, "head", "1.1.0", [{"nodeid": f"{UP}::a", **passed}, {"nodeid": f"{UP}::b", **passed}])
    (entry,) = upstream.summarize(runs, project)
    assert entry["experiment"] == "demo" and entry["pr"] == 1 and entry["kind"] == "release"
    assert entry["verdict"] == upstream.FIXED_BY_HEAD and entry["same_test_files"] is True
    assert entry["sides"]["base"]["totals"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 0, "total": 2}
    assert entry["sides"]["base"]["types"] == {"AttributeError": 1}
    assert entry["sides"]["head"]["file"] == "demo.head.release-1.1.0.upstream.json"
    assert entry["changed"] == [{"nodeid": f"{UP}::b", "base": {"outcome": "failed", "type": "AttributeError"},
                                 "head": {"outcome": "passed", "type": None}}]
    assert upstream.summarize(tmp_path / "empty", project) == []
