"""Which side a tree behaves like: per telling scenario, per control, per release, and the release watch.

A tree's result is judged against the published base and head results. On the
scenarios that tell them apart, on the keys that change, per scenario: pre-fix
(observes what base observes), fixed (what head observes), neither, or error (it
raised). Every key base and head agree on is a control, wherever it sits: a
control scenario's keys, and a telling scenario's keys both sides record alike
beside its changing ones. A control deviates where the tree records what neither
side does, and so does a telling scenario fixed on its changing keys (a leak:
right where the fix changes things, wrong where it should not). Per tree:
partial (some telling scenarios fixed, some pre-fix, whatever the others did),
else error (a telling scenario raised: named, with the others' behaviour beside
it), neither, pre-fix or fixed; and a tree
fixed on every telling scenario whose control departs from both sides deviates
(an over-broad fix or a leak: not the fixed code). Keys that kept a tree from fixed are
shown beside base's and head's (``Judgement.explain``). The sweep and ``check``
both judge through ``judge`` here; the release watch (``flagged``) names every
release after the first fixed one that is not fixed, and every release that failed.
A gated fix's release is then read as it ships (``as_shipped``): fixed code whose own
default leaves the gate off is present but off. A release the registry declares cannot be probed on a
CPU (``as_declared``) that failed as declared cannot run: the watch sets it aside, and flags one that
answered (a stale declaration) or failed otherwise.

An all-clear (not affected, fixed, keys set aside) stands only on observations
that ran to their end without error and recorded the deciding keys: a key a tree
never recorded is ``NOT_OBSERVED``, never null and never any side's value (the
scenario matches neither side, and ``unobserved`` names the key), and a registry
rule matched by a scenario that raised is refused (the answer is an error,
naming the rule, the scenario and what it raised). The judge reads no file: its
callers load the documents (``documents/references.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, RELEASE_WATCH
from ..documents.observations import NOT_OBSERVED, Explained, Values
from ..documents.tables import GateDefault, ReleaseOutcome, first_carrying, flagged
from ..documents.vocabulary import Behaviour, Classification, GateState
from ..registry import CannotProbe, Expectation, Experiment, Gate, Justification, NotAffected, NotDeciding
from .compare import same


def signature(doc: dict, telling: dict[str, list[str] | None]) -> dict[str, object]:
    """The observations that decide: per scenario, the named keys (or all of them). A key the scenario never
    recorded is ``NOT_OBSERVED`` (never null), and so is a scenario the document does not have."""
    out: dict[str, object] = {}
    for sid, keys in telling.items():
        scenario = doc["scenarios"].get(sid)
        observed = (scenario or {}).get("observed") or {}
        if scenario is None:
            out[sid] = NOT_OBSERVED
        else:
            out[sid] = observed if keys is None else {k: observed.get(k, NOT_OBSERVED) for k in keys}
    return out


def _complete(found: object) -> bool:
    return found is not NOT_OBSERVED and not (isinstance(found, dict) and NOT_OBSERVED in found.values())


def matches(tree: object, side: object) -> bool:
    """A tree's signature of one scenario is a side's: every deciding key recorded, each as that side's."""
    return _complete(tree) and _complete(side) and same(tree, side)


def agree(tree: object, side: object) -> bool:
    """One key on two documents: the same value (typed, as JSON), or recorded by neither."""
    if tree is NOT_OBSERVED or side is NOT_OBSERVED:
        return tree is side
    return same(tree, side)


def changing(e: Expectation) -> list[str]:
    """The keys of a changing scenario whose base and head expectations differ (a key expected alike is a control)."""
    return sorted(k for k in set(e.base) | set(e.head)
                  if not same(e.base.get(k, NOT_OBSERVED), e.head.get(k, NOT_OBSERVED)))


def telling_scenarios(base: dict, head: dict, exp: Experiment | None = None) -> dict[str, list[str] | None]:
    """What tells base from head: the registry's changing scenarios on the declared keys that change,
    else every scenario whose observations differ. Tree facts and controls do not decide."""
    if exp is not None and any(e.changes for e in exp.expect.values()):
        return {sid: changing(e) for sid, e in sorted(exp.expect.items()) if e.changes}
    return {sid: None for sid in sorted(set(base["scenarios"]) | set(head["scenarios"]))
            if not same(base["scenarios"].get(sid, {}).get("observed"), head["scenarios"].get(sid, {}).get("observed"))}


def agreed(base: dict, head: dict, sid: str) -> set[str]:
    """The keys of ``sid`` base and head both record alike, where both ran it clean."""
    if _raised(base, sid) or _raised(head, sid):
        return set()
    was, now = _observed(base, sid), _observed(head, sid)
    return {k for k in set(was) & set(now) if same(was[k], now[k])}


def control_scenarios(base: dict, head: dict, exp: Experiment | None = None) -> dict[str, list[str] | None]:
    """What the fix must not change, in every scenario: the keys base and head agree on. With the registry:
    each control's declared keys and each scenario's keys both sides record alike, outside the keys that tell
    them apart (a leak a telling scenario's keys miss departs there); else every scenario base and head
    observe alike, whole."""
    if exp is not None and exp.expect:
        telling = telling_scenarios(base, head, exp)
        found = {sid: sorted((set() if e.changes else set(e.head)) | agreed(base, head, sid)
                             - set(telling.get(sid) or ())) for sid, e in sorted(exp.expect.items())}
        return {sid: keys for sid, keys in found.items() if keys}
    return {sid: None for sid in sorted(set(base["scenarios"]) & set(head["scenarios"]))
            if same(base["scenarios"][sid].get("observed"), head["scenarios"][sid].get("observed"))}


def not_deciding(doc: dict, exp: Experiment | None) -> list[NotDeciding]:
    """The registry's rules that hold on ``doc`` (on scenarios that ran clean): keys that do not decide here."""
    return [rule for rule in (exp.not_deciding.values() if exp else ()) if rule.holds(doc)]


def deciding_here(telling: dict[str, list[str] | None], rules: list[NotDeciding]) -> dict[str, list[str] | None]:
    """The scenarios' keys minus those the rules set aside: [] where no key of a scenario decides."""
    out = dict(telling)
    for rule in rules:
        for sid, keys in rule.keys.items():
            if sid in out:
                out[sid] = [] if keys is None else [k for k in out[sid] or () if k not in keys]
    return out


def _raised(doc: dict, sid: str) -> bool:
    return (doc["scenarios"].get(sid) or {}).get("error") is not None


def _behaviours(doc: dict, base: dict, head: dict, telling: dict[str, list[str] | None]) -> dict[str, Behaviour]:
    got, was, now = signature(doc, telling), signature(base, telling), signature(head, telling)
    out = {}
    for sid in telling:
        if _raised(doc, sid):
            out[sid] = Behaviour.ERROR
        elif telling[sid] == []:
            out[sid] = Behaviour.NOT_DECIDING
        elif matches(got[sid], was[sid]):
            out[sid] = Behaviour.PRE_FIX
        elif matches(got[sid], now[sid]):
            out[sid] = Behaviour.FIXED
        else:
            out[sid] = Behaviour.NEITHER
    return out


def behaviours(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> dict[str, Behaviour]:
    """Per telling scenario: did ``doc`` do what base did, what head did, neither, or raise? A scenario
    whose keys a registry rule sets aside on this tree does not decide (a raise still shows)."""
    return _behaviours(doc, base, head, deciding_here(telling_scenarios(base, head, exp), not_deciding(doc, exp)))


def unobserved(explain: Explained) -> list[str]:
    """``sid.key`` for each key that kept a tree from fixed because the tree never recorded it."""
    return [f"{sid}.{key}" for sid, keys in explain.items() for key, values in keys.items()
            if values.tree is NOT_OBSERVED]


def _observed(doc: dict, sid: str) -> dict:
    return (doc["scenarios"].get(sid) or {}).get("observed") or {}


def keys_beside(doc: dict, base: dict, head: dict, sid: str, keys: list[str] | None, departs) -> dict[str, Values]:
    """The keys of ``sid`` (all of them for None) where ``departs(values)``: each with the tree's value beside
    base's and head's (``NOT_OBSERVED`` where a side never recorded it: never null)."""
    got, was, now = _observed(doc, sid), _observed(base, sid), _observed(head, sid)
    names = sorted(set(got) | set(was) | set(now)) if keys is None else keys
    found = {k: Values(got.get(k, NOT_OBSERVED), was.get(k, NOT_OBSERVED), now.get(k, NOT_OBSERVED)) for k in names}
    return {k: values for k, values in found.items() if departs(values)}


def _not_head(values: Values) -> bool:
    return not agree(values.tree, values.head)


def _neither(values: Values) -> bool:
    return not agree(values.tree, values.base) and not agree(values.tree, values.head)


def departures(doc: dict, base: dict, head: dict, controls: dict[str, list[str] | None]) -> Explained:
    """Per control (of ``controls``: scenario -> keys), the keys on which ``doc`` observes what neither base nor
    head observes (a key it never recorded too), each beside their values; a control that raised or whose keys
    all are set aside ([]) has none."""
    found = {sid: keys_beside(doc, base, head, sid, keys, _neither) for sid, keys in controls.items()
             if keys != [] and not _raised(doc, sid)}
    return {sid: keys for sid, keys in found.items() if keys}


def _control(doc: dict, sid: str, departed: Explained) -> Behaviour:
    """A control that raised is an error; one that departs on a key it recorded deviates (an over-broad fix,
    or a leak); one that departs only where it recorded nothing matches neither side (nothing shows it
    over-broad)."""
    if _raised(doc, sid):
        return Behaviour.ERROR
    if any(values.tree is not NOT_OBSERVED for values in departed[sid].values()):
        return Behaviour.DEVIATES
    return Behaviour.NEITHER


def overall(found: dict[str, Behaviour]) -> Classification:
    """Over the telling scenarios: some fixed and some pre-fix is partial, whatever else matched neither or
    raised (named beside it); else a raise is an error (never folded into neither); then neither, then a side."""
    kinds = set(found.values()) - {Behaviour.NOT_DECIDING}
    if {Behaviour.FIXED, Behaviour.PRE_FIX} <= kinds:
        return Classification.PARTIAL
    if Behaviour.ERROR in kinds:
        return Classification.ERROR
    if Behaviour.NEITHER in kinds or not kinds:
        return Classification.NEITHER
    return Classification.FIXED if kinds == {Behaviour.FIXED} else Classification.PRE_FIX


def with_controls(telling: Classification, controls: dict[str, Behaviour]) -> Classification:
    """A tree fixed on every telling scenario is the fixed code only if no control departs from both sides
    (else: deviates, an over-broad fix), raised (else: error) or went unrecorded (else: neither). Other
    classifications already say the tree is not the fixed code; their departing controls are named beside them."""
    if telling is not Classification.FIXED:
        return telling
    if Behaviour.DEVIATES in controls.values():
        return Classification.DEVIATES
    if Behaviour.ERROR in controls.values():
        return Classification.ERROR
    return Classification.NEITHER if Behaviour.NEITHER in controls.values() else telling


def _error(doc: dict, sid: str) -> str:
    error = doc["scenarios"][sid]["error"]
    return f"{error['type']}: {error['message']}"


def raised(doc: dict, found: dict[str, Behaviour]) -> str | None:
    """What the erroring scenarios raised, one ``sid: Type: message`` each."""
    errors = [f"{sid}: {_error(doc, sid)}" for sid, b in found.items() if b is Behaviour.ERROR]
    return "; ".join(errors) or None


def refused(doc: dict, exp: Experiment | None) -> list[str]:
    """The registry rules (not affected, not deciding) whose observation this tree matched only in scenarios
    that raised: ``rule <id> not applied: <sid> raised <Type: message>`` each. No all-clear rests on them."""
    rules: list[NotAffected | NotDeciding] = [*exp.not_affected.values(), *exp.not_deciding.values()] if exp else []
    return [f"rule {rule.id} not applied: {sid} raised {_error(doc, sid)}"
            for rule in rules if (reading := rule.read(doc)).refused for sid in reading.raised]


def not_affected(doc: dict, exp: Experiment | None) -> list[NotAffected]:
    """The registry's rules whose observation holds on ``doc`` (recorded by a scenario that ran clean): the
    vulnerable path is not in this tree."""
    return [rule for rule in (exp.not_affected.values() if exp else ()) if rule.holds(doc)]


def evidence(rules: list[NotAffected]) -> list[str]:
    return [f"{r.scenario}.{r.key} = {r.value!r}: {r.why} ({r.justification.value})" for r in rules]


def set_aside(doc: dict, exp: Experiment | None) -> list[str]:
    """What a reader is told of how this tree was judged: each rule that held here because of what the
    tree is (one with a ``when``), ``id: why``. A rule for every tree is the registry's, not the tree's."""
    return [f"{rule.id}: {rule.why}" for rule in not_deciding(doc, exp) if rule.when]


@dataclass(frozen=True)
class Judgement:
    """One tree against base and head: the classification, and what decided it."""

    classification: Classification
    scenarios: dict[str, Behaviour]  # each telling scenario, then each control the tree departs from or raised in
    explain: Explained  # per scenario that kept the tree from fixed (pre-fix, neither, deviates): its keys
    raised: str | None  # what the erroring scenarios (telling or control) raised, and the rules refused for it
    unobserved: list[str] = field(default_factory=list)  # deciding keys never recorded: ``sid.key``
    not_deciding: list[str] = field(default_factory=list)  # the rules that set keys aside on this tree: ``id: why``
    evidence: list[str] = field(default_factory=list)  # not affected: the observations that show it
    justification: Justification | None = None  # not affected: OpenVEX's justification
    shown_by: list[str] = field(default_factory=list)  # not affected: the scenarios whose observation shows it

    @property
    def deviations(self) -> Explained:
        """The departing controls' keys alone."""
        return {sid: keys for sid, keys in self.explain.items() if self.scenarios[sid] is Behaviour.DEVIATES}


def judge(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> Judgement:
    """The whole behaviour, for the sweep and ``check`` alike. A registry rule whose observation a clean
    scenario shows says the vulnerable path is not in the tree (not affected). Else the telling scenarios
    decide which side the tree is on, the controls whether a tree fixed there is the fixed code. Keys a rule
    sets aside here decide neither (a raise still shows); a rule matched only by a scenario that raised is
    refused, and the answer is an error naming it."""
    shown = not_affected(doc, exp)
    if shown:  # the vulnerable path is not in this tree: which observation shows it decides
        return Judgement(Classification.NOT_AFFECTED, behaviours(doc, base, head, exp), {}, None,
                         evidence=evidence(shown), justification=shown[0].justification,
                         shown_by=sorted({r.scenario for r in shown}))
    rules = not_deciding(doc, exp)
    telling = deciding_here(telling_scenarios(base, head, exp), rules)
    found = _behaviours(doc, base, head, telling)
    explain = {sid: keys_beside(doc, base, head, sid, telling[sid], _not_head) for sid, b in found.items()
               if b in (Behaviour.PRE_FIX, Behaviour.NEITHER)}
    checked = deciding_here(control_scenarios(base, head, exp), rules)
    departed = departures(doc, base, head, checked)
    # A telling scenario fixed on its telling keys is judged on the keys both sides agree on as a control is;
    # one already pre-fix or neither says the tree is not the fixed code there, whatever else it departs on.
    leaks = {sid: _control(doc, sid, departed) for sid, b in found.items() if b is Behaviour.FIXED and sid in departed}
    controls = {sid: _control(doc, sid, departed) for sid in checked
                if sid not in found and (_raised(doc, sid) or sid in departed)}
    explain.update({sid: keys for sid, keys in departed.items() if sid in leaks or sid not in found})
    everything = {**found, **leaks, **controls}
    classification = with_controls(overall(found), {**leaks, **controls})
    refusals = refused(doc, exp)
    if refusals:
        classification = Classification.ERROR
    why = "; ".join(filter(None, [raised(doc, everything), *refusals])) or None
    return Judgement(classification, everything, explain, why, unobserved(explain), set_aside(doc, exp))


DIFFERING = (Behaviour.NEITHER, Behaviour.ERROR, Behaviour.DEVIATES)


def classify(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> ReleaseOutcome:
    """One release of a sweep, as ``judge`` answers it."""
    judged = judge(doc, base, head, exp)
    version = doc["tree"]["resolved"]
    if judged.classification is Classification.NOT_AFFECTED:
        return ReleaseOutcome(version, judged.classification, judged.scenarios, [], None, judged.evidence)
    differing = [sid for sid, b in judged.scenarios.items() if b in DIFFERING]
    return ReleaseOutcome(version, judged.classification, judged.scenarios, differing, judged.raised,
                          not_deciding=judged.not_deciding, deviations=judged.deviations,
                          unobserved=judged.unobserved)


def as_shipped(outcome: ReleaseOutcome, gate: Gate, read: dict | None) -> ReleaseOutcome:
    """A gated fix's release as it ships: the probe ran the fix with its gate on, and ``read`` is the gate's
    record from the release's probe process with no environment given (probes/_serverenv.py; None: none
    written). Fixed code whose default leaves the gate off is present but off; a default that turns it on, or a
    tree that does not define the variable, keeps the code's answer. Fixed code whose default is not read here
    is no all-clear: an error naming the gate."""
    state = GateState((read or {}).get("state", GateState.UNREAD.value))
    found = dataclasses.replace(outcome, gate=GateDefault(gate.variable, gate.on, state))
    if outcome.classification is not Classification.FIXED or state in (GateState.ON, GateState.UNDEFINED):
        return found
    if state is GateState.OFF:
        return dataclasses.replace(found, classification=Classification.PRESENT_OFF)
    why = (read or {}).get("why") or "the probe process wrote no environment record"
    return dataclasses.replace(found, classification=Classification.ERROR,
                               error=f"the fix is present, but the default of {gate.variable} is not read here: {why}")


def as_declared(outcome: ReleaseOutcome, declared: CannotProbe, doc: dict | None) -> ReleaseOutcome:
    """A release the registry declares cannot be probed on a CPU for this experiment (``doc``: its result; None
    where the probe wrote none). Failing as declared (it failed or raised, and every error it raised holds the
    declared text) it cannot run, the cause named; else it keeps its classification, the declaration named
    beside it, and the release watch flags it: answered, the declaration is stale; failing otherwise, it is a
    failure the declaration does not cover."""
    found = dataclasses.replace(outcome, declared=declared.why)
    if outcome.classification is Classification.FAILED:
        errors = [outcome.error or ""]
    elif outcome.classification is Classification.ERROR and doc is not None:
        errors = [_error(doc, sid) for sid in doc["scenarios"] if _raised(doc, sid)]
    else:
        return found
    if errors and all(declared.raises in error for error in errors):
        return dataclasses.replace(found, classification=Classification.CANNOT_RUN)
    return found


def watch_exit(outcomes: list[ReleaseOutcome]) -> int:
    """The sweep's exit code for one experiment: a flagged release (a failed one anywhere: before the first fixed
    one it may hide the real bracket) outranks no release carrying the fix at all. A gated fix present but off in
    every release that carries it is found all the same: the sweep says where it is and that it is off."""
    if flagged(outcomes):
        return RELEASE_WATCH
    return CONFIRMED if first_carrying(outcomes) else BEHAVIOUR_DIFFERS


REFERENCES = ("published", "fresh")  # what the sweep and check judge against: results/, or runs/ (republishing)
