"""The tables the lanes write: the release sweep's and the mutation lane's, typed, with one loader each.

``SweepTable.load`` and ``MutationTable.load`` are the only readers of these
files: the report, publish and the OSV records all go through them. Each keeps
the document as written (``doc``) for the report, which shows it as it is.
Each records what made it (``provenance``) and how it was asked for
(``parameters``); ``stale`` compares the first with the checkout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, HarnessError
from ..core.files import read_json
from ..registry import REGISTRY_FILE, MutantKind, Operator
from .observations import Explained, explained_from_doc, explained_json
from .provenance import KIT, MUTATION_DRIVERS, SWEEP_DRIVERS, Provenance, Shaped, stale_why
from .versions import Schema
from .vocabulary import LACKS_FIX, Behaviour, Classification, GateState, MutantStatus

SWEEP_TODO = "rerun the sweep (`nox -s sweep`) and publish it"
MUTATION_TODO = "rerun `python -m pdevidence mutate <experiment>`"


# ---------------------------------------------------------------- the release sweep


@dataclass(frozen=True)
class GateDefault:
    """A gated fix's variable as the release's own probe process reads it with no environment given: its
    default's state (on, off, undefined by this tree, or unread: not established here)."""

    variable: str
    on: str  # the value that turns the fix on (the registry's)
    state: GateState

    def to_json(self) -> dict:
        return {"variable": self.variable, "on": self.on, "state": self.state.value}

    @classmethod
    def from_doc(cls, doc: Any) -> GateDefault | None:
        if doc is None:
            return None
        if not (isinstance(doc, dict) and isinstance(doc.get("variable"), str) and isinstance(doc.get("on"), str)):
            raise ValueError("gate must hold variable, on and state")
        return cls(doc["variable"], doc["on"], GateState(doc.get("state")))


@dataclass
class ReleaseOutcome:
    """One release in a sweep table: its classification and, per telling scenario, its behaviour."""

    version: str
    classification: Classification
    scenarios: dict[str, Behaviour] = field(default_factory=dict)
    differing: list[str] = field(default_factory=list)  # scenarios matching neither reference, or erroring
    error: str | None = None  # why it could not be probed (failed), or what its scenarios raised (error)
    evidence: list[str] = field(default_factory=list)  # not affected: the observations that show it
    not_deciding: list[str] = field(default_factory=list)  # the registry rules that set keys aside on this tree
    # The controls the release departs from both sides on: per scenario, each such key beside base's and head's.
    deviations: Explained = field(default_factory=dict)
    unobserved: list[str] = field(default_factory=list)  # deciding keys the release never recorded: ``sid.key``
    gate: GateDefault | None = None  # a gated fix: its variable's default as this release reads it
    # The registry declares the release cannot be probed on a CPU for this experiment: the cause it names (``cannot
    # run`` where it failed as declared; anything else is flagged: a stale declaration, or another failure).
    declared: str | None = None

    def to_json(self) -> dict:
        found = {"version": self.version, "classification": self.classification.value,
                 "scenarios": {sid: b.value for sid, b in self.scenarios.items()},
                 "differing": self.differing, "error": self.error}
        # Each only where it says something: other entries keep their bytes.
        if self.evidence:
            found["evidence"] = self.evidence
        if self.not_deciding:
            found["not_deciding"] = self.not_deciding
        if self.deviations:
            found["deviations"] = explained_json(self.deviations)
        if self.unobserved:
            found["unobserved"] = self.unobserved
        if self.gate is not None:
            found["gate"] = self.gate.to_json()
        if self.declared is not None:
            found["declared"] = self.declared
        return found

    @property
    def stale_declaration(self) -> bool:
        """Declared not probeable on a CPU, yet answered: the declaration has become wrong (remove it)."""
        return self.declared is not None and self.classification not in UNANSWERED

    @property
    def failed_otherwise(self) -> bool:
        """Declared not probeable on a CPU, and not answered, but not failing as declared (another cause)."""
        return self.declared is not None and self.classification in (Classification.FAILED, Classification.ERROR)


# A release so classified was not answered: it failed, raised, or (declared so) cannot run on a CPU.
UNANSWERED = (Classification.FAILED, Classification.ERROR, Classification.CANNOT_RUN)


def first_fixed(outcomes: list[ReleaseOutcome]) -> str | None:
    """The oldest release that behaves as fixed (a later one may still regress)."""
    return next((o.version for o in outcomes if o.classification is Classification.FIXED), None)


def first_carrying(outcomes: list[ReleaseOutcome]) -> str | None:
    """The oldest release whose code behaves as fixed, whether its default runs it or (a gated fix present but
    off) not: where the fix's commit arrived."""
    return next((o.version for o in outcomes
                 if o.classification in (Classification.FIXED, Classification.PRESENT_OFF)), None)


def regressions(outcomes: list[ReleaseOutcome]) -> list[str]:
    """Releases after the first fixed one that behave as pre-fix again, wholly or in part."""
    fixed = first_fixed(outcomes)
    if fixed is None:
        return []
    after = [o for o in outcomes if Version(o.version) > Version(fixed)]
    return [o.version for o in after if o.classification in LACKS_FIX]


def flagged(outcomes: list[ReleaseOutcome]) -> list[str]:
    """The release watch: releases after the first fixed one that are not fixed, whatever they are
    instead (a regression, a probe that breaks or matches neither side, a release that failed), and a
    release that failed anywhere: one not probed before the first fixed one may be the real first fixed.
    A release the registry declares cannot be probed on a CPU that failed as declared (cannot run) is set
    aside; one declared so that answered (a stale declaration) or failed otherwise is flagged."""
    fixed = first_fixed(outcomes)
    return [o.version for o in outcomes if o.classification is Classification.FAILED
            or (o.declared is not None and o.classification is not Classification.CANNOT_RUN)
            or (fixed is not None and Version(o.version) > Version(fixed)
                and o.classification not in (Classification.FIXED, Classification.CANNOT_RUN))]


def _outcomes(releases: list) -> list[ReleaseOutcome]:
    return [ReleaseOutcome(r["version"], Classification(r["classification"])) for r in releases]


def _sweep_1_to_2(doc: dict) -> dict:
    """/1 had one classification per release: no behaviour per scenario (none known), no as-of
    date, and no list of regressions, which /2 derives from the classifications by the same rule."""
    releases = doc.get("releases") if isinstance(doc.get("releases"), list) else []
    for entry in releases:
        if isinstance(entry, dict):
            entry.setdefault("scenarios", {})
    doc.setdefault("as_of", None)
    if "regressions" not in doc:
        try:
            doc["regressions"] = regressions(_outcomes(releases))
        except (TypeError, KeyError, ValueError, InvalidVersion):
            pass  # the check of the upgraded document names what is wrong
    return doc


def _sweep_2_to_3(doc: dict) -> dict:
    """/3 added the classification "error" (before, a release whose telling scenario raised was
    "neither"), the release watch's list, which it derives from the classifications by the same rule,
    and what made the table and how it was asked for: unknown for /2, so an upgraded table is stale."""
    try:
        doc["flagged"] = flagged(_outcomes(doc["releases"]))
    except (TypeError, KeyError, ValueError, InvalidVersion):
        pass  # the check of the upgraded document names what is wrong
    doc.setdefault("provenance", None)
    doc.setdefault("parameters", None)
    return doc


def _sweep_3_to_4(doc: dict) -> dict:
    """/4 judges the controls too: the classification and the scenario behaviour "deviates" (a control the
    release departs from both sides on) and each release's ``deviations``. A /3 table judged none, so it has
    none of them and reads as it is."""
    return doc


def _sweep_4_to_5(doc: dict) -> dict:
    """/5 records the era parts a merge went without (``parameters.missing_eras``: a partial table) and
    flags a release that failed anywhere, not only after the first fixed one. A /4 merge did not notice a
    missing part, so it records none; its watch list is derived again by the /5 rule."""
    if isinstance(doc.get("parameters"), dict):
        doc["parameters"].setdefault("missing_eras", [])
    try:
        doc["flagged"] = flagged(_outcomes(doc["releases"]))
    except (TypeError, KeyError, ValueError, InvalidVersion):
        pass  # the check of the upgraded document names what is wrong
    return doc


def _sweep_5_to_6(doc: dict) -> dict:
    """/6 reads a gated fix's default in each release (``gate``) and classifies a release whose code is fixed
    but whose default leaves the gate off as "present but off". A /5 table read no default: a gated fix's
    releases read fixed by their code alone, as written (and the table is stale)."""
    return doc


def _sweep_6_to_7(doc: dict) -> dict:
    """/7 reads the registry's declarations of releases that cannot be probed on a CPU: a release's ``declared``
    (the cause) and the classification "cannot run" (failed as declared, set aside by the release watch). A /6
    table had none: its failed and erroring releases read as written."""
    return doc


SWEEP_SCHEMA = Schema("pdevidence-sweep/", 7, {1: _sweep_1_to_2, 2: _sweep_2_to_3, 3: _sweep_3_to_4,
                                               4: _sweep_4_to_5, 5: _sweep_5_to_6, 6: _sweep_6_to_7})


def partial_sweep(parameters: dict | None) -> str | None:
    """Why a sweep table (its ``parameters`` as written) does not cover every release from the floor; None when
    it does (or, on a table older than /3, is not known not to). The report reads tables as written: one rule
    for it and for the typed table."""
    if not isinstance(parameters, dict):
        return None
    why = ["releases named on the command line"] if parameters.get("explicit") else []
    if parameters.get("missing_eras"):
        why.append(f"no part for era {', '.join(parameters['missing_eras'])}")
    return "; ".join(why) or None


@dataclass(frozen=True)
class SweepParameters:
    """How a sweep was asked for: which releases, and the base and head results it judged against."""

    explicit: bool  # versions named on the command line (a partial sweep), not every release from the floor
    pre: bool  # pre-, post- and dev releases included
    floor: str  # the release floor it started from: the experiment's own (registry.Registry.floor), else the registry's
    references: dict[str, str]  # the base and head result files (names) it judged against -> SHA-256
    missing_eras: tuple[str, ...] = ()  # a merge asked for a partial table: the eras it had no part of

    def to_json(self) -> dict[str, Any]:
        return {"explicit": self.explicit, "pre": self.pre, "floor": self.floor,
                "references": dict(sorted(self.references.items())), "missing_eras": list(self.missing_eras)}

    @property
    def partial(self) -> str | None:
        """Why the table does not cover every release from the floor (None: it does)."""
        return partial_sweep(self.to_json())

    @classmethod
    def from_doc(cls, doc: Any) -> SweepParameters:
        ok = (isinstance(doc, dict) and isinstance(doc.get("explicit"), bool) and isinstance(doc.get("pre"), bool)
              and isinstance(doc.get("floor"), str) and isinstance(doc.get("references"), dict)
              and all(isinstance(v, str) for v in doc["references"].values())
              and isinstance(doc.get("missing_eras"), list) and all(isinstance(e, str) for e in doc["missing_eras"]))
        if not ok:
            raise ValueError("parameters must hold explicit and pre (booleans), floor (a version), "
                             "references (file -> SHA-256) and missing_eras (a list of era names)")
        return cls(doc["explicit"], doc["pre"], doc["floor"], dict(doc["references"]), tuple(doc["missing_eras"]))


@dataclass(frozen=True)
class SweepTable:
    schema_version: int  # as written; the fields are in the current form
    experiment: str
    first_fixed: str | None  # the oldest release that behaves as fixed; a later one may regress
    regressions: list[str]
    flagged: list[str]  # the release watch: after the first fixed release, not fixed
    as_of: str | None  # the newest probed release's upload time
    releases: list[ReleaseOutcome]
    provenance: Provenance | None  # None on a table older than /3: what made it is unknown
    parameters: SweepParameters | None
    doc: dict[str, Any]

    def stale(self, root: Path, probe: str) -> list[str]:
        """How this checkout differs from what made the table (``probe``: the experiment's, in the checkout)."""
        return stale_why(self.provenance, root, [probe, KIT, *SWEEP_DRIVERS, REGISTRY_FILE], Shaped.TABLE)

    @property
    def partial(self) -> str | None:
        """Why the table does not cover every release from the floor (None: it does, or is too old to say)."""
        return self.parameters.partial if self.parameters else None

    @classmethod
    def from_doc(cls, doc: Any, *, source: str) -> SweepTable:
        """Check a sweep table; a violation names the source and the field."""
        def bad(why: str) -> HarnessError:
            return HarnessError(f"{source} is not a sweep table: {why}", expected=f"a {SWEEP_SCHEMA.readable} document",
                                todo=SWEEP_TODO)

        written = doc
        version, doc = SWEEP_SCHEMA.read(doc, bad)
        for key in ("experiment", "releases", "regressions", "flagged", "first_fixed"):
            if key not in doc:
                raise bad(f"missing {key!r}")
        if not isinstance(doc["experiment"], str) or not isinstance(doc["releases"], list):
            raise bad("experiment must be a string and releases a list")
        for key in ("regressions", "flagged"):
            if not (isinstance(doc[key], list) and all(isinstance(v, str) for v in doc[key])):
                raise bad(f"{key} must be a list of versions")
        if not isinstance(doc["first_fixed"], (str, type(None))) or not isinstance(doc.get("as_of"), (str, type(None))):
            raise bad("first_fixed and as_of must be strings or null")
        releases = []
        for entry in doc["releases"]:
            try:
                releases.append(ReleaseOutcome(
                    entry["version"], Classification(entry["classification"]),
                    {sid: Behaviour(b) for sid, b in entry.get("scenarios", {}).items()},
                    list(entry.get("differing", [])), entry.get("error"), list(entry.get("evidence", [])),
                    list(entry.get("not_deciding", [])), explained_from_doc(entry.get("deviations", {})),
                    list(entry.get("unobserved", [])), GateDefault.from_doc(entry.get("gate")),
                    entry.get("declared")))
            except (TypeError, KeyError, ValueError, AttributeError):
                raise bad(f"release entry {entry!r}") from None
            said = (releases[-1].error, releases[-1].declared)
            if not isinstance(entry["version"], str) or not all(isinstance(s, (str, type(None))) for s in said):
                raise bad(f"release entry {entry!r}")
            if releases[-1].classification is Classification.CANNOT_RUN and releases[-1].declared is None:
                raise bad(f"release entry {entry!r}: cannot run only where the registry declares it (declared)")
        try:
            derived = {"first_fixed": first_fixed(releases), "regressions": regressions(releases),
                       "flagged": flagged(releases)}
        except InvalidVersion as exc:
            raise bad(f"release version: {exc}") from None
        if any(doc[key] != value for key, value in derived.items()):
            raise bad(f"first_fixed, regressions and flagged must be what its releases' classifications give: {derived}")
        provenance, parameters = _recorded(doc, version < 3, SweepParameters.from_doc, bad)
        return cls(version, doc["experiment"], doc["first_fixed"], list(doc["regressions"]), list(doc["flagged"]),
                   doc.get("as_of"), releases, provenance, parameters, written)

    @classmethod
    def load(cls, path: Path) -> SweepTable:
        return cls.from_doc(read_json(path, "sweep table", todo=SWEEP_TODO), source=str(path))


# ---------------------------------------------------------------- the mutation lane


@dataclass(frozen=True)
class MutantOutcome:
    id: str
    title: str
    kind: MutantKind
    target: str
    operator: Operator
    status: MutantStatus
    killed_by: dict[str, list[str]] = field(default_factory=dict)  # per scenario: keys moved, and error:<Type>
    error: str | None = None

    @property
    def only_raised(self) -> bool:
        """Killed, but no scenario observed it: every kill is an exception (``error:<Type>``)."""
        return self.status is MutantStatus.KILLED and raised_only(self.killed_by)

def _recorded(doc: dict, old: bool, parameters_of, bad) -> tuple[Provenance | None, Any]:
    """A table's provenance and parameters: required since they were recorded, null on an older table."""
    for key in ("provenance", "parameters"):
        if key not in doc or (doc[key] is None and not old):
            raise bad(f"missing {key!r}")
    try:
        return (None if doc["provenance"] is None else Provenance.from_doc(doc["provenance"]),
                None if doc["parameters"] is None else parameters_of(doc["parameters"]))
    except ValueError as exc:
        raise bad(str(exc)) from None


RAISED = "error:"  # how killed_by records a kill by an exception: error:<Type>


def raised_only(killed_by: dict[str, list[str]]) -> bool:
    keys = [k for keys in killed_by.values() for k in keys]
    return bool(keys) and all(k.startswith(RAISED) for k in keys)


def _mutate_1_to_2(doc: dict) -> dict:
    """/2 counts kills by observation and kills only by raising apart in the score (/1 recorded every
    kill's keys, so both counts follow from its mutants), and records what made the table and which
    mutants it ran: unknown for /1, so an upgraded table is stale."""
    try:
        killed = [m["killed_by"] for m in doc["mutants"] if m["status"] == MutantStatus.KILLED.value]
        raised = sum(raised_only(k) for k in killed)
        doc["score"] = {**doc["score"], "by_observation": len(killed) - raised, "only_raising": raised}
    except (TypeError, KeyError, AttributeError):
        pass  # the check of the upgraded document names what is wrong
    doc.setdefault("provenance", None)
    doc.setdefault("parameters", None)
    return doc


MUTATION_SCHEMA = Schema("pdevidence-mutate/", 2, {1: _mutate_1_to_2})


@dataclass(frozen=True)
class MutationParameters:
    """How the lane was asked for: the mutants it ran (the registry's, in its order)."""

    mutants: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"mutants": list(self.mutants)}

    @classmethod
    def from_doc(cls, doc: Any) -> MutationParameters:
        if not (isinstance(doc, dict) and isinstance(doc.get("mutants"), list)
                and all(isinstance(m, str) for m in doc["mutants"])):
            raise ValueError("parameters must hold mutants (a list of mutant ids)")
        return cls(list(doc["mutants"]))


@dataclass(frozen=True)
class MutationTable:
    experiment: str
    tree: dict[str, str]
    scenarios: list[str]
    mutants: list[MutantOutcome]
    provenance: Provenance | None = None  # None on a table older than /2: what made it is unknown
    parameters: MutationParameters | None = None
    schema: str = MUTATION_SCHEMA.name
    doc: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # as written, when loaded

    def stale(self, root: Path, probe: str) -> list[str]:
        """How this checkout differs from what made the table (``probe``: the experiment's, in the checkout)."""
        return stale_why(self.provenance, root, [probe, KIT, *MUTATION_DRIVERS, REGISTRY_FILE], Shaped.TABLE)

    @property
    def score(self) -> dict[str, int]:
        applicable = [m for m in self.mutants if m.status is not MutantStatus.NOT_APPLICABLE]
        killed = [m for m in applicable if m.status is MutantStatus.KILLED]
        raised = sum(m.only_raised for m in killed)
        return {"killed": len(killed), "by_observation": len(killed) - raised, "only_raising": raised,
                "applicable": len(applicable), "total": len(self.mutants)}

    @property
    def unkilled(self) -> list[MutantOutcome]:
        """Every mutant the probe did not kill: survived, could not be run, or (a table older than the rule that
        makes it an error on the lane's own tree) not applicable."""
        return [m for m in self.mutants if m.status is not MutantStatus.KILLED]

    @property
    def exit_code(self) -> int:
        """Confirmed only when every declared mutant applied and was killed."""
        return CONFIRMED if self.mutants and not self.unkilled else BEHAVIOUR_DIFFERS

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "experiment": self.experiment, "tree": self.tree, "score": self.score,
                "scenarios": self.scenarios,
                "provenance": self.provenance.to_json() if self.provenance else None,
                "parameters": self.parameters.to_json() if self.parameters else None,
                "mutants": [{**asdict(m), "kind": m.kind.value, "operator": m.operator.value,
                             "status": m.status.value} for m in self.mutants]}

    @classmethod
    def from_doc(cls, doc: Any, *, source: str) -> MutationTable:
        """Check a mutation table; a bad one names the source and the field."""
        def bad(why: str) -> HarnessError:
            return HarnessError(f"{source} is not a mutation table: {why}",
                                expected=f"a {MUTATION_SCHEMA.readable} document", todo=MUTATION_TODO)

        written = doc
        version, doc = MUTATION_SCHEMA.read(doc, bad)
        try:
            mutants = [MutantOutcome(id=m["id"], title=m["title"], kind=MutantKind(m["kind"]), target=m["target"],
                                     operator=Operator(m["operator"]), status=MutantStatus(m["status"]),
                                     killed_by={s: list(keys) for s, keys in m["killed_by"].items()},
                                     error=m["error"]) for m in doc["mutants"]]
            provenance, parameters = _recorded(doc, version < 2, MutationParameters.from_doc, bad)
            table = cls(experiment=doc["experiment"], tree=dict(doc["tree"]), scenarios=list(doc["scenarios"]),
                        mutants=mutants, provenance=provenance, parameters=parameters, doc=written)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad(f"{type(exc).__name__}: {exc}") from None
        if doc.get("score") != table.score:
            raise bad(f"score {doc.get('score')} does not match its mutants ({table.score})")
        return table

    @classmethod
    def load(cls, path: Path) -> MutationTable:
        return cls.from_doc(read_json(path, "mutation table", todo=MUTATION_TODO), source=str(path))
