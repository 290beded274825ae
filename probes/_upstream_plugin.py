"""A pytest plugin the upstream runner copies into its scratch directory and loads with ``-p``.

It runs inside the cell's environment, so it needs nothing but pytest and the standard library
(it never imports pdevidence). pytest's JUnit XML writes one ``<failure>`` per failed subtest,
without the subtest's parameters, and nothing for a passed one; this plugin writes one JSON line
per report pytest logs - tests, subtests and collection problems - to ``$PDEVIDENCE_UPSTREAM_RECORD``.
"""

import json
import os

import pytest

RECORD_ENV = "PDEVIDENCE_UPSTREAM_RECORD"  # upstream_pytest.RECORD_ENV


def _params(kwargs) -> dict:
    # pytest 9 hands over the parameters already repr'd; older plugins pass the values.
    return {str(k): v if isinstance(v, str) else repr(v) for k, v in kwargs.items()}


def _write(report, when: str) -> None:
    context = getattr(report, "context", None)  # set on subtest reports only
    crash = getattr(report.longrepr, "reprcrash", None)
    record = {
        "nodeid": report.nodeid,
        "when": when,
        "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"),
        "subtest": None if context is None else {"msg": context.msg, "params": _params(context.kwargs)},
        "longrepr": "" if report.passed else report.longreprtext,
        "crash": crash.message if crash is not None else None,
    }
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


# trylast: pytest's own subtest hook turns a test with failed subtests into a failure while the
# terminal reporter logs it; record the report as the summary counts it.
@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report) -> None:
    _write(report, report.when)


@pytest.hookimpl(trylast=True)
def pytest_collectreport(report) -> None:
    if not report.passed:
        _write(report, "collection")
