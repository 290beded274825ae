"""Exit codes and the one error type the harness raises to users.

Every code means one thing; docs/operators/exit-codes.md documents them.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

CONFIRMED = 0  # differential confirmed / the command did what was asked
BEHAVIOUR_DIFFERS = 1  # not reproduced, or a fresh result differs from the published one
USAGE = 2  # bad arguments, unknown experiment or side, malformed registry
ENVIRONMENT = 3  # a tree could not be fetched, an env not built, a probe not run
INCOMPLETE = 4  # cells the comparison needs have no result yet
INTEGRITY = 5  # a checksum did not match (download, published artifact, SHA256SUMS)
ENVIRONMENT_DIFFERS = 6  # behaviour confirmed, but on other pins than the published run
INTERNAL = 7  # an unexpected exception: a bug in pdevidence, never a verdict
STALE = 8  # evidence made by other inputs (probe, kit, drivers, registry, constraints, harness) than this checkout's
RELEASE_WATCH = 9  # the release sweep: a release after the first fixed one is not fixed

EXIT_CODES = {
    CONFIRMED: "differential confirmed (or the command succeeded)",
    BEHAVIOUR_DIFFERS: "behaviour differs: not reproduced, or differs from the published result",
    USAGE: "usage error: unknown experiment, side or option; malformed registry",
    ENVIRONMENT: "environment problem: tree not fetchable, environment not buildable, probe could not run",
    INCOMPLETE: "incomplete: a cell the comparison needs has no result",
    INTEGRITY: "integrity failure: a checksum did not match",
    ENVIRONMENT_DIFFERS: "behaviour confirmed, but the receipts show other pins than the published run",
    INTERNAL: "internal error: a bug in pdevidence (the traceback is printed; please report it)",
    STALE: "stale evidence: made by another probe, kit, driver, registry, constraints or harness; republish",
    RELEASE_WATCH: "release watch: a release after the first fixed one is not fixed (lost the fix, or broke the probe)",
}


class HarnessError(Exception):
    """What happened, what was expected, and what to do about it."""

    def __init__(self, what: str, *, expected: str = "", todo: str = "", code: int = ENVIRONMENT):
        super().__init__(what)
        self.what = what
        self.expected = expected
        self.todo = todo
        self.code = code

    def __str__(self) -> str:
        lines = [self.what]
        if self.expected:
            lines.append(f"  expected: {self.expected}")
        if self.todo:
            lines.append(f"  what to do: {self.todo}")
        return "\n".join(lines)


def usage(what: str, *, expected: str = "", todo: str = "") -> HarnessError:
    return HarnessError(what, expected=expected, todo=todo, code=USAGE)


def integrity(what: str, *, expected: str = "", todo: str = "") -> HarnessError:
    return HarnessError(what, expected=expected, todo=todo, code=INTEGRITY)


def print_error(exc: HarnessError) -> None:
    print(f"error: {exc}", file=sys.stderr)


def internal_error(exc: BaseException, where: str) -> int:
    """An exception no one expected: its traceback, a line saying whose bug it is, and INTERNAL."""
    traceback.print_exception(exc, file=sys.stderr)
    print(f"internal error in {where}: {type(exc).__name__}: {exc}\n"
          "  this is a bug in pdevidence, not a verdict about SGLang: please report it with the traceback above",
          file=sys.stderr)
    return INTERNAL


def boundary(fn: Callable[[], int], *, where: str, report: Callable[[HarnessError], None] = print_error) -> int:
    """The one error boundary of every entry point (the CLI, nox sessions, worker threads).

    A ``HarnessError`` becomes its own exit code; any other ``Exception`` becomes INTERNAL, so a
    crash can never read as a verdict (``check``'s 1 is "affected"). Signals (BaseException) pass.
    """
    try:
        return fn()
    except HarnessError as exc:
        report(exc)
        return exc.code
    except Exception as exc:
        return internal_error(exc, where)


# When several things went wrong, the exit code names the one to fix first; a bug in the
# harness first of all, since nothing else it says can then be trusted.
_PRECEDENCE = (INTERNAL, USAGE, INTEGRITY, STALE, ENVIRONMENT, RELEASE_WATCH, BEHAVIOUR_DIFFERS, INCOMPLETE,
               ENVIRONMENT_DIFFERS, CONFIRMED)


def worst(codes) -> int:
    return min(codes, key=_PRECEDENCE.index, default=CONFIRMED)
