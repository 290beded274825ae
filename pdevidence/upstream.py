"""The PR's own test files, taken from the head tree, run against each side's tree.

``upstream(<experiment>, <side>)`` copies the registry's ``upstream_tests``
(paths inside the SGLang repository) from the head commit - or from a local
directory, since release wheels carry no tests - into a scratch directory, and
runs them with pytest in the side's cell environment (the one the probe cell
builds). The JUnit XML becomes ``<experiment>.<side>.<tree>.upstream.json``:
per test its outcome and, for failures and errors, the exception type; failing
tests are the data, not a harness failure. The receipt beside it records where
the tests came from, their SHA-256, the pytest command, its exit status and the
SHA-256 of the log kept under ``.cells/logs/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

from . import cells, receipts, results, trees
from .errors import ENVIRONMENT, HarnessError, usage
from .fetch import sha256_file
from .locking import exclusive
from .paths import runs_dir, tree_lock_file, work_dir
from .probe_run import run_killable, tail, timeout_seconds
from .registry import SIDES, Experiment, Registry

RESULT_SCHEMA = "pdevidence-upstream/1"
RECEIPT_SCHEMA = "pdevidence-upstream-receipt/1"
RESULT_SUFFIX = ".upstream.json"
TESTS_ENV = "PDEVIDENCE_UPSTREAM_TESTS"
TOTAL_KEYS = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
# pytest: 0 all passed, 1 some failed, 5 nothing collected - all data. 2 interrupted,
# 3 internal error, 4 usage error: the run itself went wrong.
BROKEN_RUN = (3, 4)

# The last "path:line: TypeName" of a pytest long report names the exception raised.
_LOCATION_TYPE = re.compile(r"^\S.*:\d+: ((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\s*$")
# "E   ImportError: cannot import name ..." (collection errors carry no location line).
_E_LINE_TYPE = re.compile(r"^E\s+((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s|:$|$)")
_MESSAGE_TYPE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s|:$|$)")
_PHASE_MESSAGE = re.compile(r'^failed on (setup|teardown) with "(.*)"$', re.S)


# --- where the test files come from ----------------------------------------------------------


@dataclass(frozen=True)
class TestFile:
    rel: str  # the registry's path inside the SGLang repository
    origin: Path  # where it was read
    data: bytes  # exactly what is copied and run

    __test__ = False  # not a pytest class

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class TestSource:
    kind: str  # head-tree | local
    files: list[TestFile]
    details: dict = field(default_factory=dict)

    __test__ = False

    def receipt(self) -> dict:
        return {"kind": self.kind, **self.details,
                "files": [{"path": f.rel, "read_from": str(f.origin), "sha256": f.sha256} for f in self.files]}


def _no_source(exp: Experiment, why: str) -> HarnessError:
    return usage(
        f"no source for the upstream tests of {exp.name}: {why}",
        expected=f"the files {', '.join(exp.upstream_tests)} of the head commit {exp.git['head'][:12]}",
        todo=f"set {TESTS_ENV}=/path/to/sglang-checkout (or pass --tests DIR), or SGLANG_REPO=<clone that has "
        "the head commit>; release wheels carry no tests",
    )


def _check_rel(exp: Experiment, rel: str) -> PurePosixPath:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or path.suffix != ".py":
        raise usage(f"experiments.{exp.name}.upstream_tests: {rel!r} is not a relative path to a .py file "
                    "inside the SGLang repository")
    return path


def local_source(directory: Path, rels: list[str] | tuple[str, ...], exp: Experiment | None = None) -> TestSource:
    """Each path inside ``directory`` (an SGLang checkout), else its file name directly in it."""
    directory = directory.expanduser().resolve()
    if not directory.is_dir():
        raise usage(f"the upstream test directory {directory} does not exist",
                    todo=f"point {TESTS_ENV} (or --tests) at an SGLang checkout or a directory with the test files")
    files, missing = [], []
    for rel in rels:
        path = _check_rel(exp, rel) if exp else PurePosixPath(rel)
        for candidate in (directory / path, directory / path.name):
            if candidate.is_file():
                files.append(TestFile(str(path), candidate, candidate.read_bytes()))
                break
        else:
            missing.append(rel)
    if missing:
        raise usage(f"upstream test files not found in {directory}: {', '.join(missing)}",
                    expected="the registry's paths inside that directory, or the bare file names in it",
                    todo=f"point {TESTS_ENV} (or --tests) at an SGLang checkout of the head commit")
    return TestSource("local", files, {"path": str(directory), **_git_state(directory, [f.origin for f in files])})


def _git_state(directory: Path, files: list[Path]) -> dict:
    """For a directory inside a git checkout: which checkout, its HEAD, and whether the test
    files differ from that HEAD (modified or untracked)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True)

    if not shutil.which("git") or git("rev-parse", "--is-inside-work-tree").returncode != 0:
        return {"git_head": None}
    status = git("status", "--porcelain", "--untracked-files=all", "--", *map(str, files))
    return {"git_toplevel": git("rev-parse", "--show-toplevel").stdout.strip(),
            "git_head": git("rev-parse", "HEAD").stdout.strip() or None,
            "files_differ_from_head": bool(status.stdout.strip())}


def head_tree_source(registry: Registry, exp: Experiment) -> TestSource:
    """The files of the experiment's head commit (SGLANG_REPO clone, or the GitHub archive)."""
    clone = os.environ.get("SGLANG_REPO")
    try:
        tree = trees.git_tree(exp.git["head"], trees.LockFile(tree_lock_file(registry.root)),
                              clone=Path(clone) if clone else None)
    except HarnessError as exc:
        if exc.code != ENVIRONMENT:
            raise
        raise _no_source(exp, f"the head tree is not available ({exc.what.splitlines()[0]})") from None
    files, missing = [], []
    for rel in exp.upstream_tests:
        path = tree.repo_root / _check_rel(exp, rel)
        if path.is_file():
            files.append(TestFile(rel, path, path.read_bytes()))
        else:
            missing.append(rel)
    if missing:
        raise usage(f"the head commit {exp.git['head'][:12]} has no {', '.join(missing)}",
                    todo=f"fix experiments.{exp.name}.upstream_tests in the registry")
    return TestSource("head-tree", files, {"head": tree.resolved, "tree": tree.receipt()})


def resolve_source(registry: Registry, exp: Experiment, tests_dir: Path | None = None) -> TestSource:
    """``tests_dir`` (--tests), else $PDEVIDENCE_UPSTREAM_TESTS, else the head git tree."""
    if not exp.upstream_tests:
        raise usage(f"experiment {exp.name!r} lists no upstream_tests",
                    todo=f"add upstream_tests = [\"test/...py\"] to [experiments.{exp.name}]")
    directory = tests_dir or os.environ.get(TESTS_ENV)
    if directory:
        return local_source(Path(directory), exp.upstream_tests, exp)
    return head_tree_source(registry, exp)


# --- running pytest and reading its JUnit XML ------------------------------------------------


@dataclass
class SuiteRun:
    command: list[str]
    exit_status: int
    log: Path
    log_sha256: str
    tests: list[dict]
    messages: list[dict]
    started: datetime
    finished: datetime



def run_suite(interpreter: Path, files: list[TestFile], log: Path, *, timeout: float | None = None,
              env: dict | None = None) -> SuiteRun:
    """pytest on a scratch copy of ``files`` (their repository paths kept), so no conftest or
    pytest configuration of a checkout applies; one JUnit entry per outcome."""
    timeout = timeout_seconds() if timeout is None else timeout
    log.parent.mkdir(parents=True, exist_ok=True)
    run_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               **(env or {})}
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        run_env.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="pdevidence-upstream-") as scratch:
        suite = Path(scratch) / "suite"
        suite.mkdir()
        ini = suite / "pytest.ini"
        ini.write_text("[pytest]\njunit_family = xunit2\n", encoding="utf-8")
        for f in files:
            dest = suite / f.rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.data)
        junit = Path(scratch) / "junit.xml"
        command = [str(interpreter), "-m", "pytest", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                   "-c", str(ini), "--rootdir", str(suite), "--confcutdir", str(suite),
                   f"--junitxml={junit}", *[f.rel for f in files]]
        started = receipts.now()
        status = run_killable(command, log, timeout=timeout, env=run_env, cwd=suite, what="the upstream tests")
        finished = receipts.now()
        try:
            xml_text = junit.read_text(encoding="utf-8")
        except OSError:
            xml_text = None
    if status in BROKEN_RUN or xml_text is None:
        raise HarnessError(
            f"pytest exited with status {status}{'' if xml_text else ' and wrote no JUnit XML'}: the tests could "
            f"not run in this environment; no result written.\nlast output:\n{tail(log)}",
            todo=f"full log: {log}",
        )
    try:
        tests, messages = parse_junit(xml_text, [f.rel for f in files])
    except ET.ParseError as exc:
        raise HarnessError(f"pytest wrote unreadable JUnit XML ({exc}); no result written",
                           todo=f"full log: {log}") from None
    return SuiteRun(command, status, log, sha256_file(log), tests, messages, started, finished)


def nodeid(classname: str, name: str, rels: list[str]) -> str:
    """Undo pytest's JUnit name mangling (``a/b/test_x.py::C::t`` -> ``a.b.test_x.C`` + ``t``)."""
    modules = {str(PurePosixPath(rel).with_suffix("")).replace("/", "."): rel for rel in rels}
    if not classname:  # a module-level entry: a collection error or a module skip
        return modules.get(name, name)
    for module in sorted(modules, key=len, reverse=True):
        if classname == module or classname.startswith(module + "."):
            classes = classname[len(module) + 1:].split(".") if classname != module else []
            return "::".join([modules[module], *classes, name])
    return f"{classname}::{name}"


def exception_type(element: ET.Element) -> str | None:
    """The type of the exception a <failure>/<error> reports: its ``type`` attribute if pytest
    ever writes one, else the report's last location line, else its last ``E   Type:`` line,
    else the message."""
    declared = element.get("type")
    if declared and not declared.startswith("pytest."):
        return declared.rsplit(".", 1)[-1]
    lines = (element.text or "").splitlines()
    for pattern in (_LOCATION_TYPE, _E_LINE_TYPE):
        for line in reversed(lines):
            match = pattern.match(line.rstrip())
            if match:
                return match.group(1).rsplit(".", 1)[-1]
    message = element.get("message") or ""
    phase = _PHASE_MESSAGE.match(message)
    match = _MESSAGE_TYPE.match(phase.group(2) if phase else message)
    return match.group(1).rsplit(".", 1)[-1] if match else None


def _phase(element: ET.Element, classname: str) -> str:
    if element.tag == "failure":
        return "call"
    message = element.get("message") or ""
    if message == "collection failure" or not classname:
        return "collection"
    phase = _PHASE_MESSAGE.match(message)
    return phase.group(1) if phase else "unknown"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def parse_junit(xml_text: str, rels: list[str]) -> tuple[list[dict], list[dict]]:
    """Per outcome entry: ``{nodeid, outcome, phase, type}``; and the messages (for the receipt).

    A test case with a failure and a teardown error yields two entries, as pytest counts them.
    """
    tests, messages = [], []
    for case in ET.fromstring(xml_text).iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        node = nodeid(classname, name, rels)
        reported = [child for child in case if child.tag in ("failure", "error", "skipped")]
        if not reported:
            tests.append({"nodeid": node, "outcome": "passed", "phase": None, "type": None})
            continue
        for child in reported:
            if child.tag == "skipped":
                entry = {"nodeid": node, "outcome": "skipped", "phase": None, "type": child.get("type")}
            else:
                entry = {"nodeid": node, "outcome": "failed" if child.tag == "failure" else "error",
                         "phase": _phase(child, classname), "type": exception_type(child)}
            tests.append(entry)
            message = child.get("message") or ""
            if entry["outcome"] == "error" and entry["phase"] == "collection":
                # "collection failure" says nothing; the E line says what failed to import.
                e_lines = [ln for ln in (child.text or "").splitlines() if _E_LINE_TYPE.match(ln)]
                message = e_lines[-1][1:].strip() if e_lines else message
            messages.append({"nodeid": node, "outcome": entry["outcome"], "phase": entry["phase"],
                             "message": _first_line(message)})
    return tests, messages


def totals(tests: list[dict]) -> dict[str, int]:
    counts = Counter(t["outcome"] for t in tests)
    return {**{key: counts.get(outcome, 0) for outcome, key in TOTAL_KEYS.items()}, "total": len(tests)}


def type_counts(tests: list[dict]) -> dict[str, int]:
    """Failures and errors by exception type (``"unknown"`` when the report names none)."""
    counts = Counter(t["type"] or "unknown" for t in tests if t["outcome"] in ("failed", "error"))
    return dict(sorted(counts.items()))


# --- the cell: tree, environment, run, result and receipt ------------------------------------


def result_name(experiment: str, side: str, label: str) -> str:
    return results.result_name(experiment, side, label, RESULT_SUFFIX)


def cell_name(experiment: str, side: str) -> str:
    return f"upstream({experiment}, {side})"


@dataclass
class UpstreamOutcome:
    name: str
    result: Path
    receipt: Path
    doc: dict


def result_doc(experiment: str, side: str, tree: trees.Tree, source: TestSource, run: SuiteRun) -> dict:
    """The deterministic part: same tree, same test files, same environment -> same bytes."""
    return {
        "schema": RESULT_SCHEMA,
        "experiment": experiment,
        "side": side,
        "tree": tree.result_tree(),
        "files": {f.rel: f.sha256 for f in source.files},
        "tests": run.tests,
        "totals": totals(run.tests),
        "types": type_counts(run.tests),
    }


def run_upstream(registry: Registry, cell: cells.Cell, *, tests_dir: Path | None = None,
                 out_dir: Path | None = None, log=print) -> UpstreamOutcome:
    exp = registry.experiment(cell.experiment)
    name = cell_name(cell.experiment, cell.side)
    source = resolve_source(registry, exp, tests_dir)  # before any environment is built
    log(f"{name}: {len(source.files)} test file(s) from "
        + (f"the head tree {source.details['head'][:12]}" if source.kind == "head-tree" else source.details["path"]))
    tree = cells.resolve_tree(registry, cell)
    slug = cells.cell_slug(registry, cell, tree)
    result = (out_dir or runs_dir(registry.root)) / result_name(cell.experiment, cell.side, tree.label())
    receipt_file = results.receipt_path(result)
    work = work_dir(registry.root)
    # The probe cell's lock: its environment may be rebuilt by either run, never by both at once.
    with exclusive(work / "locks" / f"{slug}.lock", f"cell {name}"):
        result.unlink(missing_ok=True)
        receipt_file.unlink(missing_ok=True)
        started = receipts.now()
        env = cells.cell_environment(registry, tree, slug)
        log(f"{name}: {'reusing' if env.reused else 'built'} environment {env.path}")
        log(f"{name}: running pytest on {tree.label()}")
        run = run_suite(env.interpreter, source.files, work / "logs" / f"{slug}.upstream.log")
        packages = env.packages()  # before the result: no result without its receipt
        doc = result_doc(cell.experiment, cell.side, tree, source, run)
        results.write_atomic(result, results.dumps(doc))
        finished = receipts.now()
        receipt = {
            "schema": RECEIPT_SCHEMA,
            "cell": name,
            "experiment": cell.experiment,
            "side": cell.side,
            "tree": tree.receipt(),
            "tests_source": source.receipt(),
            "result": {"file": result.name, "sha256": sha256_file(result)},
            "log": {"file": str(run.log), "sha256": run.log_sha256},
            "command": run.command,
            "pytest_exit_status": run.exit_status,
            "messages": run.messages,
            "environment": {"path": str(env.path), "reused": env.reused, "interpreter": str(env.interpreter),
                            "setup_commands": env.commands},
            "torch": {"build": env.torch_build(), "channel": env.torch.channel, "note": env.torch.note},
            "packages": packages,
            "started": started.isoformat(timespec="seconds"),
            "pytest_started": run.started.isoformat(timespec="seconds"),
            "pytest_finished": run.finished.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "duration_s": round((finished - started).total_seconds(), 3),
        }
        results.write_atomic(receipt_file, results.dumps(receipt))
    log(f"{name}: {describe(doc)}; wrote {result}")
    return UpstreamOutcome(name, result, receipt_file, doc)


def describe(doc: dict) -> str:
    t = doc["totals"]
    line = f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped"
    if doc["types"]:
        line += " (" + ", ".join(f"{k} {v}" for k, v in doc["types"].items()) + ")"
    return line


# --- base vs head, for compare/report -------------------------------------------------------

BOTH_PASS = "tests pass on both sides"
FIXED_BY_HEAD = "tests fail on base, pass on head"
FAIL_ON_HEAD = "tests fail on head"
NO_TESTS = "no tests ran"
INCOMPLETE = "incomplete"


def _expected_label(exp: Experiment, side: str, kind: str) -> str | None:
    pin = exp.git[side] if kind == "git" else exp.releases.get(side)
    return trees.tree_label(kind, pin) if pin else None


def _bad(t: dict) -> int:
    return t["failed"] + t["errors"]


def summarize(runs: Path, registry: Registry, kinds: tuple[str, ...] = ("release", "git")) -> list[dict]:
    """One entry per experiment and tree kind that has an upstream result on either side.

    Reads ``runs/<experiment>.<side>.<tree>.upstream.json`` only; runs nothing.
    """
    out = []
    for exp in registry.experiments.values():
        for kind in kinds:
            docs: dict[str, tuple[str, dict] | None] = {}
            for side in SIDES:
                label = _expected_label(exp, side, kind)
                path = runs / result_name(exp.name, side, label) if label else None
                docs[side] = (path.name, _load(path)) if path is not None and path.exists() else None
            if any(docs.values()):
                out.append(_pair(exp, kind, docs))
    return out


def _load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path} is unreadable: {exc}", todo="delete it and rerun its upstream session") from None
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA \
            or not {"tree", "totals", "types", "files", "tests"} <= doc.keys():
        raise HarnessError(f"{path} is not an upstream result", expected=f"schema {RESULT_SCHEMA}",
                           todo="delete it and rerun its upstream session")
    return doc


def _key(test: dict) -> tuple[str, str]:
    # A test can have a failure and a teardown error: tell them apart by phase.
    return test["nodeid"], test["phase"] if test["outcome"] == "error" else ""


def _pair(exp: Experiment, kind: str, docs: dict[str, tuple[str, dict] | None]) -> dict:
    sides = {side: {"file": found[0], "tree": found[1]["tree"], "totals": found[1]["totals"],
                    "types": found[1]["types"], "files": found[1]["files"]} if found else None
             for side, found in docs.items()}
    tests = {side: {_key(t): t for t in found[1]["tests"]} if found else {} for side, found in docs.items()}
    changed = []
    for key in sorted(set(tests["base"]) | set(tests["head"])):
        shown = {side: ({"outcome": t["outcome"], "type": t["type"]} if t else None)
                 for side, t in ((s, tests[s].get(key)) for s in SIDES)}
        if shown["base"] != shown["head"]:
            changed.append({"nodeid": key[0], **shown})
    base, head = sides["base"], sides["head"]
    if base is None or head is None:
        verdict = INCOMPLETE
    elif base["totals"]["total"] == 0 or head["totals"]["total"] == 0:
        verdict = NO_TESTS
    elif _bad(head["totals"]):
        verdict = FAIL_ON_HEAD
    elif _bad(base["totals"]):
        verdict = FIXED_BY_HEAD
    else:
        verdict = BOTH_PASS
    return {
        "experiment": exp.name,
        "pr": exp.pr,
        "kind": kind,
        "verdict": verdict,
        "same_test_files": bool(base and head and base["files"] == head["files"]),
        "sides": sides,
        "changed": changed,
    }
