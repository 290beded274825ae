"""Probe many trees through the warm engine, keeping each tree's outcome under a key of what made it.

A tree's outcome (per experiment: the result document, or why its setup failed) is
kept under ``.cells/outcomes/<key>/``, the key being what the tree holds (a release's
or wheel's SHA-256, a commit, a work tree's HEAD and changes or, outside git, its
content), the closure, every file that runs in the cell (probes, kit, drivers,
engine), the harness itself, the interpreter and the torch channel. An
unchanged rerun probes nothing; a new release is the only tree probed. What the
engine could not finish (a crash, a timeout) is never kept, nor what ran out of memory (a higher limit may
run it). How the tree's process ran (``core/sandbox.py``) is kept with its outcome.

Trees that do not trust each other never share an engine (its children share one
sandbox, and a child could write another tree's results): the releases from the
package index (and the project's own backports of them) share one; a tree the
operator brings (a source tree, a commit, a wheel file) gets one of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from .. import environments
from ..core import children, debris, faults, inuse, phases, sandbox
from ..core.errors import HarnessError
from ..core.files import dumps, read_json, sha256_file, write_atomic
from ..core.locking import exclusive
from ..core.paths import run_logs, work_dir
from ..documents.provenance import Shaped, harness_digest, tree_digest
from ..registry import Era, Registry
from ..sources.importable import importable_dir
from ..sources.trees import Tree
from . import allprobes, engine


def outcome_key(reg: Registry, tree: Tree, closure: Path, interpreter: str, channel: str,
                stand_ins: dict[str, str], tree_args: dict[str, str]) -> str:
    parts = {
        "tree": [tree.kind, tree.resolved, tree.digest],
        "args": tree_args,  # what the documents say of the tree (a sweep's side is not a check's); server arguments
        "closure": sha256_file(closure),
        "in_cell": tree_digest(list((reg.root / "probes").glob("*.py")), reg.root),
        "harness": harness_digest(Shaped.RESULT),
        "python": interpreter,
        "torch": channel,
        "stand_ins": stand_ins,
        "sandbox": sandbox.detect().tool.value,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _complete(directory: Path, experiments: list[str], records: tuple[str, ...] = ()) -> bool:
    """Every experiment left a result or a cannot-run record (and each of ``records``: what the server arguments
    and environment given read as): an outcome worth keeping (or reusing)."""
    if not all((directory / record).exists() for record in records):
        return False
    return all((directory / f"{name}.json").exists() or (directory / f"{name}{allprobes.CANNOT_RUN_SUFFIX}").exists()
               for name in experiments)


SERVER_ARGS = "server_args"  # the tree argument carrying an operator's server arguments (check --server-args)
# The tree arguments carrying an operator's server environment (check --server-env) and the registry's gates.
SERVER_ENV, SERVER_GATES = "server_env", "server_gates"


def records_of(tree_args: dict[str, str]) -> tuple[str, ...]:
    """The records the probe driver writes beside the results for these arguments."""
    found = (allprobes.CONFIG_FILE,) if SERVER_ARGS in tree_args else ()
    return found + ((allprobes.ENVIRONMENT_FILE,) if {SERVER_ENV, SERVER_GATES} & set(tree_args) else ())
CONTAINMENT = "containment.json"  # how the outcome's process ran, kept beside it


def _copy(source: Path, dest: Path, experiments: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in experiments:
        for suffix in (".json", allprobes.CANNOT_RUN_SUFFIX):
            if (source / f"{name}{suffix}").exists():
                shutil.copy2(source / f"{name}{suffix}", dest / f"{name}{suffix}")
    for record in (allprobes.CONFIG_FILE, allprobes.ENVIRONMENT_FILE):
        if (source / record).exists():
            shutil.copy2(source / record, dest / record)


def _keep(entry: Path, produced: Path, experiments: list[str], containment: dict | None, locks: Path) -> None:
    """Copy what the probe wrote into the cache entry, with how it ran, renamed into place whole."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=debris.prefix(entry.parent, entry.name), suffix=".tmp"))
    try:
        _copy(produced, staging, experiments)
        write_atomic(staging / CONTAINMENT, dumps(containment))
        os.chmod(staging, 0o755)
        with _held(entry, locks):
            _swap_in(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _held(directory: Path, locks: Path):
    """The lock of a directory that is read whole and replaced whole (a kept outcome, a tree's output), in
    ``locks``: nothing but the outcomes themselves where they are."""
    name = hashlib.sha256(os.fsencode(directory.resolve())).hexdigest()[:24]
    return exclusive(locks / f"outcome-{name}.lock", f"the outcome {directory}")


def _swap_in(staging: Path, dest: Path) -> None:
    """``dest`` becomes ``staging`` (the caller holds its ``_held``): the old one is moved aside, not deleted
    in place, so no reader ever sees half of either; what a killed swap left aside goes on the next one."""
    for left in dest.parent.glob(f".{dest.name}.*.old"):
        shutil.rmtree(left, ignore_errors=True)
    aside = dest.with_name(f".{dest.name}.{os.getpid()}.old")
    if dest.exists():
        os.rename(dest, aside)
    faults.point("outcome")
    os.rename(staging, dest)
    shutil.rmtree(aside, ignore_errors=True)


JOBS = 2  # children at once in an engine, and eras side by side


def _ready_closure(reg: Registry, era: Era | None) -> environments.CellEnvironment | None:
    """The era's closure environment where it is there already; None where probing would build it."""
    if environments.closure_environment_path(reg, environments.closure(reg, era)).is_dir():
        return environments.closure_environment(reg, era)
    return None


def _engine_settings(env: environments.CellEnvironment, era: Era | None, quiet: dict[str, str],
                     jobs: int) -> dict:
    """What an era's engine is started with besides its interpreter: a kept engine is found again by them."""
    return {"preload": engine.preload_file(env.path), "env": {**environments.stand_in_env(era), **quiet},
            "jobs": jobs}


def compile_ahead(reg: Registry, tree: Tree) -> None:
    """Compile ``tree`` for its era's closure environment, as probing it will (``_probe_era``), where that
    environment is there already: a tree made before its round (a bisection's). Where it is not, nothing: the
    round builds the environment and compiles the tree then."""
    era = environments.era_of(reg, tree)
    if (env := _ready_closure(reg, era)) is not None:
        importable_dir(tree, env.interpreter)


def start_kept_engine(reg: Registry, tree: Tree, engines: engine.Engines, jobs: int = JOBS) -> None:
    """Start the engine ``engines`` keeps for ``tree``'s era, the one the round probing ``tree`` uses, where its
    closure environment is there already: its closure's import runs while the round's trees are made. Where it
    is not, nothing: the round builds the environment and starts the engine."""
    era = environments.era_of(reg, tree)
    if (env := _ready_closure(reg, era)) is not None:
        settings = _engine_settings(env, era, {}, jobs)
        engines.session(env.interpreter, settings["preload"], settings["env"], settings["jobs"])


def probe_trees(reg: Registry, trees: list[Tree], experiments: list[str], tree_args: dict[str, dict[str, str]], *,
                out_dir: Path, jobs: int = JOBS, force: bool = False, log=print,
                engines: engine.Engines | None = None,
                only: dict[str, list[str]] | None = None) -> dict[str, dict[str, allprobes.Outcome]]:
    """Per tree label, per experiment, the outcome: from the cache, else from one engine per era for the misses
    (``engines``' kept one, for a caller probing round after round: the trees it sees then share it).
    ``only`` (per tree label) probes a tree for those of ``experiments`` alone (the sweep: those whose floor is
    at or below the release); its outcomes then name only them.

    A label names one content (``trees.tree_label``): a tree given twice, or two copies of one, is probed once.
    Up to ``jobs`` eras run side by side: an engine's start (its closure's import) uses one core, so the next
    era's runs beside it and beside the children of the one before, rather than after them."""
    by_era: dict[str, tuple[Era | None, list[Tree]]] = {}
    for tree in {tree.label(): tree for tree in trees}.values():
        era = environments.era_of(reg, tree)
        by_era.setdefault(era.name if era else "", (era, []))[1].append(tree)
    found = {}
    with children.workers(min(jobs, len(by_era)), "era") as pool:
        running = [pool.submit(_probe_era, reg, era, members, experiments, tree_args, out_dir=out_dir, jobs=jobs,
                               force=force, log=log, engines=engines, only=only) for era, members in by_era.values()]
        try:
            for era in running:
                found.update(era.result())
        except BaseException:
            for era in running:  # an era failed: those not started yet never start
                era.cancel()
            raise
    return found


def probed_on(experiments: list[str], only: dict[str, list[str]] | None, label: str) -> list[str]:
    """The experiments a tree is probed for: those of ``experiments`` its ``only`` entry names (none: all)."""
    if only is None or label not in only:
        return list(experiments)
    return [name for name in experiments if name in only[label]]


def _probe_era(reg: Registry, era: Era | None, trees: list[Tree], experiments: list[str],
               tree_args: dict[str, dict[str, str]], *, out_dir: Path, jobs: int, force: bool,
               log, engines: engine.Engines | None = None,
               only: dict[str, list[str]] | None = None) -> dict[str, dict[str, allprobes.Outcome]]:
    wanted = {tree.label(): probed_on(experiments, only, tree.label()) for tree in trees}
    for tree in trees:  # refused before the closure is built
        sandbox.admit(tree.pinned, f"the tree {tree.label()}")
    work = work_dir(reg.root)
    where = f"engine ({era.name})" if era else "engine"
    with phases.measure(phases.ENVIRONMENTS):
        env = environments.closure_environment(reg, era, log=lambda msg: log(f"{where}: {msg}"))
    closure = environments.closure(reg, era)
    stand_ins = environments.stand_in_env(era)
    identity = environments.find_python(reg.python).identity()
    keys = {tree.label(): outcome_key(reg, tree, closure, identity, env.torch.channel.value, stand_ins,
                                      tree_args[tree.label()])
            for tree in trees}
    found: dict[str, dict[str, allprobes.Outcome]] = {}
    todo = []
    out_dir.mkdir(parents=True, exist_ok=True)
    # This run's own copy of every tree's output, swapped into out_dir whole: runs at once never mix theirs.
    private = Path(tempfile.mkdtemp(dir=out_dir, prefix=debris.prefix(out_dir, "probing")))
    try:
        for tree in trees:
            label, entry = tree.label(), work / "outcomes" / keys[tree.label()]
            inuse.use(entry)
            kept = None if force else _reuse(entry, private / label, wanted[label], work / "locks",
                                             records_of(tree_args[label]))
            if kept is not None:
                found[label] = allprobes.collect([reg.experiment(name) for name in wanted[label]], private / label,
                                                 entry / "none.log", "left no outcome", kept["containment"])
            else:
                with phases.measure(phases.TREES):
                    unpacked = importable_dir(tree, env.interpreter)
                todo.append(engine.TreeTask(label, unpacked, tree_args[label], tree.pinned,
                                            shared=_from_the_index(tree)))
        if found:
            log(f"{where}: {len(found)} tree(s) unchanged, outcomes reused: {', '.join(found)} (use --force to reprobe)")
        # A work tree (--path) is the user's: its imports must leave no bytecode in it.
        quiet = {"PYTHONDONTWRITEBYTECODE": "1"} if any(t.kind == "path" for t in trees) else {}
        kept = bool(todo) and engines is not None and engines.sees([t.path for t in todo])
        groups = [todo] if kept else _groups(todo)  # a kept engine's trees trust each other (its caller's word)
        for group in groups:
            alone = (" in the engine kept across rounds" if kept else
                     " in an engine of its own" if len(groups) > 1 and not group[0].shared else "")
            log(f"{where}: probing {', '.join(_named(t.label, wanted[t.label], experiments) for t in group)} "
                f"({jobs} at a time){alone}")
            ran = engine.run(reg, env.interpreter, group, experiments, out_dir=private,
                             logs=None if kept else run_logs(work / "logs" / "engine"),
                             **_engine_settings(env, era, quiet, jobs), log=log, engines=engines if kept else None,
                             only={t.label: wanted[t.label] for t in group})
            faults.point("probe")
            for label, outcomes in ran.items():
                found[label] = outcomes
                short = any(o.out_of_memory for o in outcomes.values())  # a higher limit may run it: not kept
                if _complete(private / label, wanted[label], records_of(tree_args[label])) and not short:
                    _keep(work / "outcomes" / keys[label], private / label, wanted[label],
                          next(iter(outcomes.values())).containment, work / "locks")
        for label in found:
            with _held(out_dir / label, work / "locks"):
                _swap_in(private / label, out_dir / label)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return found


def _named(label: str, wanted: list[str], experiments: list[str]) -> str:
    """A tree as the log names it: with the experiments it is probed for where not every one."""
    return label if len(wanted) == len(experiments) else f"{label} ({', '.join(wanted)} only)"


def _reuse(entry: Path, dest: Path, experiments: list[str], locks: Path, records: tuple[str, ...]) -> dict | None:
    """Copy a complete kept outcome to ``dest`` and say how it ran (``{"containment": ...}``); None: there is none."""
    with _held(entry, locks):
        if not _complete(entry, experiments, records):
            return None
        _copy(entry, dest, experiments)
        return {"containment": _kept_containment(entry)}


def _from_the_index(tree: Tree) -> bool:
    """A release from the package index, or the project's own backport of one: such trees share an engine."""
    return tree.kind == "release" or tree.source == "backport"


def _groups(tasks: list[engine.TreeTask]) -> list[list[engine.TreeTask]]:
    """The trees from the index together, every other tree alone."""
    shared = [t for t in tasks if t.shared]
    return ([shared] if shared else []) + [[t] for t in tasks if not t.shared]


def _kept_containment(entry: Path) -> dict | None:
    """How a kept outcome's process ran; None for an entry kept before containment was recorded."""
    try:
        found = read_json(entry / CONTAINMENT, "containment record", todo="")
    except HarnessError:  # missing or unreadable: unknown
        return None
    return found if isinstance(found, dict) else None
