"""The words our documents carry: every enum a result, table or report stores as a string.

They live here, below the stages that decide them, so that a loader can check
a document and every stage (judge, lanes, report, publish) compares members,
never restated strings.
"""

from __future__ import annotations

import enum

from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, ENVIRONMENT_DIFFERS, INCOMPLETE, INTEGRITY


class Behaviour(str, enum.Enum):
    """What one telling scenario did on a tree: what base did, what head did, neither, or raised; and a
    control (a scenario base and head agree on) that the tree departs from or raised in."""

    PRE_FIX = "pre-fix"
    FIXED = "fixed"
    NEITHER = "neither"
    ERROR = "error"
    NOT_AFFECTED = "not affected"  # the tree lacks the vulnerable path (a registry rule's observation shows it)
    NOT_DECIDING = "not deciding"  # on this tree none of its keys tells base from head (a registry rule says why)
    DEVIATES = "deviates"  # a control: the tree observes what neither base nor head observes


class Classification(str, enum.Enum):
    """What a release did, over all telling scenarios (a sweep table's column)."""

    PRE_FIX = "pre-fix"
    FIXED = "fixed"
    PARTIAL = "partial"
    NEITHER = "neither"
    ERROR = "error"  # a telling scenario raised: the probe broke on this release, named beside the others
    FAILED = "failed"  # the release could not be probed at all
    NOT_AFFECTED = "not affected"  # the vulnerable path is not in this tree: ``evidence`` names what shows it
    # Fixed on every telling scenario, but a key base and head agree on departs from both sides (``deviations``
    # names them): an over-broad fix or a leak, not the fixed code.
    DEVIATES = "deviates"
    # A gated fix (the registry's ``gate``): the code is fixed with its gate on, but the release's own default
    # leaves the gate off, so a server run with the defaults is exposed (``gate`` names the variable).
    PRESENT_OFF = "present but off"
    # The registry declares the release cannot be probed on a CPU (``[cannot_probe]``: a fact of the release, its
    # cause named), and it failed as declared: nothing was seen either way, and the release watch sets it aside.
    CANNOT_RUN = "cannot run"


class CheckStatus(str, enum.Enum):
    """What ``check`` answers per fix for one build (check documents, the corpus table, OpenVEX)."""

    FIXED = "fixed"
    AFFECTED = "affected"
    PARTIAL = "partial"
    UNKNOWN = "unknown"
    CANNOT_RUN = "cannot run"
    NOT_AFFECTED = "not affected"
    DEVIATES = "deviates"  # fixed where the scenarios tell, but a control departs from both sides: not the fixed code


class RestsOn(str, enum.Enum):
    """What a check's answer rests on, given the operator's server arguments (check documents)."""

    CODE = "code"  # what the build's code does (the configuration enters the path, or cannot tell)
    CONFIGURATION = "configuration"  # not affected: the configuration given never enters the fix's code path


class GateState(str, enum.Enum):
    """Whether the server's environment turns a gated fix on, as the tree reads its variable (check documents;
    the probe driver's environment record, probes/_serverenv.py, writes these values)."""

    ON = "on"  # the variable holds the value that turns the fix on
    OFF = "off"  # it does not (given so, or its default): the fix's code is present but never runs
    UNDEFINED = "undefined"  # the tree does not define it: its code alone answers
    UNREAD = "unread"  # how the tree reads it is not established here: never an all-clear


class CommitOutcome(str, enum.Enum):
    """How one commit behaved for one experiment in a bisection (check's answer, reduced to a side)."""

    FIXED = "fixed"
    PRE_FIX = "pre-fix"
    NOT_AFFECTED = "not affected"
    SKIPPED = "skipped"  # neither side: its probe cannot run, or it is partial, neither or raised


class Boundary(str, enum.Enum):
    """Which change a bisection looks for: its old side, and its new side."""

    FIX = "fix"
    INTRODUCED = "introduced"

    @property
    def sides(self) -> tuple[CommitOutcome, CommitOutcome]:
        return {Boundary.FIX: (CommitOutcome.PRE_FIX, CommitOutcome.FIXED),
                Boundary.INTRODUCED: (CommitOutcome.NOT_AFFECTED, CommitOutcome.PRE_FIX)}[self]


class Finding(str, enum.Enum):
    """What a bisection found of one boundary."""

    FOUND = "found"  # the first commit of the new side, its predecessor of the old
    NOT_NARROWED = "not narrowed"  # skipped commits leave a range holding the boundary
    ENDS_DIFFER = "ends differ"  # the start is not the old side, or the end not the new one
    OUTSIDE_HISTORY = "outside the history"  # the end is the newest commit the history has, and not the new side
    NOT_SOUGHT = "not sought"  # no bracket of releases to look between (said why)


# A release classified so lacks the fix, wholly or in part (after a fixed one: a regression).
# As shipped, a release whose fix is present but off by default lacks it too: its server runs the pre-fix path.
LACKS_FIX = (Classification.PRE_FIX, Classification.PARTIAL, Classification.PRESENT_OFF)


class MutantStatus(str, enum.Enum):
    """A mutant's fate in a mutation table."""

    KILLED = "killed"
    SURVIVED = "survived"
    NOT_APPLICABLE = "not applicable"  # older tables only: on the lane's own tree a missing target is an error
    ERROR = "error"


class Verdict(enum.StrEnum):
    """A comparison's answer per experiment and tree kind (the report's pairs)."""

    CONFIRMED = "differential confirmed"
    NOT_REPRODUCED = "not reproduced"
    INCOMPLETE = "incomplete"
    ENVIRONMENT_DIFFERS = "environment differs"
    PUBLISHED_DIFFERS = "differs from published"
    INTEGRITY = "published artifact failed verification"

    @property
    def exit_code(self) -> int:
        return _VERDICT_CODES[self]


_VERDICT_CODES = {
    Verdict.CONFIRMED: CONFIRMED,
    Verdict.NOT_REPRODUCED: BEHAVIOUR_DIFFERS,
    Verdict.PUBLISHED_DIFFERS: BEHAVIOUR_DIFFERS,
    Verdict.INCOMPLETE: INCOMPLETE,
    Verdict.ENVIRONMENT_DIFFERS: ENVIRONMENT_DIFFERS,
    Verdict.INTEGRITY: INTEGRITY,
}


class PublishedStatus(enum.StrEnum):
    """A fresh result against its published counterpart in results/."""

    IDENTICAL = "identical"
    DIFFERS = "differs"
    UNPUBLISHED = "unpublished"
    FAILED = "failed verification"


class KeyStatus(enum.StrEnum):
    """An observation (or a whole scenario) from base to head."""

    UNCHANGED = "unchanged"
    CHANGED = "changed"
    ABSENT = "absent"  # only one tree has it
