"""Release sweep: which SGLang release carries each fix, and does a later one drop it?

Probes every release from the registry's floor up, every experiment in one
process per release (one SGLang import), and classifies each release by the
scenarios that tell the registry's base and head apart: per scenario pre-fix
(observes what base observes), fixed (what head observes), neither, or error;
per release pre-fix, fixed, partial (some of each), neither or failed. A
release after the first fixed one that is pre-fix or partial again is a
regression.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .. import environments
from ..cells import allprobes, warm
from ..core.errors import INCOMPLETE, HarnessError, usage
from ..core.errors import integrity as integrity_error
from ..core.files import relative, sha256_file
from ..core.locking import exclusive
from ..core.paths import tree_lock_file, work_dir
from ..documents import integrity, provenance, results
from ..documents.provenance import Provenance, stale_error
from ..documents.receipts import Receipt
from ..documents.tables import SWEEP_SCHEMA, ReleaseOutcome, SweepParameters, first_fixed, regressions
from ..documents.vocabulary import Behaviour, Classification
from ..judge.compare import expected_file, same
from ..registry import SIDES, Experiment, Registry
from ..sources import trees

SWEEP_SIDE = "sweep"


def releases(files: list[dict], python: str, floor: str, *, pre: bool = False, project: str = "sglang") -> list[str]:
    """Versions with a wheel for this Python and machine, oldest first, from ``floor`` up.

    Final releases only, unless ``pre``: then pre-, post- and dev releases too.
    """
    supported, found = trees.supported_tags(python), {}
    for f in files:
        version = None if f.get("yanked") else trees.wheel_fits(f["filename"], project, supported)
        if version is None or version < Version(floor):
            continue
        if pre or not (version.is_prerelease or version.is_postrelease):
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


def behaviours(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> dict[str, Behaviour]:
    """Per telling scenario: did ``doc`` do what base did, what head did, neither, or raise?"""
    telling = telling_scenarios(base, head, exp)
    got, was, now = signature(doc, telling), signature(base, telling), signature(head, telling)
    out = {}
    for sid in telling:
        if (doc["scenarios"].get(sid) or {}).get("error") is not None:
            out[sid] = Behaviour.ERROR
        elif same(got[sid], was[sid]):
            out[sid] = Behaviour.PRE_FIX
        elif same(got[sid], now[sid]):
            out[sid] = Behaviour.FIXED
        else:
            out[sid] = Behaviour.NEITHER
    return out


def overall(found: dict[str, Behaviour]) -> Classification:
    kinds = set(found.values())
    if kinds & {Behaviour.NEITHER, Behaviour.ERROR} or not kinds:
        return Classification.NEITHER
    if kinds == {Behaviour.PRE_FIX}:
        return Classification.PRE_FIX
    if kinds == {Behaviour.FIXED}:
        return Classification.FIXED
    return Classification.PARTIAL


def classify(doc: dict, base: dict, head: dict, exp: Experiment | None = None) -> ReleaseOutcome:
    found = behaviours(doc, base, head, exp)
    differing = [sid for sid, b in found.items() if b in (Behaviour.NEITHER, Behaviour.ERROR)]
    return ReleaseOutcome(doc["tree"]["resolved"], overall(found), found, differing)


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


def references(reg: Registry, exp: Experiment, directory: Path, *, fresh: bool = False) -> References:
    """The registry's release-backed base and head results, verified before anything is judged by them.

    Published (``results/``): each file and its receipt must match SHA256SUMS.txt and load (else exit 5,
    naming it). Fresh (``runs/``, while republishing): each must load with its receipt. Either way the
    receipt must record this checkout's probe, kit, registry, constraints and harness (else exit 8).
    """
    docs, digests, stale = {}, {}, {}
    for side in SIDES:
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
            docs[side] = results.load(path, experiment=exp.name)
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


def sweep(reg: Registry, experiments: list[str], *, published: Path, out_dir: Path,
          versions: list[str] | None = None, pre: bool = False, jobs: int = 2, cold: bool = False,
          force: bool = False, fresh_references: bool = False,
          log=print) -> tuple[dict[str, list[ReleaseOutcome]], str | None, dict[str, References]]:
    """Every release, every experiment; outcomes per experiment, as-of date, and what they were judged against.

    ``published`` holds the base and head results judged against: results/, or runs/ with
    ``fresh_references`` (a republish, where the published ones are stale).

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
    versions = versions or releases(files, reg.python, reg.release_floor, pre=pre)
    environments.torch_choice(reg)
    lock = trees.LockFile(tree_lock_file(reg.root))
    probed = _cold(reg, versions, experiments, lock, out_dir, jobs, log) if cold else \
        _warm(reg, versions, experiments, lock, out_dir, jobs, force, log)

    def judged(version: str) -> dict[str, ReleaseOutcome]:
        outcomes = probed[version]
        if isinstance(outcomes, str):
            return {name: ReleaseOutcome(version, Classification.FAILED, error=outcomes) for name in experiments}
        found = {}
        for name, outcome in outcomes.items():
            if outcome.doc is None:
                found[name] = ReleaseOutcome(version, Classification.FAILED, error=outcome.error)
            else:
                found[name] = classify(outcome.doc, refs[name].base, refs[name].head, reg.experiment(name))
        return found

    per_release = [judged(version) for version in versions]
    return {name: [r[name] for r in per_release] for name in experiments}, as_of(files, versions), refs


def default_releases(reg: Registry, *, pre: bool = False) -> list[str]:
    """What a sweep probes when no version is named: every release from the registry's floor up."""
    return releases(trees.index_files("sglang"), reg.python, reg.release_floor, pre=pre)


def _tree_args(version: str) -> dict[str, str]:
    return {"side": SWEEP_SIDE, "tree_kind": "release", "tree_ref": version, "tree_resolved": version}


def _cold(reg: Registry, versions: list[str], experiments: list[str], lock: trees.LockFile, out_dir: Path,
          jobs: int, log) -> dict[str, dict[str, allprobes.Outcome] | str]:
    """One environment and one fresh probe process per release."""
    def one(version: str) -> dict[str, allprobes.Outcome] | str:
        try:
            tree = trees.release_tree(version, reg.python, lock)
            slug = f"{SWEEP_SIDE}.{tree.label()}"
            with exclusive(work_dir(reg.root) / "locks" / f"{slug}.lock", f"the sweep environment {slug}"):
                env = environments.cell_environment(reg, tree, slug)
                log(f"sweep: probing {', '.join(experiments)} on {tree.label()}")
                return allprobes.run(reg, env.interpreter, experiments, _tree_args(version),
                                     out_dir=out_dir / tree.label(), log=work_dir(reg.root) / "logs" / f"{slug}.log",
                                     env=env.probe_env)
        except HarnessError as exc:
            return str(exc).splitlines()[0]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip(versions, pool.map(one, versions)))


def _warm(reg: Registry, versions: list[str], experiments: list[str], lock: trees.LockFile, out_dir: Path,
          jobs: int, force: bool, log) -> dict[str, dict[str, allprobes.Outcome] | str]:
    """Every release through the warm engine, the unchanged ones from the outcome cache."""
    found: dict[str, dict[str, allprobes.Outcome] | str] = {}
    ready = []
    for version in versions:
        try:
            ready.append(trees.release_tree(version, reg.python, lock))
        except HarnessError as exc:
            found[version] = str(exc).splitlines()[0]
    with exclusive(work_dir(reg.root) / "locks" / f"{SWEEP_SIDE}.engine.lock", "the sweep's warm engine"):
        probed = warm.probe_trees(reg, ready, experiments, {t.label(): _tree_args(t.resolved) for t in ready},
                                  out_dir=out_dir, jobs=jobs, force=force, log=log)
    for tree in ready:
        found[tree.resolved] = probed[tree.label()]
    return found


def table(experiment: str, outcomes: list[ReleaseOutcome], bracket: dict[str, str | None]) -> str:
    lines = [f"release sweep: {experiment}", f"  {'release':<12} classification"]
    regressed = set(regressions(outcomes))
    for o in outcomes:
        pre_fix = [sid for sid, b in o.scenarios.items() if b is Behaviour.PRE_FIX]
        detail = (f" ({', '.join(o.differing)})" if o.differing else f" ({o.error})" if o.error
                  else f" (pre-fix: {', '.join(pre_fix)})" if o.classification is Classification.PARTIAL else "")
        flag = "  REGRESSION: the fix is gone again" if o.version in regressed else ""
        lines.append(f"  {o.version:<12} {o.classification.value}{detail}{flag}")
    fixed = first_fixed(outcomes)
    lines.append(f"  first fixed release: {fixed or 'none found'}")
    if regressed:
        lines.append(f"  regressions: {', '.join(sorted(regressed, key=Version))}")
    if fixed and bracket.get("head") and fixed != bracket["head"]:
        lines.append(f"  note: the registry's release head is {bracket['head']}, the sweep says {fixed}")
    return "\n".join(lines)


def made_by(reg: Registry, experiments: list[str]) -> Provenance:
    """What makes a sweep's tables: the experiments' probes, the kit, the engine and its driver, the registry,
    every closure a release may run in (today's and each era's), the harness."""
    closures = [environments.closure_for_era(reg, None), *(era.constraints for era in reg.eras.values())]
    return provenance.record(reg.root, provenance.inputs(reg, experiments, provenance.SWEEP_DRIVERS, closures))


def document(experiment: str, outcomes: list[ReleaseOutcome], as_of_date: str | None, made: Provenance,
             parameters: SweepParameters) -> dict:
    return {"schema": SWEEP_SCHEMA.name, "experiment": experiment, "first_fixed": first_fixed(outcomes),
            "regressions": regressions(outcomes), "as_of": as_of_date,
            "releases": [o.to_json() for o in outcomes],
            "provenance": made.to_json(), "parameters": parameters.to_json()}
