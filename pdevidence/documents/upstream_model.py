"""The upstream result document: outcomes, tests with their subtests, totals, one loader.

A test entry is one outcome pytest reports for a test (a test with a failure and a teardown error
has two); the subtests it ran are listed on the entry of its call. Totals count as pytest's
summary line does: tests per outcome, subtests apart.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ..core.errors import HarnessError
from ..core.files import read_json
from ..sources.trees import tree_label

RESULT_SCHEMA = "pdevidence-upstream/2"


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"


BAD = (Outcome.FAILED, Outcome.ERROR)
# Outcome -> its key in ``totals`` (pytest's summary says "2 errors"; the others are adjectives).
TOTAL_KEYS = {o: ("errors" if o is Outcome.ERROR else o.value) for o in Outcome}


class Verdict(StrEnum):
    BOTH_PASS = "tests pass on both sides"
    FIXED_BY_HEAD = "tests fail on base, pass on head"
    FAIL_ON_HEAD = "tests fail on head"
    TREE_PASSES = "tests pass on this tree"
    TREE_FAILS = "tests fail on this tree"
    NO_TESTS = "no tests ran"
    INCOMPLETE = "incomplete"


class Invalid(ValueError):
    """A field of the document is missing or has the wrong shape."""


def _get(doc: dict, key: str, kind: type | tuple[type, ...]):
    if not isinstance(doc, dict) or key not in doc:
        raise Invalid(f"no {key!r}")
    if not isinstance(doc[key], kind):
        raise Invalid(f"{key!r} is {type(doc[key]).__name__}")
    return doc[key]


def _outcome(value) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        raise Invalid(f"outcome {value!r}") from None


@dataclass(frozen=True)
class Subtest:
    msg: str | None  # unittest's subTest("msg") / subtests.test("msg")
    params: dict[str, str]  # keyword parameters, as pytest reprs them: {"i": "3"}
    outcome: Outcome
    type: str | None  # the exception type of a failure; pytest.skip / pytest.xfail

    def key(self) -> str:
        return json.dumps([self.msg, self.params], sort_keys=True)

    def to_json(self) -> dict:
        return {"msg": self.msg, "params": self.params, "outcome": self.outcome.value, "type": self.type}

    @classmethod
    def from_json(cls, doc: dict) -> Subtest:
        return cls(_get(doc, "msg", (str, type(None))), _get(doc, "params", dict), _outcome(doc.get("outcome")),
                   _get(doc, "type", (str, type(None))))


@dataclass(frozen=True)
class TestEntry:
    nodeid: str
    outcome: Outcome
    phase: str | None  # collection | setup | call | teardown for errors and failures
    type: str | None
    subtests: tuple[Subtest, ...] = ()

    __test__ = False  # not a pytest class

    def to_json(self) -> dict:
        return {"nodeid": self.nodeid, "outcome": self.outcome.value, "phase": self.phase, "type": self.type,
                "subtests": [s.to_json() for s in self.subtests]}

    @classmethod
    def from_json(cls, doc: dict) -> TestEntry:
        return cls(_get(doc, "nodeid", str), _outcome(doc.get("outcome")), _get(doc, "phase", (str, type(None))),
                   _get(doc, "type", (str, type(None))),
                   tuple(Subtest.from_json(s) for s in _get(doc, "subtests", list)))


def _count(outcomes) -> dict[str, int]:
    counts = Counter(outcomes)
    return {**{key: counts.get(o, 0) for o, key in TOTAL_KEYS.items()}, "total": sum(counts.values())}


def totals(tests: list[TestEntry]) -> dict[str, int]:
    """Tests per outcome, as pytest counts them (a subtest is not a test)."""
    return _count(t.outcome for t in tests)


def subtest_totals(tests: list[TestEntry]) -> dict[str, int]:
    return _count(s.outcome for t in tests for s in t.subtests)


def type_counts(tests: list[TestEntry]) -> dict[str, int]:
    """Failures and errors of tests and subtests by exception type ("unknown" when none is named).
    A test failed only by its subtests ("contains 1 failed subtest") raised nothing of its own."""
    found = [(s.outcome, s.type) for t in tests for s in t.subtests]
    found += [(t.outcome, t.type) for t in tests
              if t.type or not any(s.outcome in BAD for s in t.subtests)]
    counts = Counter(kind or "unknown" for outcome, kind in found if outcome in BAD)
    return dict(sorted(counts.items()))


def pytest_summary(tests: list[TestEntry]) -> dict[str, int]:
    """The counts of pytest's own summary line ("2 failed, 8 passed, 1 skipped, 6 subtests passed"),
    with subtest verbosity on as the runner sets it: pytest counts a failed subtest as "failed", a
    skipped one as "skipped", a passed one as "subtests passed", and the test around them by its
    own outcome (a unittest method whose subtests failed still "passed")."""
    t, s = totals(tests), subtest_totals(tests)
    counts = {"failed": t["failed"] + s["failed"], "passed": t["passed"], "skipped": t["skipped"] + s["skipped"],
              "xfailed": t["xfailed"] + s["xfailed"], "xpassed": t["xpassed"] + s["xpassed"],
              "errors": t["errors"] + s["errors"], "subtests passed": s["passed"]}
    return {k: v for k, v in counts.items() if v}


def summary_line(tests: list[TestEntry]) -> str:
    """pytest's summary line, without its time: "8 failed, 4 passed, 1 error, 7 subtests passed"."""
    parts = [f"{n} {'error' if what == 'errors' and n == 1 else what}" for what, n in pytest_summary(tests).items()]
    return ", ".join(parts) or "no tests ran"


@dataclass(frozen=True)
class UpstreamResult:
    experiment: str
    side: str
    tree: dict[str, str]  # kind, ref, resolved
    files: dict[str, str]  # repository path -> SHA-256 of the test file run
    tests: list[TestEntry] = field(default_factory=list)
    schema: str = RESULT_SCHEMA

    @property
    def totals(self) -> dict[str, int]:
        return totals(self.tests)

    @property
    def subtest_totals(self) -> dict[str, int]:
        return subtest_totals(self.tests)

    @property
    def types(self) -> dict[str, int]:
        return type_counts(self.tests)

    @property
    def bad(self) -> int:
        """Failed and erroring tests and subtests: the side's tests did not all pass."""
        return sum(self.totals[TOTAL_KEYS[o]] + self.subtest_totals[TOTAL_KEYS[o]] for o in BAD)

    def to_json(self) -> dict:
        """The deterministic document: same tree, same test files, same environment -> same bytes."""
        return {"schema": self.schema, "experiment": self.experiment, "side": self.side, "tree": self.tree,
                "files": self.files, "tests": [t.to_json() for t in self.tests], "totals": self.totals,
                "subtest_totals": self.subtest_totals, "types": self.types}

    @classmethod
    def from_json(cls, doc: dict) -> UpstreamResult:
        if _get(doc, "schema", str) != RESULT_SCHEMA:
            raise Invalid(f"schema {doc['schema']!r}")
        tree = _get(doc, "tree", dict)
        if not all(isinstance(tree.get(key), str) for key in ("kind", "ref", "resolved")):
            raise Invalid("tree must have kind, ref and resolved")
        result = cls(_get(doc, "experiment", str), _get(doc, "side", str), tree, _get(doc, "files", dict),
                     [TestEntry.from_json(t) for t in _get(doc, "tests", list)])
        for key in ("totals", "subtest_totals", "types"):
            if doc.get(key) != getattr(result, key):
                raise Invalid(f"{key!r} does not match the tests")
        return result


def load(path: Path, *, experiment: str | None = None, side: str | None = None,
         label: str | None = None) -> UpstreamResult:
    """The one loader: a missing, unreadable or malformed result is an environment problem (rerun it).
    ``experiment``, ``side`` and the tree ``label``, when given, are what its file name says."""
    def bad(why: str) -> HarnessError:
        return HarnessError(f"{path} is not a usable upstream result: {why}", expected=f"schema {RESULT_SCHEMA}",
                            todo="delete it and rerun its upstream session")

    try:
        doc = read_json(path, "upstream result", todo="")
    except HarnessError as exc:
        raise bad(exc.what) from None
    try:
        result = UpstreamResult.from_json(doc)
    except Invalid as exc:
        raise bad(str(exc)) from None
    found = (("experiment", experiment, result.experiment), ("side", side, result.side),
             ("tree", label, tree_label(result.tree["kind"], result.tree["resolved"])))
    for name, want, got in found:
        if want is not None and got != want:
            raise bad(f"{name} {got!r}, expected {want!r} from its file name")
    return result
