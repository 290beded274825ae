"""Release sweep: which SGLang release carries each fix, and does a later one lose it or break?

Probes every release from the registry's floor up (an experiment may reach further back: its own
``release_floor``, where its code path is older than PD), every experiment whose floor is at or below
the release in one process per release (one SGLang import), and has the judge (``judge/classify.py``)
classify each release by the scenarios that tell the registry's base and head
apart and by the controls: pre-fix, fixed, partial, neither, error (a telling
scenario raised), deviates (fixed, but a control departs from both sides) or
failed (not probed). The release watch flags every release after the first fixed
one that is not fixed, and a release that failed anywhere (one not probed before
the first fixed one may be the real first fixed): exit 9. One that is pre-fix or
partial again after the first fixed one is also a regression. A release the registry
declares cannot be probed on a CPU (``[cannot_probe]``) is still probed: failing as
declared it "cannot run" (the cause named) and is set aside; answering, its declaration
is stale and flagged (exit 9), as is one failing otherwise.

A gated fix (the registry's ``gate``) is probed with its gate on; each release's
probe process also reads the gate's variable with no environment given (the
release's own default, as ``check`` does). Fixed code whose default leaves the
gate off is "present but off": as shipped the server is exposed, so it lacks
the fix (a default that turns it on is the first fixed release).
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .. import environments
from ..cells import allprobes, warm
from ..core import children
from ..core.arguments import DEFAULT_PLATFORM
from ..core.errors import HarnessError, usage
from ..core.locking import exclusive
from ..core.paths import tree_lock_file, work_dir
from ..documents import provenance
from ..documents.observations import explained_text
from ..documents.provenance import Provenance
from ..documents.references import References, references
from ..documents.tables import SWEEP_SCHEMA, ReleaseOutcome, SweepParameters, first_fixed, flagged, regressions
from ..documents.vocabulary import Behaviour, Classification
from ..judge.classify import as_declared, as_shipped, classify
from ..registry import REGISTRY_FILE, Registry
from ..sources import trees

SWEEP_SIDE = "sweep"


def releases(files: list[dict], python: str, floor: str, *, pre: bool = False, project: str = "sglang") -> list[str]:
    """Versions with a wheel for this Python and machine, oldest first, from ``floor`` up.

    Final and post-releases (operators run ``0.5.6.post2``; the first PD release is a post-release), and with
    ``pre`` pre- and dev releases too.
    """
    supported, found = trees.supported_tags(python), {}
    for f in files:
        version = None if f.get("yanked") else trees.wheel_fits(f["filename"], project, supported)
        if version is None or version < Version(floor):
            continue
        if pre or not version.is_prerelease:
            found[version] = str(version)
    return [found[v] for v in sorted(found)]


def as_of(files: list[dict], versions: list[str], project: str = "sglang") -> str | None:
    """When the newest probed release was uploaded: the date a sweep table speaks for (no wall clock)."""
    wanted = {Version(v) for v in versions}
    times = []
    for f in files:
        try:
            version = parse_wheel_filename(f["filename"])[1]
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if version in wanted and f.get("upload-time"):
            times.append(f["upload-time"])
    return max(times, default=None)


def sweep(reg: Registry, experiments: list[str], *, published: Path, out_dir: Path,
          versions: list[str] | None = None, pre: bool = False, jobs: int = 2, cold: bool = False,
          force: bool = False, fresh_references: bool = False, floored: bool | None = None,
          log=print) -> tuple[dict[str, list[ReleaseOutcome]], str | None, dict[str, References]]:
    """Every release, every experiment; outcomes per experiment, as-of date, and what they were judged against.

    ``published`` holds the base and head results judged against: results/, or runs/ with
    ``fresh_references`` (a republish, where the published ones are stale).

    Without ``versions``, every release from the lowest floor of the experiments swept; ``floored`` (by default
    when no version is named) probes each release only for the experiments whose floor is at or below it
    (``Registry.floor``), so each experiment's table starts at its own floor: an experiment that reads further
    back than the others is probed there alone, the others keep their tables. Unfloored, every experiment is
    probed on every release named.

    A release the registry declares cannot be probed on a CPU (``[cannot_probe]``) is probed all the same: one
    that fails as declared cannot run, set aside by the release watch; one that answers is flagged (a stale
    declaration).

    By default the warm engine probes the releases whose outcome is not cached yet; ``cold``
    runs one fresh probe process per release in its own environment instead (the reference
    the engine is measured and checked against).
    """
    for version in versions or []:
        if version in reg.experiments:
            raise usage(f"{version!r} is an experiment, not a version",
                        todo=f"name experiments with --experiment {version}")
        trees.parse_version(version)
    refs = {name: references(reg, reg.experiment(name), published, fresh=fresh_references) for name in experiments}
    files = trees.index_files("sglang")
    floored = versions is None if floored is None else floored
    versions = releases(files, reg.python, lowest_floor(reg, experiments), pre=pre) if versions is None \
        else versions
    wanted = probed_for(reg, versions, experiments, floored=floored)
    versions = [v for v in versions if wanted[v]]  # below every floor (an era's part named it): not probed
    environments.torch_choice(reg)
    lock = trees.LockFile(tree_lock_file(reg.root))
    if not versions:  # an era with no release: its part says so, with no engine started
        probed = {}
    elif cold:
        probed = _cold(reg, versions, wanted, lock, out_dir, jobs, log)
    else:
        probed = _warm(reg, versions, wanted, lock, out_dir, jobs, force, log)

    def judged(version: str) -> dict[str, ReleaseOutcome]:
        outcomes, read = probed[version]
        if isinstance(outcomes, str):
            found = {name: ReleaseOutcome(version, Classification.FAILED, error=outcomes) for name in wanted[version]}
            return {name: declared_as(reg, name, o, None) for name, o in found.items()}
        found = {}
        for name, outcome in outcomes.items():
            exp = reg.experiment(name)
            if outcome.doc is None:
                found[name] = declared_as(reg, name, ReleaseOutcome(version, Classification.FAILED,
                                                                    error=outcome.error), None)
                continue
            found[name] = classify(outcome.doc, refs[name].base, refs[name].head, exp)
            if exp.gate is not None and exp.gate.decides_on(DEFAULT_PLATFORM):  # the sweep answers for CUDA
                found[name] = as_shipped(found[name], exp.gate, (read or {}).get("gates", {}).get(exp.gate.variable))
            found[name] = declared_as(reg, name, found[name], outcome.doc)
        return found

    per_release = dict(zip(versions, map(judged, versions)))
    return ({name: [per_release[v][name] for v in versions if name in wanted[v]] for name in experiments},
            as_of(files, versions), refs)


def probed_for(reg: Registry, versions: list[str], experiments: list[str], *, floored: bool) -> dict[str, list[str]]:
    """Per release, the experiments probed on it: floored, those whose floor is at or below it (an experiment is
    never probed below its own floor: its table would discard the outcome); else every one."""
    return {v: [name for name in experiments if not floored or Version(v) >= Version(reg.floor(name))]
            for v in versions}


def declared_as(reg: Registry, name: str, outcome: ReleaseOutcome, doc: dict | None) -> ReleaseOutcome:
    """``outcome`` read against the registry's declaration that its release cannot be probed on a CPU for
    ``name``, where there is one (``classify.as_declared``)."""
    declared = reg.declared(outcome.version, name)
    return outcome if declared is None else as_declared(outcome, declared, doc)


def lowest_floor(reg: Registry, experiments: list[str] | None = None) -> str:
    """The oldest release any of ``experiments`` (default: every one) is swept from."""
    return min((reg.floor(name) for name in experiments or reg.experiments), key=Version)


def default_releases(reg: Registry, *, pre: bool = False, experiments: list[str] | None = None) -> list[str]:
    """What a sweep probes when no version is named: every release from the lowest floor of ``experiments``
    (default: every experiment) up."""
    return releases(trees.index_files("sglang"), reg.python, lowest_floor(reg, experiments), pre=pre)


def gate_args(reg: Registry, experiments: list[str]) -> dict[str, str]:
    """The probe driver's arguments that have it read each swept gated fix's variable with no environment given
    (its default): none where no experiment is gated (an ungated sweep's outcomes are kept by what they were)."""
    gates = {exp.gate.variable: exp.gate.on for exp in map(reg.experiment, experiments) if exp.gate}
    return {warm.SERVER_GATES: json.dumps(gates, sort_keys=True)} if gates else {}


def _tree_args(version: str, gates: dict[str, str]) -> dict[str, str]:
    return {"side": SWEEP_SIDE, "tree_kind": "release", "tree_ref": version, "tree_resolved": version, **gates}


# Per release: the experiments' outcomes (or why it could not be probed) and its environment record (the gates'
# defaults as it reads them; None where none was asked for or written).
Probed = tuple[dict[str, allprobes.Outcome] | str, dict | None]


def _read(out: Path, gates: dict[str, str]) -> dict | None:
    return allprobes.read_environment(out) if gates else None


def _cold(reg: Registry, versions: list[str], wanted: dict[str, list[str]], lock: trees.LockFile, out_dir: Path,
          jobs: int, log) -> dict[str, Probed]:
    """One environment and one fresh probe process per release, probing the experiments ``wanted`` on it."""
    def one(version: str) -> Probed:
        gates = gate_args(reg, wanted[version])
        try:
            tree = trees.release_tree(version, reg.python, lock)
            out = out_dir / tree.label()
            outcomes = allprobes.run_in_environment(reg, tree, f"{SWEEP_SIDE}.{tree.label()}", wanted[version],
                                                    _tree_args(version, gates), out_dir=out, log=log)
            return outcomes, _read(out, gates)
        except HarnessError as exc:
            return str(exc).splitlines()[0], None

    with children.workers(jobs, "tree") as pool:
        return dict(zip(versions, pool.map(one, versions)))


def _warm(reg: Registry, versions: list[str], wanted: dict[str, list[str]], lock: trees.LockFile, out_dir: Path,
          jobs: int, force: bool, log) -> dict[str, Probed]:
    """Every release through the warm engine, each probing the experiments ``wanted`` on it, the unchanged ones
    from the outcome cache (with their records)."""
    found: dict[str, Probed] = {}
    ready = []
    for version in versions:
        try:
            ready.append(trees.release_tree(version, reg.python, lock))
        except HarnessError as exc:
            found[version] = str(exc).splitlines()[0], None
    gates = {t.label(): gate_args(reg, wanted[t.resolved]) for t in ready}
    every = list(dict.fromkeys(name for names in wanted.values() for name in names))
    with exclusive(work_dir(reg.root) / "locks" / f"{SWEEP_SIDE}.engine.lock", "the sweep's warm engine"):
        probed = warm.probe_trees(reg, ready, every, {t.label(): _tree_args(t.resolved, gates[t.label()])
                                                      for t in ready},
                                  out_dir=out_dir, jobs=jobs, force=force, log=log,
                                  only={t.label(): wanted[t.resolved] for t in ready})
    for tree in ready:
        found[tree.resolved] = probed[tree.label()], _read(out_dir / tree.label(), gates[tree.label()])
    return found


# The scenarios a release's detail names, by classification (any raise and departing control are named too).
NAMED = {Classification.PARTIAL: (Behaviour.PRE_FIX, Behaviour.NEITHER),
         Classification.NEITHER: (Behaviour.NEITHER, Behaviour.PRE_FIX, Behaviour.FIXED),
         Classification.ERROR: (Behaviour.NEITHER, Behaviour.PRE_FIX, Behaviour.FIXED)}


def detail(o: ReleaseOutcome) -> str:
    """Why a release is not simply pre-fix or fixed: what raised, each scenario's behaviour beside the others,
    each control it departs from both sides on with its values, and the rules that set keys aside."""
    if o.classification is Classification.CANNOT_RUN:
        return f" on a CPU, as the registry declares: {o.declared}"
    if o.stale_declaration or o.failed_otherwise:
        return f"{_detail(o)} (declared cannot run on a CPU: {o.declared})"
    return _detail(o)


def _detail(o: ReleaseOutcome) -> str:
    if o.classification is Classification.FAILED:
        return f" ({o.error})" if o.error else ""
    if o.classification is Classification.NOT_AFFECTED:
        return f" ({'; '.join(o.evidence)})"
    if o.classification is Classification.PRESENT_OFF and o.gate is not None:
        return f" (fixed with {o.gate.variable}={o.gate.on}; off by default)"
    by = {b: [sid for sid, got in o.scenarios.items() if got is b] for b in Behaviour}
    aside = f" (judged without: {', '.join(rule.split(':')[0] for rule in o.not_deciding)})" if o.not_deciding else ""
    parts = [f"raised: {o.error}"] if o.error else []
    parts += [f"{b.value}: {', '.join(by[b])}" for b in NAMED.get(o.classification, ()) if by[b]]
    parts += [f"departs from both sides on {line}" for line in explained_text(o.deviations)]
    return (f" ({'; '.join(parts)})" if parts else "") + aside


def gate_legend(outcomes: list[ReleaseOutcome]) -> str | None:
    """The line that says what "present but off" means here, naming the variable; None where no release is."""
    off = [o for o in outcomes if o.classification is Classification.PRESENT_OFF and o.gate is not None]
    if not off:
        return None
    gate = off[0].gate
    return (f"{Classification.PRESENT_OFF.value}: the release carries the fix, but its default leaves "
            f"{gate.variable} off, so a server run with the defaults is exposed; set {gate.variable}={gate.on} in "
            f"the server's environment to turn it on ({', '.join(o.version for o in off)})")


def table(experiment: str, outcomes: list[ReleaseOutcome], bracket: dict[str, str | None],
          parameters: SweepParameters | None = None) -> str:
    lines = [f"release sweep: {experiment}"]
    if parameters and parameters.partial:
        lines.append(f"  PARTIAL SWEEP ({parameters.partial}): not every release; publish refuses it")
    lines.append(f"  {'release':<12} classification")
    fixed = first_fixed(outcomes)
    regressed, watched = set(regressions(outcomes)), flagged(outcomes)
    stale = [o.version for o in outcomes if o.stale_declaration]
    otherwise = [o.version for o in outcomes if o.failed_otherwise]
    after = [v for v in watched if fixed and Version(v) > Version(fixed) and v not in stale + otherwise]
    unprobed = [v for v in watched if v not in after + stale + otherwise]  # failed with no fixed release before it
    for o in outcomes:
        flag = ("  REGRESSION: the fix is gone again" if o.version in regressed
                else "  WATCH: declared cannot run, but it answers: remove the declaration" if o.version in stale
                else "  WATCH: declared cannot run, but it fails otherwise" if o.version in otherwise
                else "  WATCH: not fixed after a fixed release" if o.version in after
                else "  WATCH: not probed, it may be the first fixed release" if o.version in unprobed else "")
        lines.append(f"  {o.version:<12} {o.classification.value}{detail(o)}{flag}")
    lines.append(f"  first fixed release: {fixed or 'none found'}")
    if regressed:
        lines.append(f"  regressions: {', '.join(sorted(regressed, key=Version))}")
    kinds = {o.version: o.classification.value for o in outcomes}
    if after:
        lines.append(f"  release watch: not fixed after {fixed}: " + ", ".join(f"{v} ({kinds[v]})" for v in after))
    if unprobed:
        lines.append(f"  release watch: not probed (the first fixed release may be among them): {', '.join(unprobed)}")
    if stale:
        lines.append("  release watch: declared cannot be probed on a CPU, but probed: "
                     + ", ".join(f"{v} ({kinds[v]})" for v in stale)
                     + f"; the declaration is stale: remove {' and '.join(_declaration(v) for v in stale)} from "
                       f"{REGISTRY_FILE}")
    if otherwise:
        lines.append("  release watch: declared cannot be probed on a CPU, but it failed otherwise than declared: "
                     + ", ".join(f"{v} ({kinds[v]})" for v in otherwise)
                     + f"; read what it raised, then fix the probe or the declaration in {REGISTRY_FILE}")
    aside = [o.version for o in outcomes if o.classification is Classification.CANNOT_RUN]
    if aside:
        lines.append(f"  set aside by the release watch (cannot run on a CPU, as declared): {', '.join(aside)}")
    legend = gate_legend(outcomes)
    if legend:
        lines.append(f"  {legend}")
    if fixed and bracket.get("head") and fixed != bracket["head"]:
        lines.append(f"  note: the registry's release head is {bracket['head']}, the sweep says {fixed}")
    return "\n".join(lines)


def _declaration(version: str) -> str:
    return f'[cannot_probe."{version}"]'


def made_by(reg: Registry, experiments: list[str]) -> Provenance:
    """What makes a sweep's tables: the experiments' probes, the kit, the engine and its driver, the registry,
    every closure a release may run in (today's and each era's), the harness."""
    closures = [environments.closure(reg), *(era.constraints for era in reg.eras.values())]
    return provenance.record(reg.root, provenance.inputs(reg, experiments, provenance.SWEEP_DRIVERS, closures),
                             provenance.Shaped.TABLE)


def document(experiment: str, outcomes: list[ReleaseOutcome], as_of_date: str | None, made: Provenance,
             parameters: SweepParameters) -> dict:
    return {"schema": SWEEP_SCHEMA.name, "experiment": experiment, "first_fixed": first_fixed(outcomes),
            "regressions": regressions(outcomes), "flagged": flagged(outcomes), "as_of": as_of_date,
            "releases": [o.to_json() for o in outcomes],
            "provenance": made.to_json(), "parameters": parameters.to_json()}
