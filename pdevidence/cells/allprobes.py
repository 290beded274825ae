"""Every experiment's probe on one tree in one process (probes/probe_all.py): one SGLang import.

What comes back per experiment is either a validated result document or the
reason it could not run; a crash of the whole process is an error naming its
output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import environments
from ..core import sandbox
from ..core.errors import HarnessError
from ..core.files import read_json, sha256_file
from ..core.locking import exclusive
from ..core.paths import work_dir
from ..documents import results
from ..registry import Experiment, Registry
from ..sources import trees
from .probe_run import MEMORY_ERROR, memory_error_scenario, raised_memory_error, run_killable, tail, timeout_seconds

DRIVER = "probe_all.py"
CANNOT_RUN_SUFFIX = ".cannot-run.json"  # what the driver writes for an experiment whose setup failed
CONFIG_FILE = "config.json"  # what the driver writes of the server arguments it was given (probe_all.CONFIG_FILE)
ENVIRONMENT_FILE = "environment.json"  # of the server environment and the gates (probe_all.ENVIRONMENT_FILE)


@dataclass
class Outcome:
    experiment: str
    doc: dict | None = None  # the result document, when the probe ran
    result_sha256: str | None = None
    error: str | None = None  # why it could not run
    containment: dict | None = None  # how the process ran (sandbox.Containment.record)
    out_of_memory: bool = False  # it could not run for want of memory: an answer of this run's limit, never kept


def driver(reg: Registry) -> Path:
    return reg.root / "probes" / DRIVER


PROBE_ENV = {"HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}


def clear(out_dir: Path, experiments: list[str]) -> None:
    """A stale file must never pass for this run's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in experiments:
        for suffix in (".json", CANNOT_RUN_SUFFIX):
            (out_dir / f"{name}{suffix}").unlink(missing_ok=True)
    for record in (CONFIG_FILE, ENVIRONMENT_FILE):
        (out_dir / record).unlink(missing_ok=True)


def _read_record(out_dir: Path, name: str, what: str, keys: tuple[str, ...]) -> dict | None:
    path = out_dir / name
    if not path.exists():
        return None
    found = read_json(path, what, todo=f"run the check again; it is rewritten: {path}")
    if not isinstance(found, dict) or not (set(keys) <= set(found)):
        raise HarnessError(f"{path} is not a valid {what} (keys {', '.join(keys)})", todo="run the check again with --force")
    return found


def read_config(out_dir: Path) -> dict | None:
    """What the driver read of the server arguments it was given (``probe_all.read_configuration``); None: it
    wrote nothing (it was given none, or did not get that far)."""
    return _read_record(out_dir, CONFIG_FILE, "configuration record", ("values", "error"))


def read_environment(out_dir: Path) -> dict | None:
    """What the driver read of the server environment and the gates it was given (``_serverenv``); None: it
    wrote nothing (it was given neither, or did not get that far)."""
    return _read_record(out_dir, ENVIRONMENT_FILE, "environment record", ("values", "undefined", "gates", "error"))


def tree_argv(tree_args: dict[str, str]) -> list[str]:
    return [f"--{key.replace('_', '-')}={value}" for key, value in tree_args.items()]


def run(reg: Registry, interpreter: Path | str, experiments: list[str], tree_args: dict[str, str], *,
        out_dir: Path, log: Path, trusted: bool = False, env: dict | None = None) -> dict[str, Outcome]:
    """Run the driver with ``interpreter``, contained (``trusted``: a pinned tree); results land in
    ``out_dir/<experiment>.json``."""
    exps = [reg.experiment(name) for name in experiments]
    clear(out_dir, experiments)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [str(interpreter), str(driver(reg)), *[str(e.probe) for e in exps], "--out-dir", str(out_dir),
               *tree_argv(tree_args)]
    run_env = {**os.environ, **PROBE_ENV, **(env or {})}
    view = sandbox.View(read=(driver(reg).parent, *{e.probe.parent for e in exps}), write=(out_dir,))
    ran = run_killable(command, log, timeout=timeout_seconds(), env=run_env, what=f"probe driver {DRIVER}",
                       view=view, trusted=trusted)
    status = ran.memory_killed or f"exited with status {ran.status}"
    return collect(exps, out_dir, log, status, ran.containment)


def run_in_environment(reg: Registry, tree: trees.Tree, slug: str, experiments: list[str],
                       tree_args: dict[str, str], *, out_dir: Path, log) -> dict[str, Outcome]:
    """``tree`` installed into the environment ``slug`` (built, or reused when complete), every probe run in it.

    The environment is locked for the whole run: another process building or probing it waits."""
    with exclusive(work_dir(reg.root) / "locks" / f"{slug}.lock", f"the environment {slug}"):
        env = environments.cell_environment(reg, tree, slug)
        log(f"{slug}: {'reusing' if env.reused else 'built'} environment {env.path}, "
            f"probing {', '.join(experiments)}")
        return run(reg, env.interpreter, experiments, tree_args, out_dir=out_dir,
                   log=work_dir(reg.root) / "logs" / f"{slug}.log", trusted=tree.pinned, env=env.probe_env)


def collect(exps: list[Experiment], out_dir: Path, log: Path, status: str,
            containment: dict | None) -> dict[str, Outcome]:
    """What the driver left per experiment: a result, the reason it could not run, or nothing (say why);
    each with how its process ran."""
    outcomes = {}
    for exp in exps:
        result, failed = out_dir / f"{exp.name}.json", out_dir / f"{exp.name}{CANNOT_RUN_SUFFIX}"
        if result.exists():
            doc = results.load(result, experiment=exp.name)
            short = memory_error_scenario(doc)
            if short:  # a scenario that ran out of memory observed nothing of the tree: none is judged
                outcomes[exp.name] = Outcome(exp.name, error=f"MemoryError in scenario {short}: the probe process "
                                             f"{sandbox.out_of_memory(containment, killed=False)}",
                                             containment=containment, out_of_memory=True)
            else:
                outcomes[exp.name] = Outcome(exp.name, doc, sha256_file(result), containment=containment)
        elif failed.exists():
            error = read_json(failed, "cannot-run record", todo=f"full log: {log}")["error"]
            said = f"{error['type']}: {error['message']}"
            if error["type"] == MEMORY_ERROR:
                said = f"{said.rstrip(': ')}: the probe process {sandbox.out_of_memory(containment, killed=False)}"
            outcomes[exp.name] = Outcome(exp.name, error=said, containment=containment,
                                         out_of_memory=error["type"] == MEMORY_ERROR)
        elif raised_memory_error(log):  # outside any scenario and prepare(): the driver's traceback ends so
            outcomes[exp.name] = Outcome(exp.name, error=f"MemoryError: the probe process "
                                         f"{sandbox.out_of_memory(containment, killed=False)} and wrote nothing for "
                                         f"{exp.name}; last output:\n{tail(log)}", containment=containment,
                                         out_of_memory=True)
        else:
            said = f"last output:\n{tail(log)}" if log.exists() else "it left no output"
            outcomes[exp.name] = Outcome(exp.name, error=f"the probe process {status} and wrote nothing for "
                                         f"{exp.name}; {said}", containment=containment)
    return outcomes
