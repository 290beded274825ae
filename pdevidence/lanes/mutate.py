"""The mutation lane: does each probe notice when its fix is broken?

``run`` takes the registry's head release of an experiment and runs
``probes/probe_mutants.py`` on it once, in one process: a child of the warm
engine (``cells/engine.py``: the closure imported once, the unpacked release first
on the child's path), or with ``cold`` a fresh process in the release cell's
environment. The driver runs the probe's scenarios unmutated (the baseline), then
under each declared mutant, one after the other. ``judge`` turns that document into
the mutation table (``runs/mutate.<exp>.json``, schema ``pdevidence-mutate/2``); the
document itself is kept (``runs/mutate/<exp>.probe.json``), and ``mutant_results``
gives each mutant's observations as the probe result ``check`` judges, so an
over-broad mutant can be shown not to read "fixed" through ``check``.

The kill rule, per mutant, over the scenarios the registry has expectations for,
and only on the keys it expects that the mutated run observed (tree facts such as
``door_verdict`` never count, nor a key a crash left unobserved):

- the baseline must show the registry's head expectation on every expected key,
  and the scenarios rerun unmutated after all mutants must equal it (else no kill
  can be judged and the run fails);
- ``removes-fix``: killed by a differential scenario (``changes = true``) when a
  key whose base and head expectations differ leaves its baseline value and
  either equals the base expectation or, both being integers, comes closer to it;
- ``over-broad``: killed by a control (``changes = false``) when any expected key
  leaves its baseline value;
- ``leaks`` (right where the fix changes things, wrong where base and head agree, e.g. a
  request never released): killed by any scenario when a key whose base and head
  expectations agree leaves its baseline value;
- an exception raised inside a scenario under the mutant (the baseline ran clean)
  kills in the scenarios that count for the mutant's kind, recorded as the key
  ``error:<Type>`` beside whatever keys the scenario observed moving before it
  (so a crash is never mistaken for an observation): the table marks a scenario
  that killed only by an error ``E``, one that observed the kill ``K``, and the
  score counts mutants killed by observation and those killed only by raising
  apart. A kill only by raising still counts as killed: a telling scenario that
  raises can never read as fixed (the sweep classifies that release "error",
  ``check`` answers "unknown"), so the probe still cannot pass the broken fix;
  but it is the weaker evidence, and the score line says how many there are.

The lane runs on the tree its mutants were written for, so a mutant that cannot be
applied there is an "error" of the lane and counts as not killed: one whose target
is missing (the driver says "not applicable", which on another tree, a backport or
an older release, it may well be) as much as one that cannot be built (an edit
whose text is not found). Exit 0 only when every declared mutant applied and was
killed; survivors and errors are named.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import environments, registry
from ..cells import allprobes, cells, engine, probe_run
from ..core import sandbox
from ..core.errors import BEHAVIOUR_DIFFERS, ENVIRONMENT, HarnessError, usage
from ..core.files import dumps, move_atomic, read_json, write_atomic
from ..core.locking import exclusive
from ..core.paths import run_logs, runs_dir, work_dir
from ..documents import provenance, results
from ..documents.tables import RAISED, MutantOutcome, MutationParameters, MutationTable
from ..documents.vocabulary import MutantStatus
from ..judge.compare import MISSING, same
from ..sources.importable import importable_dir

PROBE_SCHEMA = "pd-mutant-probe/1"
DRIVER = "probe_mutants.py"
ENGINE_DRIVER = "probe_mutants"  # the same driver, as the engine's child imports it


# ---------------------------------------------------------------- the kill rule


def _moved_toward(base: Any, baseline: Any, mutated: Any) -> bool:
    if same(mutated, baseline):
        return False
    if same(mutated, base):
        return True
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (base, baseline, mutated))
    return ints and abs(mutated - base) < abs(baseline - base)


def scenario_kills(kind: registry.MutantKind, expect: registry.Expectation, baseline: dict, mutated: dict) -> list[str]:
    """The keys by which one scenario kills one mutant (empty: it does not)."""
    leaks = kind is registry.MutantKind.LEAKS
    if not leaks and expect.changes != (kind is registry.MutantKind.REMOVES_FIX):
        return []
    before, after = baseline.get("observed", {}), mutated.get("observed", {})
    if leaks:  # in any scenario: a key base and head are expected to agree on
        keys = [k for k in expect.head if k in after and same(expect.base.get(k, MISSING), expect.head[k])
                and not same(after[k], before.get(k))]
    elif expect.changes:
        keys = [k for k in expect.head if k in after and k in expect.base and not same(expect.base[k], expect.head[k])
                and _moved_toward(expect.base[k], before.get(k), after[k])]
    else:
        keys = [k for k in expect.head if k in after and not same(after[k], before.get(k))]
    error = mutated.get("error")
    return sorted(keys) + ([f"{RAISED}{error.get('type', 'Exception')}"] if error else [])


def check_baseline(exp: registry.Experiment, baseline: dict) -> None:
    """The unmutated run must be the head the registry expects, or no kill means anything."""
    wrong = []
    for sid, expect in sorted(exp.expect.items()):
        sc = baseline.get(sid)
        if sc is None or sc.get("error"):
            wrong.append(f"{sid}: {'missing' if sc is None else sc['error']}")
            continue
        wrong += [f"{sid}.{k}: {sc['observed'].get(k)!r}, expected {v!r}"
                  for k, v in sorted(expect.head.items()) if not same(sc["observed"].get(k, MISSING), v)]
    if wrong:
        raise HarnessError(
            f"{exp.name}: the unmutated head run does not show the registry's head expectations:\n  "
            + "\n  ".join(wrong), code=BEHAVIOUR_DIFFERS,
            todo=f"run `nox -s \"release({exp.name}, head)\"` and compare; fix the probe or the expectations first")


def judge(exp: registry.Experiment, doc: dict, made_by: provenance.Provenance,
          mutants: list[str] | None = None) -> MutationTable:
    """The mutation table of one driver document, made by ``made_by``, over ``mutants`` (default: all)."""
    check_baseline(exp, doc["baseline"])
    if not same(doc.get("baseline_after", doc["baseline"]), doc["baseline"]):
        moved = sorted(sid for sid, sc in doc["baseline"].items() if not same(doc["baseline_after"].get(sid), sc))
        raise HarnessError(f"{exp.name}: the unmutated scenarios ran differently after the mutants ({', '.join(moved)}):"
                           " a mutant left state behind, so no kill can be trusted", code=ENVIRONMENT,
                           todo="run the mutants one at a time with the driver's --only to find which one")
    scenarios = sorted(exp.expect)
    outcomes = []
    chosen = list(exp.mutants) if mutants is None else mutants
    for mid in chosen:
        mutant, run = exp.mutants[mid], doc["mutants"].get(mid)
        if run is None:
            raise HarnessError(f"the mutant driver reported nothing for {mid}", todo="rerun; if it persists, "
                               f"the driver {DRIVER} is broken")
        common = dict(id=mid, title=mutant.title, kind=mutant.kind, target=mutant.target,
                      operator=mutant.operator)
        if run["status"] != "applied":
            error = run["error"]
            if run["status"] == "not applicable":  # a probe that lost its grip on the code: never dropped
                error = (f"not applicable on {_label(doc['tree'])}, the tree it was written for: {error}; "
                         "point the mutant at where the fix lives now")
            outcomes.append(MutantOutcome(**common, status=MutantStatus.ERROR, error=error))
            continue
        killed_by = {}
        for sid in scenarios:
            keys = scenario_kills(mutant.kind, exp.expect[sid], doc["baseline"][sid], run["scenarios"].get(sid, {}))
            if keys:
                killed_by[sid] = keys
        outcomes.append(MutantOutcome(**common, status=MutantStatus.KILLED if killed_by else MutantStatus.SURVIVED,
                                      killed_by=killed_by))
    return MutationTable(experiment=exp.name, tree=dict(doc["tree"]), scenarios=scenarios, mutants=outcomes,
                         provenance=made_by, parameters=MutationParameters(chosen))


def _label(tree: dict) -> str:
    return f"{tree.get('kind', 'tree')} {tree.get('resolved') or tree.get('ref', '?')}"


# ---------------------------------------------------------------- presentation


def _mark(outcome: MutantOutcome, sid: str) -> str:
    keys = outcome.killed_by.get(sid)
    if not keys:
        return "."
    return "E" if all(k.startswith(RAISED) for k in keys) else "K"


def table(result: MutationTable) -> str:
    """Mutant x scenario: K killed by observation, E killed by an error, . not; then survivors and the score,
    kills by observation and kills only by raising counted apart."""
    width = max(len(m.id) for m in result.mutants) if result.mutants else 6
    cols = [s.rjust(max(3, len(s))) for s in result.scenarios]
    lines = [f"{'mutant':<{width}}  {'kind':<11}  " + " ".join(cols) + "  status"]
    for m in result.mutants:
        marks = " ".join(_mark(m, s).rjust(len(c)) for s, c in zip(result.scenarios, cols))
        status = f"{m.status.value} (only by raising)" if m.only_raised else m.status.value
        lines.append(f"{m.id:<{width}}  {m.kind.value:<11}  {marks}  {status}")
    for m in result.mutants:
        raised = [f"{s} {k.removeprefix(RAISED)}" for s, keys in m.killed_by.items() for k in keys
                  if k.startswith(RAISED)]
        if raised:
            lines.append(f"raised under {m.id}: {', '.join(raised)}")
    for m in result.unkilled:
        why = f" ({m.error})" if m.error else ""
        lines.append(f"{m.status.value}: {m.id} [{m.kind.value}] {m.title}{why}")
    score = result.score
    lines.append(f"{result.experiment}: {score['killed']} of {score['applicable']} mutants killed "
                 f"({score['by_observation']} by observation, {score['only_raising']} only by raising)")
    return "\n".join(lines)


# ---------------------------------------------------------------- running it


def run(reg: registry.Registry, experiment: str, *, cold: bool = False, mutants: list[str] | None = None,
        log=print) -> MutationTable:
    """Every mutant of ``experiment`` (or those of ``mutants``) on its head release, in one probe process: a child
    of the warm engine, or with ``cold`` a fresh process in the release cell's environment."""
    exp = reg.experiment(experiment)
    if not exp.mutants:
        raise usage(f"experiment {experiment!r} declares no mutants",
                    todo=f"add [experiments.{experiment}.mutants.<id>] tables to {registry.REGISTRY_FILE}")
    chosen = _chosen(exp, mutants)
    cell = cells.Cell(experiment, "head", "release")
    tree = cells.resolve_tree(reg, cell)
    runs = runs_dir(reg.root)
    specs = runs / "mutate" / f"{experiment}.specs.json"
    out = runs / "mutate" / f"{experiment}.probe.json"
    partial = out.with_name(f".{out.name}.partial")
    made = made_by(reg, experiment, tree)  # before anything runs: what a change during the run must not pass for
    argv = ["--probe", str(exp.probe), "--mutants", str(specs), "--tree-kind", tree.kind, "--tree-ref", tree.ref,
            "--tree-resolved", tree.resolved, "--out", str(partial)]
    with exclusive(work_dir(reg.root) / "locks" / f"mutate.{experiment}.lock", f"mutate({experiment})"):
        write_atomic(specs, dumps([exp.mutants[mid].spec() for mid in chosen]))
        try:
            (_run_cold if cold else _run_warm)(reg, cell, tree, argv, out.parent, log=log)
            doc = _driver_document(partial, exp)
            move_atomic(partial, out)
        finally:
            partial.unlink(missing_ok=True)
    return judge(exp, doc, made, chosen)


def _chosen(exp: registry.Experiment, named: list[str] | None) -> list[str]:
    """The mutants to run, in the registry's order (all of them unless some are named)."""
    unknown = sorted(set(named or []) - set(exp.mutants))
    if unknown:
        raise usage(f"{exp.name} declares no mutant {', '.join(unknown)}",
                    todo=f"name one of: {', '.join(exp.mutants)}")
    return [mid for mid in exp.mutants if not named or mid in named]


def _run_warm(reg: registry.Registry, cell: cells.Cell, tree, argv: list[str], writes: Path, *, log) -> None:
    """The driver in a child of the warm engine of the tree's closure, the tree unpacked first on its path;
    it writes in ``writes`` only."""
    where = f"mutate({cell.experiment})"
    era = environments.era_of(reg, tree)
    env = environments.closure_environment(reg, era, log=lambda msg: log(f"{where}: {msg}"))
    work = work_dir(reg.root)
    # The child imports the tree once and forks each mutant from there, two at a time.
    task = engine.DriverTask(cell.experiment, importable_dir(tree, env.interpreter), [*argv, "--jobs", "2"],
                             driver=ENGINE_DRIVER, writes=(writes,))
    logs = run_logs(work / "logs" / f"mutate-engine.{cell.experiment}")
    log(f"{where}: the mutants on {tree.label()} in a warm engine child")
    failure = engine.run_tasks(reg, env.interpreter, [task], logs=logs, preload=engine.preload_file(env.path),
                               trusted=tree.pinned, jobs=1, env=environments.stand_in_env(era),
                               log=log).failures[task.id]
    if failure:
        logfile = logs / f"{task.id}.log"
        said = f"last output:\n{probe_run.tail(logfile)}" if logfile.exists() else "it left no output"
        raise HarnessError(f"mutant driver for {cell.experiment} {failure}; no table written.\n{said}",
                           code=ENVIRONMENT,
                           todo=f"full log: {logfile}; `mutate {cell.experiment} --cold` runs it in a fresh process")


def _run_cold(reg: registry.Registry, cell: cells.Cell, tree, argv: list[str], writes: Path, *, log) -> None:
    """The driver in a fresh process of the release cell's environment (SGLang installed there); it writes
    in ``writes`` only."""
    slug = cells.cell_slug(reg, cell, tree)
    with exclusive(work_dir(reg.root) / "locks" / f"{slug}.lock", f"cell {cell.name}"):
        env = environments.cell_environment(reg, tree, slug)
        log(f"mutate({cell.experiment}): the mutants on {tree.label()} in a fresh process")
        logfile = work_dir(reg.root) / "logs" / f"mutate.{cell.experiment}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        probes = reg.experiment(cell.experiment).probe.parent
        command = [str(env.interpreter), str(probes / DRIVER), *argv]
        run_env = {**os.environ, **allprobes.PROBE_ENV}
        ran = probe_run.run_killable(command, logfile, timeout=probe_run.timeout_seconds(), env=run_env,
                                     what=f"mutant driver for {cell.experiment}",
                                     view=sandbox.View(read=(probes,), write=(writes,)), trusted=tree.pinned)
        if ran.status != 0:
            how = ran.memory_killed or f"exited with status {ran.status}"
            raise HarnessError(f"mutant driver for {cell.experiment} {how}; no table written.\n"
                               f"last output:\n{probe_run.tail(logfile)}", code=ENVIRONMENT,
                               todo=f"full log: {logfile}")


def made_by(reg: registry.Registry, experiment: str, tree) -> provenance.Provenance:
    """What makes a mutation table: the probe, the kit, the driver and its mutant kit, the registry, the
    closure ``tree`` runs in, the harness."""
    closure = environments.closure(reg, environments.era_of(reg, tree))
    return provenance.record(reg.root, provenance.inputs(reg, [experiment], provenance.MUTATION_DRIVERS, [closure]),
                             provenance.Shaped.TABLE)


def _driver_document(path: Path, exp: registry.Experiment) -> dict:
    try:
        doc = read_json(path, "mutant driver document", todo="")
    except HarnessError as exc:
        raise HarnessError(f"the mutant driver exited 0 but wrote no readable document: {exc.what}") from None
    ok = (isinstance(doc, dict) and doc.get("schema") == PROBE_SCHEMA and doc.get("experiment") == exp.name
          and isinstance(doc.get("baseline"), dict) and isinstance(doc.get("mutants"), dict)
          and isinstance(doc.get("tree"), dict))
    if not ok:
        raise HarnessError(f"{path} is not a {PROBE_SCHEMA} document for {exp.name}",
                           todo=f"the driver {DRIVER} and the harness disagree; rerun from one checkout")
    return doc


def as_result(exp: registry.Experiment, doc: dict, scenarios: dict, side: str, *,
              source: str = "the mutant driver document") -> dict:
    """Scenarios the driver ran (the baseline's, or a mutant's) as the probe result a build behaving so gives:
    the driver's tree and adaptations beside them."""
    found = {"schema": results.RESULT_SCHEMA.name, "experiment": exp.name, "side": side, "tree": doc["tree"],
             "scenarios": scenarios}
    if doc.get("adaptations"):  # rules that hold on an adaptation judge it as they judge the tree
        found["adaptations"] = doc["adaptations"]
    return results.validate(found, source=f"{source}, {side}", experiment=exp.name)


def mutant_results(exp: registry.Experiment, doc: dict, *, source: str = "the mutant driver document") -> dict[str, dict]:
    """Each applied mutant's run as the probe result a build carrying it gives (``check`` judges these)."""
    return {mid: as_result(exp, doc, run["scenarios"], f"mutant-{mid}", source=source)
            for mid, run in doc["mutants"].items() if run["status"] == "applied"}


def write(result: MutationTable, root: Path) -> Path:
    path = runs_dir(root) / f"mutate.{result.experiment}.json"
    write_atomic(path, dumps(result.to_json()))
    return path
