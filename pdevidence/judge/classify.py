"""Which side a tree behaves like: per telling scenario, per control, per release, and the release watch.

A tree's result is judged against the published base and head results. On the
scenarios that tell them apart, per scenario: pre-fix (observes what base
observes), fixed (what head observes), neither, or error (it raised). On the
controls (scenarios base and head agree on): deviates where the tree observes
what neither side does. Per tree: partial (some telling scenarios fixed, some
pre-fix, whatever the others did), else error (a telling scenario raised: named,
with the others' behaviour beside it), neither, pre-fix or fixed; and a tree
fixed on every telling scenario whose control departs from both sides deviates
(an over-broad fix: not the fixed code). Keys that kept a tree from fixed are
shown beside base's and head's (``Judgement.explain``). The sweep and ``check``
both judge through here; the release watch (``flagged``) names every release
after the first fixed one that is not fixed, and every release that failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, INCOMPLETE, RELEASE_WATCH, HarnessError
from ..core.errors import integrity as integrity_error
from ..core.files import relative, sha256_file
from ..documents import integrity, results
from ..documents.provenance import stale_error
from ..documents.observations import NOT_OBSERVED, Explained, Values
from ..documents.receipts import Receipt
from ..documents.tables import ReleaseOutcome, first_fixed, flagged
from ..documents.vocabulary import Behaviour, Classification
from ..registry import SIDES, Experiment, NotAffected, NotDeciding, Registry
from .compare import expected_file, same


def signature(doc: dict, telling: dict[str, list[str] | None]) -> dict[str, object]:
    """The observations that decide: per scenario, the named keys (or all of them)."""
    out = {}
    for sid, keys in telling.items():
        observed = doc["scenarios"].get(sid, {}).get("observed") or {}
        out[sid] = observed if keys is None else {k: observed.get(k) for k in keys}
    return out


def telling_scenarios(base: dict, head: dict, exp: Experiment | None = None) -> dict[str, list[str] | None]:
    """What tells base from head: the registry's changing scenarios on their declared keys,
    else every scenario whose observations differ. Tree facts and controls do not decide."""
    if exp is not None and any(e.changes for e in exp.expect.values()):
        return {sid: sorted(set(e.base) | set(e.head)) for sid, e in sorted(exp.expect.items()) if e.changes}
    return {sid: None for sid in sorted(set(base["scenarios"]) | set(head["scenarios"]))
            if not same(base["scenarios"].get(sid, {}).get("observed"), head["scenarios"].get(sid, {}).get("observed"))}


def control_scenarios(base: dict, head: dict, exp: Experiment | None = None) -> dict[str, list[str] | None]:
    """What the fix must not change: the registry's controls on their declared keys, else every scenario
    base and head observe alike."""
    if exp is not None and exp.expect:
        return {sid: sorted(e.head) for sid, e in sorted(exp.expect.items()) if not e.changes}
    return {sid: None for sid in sorted(set(base["scenarios"]) & set(head["scenarios"]))
            if same(base["scenarios"][sid].get("observed"), head["scenarios"][sid].get("observed"))}


def not_deciding(doc: dict, exp: Experiment | None) -> list[NotDeciding]:
    """The registry's rules that hold on ``doc``: keys that do not decide on this tree."""
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
        elif same(got[sid], was[sid]):
            out[sid] = Behaviour.PRE_FIX
        elif same(got[sid], now[sid]):
            out[sid] = Behaviour.FIXED
        else:
            out[sid] = Behaviour.NEITHER
    return out


def behaviours(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> dict[str, Behaviour]:
    """Per telling scenario: did ``doc`` do what base did, what head did, neither, or raise? A scenario
    whose keys a registry rule sets aside on this tree does not decide (a raise still shows)."""
    return _behaviours(doc, base, head, deciding_here(telling_scenarios(base, head, exp), not_deciding(doc, exp)))


def _observed(doc: dict, sid: str) -> dict:
    return (doc["scenarios"].get(sid) or {}).get("observed") or {}


def keys_beside(doc: dict, base: dict, head: dict, sid: str, keys: list[str] | None, departs) -> dict[str, Values]:
    """The keys of ``sid`` (all of them for None) where ``departs(tree, base, head)``: each with the tree's
    value beside base's and head's (compared as the judge compares: a key not observed is null)."""
    got, was, now = _observed(doc, sid), _observed(base, sid), _observed(head, sid)
    names = sorted(set(got) | set(was) | set(now)) if keys is None else keys
    return {k: Values(got.get(k, NOT_OBSERVED), was.get(k, NOT_OBSERVED), now.get(k, NOT_OBSERVED))
            for k in names if departs(got.get(k), was.get(k), now.get(k))}


def _not_head(tree: object, base: object, head: object) -> bool:
    return not same(tree, head)


def _neither(tree: object, base: object, head: object) -> bool:
    return not same(tree, base) and not same(tree, head)


def departures(doc: dict, base: dict, head: dict, controls: dict[str, list[str] | None]) -> Explained:
    """Per control (of ``controls``: scenario -> keys), the keys on which ``doc`` observes what neither base nor
    head observes, each beside their values; a control that raised or whose keys all are set aside ([]) has none."""
    found = {sid: keys_beside(doc, base, head, sid, keys, _neither) for sid, keys in controls.items()
             if keys != [] and not _raised(doc, sid)}
    return {sid: keys for sid, keys in found.items() if keys}


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
    (else: deviates, an over-broad fix) or raised (else: error). Other classifications already say the tree is
    not the fixed code; their departing controls are named beside them."""
    if telling is not Classification.FIXED:
        return telling
    if Behaviour.DEVIATES in controls.values():
        return Classification.DEVIATES
    return Classification.ERROR if Behaviour.ERROR in controls.values() else telling


def raised(doc: dict, found: dict[str, Behaviour]) -> str | None:
    """What the erroring scenarios raised, one ``sid: Type: message`` each."""
    errors = [f"{sid}: {doc['scenarios'][sid]['error']['type']}: {doc['scenarios'][sid]['error']['message']}"
              for sid, b in found.items() if b is Behaviour.ERROR]
    return "; ".join(errors) or None


@dataclass(frozen=True)
class Judgement:
    """One tree against base and head: the classification, and what decided it."""

    classification: Classification
    scenarios: dict[str, Behaviour]  # each telling scenario, then each control the tree departs from or raised in
    explain: Explained  # per scenario that kept the tree from fixed (pre-fix, neither, deviates): its keys
    raised: str | None  # what the erroring scenarios (telling or control) raised

    @property
    def deviations(self) -> Explained:
        """The departing controls' keys alone."""
        return {sid: keys for sid, keys in self.explain.items() if self.scenarios[sid] is Behaviour.DEVIATES}


def judge(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> Judgement:
    """The whole behaviour: the telling scenarios decide which side the tree is on, the controls whether a tree
    fixed there is the fixed code. Keys a registry rule sets aside here decide neither (a raise still shows)."""
    rules = not_deciding(doc, exp)
    telling = deciding_here(telling_scenarios(base, head, exp), rules)
    found = _behaviours(doc, base, head, telling)
    explain = {sid: keys_beside(doc, base, head, sid, telling[sid], _not_head) for sid, b in found.items()
               if b in (Behaviour.PRE_FIX, Behaviour.NEITHER)}
    checked = deciding_here(control_scenarios(base, head, exp), rules)
    departed = departures(doc, base, head, checked)
    controls = {sid: Behaviour.ERROR if _raised(doc, sid) else Behaviour.DEVIATES for sid in checked
                if _raised(doc, sid) or sid in departed}
    explain.update(departed)
    everything = {**found, **controls}
    return Judgement(with_controls(overall(found), controls), everything, explain, raised(doc, everything))


def not_affected(doc: dict, exp: Experiment | None) -> list[NotAffected]:
    """The registry's rules whose observation holds on ``doc``: the vulnerable path is not in this tree."""
    return [rule for rule in (exp.not_affected.values() if exp else ()) if rule.holds(doc)]


def evidence(rules: list[NotAffected]) -> list[str]:
    return [f"{r.scenario}.{r.key} = {r.value!r}: {r.why} ({r.justification.value})" for r in rules]


def set_aside(doc: dict, exp: Experiment | None) -> list[str]:
    """What a reader is told of how this tree was judged: each rule that held here because of what the
    tree is (one with a ``when``), ``id: why``. A rule for every tree is the registry's, not the tree's."""
    return [f"{rule.id}: {rule.why}" for rule in not_deciding(doc, exp) if rule.when]


DIFFERING = (Behaviour.NEITHER, Behaviour.ERROR, Behaviour.DEVIATES)


def classify(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> ReleaseOutcome:
    rules = not_affected(doc, exp)
    if rules:
        found = behaviours(doc, base, head, exp)
        return ReleaseOutcome(doc["tree"]["resolved"], Classification.NOT_AFFECTED, found, [], None, evidence(rules))
    judged = judge(doc, base, head, exp)
    differing = [sid for sid, b in judged.scenarios.items() if b in DIFFERING]
    return ReleaseOutcome(doc["tree"]["resolved"], judged.classification, judged.scenarios, differing, judged.raised,
                          not_deciding=set_aside(doc, exp), deviations=judged.deviations)


def watch_exit(outcomes: list[ReleaseOutcome]) -> int:
    """The sweep's exit code for one experiment: a flagged release (a failed one anywhere: before the first fixed
    one it may hide the real bracket) outranks no fixed release at all."""
    if flagged(outcomes):
        return RELEASE_WATCH
    return CONFIRMED if first_fixed(outcomes) else BEHAVIOUR_DIFFERS


REFERENCES = ("published", "fresh")  # what the sweep and check judge against: results/, or runs/ (republishing)


@dataclass(frozen=True)
class References:
    """The base and head result documents a build is judged against, and each file's SHA-256 (by name)."""

    docs: dict[str, dict]  # side -> result document
    digests: dict[str, str]

    @property
    def base(self) -> dict:
        return self.docs["base"]

    @property
    def head(self) -> dict:
        return self.docs["head"]


def references(reg: Registry, exp: Experiment, directory: Path, *, fresh: bool = False,
               sides: tuple[str, ...] = SIDES) -> References:
    """The registry's release-backed base and head results (or only ``sides``), verified before anything is
    judged by them.

    Published (``results/``): each file and its receipt must match SHA256SUMS.txt and load (else exit 5,
    naming it). Fresh (``runs/``, while republishing): each must load with its receipt. Either way the
    receipt must record this checkout's probe, kit, registry, constraints and harness (else exit 8).
    """
    docs, digests, stale = {}, {}, {}
    for side in sides:
        path = directory / expected_file(exp, side, "release")
        if not path.exists():
            todo = ("run `nox -s matrix` first" if fresh else
                    f"run `nox -s \"release({exp.name}, {side})\"` and `nox -s publish` first")
            raise HarnessError(f"the {'fresh' if fresh else 'published'} {side} result {path.name} is missing",
                               code=INCOMPLETE, todo=todo)
        receipt = results.receipt_path(path)
        if not fresh:
            for file in (path, receipt):
                why = integrity.problem(reg.root, relative(file, reg.root))
                if why:
                    raise integrity_error(f"the published reference {relative(file, reg.root)} fails verification: "
                                          f"{why}", todo="restore it from git (`git checkout -- results/`) "
                                          "or republish; nothing was judged")
        try:
            docs[side] = results.load(path, experiment=exp.name, side=side)
            made = Receipt.load(receipt, experiment=exp.name, side=side)
        except HarnessError as exc:
            raise integrity_error(f"the {'fresh' if fresh else 'published'} reference {relative(path, reg.root)} "
                                  f"is not valid: {exc.what}", todo=exc.todo) from None
        digests[path.name] = sha256_file(path)
        why = made.stale(reg.root)
        if why:
            stale[relative(receipt, reg.root)] = why
    if stale:
        raise stale_error(stale, reg, what="reference results")
    return References(docs, digests)
