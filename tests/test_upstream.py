"""Upstream test runs: source resolution, pytest in a scratch copy read through our report
plugin, subtests, the typed result + receipt, and the base/head summary. No SGLang, no network:
the "upstream tests" are the fixture suite in tests/fixtures/upstream_suite/, run with this
interpreter (its pytest is the cells' pinned one; see test_the_cells_pin_the_pytest_we_test_with)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from packaging.version import Version
from synthetic import REGISTRY, make_project

from pdevidence import cli, environments, registry
from pdevidence.cells import cells
from pdevidence.core.errors import ENVIRONMENT, USAGE, HarnessError
from pdevidence.core.files import dumps, write_atomic
from pdevidence.documents.upstream_model import (
    RESULT_SCHEMA,
    Outcome,
    Subtest,
    TestEntry,
    UpstreamResult,
    Verdict,
    load,
    pytest_summary,
    subtest_totals,
    summary_line,
    totals,
    type_counts,
)
from pdevidence.lanes import upstream, upstream_pytest
from pdevidence.sources import trees

SUITE = Path(__file__).parent / "fixtures" / "upstream_suite"
RELS = ["test/unit/suite_upstream.py", "test/unit/suite_import_error.py"]
UP = "test/unit/suite_upstream.py"
IMP = "test/unit/suite_import_error.py"
SUB = "test/unit/suite_subtests.py"
WRAPPED = "test/unit/suite_wrapped.py"

# What the fixture suite must give, in pytest's order (collection errors first).
EXPECTED_TESTS = [
    {"nodeid": IMP, "outcome": "error", "phase": "collection", "type": "ImportError", "subtests": []},
    {"nodeid": f"{UP}::test_passes", "outcome": "passed", "phase": None, "type": None, "subtests": []},
    {"nodeid": f"{UP}::test_assertion_fails", "outcome": "failed", "phase": "call", "type": "AssertionError",
     "subtests": []},
    {"nodeid": f"{UP}::test_attribute_error", "outcome": "failed", "phase": "call", "type": "AttributeError",
     "subtests": []},
    {"nodeid": f"{UP}::test_value_error", "outcome": "failed", "phase": "call", "type": "ValueError",
     "subtests": []},
    {"nodeid": f"{UP}::TestGrouped::test_skipped", "outcome": "skipped", "phase": None, "type": "pytest.skip",
     "subtests": []},
]
EXPECTED_TOTALS = {"passed": 1, "failed": 3, "errors": 1, "skipped": 1, "xfailed": 0, "xpassed": 0, "total": 6}
NO_SUBTESTS = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "xfailed": 0, "xpassed": 0, "total": 0}
EXPECTED_TYPES = {"AssertionError": 1, "AttributeError": 1, "ImportError": 1, "ValueError": 1}
UPSTREAM_REGISTRY = REGISTRY.replace('probe = "probes/probe_demo.py"\n',
                                     'probe = "probes/probe_demo.py"\n'
                                     f'upstream_tests = {json.dumps(RELS)}\n', 1)


def as_json(tests: list[TestEntry]) -> list[dict]:
    return [t.to_json() for t in tests]


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
    assert as_json(run.tests) == EXPECTED_TESTS
    assert totals(run.tests) == EXPECTED_TOTALS and subtest_totals(run.tests) == NO_SUBTESTS
    assert type_counts(run.tests) == EXPECTED_TYPES
    assert run.log == log and run.log_sha256 == sha256(log)
    assert "suite_upstream.py" in log.read_text()
    assert run.command[run.command.index("no:cacheprovider") + 1:][:2] == ["-p", upstream_pytest.PLUGIN]
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
    assert as_json(run.tests) == EXPECTED_TESTS[1:]


def test_a_bare_file_name_in_the_directory_stands_for_its_repository_path(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "suite_upstream.py").write_bytes((SUITE / UP).read_bytes())
    (only,) = upstream.local_source(flat, [UP]).files
    assert only.rel == UP and only.origin == flat / "suite_upstream.py"
    assert only.sha256 == sha256(SUITE / UP)


# What the subtest suite must give: each method once, with its subtests and their parameters.
EXPECTED_SUBTEST_TESTS = [
    {"nodeid": f"{SUB}::TestBatches::test_all_pass", "outcome": "passed", "phase": None, "type": None,
     "subtests": [{"msg": None, "params": {"i": str(i)}, "outcome": "passed", "type": None} for i in range(3)]},
    # pytest 9 counts a unittest method whose subtests failed as passed; its subtests carry the failures.
    {"nodeid": f"{SUB}::TestBatches::test_named", "outcome": "passed", "phase": None, "type": None,
     "subtests": [{"msg": "empty", "params": {}, "outcome": "passed", "type": None},
                  {"msg": "lookup", "params": {"key": "'k'"}, "outcome": "failed", "type": "KeyError"}]},
    {"nodeid": f"{SUB}::TestBatches::test_sizes", "outcome": "passed", "phase": None, "type": None,
     "subtests": [{"msg": None, "params": {"size": str(n)}, "outcome": "passed" if n < 2 else "failed",
                   "type": None if n < 2 else "AssertionError"} for n in range(4)]},
    # The subtests fixture fails the test around a failed subtest ("contains 1 failed subtest").
    {"nodeid": f"{SUB}::test_fixture_subtests", "outcome": "failed", "phase": "call", "type": None,
     "subtests": [{"msg": "divide", "params": {"d": "0"}, "outcome": "failed", "type": "ZeroDivisionError"},
                  {"msg": "divide", "params": {"d": "1"}, "outcome": "passed", "type": None},
                  {"msg": "later", "params": {}, "outcome": "skipped", "type": "pytest.skip"}]},
]


def pytest_summary_line(log: Path) -> str:
    """The counts of pytest's last line ("==== 8 failed, 4 passed, 1 error in 0.13s ===="), warnings left out."""
    (line,) = [ln for ln in log.read_text().splitlines() if re.fullmatch(r"=+ .* in [\d.]+s(?: \(.*\))? =+", ln)]
    counts = re.sub(r"^=+ | in [\d.]+s(?: \(.*\))? =+$", "", line)
    return ", ".join(part for part in counts.split(", ") if not re.fullmatch(r"\d+ warnings?", part))


def test_the_cells_pin_the_pytest_we_test_with():
    """The subtest evidence below comes from this interpreter's pytest: the cells must run the same."""
    text = (Path(__file__).parents[1] / "constraints" / "cells-py312.txt").read_text()
    (pinned,) = re.findall(r"^pytest==(\S+)", text, re.M)
    assert Version(pinned).release[:2] == Version(pytest.__version__).release[:2], (pinned, pytest.__version__)


def test_subtests_are_recorded_with_their_parameters_and_totals_agree_with_pytest(tmp_path):
    source = upstream.local_source(SUITE, [SUB, *RELS])
    log = tmp_path / "suite.log"
    run = upstream.run_suite(Path(sys.executable), source.files, log)

    assert as_json(run.tests) == [EXPECTED_TESTS[0], *EXPECTED_SUBTEST_TESTS, *EXPECTED_TESTS[1:]]
    assert totals(run.tests) == {"passed": 4, "failed": 4, "errors": 1, "skipped": 1, "xfailed": 0, "xpassed": 0,
                                 "total": 10}
    assert subtest_totals(run.tests) == {"passed": 7, "failed": 4, "errors": 0, "skipped": 1, "xfailed": 0,
                                         "xpassed": 0, "total": 12}
    # pytest's own words, from its log: every subtest counted once, each method once.
    assert pytest_summary_line(log) == summary_line(run.tests) == \
        "8 failed, 4 passed, 2 skipped, 1 error, 7 subtests passed"
    assert pytest_summary(run.tests) == {"failed": 8, "passed": 4, "skipped": 2, "errors": 1, "subtests passed": 7}
    # test_fixture_subtests failed by its ZeroDivisionError subtest only: no "unknown" of its own.
    assert type_counts(run.tests) == {**EXPECTED_TYPES, "AssertionError": 3, "KeyError": 1, "ZeroDivisionError": 1}
    failed = [(m["nodeid"].rsplit("::", 1)[1], m["subtest"]) for m in run.messages if m["subtest"]]
    assert failed == [("test_named", {"msg": "lookup", "params": {"key": "'k'"}}),
                      ("test_sizes", {"msg": None, "params": {"size": "2"}}),
                      ("test_sizes", {"msg": None, "params": {"size": "3"}}),
                      ("test_fixture_subtests", {"msg": "divide", "params": {"d": "0"}})]


def test_a_bare_exception_over_another_takes_the_kind_of_the_one_it_wraps(tmp_path):
    run = upstream.run_suite(Path(sys.executable), upstream.local_source(SUITE, [WRAPPED]).files, tmp_path / "log")

    kinds = {t.nodeid.rsplit("::", 1)[1]: t.type for t in run.tests}
    assert kinds == {"test_attribute_error": "AttributeError",  # CustomTestCase's retry wrapper sees through
                     "test_a_bare_exception_of_its_own": "Exception",  # nothing wrapped: its own kind
                     "test_a_bare_exception_from_a_key_error": "KeyError",
                     "test_a_typed_exception_from_a_key_error": "RuntimeError"}  # a typed wrapper names its kind
    messages = {m["nodeid"].rsplit("::", 1)[1]: m["message"] for m in run.messages}
    assert messages["test_attribute_error"] == "AttributeError: 'object' object has no attribute 'note_abort_ack'"
    assert messages["test_a_bare_exception_of_its_own"] == "Exception: no kind but its own"


@pytest.mark.parametrize(("text", "message", "expected"), [
    # a call failure: the long report ends with "path:line: Type"
    ("def t():\n>  boom()\nE   pkg.mod.CustomError: no\n\nt.py:3: CustomError", "pkg.mod.CustomError: no",
     "CustomError"),
    # a collection error: only the E line names it
    ("Traceback:\nt.py:1: in <module>\n    import x\nE   ModuleNotFoundError: No module named 'x'", None,
     "ModuleNotFoundError"),
    # nothing in the text: the crash message
    ("", "KeyError: 'k'", "KeyError"),
    # a chain: the last exception's type, unless it is a bare Exception wrapping another
    ("t.py:3: KeyError\n\nDuring handling of the above exception, another exception occurred:\n\nt.py:9: Exception",
     "Exception: retry() exceed maximum number of retries.", "KeyError"),
    ("t.py:3: KeyError\n\nThe above exception was the direct cause of the following exception:\n\nt.py:9: OSError",
     "OSError: o", "OSError"),
    # neither names a type
    ("contains 1 failed subtest", "[XPASS(strict)] flaky", None),
])
def test_exception_type_from_a_long_report(text, message, expected):
    assert upstream_pytest.exception_type(text, message) == expected


def record(nodeid: str, when: str, outcome: str, *, subtest=None, longrepr: str = "", crash=None, xfail=False):
    """One line as upstream_plugin writes it."""
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "xfail": xfail, "subtest": subtest,
            "longrepr": longrepr, "crash": crash}


def test_setup_teardown_and_xfail_reports_get_their_outcome_and_phase():
    t1, t2, t3 = "test/unit/suite.py::t1", "test/unit/suite.py::TestC::t2[1.5-a.b]", "test/unit/suite.py::t3"
    tests, messages = upstream_pytest.parse_records([
        record(t1, "setup", "passed"),
        record(t1, "call", "failed", longrepr="t.py:1: ValueError", crash="ValueError: v"),
        record(t1, "teardown", "failed", longrepr="t.py:9: OSError", crash="OSError: o"),
        record(t2, "setup", "failed", longrepr="t.py:5: KeyError", crash="KeyError: k"),
        record(t2, "teardown", "passed"),
        record(t3, "call", "skipped", xfail=True, subtest={"msg": None, "params": {"n": "1"}}),
        record(t3, "call", "passed", xfail=True),
    ])
    assert as_json(tests) == [
        {"nodeid": t1, "outcome": "failed", "phase": "call", "type": "ValueError", "subtests": []},
        {"nodeid": t1, "outcome": "error", "phase": "teardown", "type": "OSError", "subtests": []},
        {"nodeid": t2, "outcome": "error", "phase": "setup", "type": "KeyError", "subtests": []},
        {"nodeid": t3, "outcome": "xpassed", "phase": None, "type": None,
         "subtests": [{"msg": None, "params": {"n": "1"}, "outcome": "xfailed", "type": "pytest.xfail"}]},
    ]
    assert totals(tests) == {"passed": 0, "failed": 1, "errors": 2, "skipped": 0, "xfailed": 0, "xpassed": 1,
                             "total": 4}
    assert [(m["phase"], m["message"]) for m in messages] == [("call", "ValueError: v"), ("teardown", "OSError: o"),
                                                              ("setup", "KeyError: k")]


def test_subtests_without_their_tests_report_are_refused():
    with pytest.raises(ValueError, match="without their test's own report"):
        upstream_pytest.parse_records([record("t.py::t", "call", "passed", subtest={"msg": "m", "params": {}})])


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


def test_an_interrupted_run_is_an_environment_problem_not_data(tmp_path):
    """pytest's exit status 2: a test raised KeyboardInterrupt and the session stopped half-way."""
    checkout = tmp_path / "sglang"
    (checkout / "test").mkdir(parents=True)
    (checkout / "test" / "suite_interrupt.py").write_text(
        "def test_before():\n    pass\n\n\ndef test_interrupts():\n    raise KeyboardInterrupt\n\n\n"
        "def test_never_reached():\n    pass\n")
    with pytest.raises(HarnessError) as err:
        upstream.run_suite(Path(sys.executable), upstream.local_source(checkout, ["test/suite_interrupt.py"]).files,
                           tmp_path / "log")
    assert err.value.code == ENVIRONMENT
    assert "status 2 (interrupted)" in str(err.value) and "no result written" in str(err.value)


def test_an_interpreter_without_pytest_is_an_environment_problem(tmp_path):
    """``python -m pytest`` without pytest exits 1, the status of failing tests; no report says one failed."""
    python = fake_interpreter(tmp_path, "echo 'No module named pytest' >&2; exit 1")
    with pytest.raises(HarnessError, match="reported no failing test") as err:
        upstream.run_suite(python, upstream.local_source(SUITE, RELS).files, tmp_path / "log")
    assert err.value.code == ENVIRONMENT and "No module named pytest" in str(err.value)


def test_unreadable_report_records_are_an_environment_problem(tmp_path):
    python = fake_interpreter(tmp_path, 'printf \'{"nodeid": \' > "$PDEVIDENCE_UPSTREAM_RECORD"; exit 1')
    with pytest.raises(HarnessError, match="report records are unreadable") as err:
        upstream.run_suite(python, upstream.local_source(SUITE, RELS).files, tmp_path / "log")
    assert err.value.code == ENVIRONMENT


def test_a_hanging_run_is_killed(tmp_path):
    python = fake_interpreter(tmp_path, "sleep 30")
    began = time.monotonic()
    with pytest.raises(HarnessError, match="did not finish within") as err:
        upstream.run_suite(python, upstream.local_source(SUITE, RELS).files, tmp_path / "log", timeout=0.3)
    assert err.value.code == ENVIRONMENT and time.monotonic() - began < 10


# --- where the tests come from ------------------------------------------------------------------


def test_an_unfetchable_head_tree_is_an_environment_problem_naming_both_ways_out(project, monkeypatch,
                                                                                 unreachable_url):
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}")
    with pytest.raises(HarnessError) as err:
        upstream.resolve_source(project, project.experiment("demo"))
    assert err.value.code == ENVIRONMENT  # docs/operators/exit-codes.md: "a tree could not be fetched" is 3
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
    (clone / "python" / "sglang").mkdir(parents=True)
    (clone / "python" / "pyproject.toml").write_text("[project]\nname = 'sglang'\n")
    (clone / "python" / "sglang" / "__init__.py").write_text("")
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


def this_interpreter_as_an_environment(env_dir: Path) -> Path:
    """A venv of this interpreter whose .pth names this environment's site-packages (pytest): what the
    sandbox shows the cell's interpreter is read from its pyvenv.cfg and .pth files, as in a real cell."""
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "python").symlink_to(sys.executable)
    (env_dir / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).resolve().parent}\n")
    site = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    (site / "this-environment.pth").write_text("\n".join(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    return env_dir


@pytest.fixture
def fake_cell(project, tmp_path, monkeypatch):
    """The side's tree and environment stand in: this interpreter, with pytest, as the cell's."""
    env_dir = this_interpreter_as_an_environment(tmp_path / "env")
    tree = trees.Tree("release", "1.0.0", "1.0.0", tmp_path / "sglang-1.0.0.whl", "e" * 64, "pypi", "x.whl")
    seen = {}

    def environment(reg, tree_, slug, constraints=None):
        seen["slug"] = slug
        return environments.CellEnvironment(env_dir, reg.python, environments.TorchChoice("cpu", "cpu"),
                                            reused=True)

    monkeypatch.setattr(cells, "resolve_tree", lambda reg, cell: tree)
    monkeypatch.setattr(environments, "cell_environment", environment)
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
        "schema": RESULT_SCHEMA, "experiment": "demo", "side": "base",
        "tree": {"kind": "release", "ref": "1.0.0", "resolved": "1.0.0"},
        "files": {rel: sha256(SUITE / rel) for rel in RELS},
        "tests": EXPECTED_TESTS, "totals": EXPECTED_TOTALS, "subtest_totals": NO_SUBTESTS, "types": EXPECTED_TYPES,
    }
    assert result.read_text() == dumps(doc)
    assert load(result, experiment="demo", side="base").to_json() == doc
    rec = json.loads(receipt.read_text())
    log = reg.root / ".cells" / "logs" / "demo.base.release-1.0.0.upstream.log"
    assert rec["log"] == {"file": str(log), "sha256": sha256(log)}
    assert rec["result"] == {"file": result.name, "sha256": sha256(result)}
    assert rec["pytest_exit_status"] == 1 and rec["environment"]["reused"] is True
    assert rec["tests_source"]["kind"] == "local" and rec["tests_source"]["path"] == str(SUITE.resolve())
    assert [f["sha256"] for f in rec["tests_source"]["files"]] == [sha256(SUITE / rel) for rel in RELS]
    assert rec["command"][1:3] == ["-m", "pytest"]
    assert "3 failed, 1 passed, 1 skipped, 1 error (AssertionError 1," in capsys.readouterr().out

    first = result.read_bytes()
    assert cli.main(argv) == 0
    assert result.read_bytes() == first  # same tree, same tests, same environment: same bytes


UNBUILT_TEST = "test/unit/test_unbuilt.py"


def test_a_path_trees_tests_import_its_python_dir_unbuilt(tmp_path, monkeypatch):
    """`--kind path`: the tests import the work tree's python/ as it is, as ``check --path`` does (it is never
    built: test_environments)."""
    fork = tmp_path / "fork"
    (fork / "python" / "sglang").mkdir(parents=True)
    (fork / "python" / "sglang" / "__init__.py").write_text("__version__ = '1.1.0'\nFROM_THE_TREE = True\n")
    tests = tmp_path / "tests"
    (tests / "test" / "unit").mkdir(parents=True)
    (tests / UNBUILT_TEST).write_text("import sglang\n\n\ndef test_the_tree_as_it_is():\n"
                                      "    assert sglang.FROM_THE_TREE\n")
    reg = registry.load(make_project(tmp_path / "project", REGISTRY.replace(
        'probe = "probes/probe_demo.py"\n', f'probe = "probes/probe_demo.py"\nupstream_tests = ["{UNBUILT_TEST}"]\n', 1)))
    env_dir = this_interpreter_as_an_environment(tmp_path / "env")
    # The environment is the closure alone (uv is not run here); what the lane does with the tree is real.
    monkeypatch.setattr(environments, "ensure", lambda home, stem, python, closure, tree, torch, **kw:
                        environments.CellEnvironment(env_dir, python, torch, reused=True))
    monkeypatch.setattr(environments.CellEnvironment, "packages", lambda self: {"pytest": "9"})
    argv = ["--root", str(reg.root), "upstream", "demo", "base", "--kind", "path", "--ref", str(fork),
            "--tests", str(tests)]
    assert cli.main(argv) == 0
    doc = load(next((reg.root / "runs").glob("demo.base.path-*.upstream.json")), experiment="demo", side="base")
    assert [(t.nodeid, t.outcome) for t in doc.tests] == [(f"{UNBUILT_TEST}::test_the_tree_as_it_is", Outcome.PASSED)]


def test_a_failed_rerun_keeps_the_previous_pair_as_it_was(fake_cell, monkeypatch):
    reg, _ = fake_cell
    argv = ["--root", str(reg.root), "upstream", "demo", "base", "--kind", "release", "--tests", str(SUITE)]
    assert cli.main(argv) == 0
    runs = reg.root / "runs"
    before = {p.name: p.read_bytes() for p in runs.iterdir()}

    def packages_fail(self):  # pytest ran; listing the environment fails before the receipt
        raise HarnessError("uv pip list failed")

    monkeypatch.setattr(environments.CellEnvironment, "packages", packages_fail)
    assert cli.main(argv) == ENVIRONMENT

    assert {p.name: p.read_bytes() for p in runs.iterdir()} == before  # byte-identical, no staging left


def test_the_session_without_a_test_source_exits_with_the_environment_code(fake_cell, monkeypatch, unreachable_url,
                                                                            capsys):
    reg, seen = fake_cell
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}")
    assert cli.main(["--root", str(reg.root), "upstream", "demo", "head", "--kind", "release"]) == ENVIRONMENT
    assert upstream.TESTS_ENV in capsys.readouterr().err
    assert "slug" not in seen  # nothing was built


# --- base vs head ---------------------------------------------------------------------------------


def write_upstream(runs: Path, side: str, version: str, tests: list[TestEntry]) -> Path:
    doc = UpstreamResult("demo", side, {"kind": "release", "ref": version, "resolved": version}, {UP: "f" * 64}, tests)
    path = runs / upstream.result_name("demo", side, f"release-{version}")
    write_atomic(path, dumps(doc.to_json()))
    return path


def passed(name: str, *subtests: Subtest) -> TestEntry:
    return TestEntry(f"{UP}::{name}", Outcome.PASSED, None, None, subtests)


def sub(outcome: Outcome, i: int, kind: str | None = None) -> Subtest:
    return Subtest(None, {"i": str(i)}, outcome, kind)


def test_summarize_pairs_base_and_head(project, tmp_path):
    runs = tmp_path / "runs"
    write_upstream(runs, "base", "1.0.0", [passed("a"), TestEntry(f"{UP}::b", Outcome.FAILED, "call", "AttributeError")])
    (entry,) = upstream.summarize(runs, project)
    assert entry["verdict"] == Verdict.INCOMPLETE and entry["sides"]["head"] is None and entry["changed"] == []

    write_upstream(runs, "head", "1.1.0", [passed("a"), passed("b")])
    (entry,) = upstream.summarize(runs, project)
    assert entry["experiment"] == "demo" and entry["pr"] == 1 and entry["kind"] == "release"
    assert entry["tree"] == upstream.PINS and entry["label"] == "release pins"
    assert entry["verdict"] == "tests fail on base, pass on head" and entry["same_test_files"] is True
    assert entry["sides"]["base"]["totals"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 0, "xfailed": 0,
                                                "xpassed": 0, "total": 2}
    assert entry["sides"]["base"]["types"] == {"AttributeError": 1}
    assert entry["sides"]["head"]["file"] == "demo.head.release-1.1.0.upstream.json"
    assert entry["changed"] == [{"nodeid": f"{UP}::b", "subtest": None,
                                 "base": {"outcome": "failed", "type": "AttributeError"},
                                 "head": {"outcome": "passed", "type": None}}]
    assert json.loads(json.dumps(entry)) == entry  # plain JSON: the verdict is its string
    assert upstream.summarize(tmp_path / "empty", project) == []


def test_failed_subtests_decide_the_verdict_and_show_which_case_changed(project, tmp_path):
    """A unittest method whose subtests failed is "passed" to pytest; its side still failed."""
    runs = tmp_path / "runs"
    write_upstream(runs, "base", "1.0.0", [passed("m", sub(Outcome.PASSED, 0), sub(Outcome.FAILED, 1, "KeyError"))])
    write_upstream(runs, "head", "1.1.0", [passed("m", sub(Outcome.PASSED, 0), sub(Outcome.PASSED, 1))])
    (entry,) = upstream.summarize(runs, project)
    assert entry["verdict"] == Verdict.FIXED_BY_HEAD
    assert entry["sides"]["base"]["totals"]["passed"] == 1 and entry["sides"]["base"]["totals"]["failed"] == 0
    assert entry["sides"]["base"]["subtest_totals"]["failed"] == 1
    assert entry["sides"]["base"]["pytest_summary"] == {"failed": 1, "passed": 1, "subtests passed": 1}
    assert entry["sides"]["base"]["types"] == {"KeyError": 1}
    assert entry["changed"] == [{"nodeid": f"{UP}::m", "subtest": {"msg": None, "params": {"i": "1"}},
                                 "base": {"outcome": "failed", "type": "KeyError"},
                                 "head": {"outcome": "passed", "type": None}}]

    write_upstream(runs, "head", "1.1.0", [passed("m", sub(Outcome.PASSED, 0), sub(Outcome.FAILED, 1, "KeyError"))])
    (entry,) = upstream.summarize(runs, project)
    assert entry["verdict"] == Verdict.FAIL_ON_HEAD and entry["changed"] == []


def test_results_on_other_trees_are_extra_rows_labelled_with_their_tree(project, tmp_path):
    """``upstream --ref 0.9.0`` writes a result no pin names; compare still shows it."""
    runs = tmp_path / "runs"
    write_upstream(runs, "base", "1.0.0", [passed("a")])
    write_upstream(runs, "head", "1.1.0", [passed("a")])
    write_upstream(runs, "head", "0.9.0", [passed("a", sub(Outcome.FAILED, 0, "ValueError"))])
    write_upstream(runs, "base", "1.2.0", [passed("a")])
    write_upstream(runs, "head", "1.2.0", [passed("a")])
    write_upstream(runs, "base", "1.3.0", [])
    entries = upstream.summarize(runs, project)
    assert [(e["tree"], e["label"], e["verdict"]) for e in entries] == [
        (upstream.PINS, "release pins", Verdict.BOTH_PASS),
        ("release-0.9.0", "release-0.9.0", Verdict.TREE_FAILS),
        ("release-1.2.0", "release-1.2.0", Verdict.TREE_PASSES),
        ("release-1.3.0", "release-1.3.0", Verdict.NO_TESTS),
    ]
    extra = entries[1]
    assert extra["kind"] == "release" and extra["sides"]["base"] is None and extra["changed"] == []
    assert extra["sides"]["head"]["file"] == "demo.head.release-0.9.0.upstream.json"
    assert {"experiment", "pr", "kind", "verdict", "sides", "changed", "same_test_files"} <= extra.keys()
    assert upstream.summarize(runs, project, ("git",)) == []  # every one of them is a release tree


def test_a_corrupt_or_mislabelled_result_is_an_environment_error_not_a_traceback(project, tmp_path, capsys):
    runs = project.root / "runs"
    path = write_upstream(runs, "base", "1.0.0", [passed("a")])
    doc = json.loads(path.read_text())
    for broken, why in [
        ("{not json", "Expecting property name"),
        (json.dumps({**doc, "schema": "pdevidence-upstream/1"}), "schema 'pdevidence-upstream/1'"),
        (json.dumps({**doc, "tests": [{"nodeid": "x", "outcome": "exploded"}]}), "outcome 'exploded'"),
        (json.dumps({**doc, "tests": [["x"]]}), "no 'nodeid'"),
        (json.dumps({**doc, "tree": {"kind": "release", "ref": 1, "resolved": 1}}), "tree must have kind, ref"),
        (json.dumps({**doc, "totals": {**doc["totals"], "passed": 7}}), "'totals' does not match the tests"),
        (json.dumps({**doc, "side": "head"}), "side 'head', expected 'base'"),
        (json.dumps({**doc, "tree": {"kind": "release", "ref": "1.0.1", "resolved": "1.0.1"}}),
         "tree 'release-1.0.1', expected 'release-1.0.0'"),
    ]:
        path.write_text(broken)
        with pytest.raises(HarnessError, match=re.escape(why)) as err:
            upstream.summarize(runs, project)
        assert err.value.code == ENVIRONMENT and "rerun its upstream session" in str(err.value)
    assert cli.main(["--root", str(project.root), "compare", "--kind", "release"]) == ENVIRONMENT
    assert "is not a usable upstream result" in capsys.readouterr().err


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_local_tests_record_their_checkout_and_whether_they_differ_from_its_head(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "test_a.py").write_text("def test_a():\n    pass\n")
    _git(tmp_path, "add", "test_a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    clean = upstream.local_source(tmp_path, ["test_a.py"]).details
    (tmp_path / "test_a.py").write_text("def test_a():\n    assert False\n")
    edited = upstream.local_source(tmp_path, ["test_a.py"]).details
    assert clean["git_head"] == edited["git_head"] and len(clean["git_head"]) == 40
    assert (clean["files_differ_from_head"], edited["files_differ_from_head"]) == (False, True)


def test_a_checkout_git_cannot_read_is_refused_with_what_to_do(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / ".git" / "index").write_bytes(b"not an index")  # `git status` fails on a corrupt index
    with pytest.raises(HarnessError, match=r"`git status .*` failed \(128\) in the checkout holding") as err:
        upstream.local_source(tmp_path, ["test_a.py"])
    assert err.value.code == ENVIRONMENT and "index" in err.value.what
    assert "copy the test files to a directory outside it" in err.value.todo


def test_local_tests_outside_a_checkout_or_before_its_first_commit_record_no_head(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test_a.py").write_text("def test_a():\n    pass\n")
    assert upstream.local_source(outside, ["test_a.py"]).details["git_head"] is None
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    _git(fresh, "init", "-q")
    (fresh / "test_a.py").write_text("def test_a():\n    pass\n")
    details = upstream.local_source(fresh, ["test_a.py"]).details
    assert details["git_head"] is None and details["files_differ_from_head"] is True
