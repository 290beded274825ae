"""A cell: one experiment x one side x one tree source, run end to end.

registry -> tree -> environment -> probe run -> result + receipt. A cell
whose inputs are unchanged since its last run is not rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from . import environments, receipts, results, trees
from .errors import HarnessError, usage
from .fetch import sha256_file
from .locking import exclusive
from .paths import runs_dir, tree_lock_file, work_dir
from .probe_run import run_probe
from .registry import SIDES, Registry, check_side

# The session name of each tree kind: `probe(...)` is the pinned-commit cell.
SESSION_OF_KIND = {"git": "probe", "release": "release", "path": "path"}
# Environment variables that change what a probe run can observe.
RELEVANT_ENV = ("PDEVIDENCE_TORCH", "PDEVIDENCE_PYTHON", "SGLANG_REPO")


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
    return [Cell(name, side, kind) for name in registry.experiments for side in SIDES]


def parse_cell(registry: Registry, kind: str, experiment: str, side: str) -> Cell:
    if kind not in SESSION_OF_KIND:
        raise usage(f"unknown tree kind {kind!r}", expected=f"one of: {', '.join(SESSION_OF_KIND)}")
    registry.experiment(experiment)
    return Cell(experiment, check_side(side), kind)


def resolve_tree(registry: Registry, cell: Cell) -> trees.Tree:
    exp = registry.experiment(cell.experiment)
    lock = trees.LockFile(tree_lock_file(registry.root))
    if cell.kind == "git":
        clone = os.environ.get("SGLANG_REPO")
        return trees.git_tree(cell.ref or exp.git[cell.side], lock, clone=Path(clone) if clone else None)
    if cell.kind == "release":
        return trees.release_tree(cell.ref or exp.release(cell.side), registry.python, lock)
    directory = cell.ref or os.environ.get("SGLANG_TREE")
    if not directory:
        raise usage("a path cell needs a directory",
                    todo="set SGLANG_TREE=/path/to/sglang or pass the directory after `--`")
    return trees.path_tree(Path(directory))


def cache_key(registry: Registry, probe: Path, tree: trees.Tree, torch_channel: str, constraints: Path) -> str:
    """Everything that can change a cell's result; equal keys mean the stored run stands."""
    kit = probe.parent / "_probekit.py"
    parts = {
        "tree": [tree.kind, tree.resolved, tree.digest],
        "constraints": sha256_file(constraints),
        "probe": sha256_file(probe),
        "probekit": sha256_file(kit) if kit.exists() else None,
        "python": registry.python,
        "torch": torch_channel,
        "env": {k: os.environ.get(k) for k in RELEVANT_ENV},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stored_run(result: Path, key: str) -> bool:
    receipt = results.receipt_path(result)
    try:
        stored = json.loads(receipt.read_text(encoding="utf-8"))
        return (stored.get("cache_key") == key and stored.get("exit_status") == 0
                and stored["result"]["sha256"] == sha256_file(result))
    except (OSError, ValueError, KeyError, TypeError):
        return False


_torch_choice: environments.TorchChoice | None = None


def torch_choice() -> environments.TorchChoice:
    """Decided once per process, so every cell of a matrix uses the same torch channel."""
    global _torch_choice
    if _torch_choice is None:
        _torch_choice = environments.choose_torch()
    return _torch_choice


def cell_slug(registry: Registry, cell: Cell, tree: trees.Tree, constraints: Path | None = None) -> str:
    """The name a cell's environment, lock and log share; the upstream sessions reuse them."""
    slug = f"{cell.experiment}.{cell.side}.{tree.label()}"
    if constraints is not None and constraints != registry.constraints:
        slug += f".{sha256_file(constraints)[:8]}"
    return slug


def cell_environment(registry: Registry, tree: trees.Tree, slug: str,
                     constraints: Path | None = None) -> environments.CellEnvironment:
    """The cell's uv environment under ``.cells/envs/<slug>``, built or reused."""
    return environments.ensure(work_dir(registry.root) / "envs" / slug, registry.python,
                               constraints or registry.constraints, tree, torch_choice())


def run_cell(registry: Registry, cell: Cell, *, force: bool = False, out_dir: Path | None = None,
             constraints: Path | None = None, log=print) -> CellOutcome:
    """Run one cell; ``constraints`` replaces the registry's closure (the drift lane's newer pins)."""
    exp = registry.experiment(cell.experiment)
    if not exp.probe.exists():
        raise usage(f"the probe of {cell.experiment} is missing: {exp.probe}")
    tree = resolve_tree(registry, cell)
    torch = torch_choice()
    constraints = constraints or registry.constraints
    key = cache_key(registry, exp.probe, tree, torch.channel, constraints)
    out = out_dir or runs_dir(registry.root)
    result = out / results.result_name(cell.experiment, cell.side, tree.label())
    work = work_dir(registry.root)
    slug = cell_slug(registry, cell, tree, constraints)
    with exclusive(work / "locks" / f"{slug}.lock", f"cell {cell.name}"):
        if not force and cell.kind != "path" and _stored_run(result, key):
            log(f"{cell.name}: inputs unchanged, reusing {result.name} (use --force to rerun)")
            return CellOutcome(cell, result, results.receipt_path(result), reused=True)
        # A stale result must not outlive a failed rerun and be compared as if it were current.
        result.unlink(missing_ok=True)
        results.receipt_path(result).unlink(missing_ok=True)
        started = receipts.now()
        env = cell_environment(registry, tree, slug, constraints)
        log(f"{cell.name}: {'reusing' if env.reused else 'built'} environment {env.path}")
        args = ["--side", cell.side, "--tree-kind", tree.kind, "--tree-ref", tree.ref,
                "--tree-resolved", tree.resolved]
        log(f"{cell.name}: running {exp.probe.name} on {tree.label()}")
        run = run_probe(env.interpreter, exp.probe, args, result, work / "logs" / f"{slug}.log",
                        experiment=cell.experiment, side=cell.side)
        receipt = receipts.build(
            cell=cell.name, experiment=cell.experiment, side=cell.side, tree=tree, env=env,
            project=registry.root, constraints=constraints, probe=exp.probe, result=result,
            commands=[*env.commands, run.command], started=started, finished=receipts.now(),
            exit_status=run.exit_status, cache_key=key,
        )
        results.write_atomic(results.receipt_path(result), results.dumps(receipt))
    log(f"{cell.name}: wrote {result}")
    return CellOutcome(cell, result, results.receipt_path(result), reused=False)


def report_failure(cell: Cell, exc: HarnessError) -> None:
    print(f"{cell.name}: FAILED\n{exc}", file=sys.stderr)
