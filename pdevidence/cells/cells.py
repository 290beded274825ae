"""A cell: one experiment x one side x one tree source, run end to end.

registry -> tree -> environment -> probe run -> result + receipt. A cell
whose inputs are unchanged since its last run is not rerun.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import environments
from ..core import clock, sandbox, settings
from ..core.errors import STALE, HarnessError, usage
from ..core.files import dumps, move_atomic, sha256_file, write_atomic
from ..core.locking import exclusive
from ..core.paths import runs_dir, tree_lock_file, work_dir
from ..documents import provenance, receipts, results
from ..registry import REGISTRY_FILE, SIDES, Era, Registry, TorchChannel, check_side
from ..sources import trees
from .probe_run import partial_path, run_probe

# The session name of each tree kind: `probe(...)` is the pinned-commit cell.
SESSION_OF_KIND = {"git": "probe", "release": "release", "path": "path"}


@dataclass(frozen=True)
class Cell:
    experiment: str
    side: str
    kind: str
    ref: str | None = None  # overrides the registry's pin: a version, a SHA or a directory

    @property
    def name(self) -> str:
        return f"{SESSION_OF_KIND[self.kind]}({self.experiment}, {self.side})"


@dataclass
class CellOutcome:
    cell: Cell
    result: Path
    receipt: Path
    reused: bool


def matrix(registry: Registry, kind: str) -> list[Cell]:
    """Every cell of ``kind``: a pinned-commit cell only where the registry pins the experiment's commits."""
    return [Cell(name, side, kind) for name, exp in registry.experiments.items() for side in SIDES
            if kind != "git" or side in exp.git]


def parse_cell(registry: Registry, kind: str, experiment: str, side: str) -> Cell:
    if kind not in SESSION_OF_KIND:
        raise usage(f"unknown tree kind {kind!r}", expected=f"one of: {', '.join(SESSION_OF_KIND)}")
    registry.experiment(experiment)
    return Cell(experiment, check_side(side), kind)


def resolve_tree(registry: Registry, cell: Cell) -> trees.Tree:
    exp = registry.experiment(cell.experiment)
    lock = trees.LockFile(tree_lock_file(registry.root))
    if cell.kind == "git":
        return trees.git_tree(cell.ref or exp.pin("git", cell.side), lock, clone=settings.get("SGLANG_REPO"))
    if cell.kind == "release":
        return trees.release_tree(cell.ref or exp.pin("release", cell.side), registry.python, lock)
    directory = cell.ref or settings.get("SGLANG_TREE")
    if not directory:
        raise usage("a path cell needs a directory",
                    todo="set SGLANG_TREE=/path/to/sglang or pass the directory after `--`")
    return trees.path_tree(Path(directory))


def cell_era(registry: Registry, cell: Cell) -> Era | None:
    """The era a cell's tree runs in as far as it is known before the tree is fetched: a release's version
    decides (as ``environments.era_of`` decides for the tree); a commit's or a source tree's era is known
    once it is (the version it tells, else its pins): None until then."""
    if cell.kind != "release":
        return None
    return registry.era_of(cell.ref or registry.experiment(cell.experiment).pin("release", cell.side))


def cache_key(registry: Registry, made_by: provenance.Provenance, tree: trees.Tree, torch_channel: str) -> str:
    """Everything that can change a cell's result or its receipt; equal keys mean the stored run stands.

    Only what the inputs are counts, not how they were found: the interpreter by its own
    version and implementation (not its path), a tree by its SHA and digest (not SGLANG_REPO).
    What made the run (probe, kit, registry, constraints, harness) is the receipt's provenance:
    a change to any of them makes the stored receipt stale, so the cell reruns.
    """
    parts = {
        "tree": [tree.kind, tree.resolved, tree.digest],
        "made_by": made_by.to_json(),
        "python": environments.find_python(registry.python).identity(),
        "torch": TorchChannel(torch_channel).value,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stored_run(result: Path, key: str) -> bool:
    """A run that stands: its receipt loads (and vouches for the result), in the current schema, same key.

    A receipt in an older schema lacks fields the current one records, so its cell reruns.
    """
    try:
        stored = receipts.Receipt.load(results.receipt_path(result))
    except HarnessError:
        return False
    return (stored.schema_version == receipts.RECEIPT_SCHEMA_VERSION and stored.cache_key == key
            and stored.exit_status == 0)


def _same_registry(registry: Registry, made_by: provenance.Provenance) -> None:
    """The registry file as this run read it is the one its receipt will name: one edited since (a merge during
    a matrix) would label a result made by the old registry as current under the new one."""
    now = made_by.files.get(REGISTRY_FILE)
    if registry.digest and now and now != registry.digest:
        raise HarnessError(f"{REGISTRY_FILE} changed after this run read it (read {registry.digest[:12]}, now "
                           f"{now[:12]}): a result made now would name a registry it was not made with",
                           expected="a registry left as it is while cells run",
                           todo="run the command again: it reads the registry as it is now", code=STALE)


def cell_slug(registry: Registry, cell: Cell, tree: trees.Tree, closure: Path | None = None) -> str:
    """The name a cell's environment, lock and log share; the mutation and upstream lanes reuse them.
    A closure other than today's (the tree's era's, by default) is part of the name."""
    closure = closure or environments.closure(registry, environments.era_of(registry, tree))
    slug = f"{cell.experiment}.{cell.side}.{tree.label()}"
    if closure != registry.constraints:
        slug += f".{sha256_file(closure)[:8]}"
    return slug


def staging_dir(result: Path) -> Path:
    """Where a run writes its result and receipt (same names) until both are complete."""
    return result.with_name(f".{result.name.removesuffix('.json')}.partial")


def _clean_leftovers(result: Path) -> None:
    """What an interrupted or killed run of this cell may have left: never a result, always removed."""
    shutil.rmtree(staging_dir(result), ignore_errors=True)
    partial_path(result).unlink(missing_ok=True)


def run_cell(registry: Registry, cell: Cell, *, force: bool = False, out_dir: Path | None = None,
             constraints: Path | None = None, log=print) -> CellOutcome:
    """Run one cell; ``constraints`` replaces the registry's closure (the drift lane's newer pins).

    The stored result and receipt change only when a new run completes: the new pair is
    written under temporary names and then replaces the old one, so an interrupted or failed
    ``--force`` keeps the previous result. A result whose inputs changed is stale and removed
    before its cell reruns.
    """
    exp = registry.experiment(cell.experiment)
    if not exp.probe.exists():
        raise usage(f"the probe of {cell.experiment} is missing: {exp.probe}")
    environments.find_python(registry.python)  # no Python 3.12: say so before any download
    torch = environments.torch_choice(registry)
    # Picked before the tree is fetched: a CPU channel without its closure stops before any download.
    closure = environments.closure(registry, cell_era(registry, cell), torch=torch, override=constraints)
    tree = resolve_tree(registry, cell)
    if cell.kind != "release":  # what the receipt records is the closure the environment installs
        closure = environments.closure(registry, environments.era_of(registry, tree), torch=torch,
                                       override=constraints)
    made_by = provenance.record(registry.root, provenance.inputs(registry, [cell.experiment],
                                                                 provenance.CELL_DRIVERS, [closure]),
                                provenance.Shaped.RESULT)
    _same_registry(registry, made_by)
    key = cache_key(registry, made_by, tree, torch.channel)
    out = out_dir or runs_dir(registry.root)
    result = out / results.result_name(cell.experiment, cell.side, tree.label())
    receipt_file = results.receipt_path(result)
    work = work_dir(registry.root)
    slug = cell_slug(registry, cell, tree, closure)
    with exclusive(work / "locks" / f"{slug}.lock", f"cell {cell.name}"):
        _clean_leftovers(result)
        current = _stored_run(result, key)
        if not force and current:
            log(f"{cell.name}: inputs unchanged, reusing {result.name} (use --force to rerun)")
            return CellOutcome(cell, result, receipt_file, reused=True)
        if not current:  # stale: it describes other inputs and must not be compared as current
            result.unlink(missing_ok=True)
            receipt_file.unlink(missing_ok=True)
        sandbox.admit(tree.pinned, f"{cell.name} on {tree.label()}")  # before its environment is built
        started = clock.now()
        env = environments.cell_environment(registry, tree, slug, constraints, log=lambda msg: log(f"{cell.name}: {msg}"))
        log(f"{cell.name}: {'reusing' if env.reused else 'built'} environment {env.path}")
        args = ["--side", cell.side, "--tree-kind", tree.kind, "--tree-ref", tree.ref,
                "--tree-resolved", tree.resolved]
        log(f"{cell.name}: running {exp.probe.name} on {tree.label()} ...")
        staged_result = staging_dir(result) / result.name
        staged_receipt = results.receipt_path(staged_result)
        staged_result.parent.mkdir(parents=True)
        try:
            run = run_probe(env.interpreter, exp.probe, args, staged_result, work / "logs" / f"{slug}.log",
                            experiment=cell.experiment, side=cell.side, trusted=tree.pinned, env=env.probe_env)
            receipt = receipts.build(
                cell=cell.name, experiment=cell.experiment, side=cell.side, tree=tree, env=env,
                project=registry.root, constraints=closure, probe=exp.probe, result=staged_result,
                commands=[*env.commands, run.command], started=started, finished=clock.now(),
                exit_status=run.exit_status, cache_key=key, provenance=made_by, containment=run.containment,
            )
            write_atomic(staged_receipt, dumps(receipt))
            # Result first: a reader between the two renames sees a receipt that does not
            # match the result, which never counts as a stored run.
            move_atomic(staged_result, result)
            move_atomic(staged_receipt, receipt_file)
        finally:
            _clean_leftovers(result)
    log(f"{cell.name}: wrote {result}")
    return CellOutcome(cell, result, receipt_file, reused=False)


def report_failure(cell: Cell, exc: HarnessError) -> None:
    print(f"{cell.name}: FAILED\n{exc}", file=sys.stderr)
