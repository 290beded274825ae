"""pytest on a scratch copy of the upstream test files, read back through our own report plugin.

Why not JUnit XML: pytest 9 writes one ``<failure>`` per failed subtest inside its test's
``<testcase>``, without the subtest's parameters, nothing for a passed subtest, and counts every
report in ``tests=``; a unittest method whose subtests failed is itself "passed" in pytest's
summary, which JUnit cannot say. ``probes/_upstream_plugin.py`` records each report pytest logs instead.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..cells.probe_run import run_killable, tail, timeout_seconds
from ..core import clock, sandbox
from ..core.errors import HarnessError
from ..core.files import sha256_file
from ..core.paths import PROJECT
from ..documents.upstream_model import BAD, Outcome, Subtest, TestEntry

# pytest: 0 all passed, 1 some failed, 5 nothing collected - all data. 2 interrupted,
# 3 internal error, 4 usage error: the run itself went wrong.
BROKEN_RUN = (2, 3, 4)
# probes/_upstream_plugin.py runs inside the cell, under this module name; it imports pytest, so it is
# copied as a file and never imported here (pdevidence itself does not need pytest).
PLUGIN = "pdevidence_upstream_record"
PLUGIN_SOURCE = PROJECT / "probes" / "_upstream_plugin.py"
RECORD_ENV = "PDEVIDENCE_UPSTREAM_RECORD"  # where the plugin writes its lines
# Passed subtests show in pytest's summary ("6 subtests passed") only with subtest verbosity.
PYTEST_INI = "[pytest]\nverbosity_subtests = 1\n"

# The last "path:line: TypeName" of a pytest long report names the exception raised.
_LOCATION_TYPE = re.compile(r"^\S.*:\d+: ((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\s*$")
# "E   ImportError: cannot import name ..." (collection errors carry no location line).
_E_LINE_TYPE = re.compile(r"^E\s+((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s|:$|$)")
_MESSAGE_TYPE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s|:$|$)")
# pytest's long report of an exception chain (``raise ... from``, or raised while handling another)
# shows each exception of the chain in turn, separated by one of Python's own two lines.
_CHAIN = re.compile(r"^(?:During handling of the above exception, another exception occurred:"
                    r"|The above exception was the direct cause of the following exception:)[ \t]*$", re.M)
# A bare Exception raised over another names no kind of its own: the one it wraps does. SGLang's
# CustomTestCase re-raises every failure of a test method as Exception("retry() exceed maximum number
# of retries."), which would otherwise make every failing test of a PR read "Exception".
WRAPPER = "Exception"


@dataclass
class SuiteRun:
    command: list[str]
    exit_status: int
    log: Path
    log_sha256: str
    tests: list[TestEntry]
    messages: list[dict]
    started: datetime
    finished: datetime
    containment: dict  # how pytest ran (sandbox.Containment.record)


def _scratch(scratch: Path, files: list) -> tuple[Path, Path, Path]:
    """The test files at their repository paths under ``suite/`` with our pytest.ini, and the
    plugin beside them: returns (suite, plugin directory, record file)."""
    suite, plugin_dir, record = scratch / "suite", scratch / "plugin", scratch / "reports.jsonl"
    plugin_dir.mkdir()
    (plugin_dir / f"{PLUGIN}.py").write_bytes(PLUGIN_SOURCE.read_bytes())
    record.touch()
    suite.mkdir()
    (suite / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    for f in files:
        dest = suite / f.rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.data)
    return suite, plugin_dir, record


def run_suite(interpreter: Path, files: list, log: Path, *, trusted: bool = False, timeout: float | None = None,
              env: dict | None = None) -> SuiteRun:
    """pytest on a scratch copy of ``files`` (``upstream.TestFile``s, their repository paths kept),
    so no conftest or pytest configuration of a checkout applies; contained, writing in the scratch
    directory only (``trusted``: the tree and the tests are pinned)."""
    timeout = timeout_seconds() if timeout is None else timeout
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pdevidence-upstream-") as scratch:
        suite, plugin_dir, record = _scratch(Path(scratch), files)
        run_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
                   **(env or {}), RECORD_ENV: str(record)}
        run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_dir), run_env.get("PYTHONPATH")]))
        for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
            run_env.pop(name, None)
        command = [str(interpreter), "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN,
                   "--continue-on-collection-errors", "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
                   "--confcutdir", str(suite), *[f.rel for f in files]]
        started = clock.now()
        ran = run_killable(command, log, timeout=timeout, env=run_env, what="the upstream tests",
                           view=sandbox.View(write=(Path(scratch),), cwd=suite), trusted=trusted)
        status = ran.status
        finished = clock.now()
        lines = record.read_text(encoding="utf-8").splitlines()
    if status in BROKEN_RUN:
        raise HarnessError(
            f"pytest exited with status {status} ({'interrupted' if status == 2 else 'internal or usage error'}): "
            f"the tests could not run in this environment; no result written.\nlast output:\n{tail(log)}",
            todo=f"full log: {log}")
    try:
        tests, messages = parse_records([json.loads(line) for line in lines])
    except (ValueError, KeyError, TypeError) as exc:
        raise HarnessError(f"pytest's report records are unreadable ({exc!r}); no result written",
                           todo=f"full log: {log}") from None
    if status == 1 and not messages:
        # "some tests failed" with no failure reported: pytest itself did not run (not installed?).
        raise HarnessError(f"pytest exited with status 1 but reported no failing test; no result written.\n"
                           f"last output:\n{tail(log)}", todo=f"full log: {log}")
    return SuiteRun(command, status, log, sha256_file(log), tests, messages, started, finished, ran.containment)


def _section_type(text: str) -> str | None:
    """The type one exception's report names: its last location line, else its last ``E   Type:`` line."""
    lines = text.splitlines()
    for pattern in (_LOCATION_TYPE, _E_LINE_TYPE):
        for line in reversed(lines):
            match = pattern.match(line.rstrip())
            if match:
                return match.group(1).rsplit(".", 1)[-1]
    return None


def _deciding(text: str) -> tuple[str, bool]:
    """The part of a long report whose exception names the failure's kind: the last of its chain,
    unless that is a bare wrapper (then the exception it wraps, and so on back to the first); and
    whether it is a wrapped one (not the exception pytest's crash message names)."""
    sections = _CHAIN.split(text)
    last = len(sections) - 1
    deciding = next((i for i in range(last, 0, -1) if _section_type(sections[i]) != WRAPPER), 0)
    return sections[deciding], deciding < last


def exception_type(text: str, message: str | None = None) -> str | None:
    """The type of the exception a failure reports (``_deciding``'s), else the crash message's."""
    found = _section_type(_deciding(text)[0])
    if found:
        return found
    match = _MESSAGE_TYPE.match(message or "")
    return match.group(1).rsplit(".", 1)[-1] if match else None


def _outcome(rec: dict) -> Outcome:
    if rec["outcome"] == "failed":
        return Outcome.FAILED if rec["when"] == "call" else Outcome.ERROR
    if rec["outcome"] == "skipped":
        return Outcome.XFAILED if rec["xfail"] else Outcome.SKIPPED
    return Outcome.XPASSED if rec["xfail"] else Outcome.PASSED


def _type(rec: dict, outcome: Outcome) -> str | None:
    if outcome in (Outcome.SKIPPED, Outcome.XFAILED):
        return f"pytest.{'skip' if outcome is Outcome.SKIPPED else 'xfail'}"
    if outcome in BAD:
        return exception_type(rec["longrepr"], rec["crash"])
    return None


def _message(rec: dict) -> str:
    section, wrapped = _deciding(rec["longrepr"])
    if rec["when"] == "collection" or wrapped:
        # The E line says what failed to import, or what the wrapper wrapped (the crash names the wrapper).
        e_lines = [ln for ln in section.splitlines() if _E_LINE_TYPE.match(ln)]
        if e_lines:
            return e_lines[-1 if rec["when"] == "collection" else 0][1:].strip()
    for line in (rec["crash"] or rec["longrepr"]).splitlines():
        if line.strip():
            return line.strip()
    return ""


def parse_records(records: list[dict]) -> tuple[list[TestEntry], list[dict]]:
    """The plugin's report lines -> test entries in pytest's order (collection errors first), each
    call entry with the subtests logged before it; and the failure messages (for the receipt).

    Passed setup and teardown reports are not outcomes; any other report is, as pytest counts it.
    """
    tests: list[TestEntry] = []
    messages: list[dict] = []
    pending: dict[str, list[Subtest]] = {}
    for rec in records:
        outcome = _outcome(rec)
        if outcome in BAD:
            messages.append({"nodeid": rec["nodeid"], "subtest": rec["subtest"], "outcome": outcome.value,
                             "phase": rec["when"], "message": _message(rec)})
        if rec["subtest"] is not None:
            pending.setdefault(rec["nodeid"], []).append(
                Subtest(rec["subtest"]["msg"], rec["subtest"]["params"], outcome, _type(rec, outcome)))
            continue
        if outcome is Outcome.PASSED and rec["when"] != "call":
            continue
        phase = rec["when"] if outcome in BAD else None
        subtests = tuple(pending.pop(rec["nodeid"], [])) if rec["when"] == "call" else ()
        tests.append(TestEntry(rec["nodeid"], outcome, phase, _type(rec, outcome), subtests))
    if pending:
        raise ValueError(f"subtests of {', '.join(pending)} without their test's own report")
    return tests, messages
