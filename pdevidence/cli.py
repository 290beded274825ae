"""Command line: ``python -m pdevidence <command>``; the noxfile calls the same functions.

Every failure becomes one line of what happened, what was expected, what to
do, and the exit code documented in docs/operators/exit-codes.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from . import __version__, environments, registry
from .cells import cells
from .core import arguments, children, clock, debris, paths, phases, sandbox, settings
from .core.errors import CONFIRMED, EXIT_CODES, USAGE, HarnessError, boundary, usage, worst
from .core.files import dumps, sha256_file, write_atomic
from .core.locking import exclusive
from .core.paths import PROJECT, results_dir, runs_dir, tree_lock_file, work_dir
from .documents import corpus_table, integrity, reports
from .documents.tables import SweepParameters
from .judge import classify, compare
from .lanes import cache as cache_lane
from .lanes import check, corpus, drift, mutate, sweep, sweep_parts, upstream
from .publish import openvex, publish
from .report import report
from .sources import backports, trees


def run_cells(reg: registry.Registry, todo: list[cells.Cell], *, jobs: int = 1, force: bool = False) -> int:
    """Run cells, ``jobs`` at a time; every cell runs even when another fails."""
    environments.torch_choice(reg)  # a bad PDEVIDENCE_TORCH is one usage error, not one per cell

    def one(cell: cells.Cell) -> int:
        def run() -> int:
            cells.run_cell(reg, cell, force=force, log=lambda msg: print(msg, flush=True))
            return CONFIRMED
        # In a worker thread too: an unexpected exception fails this cell as a bug, never vanishes.
        return boundary(run, where=f"cell {cell.name}", report=lambda exc: cells.report_failure(cell, exc))

    with children.workers(jobs, "cell") as pool:
        try:
            codes = list(pool.map(one, todo))
        except children.Interrupted:
            pool.shutdown(cancel_futures=True)  # cells not started yet never start
            raise
    return worst(codes)


def cmd_cell(args) -> int:
    reg = registry.load(args.root)
    cell = cells.parse_cell(reg, args.kind, args.experiment, args.side)
    if args.ref:
        cell = cells.Cell(cell.experiment, cell.side, cell.kind, args.ref)
    return run_cells(reg, [cell], force=args.force)


def cmd_matrix(args) -> int:
    """Every cell, then the comparison even when a cell failed: the report names what is missing."""
    reg = registry.load(args.root)
    ran = run_cells(reg, cells.matrix(reg, args.kind), jobs=args.jobs, force=args.force)
    try:
        compared = cmd_compare(args)
    except HarnessError as exc:
        exc.code = worst([ran, exc.code])
        raise
    return worst([ran, compared])


def cmd_compare(args) -> int:
    reg = registry.load(args.root)
    kinds = [args.kind] if args.kind != "all" else list(compare.COMPARED_KINDS)
    summary = compare.compare_all(reg, runs=runs_dir(reg.root), published=results_dir(reg.root), kinds=kinds)
    summary.upstream = upstream.summarize(runs_dir(reg.root), reg, tuple(kinds))
    # Only `publish` writes results/: a comparison's report is fresh output, like the results it reads.
    written = report.write_summary(reg, summary, runs_dir(reg.root), runs=runs_dir(reg.root),
                                   published=results_dir(reg.root), command=f"python -m pdevidence {args.command} --kind {args.kind}")
    for rel, why in sorted(summary.published_failures.items()):
        print(f"published artifact failed verification: {rel}: {why}")
    print(f"wrote {', '.join(str(p) for p in written)}")
    return summary.exit_code


def cmd_cache(args) -> int:
    return cache_lane.command(registry.load(args.root), cache_lane.Verb(args.verb),
                              as_json=getattr(args, "json", False), older_than=getattr(args, "older_than", None),
                              max_size=getattr(args, "max_size", None))


def cmd_verify(args) -> int:
    integrity.verify(args.root)
    published_report = results_dir(args.root) / "report.json"
    if published_report.exists():
        reports.load_report(published_report)
    print("SHA256SUMS.txt: every listed file matches, every covered file is listed, "
          "every published receipt is valid for the result beside it, and the published report is valid")
    return CONFIRMED


def cmd_checksums(args) -> int:
    path = integrity.regenerate(args.root)
    print(f"wrote {path}")
    return CONFIRMED


def cmd_lock_cpu(args) -> int:
    """The CPU channel's hashed closure, compiled where the PyTorch CPU index is reachable."""
    reg = registry.load(args.root)
    if reg.constraints_input is None:
        raise usage("the registry names no constraints_input to compile")
    dest = reg.constraints_cpu or reg.root / "constraints" / f"cells-py{reg.python.replace('.', '')}-cpu.txt"
    environments.compile_cpu_closure(reg.constraints_input, dest, reg.python)
    print(f"wrote {dest}; commit it and set constraints_cpu = \"{dest.relative_to(reg.root)}\" in experiments.toml")
    return CONFIRMED


def cmd_lock_trees(args) -> int:
    """Pin every wheel file of releases in the tracked tree lock, with the index's SHA-256s.

    Default: the releases pinned already and the registry's release brackets (a new published
    release, e.g. from the sweep, is named explicitly). The only writer of that file.
    """
    reg = registry.load(args.root)
    lock = trees.LockFile(tree_lock_file(reg.root))
    versions = args.versions or sorted(
        {key.split("==", 1)[1] for key in lock.pinned_keys("sglang")}
        | {v for exp in reg.experiments.values() for v in exp.releases.values() if v}, key=trees.parse_version)
    for version in versions:
        trees.parse_version(version)
    files = trees.index_files("sglang")
    lock.pin_releases({f"sglang=={v}": trees.pinned_release_files(files, "sglang", v) for v in versions})
    print(f"pinned every wheel of sglang {', '.join(versions)} in {lock.path}; commit it")
    return CONFIRMED


def cmd_publish(args) -> int:
    reg = registry.load(args.root)
    done = publish.publish(reg, runs_dir(reg.root), args.kind, allow_unconfirmed=args.allow_unconfirmed)
    for path in done.files:
        print(f"published {path.relative_to(reg.root)}")
    print(f"wrote {done.sums}")
    return CONFIRMED


def cmd_sweep(args) -> int:
    reg = registry.load(args.root)
    names = args.experiment or list(reg.experiments)
    versions = args.versions or None
    fresh = args.references == "fresh"
    out = runs_dir(reg.root)
    if args.era:  # one job of the CI fan-out: this era's releases, written as a part
        versions = sweep_parts.in_era(reg, args.era, versions or sweep.default_releases(reg, pre=args.pre))
        out = sweep_parts.part_dir(out, args.era)
        if not versions:
            print(f"sweep: no release of era {args.era} to probe")
            return CONFIRMED
    made = sweep.made_by(reg, names)  # before anything runs: what a change during the run must not pass for
    found, as_of, refs = sweep.sweep(reg, names, published=runs_dir(reg.root) if fresh else results_dir(reg.root),
                                     out_dir=runs_dir(reg.root) / "sweep", versions=versions, pre=args.pre,
                                     jobs=args.jobs, cold=args.cold, force=args.force, fresh_references=fresh)
    parameters = {name: SweepParameters(explicit=bool(args.versions), pre=args.pre, floor=reg.release_floor,
                                        references=refs[name].digests) for name in found}
    if args.era:
        for name, outcomes in found.items():
            write_atomic(out / f"sweep-{name}.json", dumps(sweep.document(name, outcomes, as_of, made,
                                                                          parameters[name])))
        print(f"wrote the {args.era} part under {out}; `sweep-merge` joins the parts")
        return CONFIRMED
    return _sweep_tables(reg, found, as_of, made, parameters, out)


def cmd_sweep_merge(args) -> int:
    reg = registry.load(args.root)
    names = args.experiment or list(reg.experiments)
    merged = sweep_parts.merge(reg, runs_dir(reg.root) / sweep_parts.PARTS, names)
    return _sweep_tables(reg, {name: m.outcomes for name, m in merged.items()},
                         max((m.as_of for m in merged.values() if m.as_of), default=None),
                         sweep.made_by(reg, names), {name: m.parameters for name, m in merged.items()},
                         runs_dir(reg.root))


def _sweep_tables(reg: registry.Registry, found: dict, as_of: str | None, made, parameters: dict,
                  out: Path) -> int:
    """Write and print each experiment's table; the exit code is the release watch's."""
    for name, outcomes in found.items():
        path = out / f"sweep-{name}.json"
        write_atomic(path, dumps(sweep.document(name, outcomes, as_of, made, parameters[name])))
        print(sweep.table(name, outcomes, reg.experiment(name).releases))
        print(f"wrote {path}")
    return worst(classify.watch_exit(outcomes) for outcomes in found.values())


def cmd_check(args) -> int:
    """Is my SGLang affected? Exit 0 all fixed, 1 any affected/partial/deviates/unknown, 3 any cannot run.
    Several targets share one warm engine; the exit code is the worst of theirs."""
    reg = registry.load(args.root)
    asked = [(kind, value) for kind in ("python", "version", "wheel", "path", "git", "image")
             for value in getattr(args, kind) or []]
    if not asked:
        raise usage("check needs a target",
                    expected="one or more of --python, --version, --wheel, --path, --git, --image")
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    started = time.monotonic()
    with phases.recording() as spent:
        with phases.measure(phases.TREES):
            targets = [target for kind, value in asked for target in _resolved(reg, kind, value, log)]
        with _taking_turns(reg, targets):
            found = check.run_all(reg, targets, fresh_references=args.references == "fresh", force=args.force,
                                  log=log, server_args=args.server_args)
    log(f"time: {phases.describe(spent, time.monotonic() - started)}")
    if args.openvex:
        stamp = clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        write_atomic(args.openvex, dumps(openvex.document(reg, found, stamp)))
        log(f"wrote {args.openvex}")
    if args.json:  # one target: its document, as before; several: a list of them
        print(dumps(found[0].to_json() if len(found) == 1 else [r.to_json() for r in found]), end="")
    else:
        print("\n".join(check.table(result, verbose=args.verbose) for result in found))
    return worst(result.exit_code for result in found)


@contextlib.contextmanager
def _taking_turns(reg: registry.Registry, targets: list[tuple]):
    """An interpreter's probe output is written in place (``runs/check/<its label>``), unlike a tree's: runs at
    once that check one interpreter take turns, so that each reads its own. Locked in label order: two runs
    naming two interpreters in either order never wait for each other."""
    with contextlib.ExitStack() as held:
        interpreters = {target.label(): target.ref for target, tree in targets if tree is None}
        for label in sorted(interpreters):
            held.enter_context(exclusive(work_dir(reg.root) / "locks" / f"check-{label}.lock",
                                         f"the output of checking {interpreters[label]}"))
        yield


def _resolved(reg: registry.Registry, kind: str, value, log) -> list[tuple]:
    """The check targets an option names (an image: each SGLang package in it); a usage error names the option and
    the value it is about (what the value names is only known once looked at: a wheel for another Python, a
    directory with no sglang/, a release PyPI does not have, an image with no SGLang)."""
    try:
        if kind == "image":
            return check.resolve_image(reg, value, log=log)
        return [check.resolve(reg, **{kind: value})]
    except HarnessError as exc:
        if exc.code == USAGE:
            exc.what = f"--{kind} {str(value)!r}: {exc.what}"
        raise


def cmd_corpus(args) -> int:
    """Each declared backport's pristine, backport and partial trees through check's judge; exit 0 only when
    every answer is the expected one."""
    reg = registry.load(args.root)
    found = corpus.run(reg, args.release, fresh_references=args.references == "fresh",
                       log=lambda msg: print(msg, flush=True))
    out = runs_dir(reg.root) / corpus_table.FILE
    write_atomic(out, dumps(found.table.to_json()))
    print(corpus.table(found))
    print(f"wrote {out}")
    return found.exit_code


def cmd_drift(args) -> int:
    reg = registry.load(args.root)
    registry.check_side(args.side)
    pins = {"torch": args.torch, "torchvision": args.torchvision}
    if args.transformers:
        pins["transformers"] = args.transformers
    found = drift.run(reg, args.experiment, args.side, pins, published=results_dir(reg.root),
                      work=work_dir(reg.root), log=print)
    out = runs_dir(reg.root) / "drift" / f"{args.experiment}.{args.side}.drift.json"
    write_atomic(out, dumps(drift.document(found)))
    print(drift.summary(found))
    print(f"wrote {out}")
    return CONFIRMED  # advisory: a change is reported, never a failure


def cmd_upstream(args) -> int:
    """Failing upstream tests are the data, not an error: a written result exits 0."""
    reg = registry.load(args.root)
    cell = cells.parse_cell(reg, args.kind or settings.get("PDEVIDENCE_UPSTREAM_KIND"), args.experiment, args.side)
    if args.ref:
        cell = cells.Cell(cell.experiment, cell.side, cell.kind, args.ref)
    upstream.run_upstream(reg, cell, tests_dir=args.tests, log=lambda msg: print(msg, flush=True))
    return CONFIRMED


def cmd_mutate(args) -> int:
    """Every mutant of an experiment on its head release; exit 0 only when each applicable one is killed."""
    reg = registry.load(args.root)
    result = mutate.run(reg, args.experiment, cold=args.cold, mutants=args.mutant,
                        log=lambda msg: print(msg, flush=True))
    print(f"wrote {mutate.write(result, reg.root)}")
    print(mutate.table(result))  # its last line is the score: "<experiment>: K of N mutants killed"
    return result.exit_code


def _allow_uncontained(command: argparse.ArgumentParser) -> None:
    command.add_argument("--allow-uncontained", action="store_true",
                         help="where nothing can contain a probe process (no bubblewrap, no user namespaces), run "
                         "trees that are not pinned releases anyway: their code runs with your privileges")


class _Parser(argparse.ArgumentParser):
    """argparse, except that ``--opt=--`` gives ``--opt`` the value ``--`` (3.11 drops it, leaving an empty list
    no option expects) for its type to refuse; the subcommands' parsers are of this class too."""

    def _get_values(self, action, arg_strings):
        if action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pdevidence", description=__doc__,
                                epilog="exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
    p.add_argument("--root", type=arguments.project, default=PROJECT,
                   help="project directory (default: this checkout, or the installed copy's own files)")
    p.add_argument("--version", action=_Version, help="print the tool's version and the evidence it carries, then exit")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("cell", help="run one cell")
    c.add_argument("kind", choices=list(cells.SESSION_OF_KIND))
    c.add_argument("experiment", type=arguments.name)
    c.add_argument("side", choices=registry.SIDES)
    c.add_argument("--ref", type=arguments.ref, help="override the registry: a version, a commit SHA or a directory")
    c.add_argument("--force", action="store_true", help="rerun even if the inputs are unchanged")
    _allow_uncontained(c)
    c.set_defaults(func=cmd_cell)

    m = sub.add_parser("matrix", help="run every cell of one tree kind, then compare")
    m.add_argument("--kind", default="release", choices=["release", "git"])
    m.add_argument("--jobs", type=arguments.positive_int, default=2, help="cells run at once (default 2)")
    m.add_argument("--force", action="store_true")
    _allow_uncontained(m)
    m.set_defaults(func=cmd_matrix)

    cmp_ = sub.add_parser("compare", help="compare existing cell results; runs no probe")
    cmp_.add_argument("--kind", default="release", choices=["release", "git", "all"])
    cmp_.set_defaults(func=cmd_compare)

    sub.add_parser("verify", help="check SHA256SUMS.txt").set_defaults(func=cmd_verify)
    sub.add_parser("checksums", help="regenerate SHA256SUMS.txt").set_defaults(func=cmd_checksums)
    sub.add_parser("lock-cpu", help="compile the CPU torch channel's hashed closure (needs the PyTorch CPU index)"
                   ).set_defaults(func=cmd_lock_cpu)

    lt = sub.add_parser("lock-trees", help="pin every wheel file of SGLang releases in constraints/trees.lock.json "
                        "(default: those pinned already and the registry's brackets)")
    lt.add_argument("versions", nargs="*", type=arguments.version)
    lt.set_defaults(func=cmd_lock_trees)

    sw = sub.add_parser("sweep", help="probe every release (all experiments, one import each) and classify each")
    sw.add_argument("versions", nargs="*", type=arguments.swept_version,
                    help="releases to probe (default: the registry floor up to the newest)")
    sw.add_argument("--experiment", action="append", type=arguments.name,
                    help="only this experiment (repeatable; default: all)")
    sw.add_argument("--pre", action="store_true", help="also pre- and dev releases (post-releases are always in)")
    sw.add_argument("--jobs", type=arguments.positive_int, default=2)
    sw.add_argument("--cold", action="store_true",
                    help="one environment and one fresh probe process per release instead of the warm engine")
    sw.add_argument("--force", action="store_true", help="reprobe releases whose outcome is cached")
    sw.add_argument("--references", choices=classify.REFERENCES, default="published",
                    help="judge against the published base and head results (default), or the fresh ones in "
                    "runs/ from `nox -s matrix` (republishing, when the published ones are stale)")
    sw.add_argument("--era", type=arguments.era, help="only the releases of this era ('current': of none), written as a part under "
                    "runs/sweep-parts/<era>/ for `sweep-merge` (the CI fan-out)")
    _allow_uncontained(sw)
    sw.set_defaults(func=cmd_sweep)

    sm = sub.add_parser("sweep-merge", help="join the era parts under runs/sweep-parts/ into the sweep tables")
    sm.add_argument("--experiment", action="append", type=arguments.name,
                    help="only this experiment (repeatable; default: all)")
    sm.set_defaults(func=cmd_sweep_merge)

    ck = sub.add_parser("check", help="is my SGLang affected? run every probe on one build and judge each fix")
    # Each option may repeat; every target named is checked, every tree in one engine per era, nothing built.
    ck.add_argument("--python", type=arguments.interpreter, action="append",
                    help="an existing environment's interpreter (left untouched)")
    ck.add_argument("--version", type=arguments.version, action="append", help="an SGLang release from PyPI")
    ck.add_argument("--wheel", type=arguments.wheel, action="append",
                    help="an SGLang wheel file (a backport, a fork's build)")
    ck.add_argument("--path", type=arguments.directory, action="append",
                    help="an SGLang source tree or fork, used unbuilt (checkout root or its python/)")
    ck.add_argument("--git", metavar="SHA", type=arguments.commit, action="append",
                    help="a commit: GitHub's archive, or SGLANG_REPO=<clone>")
    ck.add_argument("--image", type=arguments.image, action="append", metavar="PATH",
                    help="a saved container image (`docker save` tarball, OCI layout directory or tar): every SGLang "
                    "package in it, read without a container runtime")
    ck.add_argument("--json", action="store_true", help=f"print the {check.SCHEMA} document instead of the table")
    ck.add_argument("-v", "--verbose", action="store_true",
                    help="below each answer, every key of every scenario that kept it from fixed, beside base's and "
                    "head's (--json always has them)")
    ck.add_argument("--openvex", type=arguments.output_file, metavar="FILE", help="also write an OpenVEX v0.2.0 document")
    ck.add_argument("--references", choices=classify.REFERENCES, default="published",
                    help="judge against the published base and head results (default), or the fresh ones in "
                    "runs/ (republishing)")
    ck.add_argument("--force", action="store_true", help="probe every tree again, ignoring the outcomes kept for it")
    given = ck.add_mutually_exclusive_group()
    given.add_argument("--server-args", type=arguments.server_args, metavar='"ARGS"',
                       help="the server's arguments (\"--disaggregation-mode decode ...\"): each fix whose code path "
                       "that configuration never enters is not affected (read with each tree's own parser)")
    given.add_argument("--server-args-file", dest="server_args", type=arguments.server_args_file, metavar="FILE",
                       help="a file holding the server's launch command (python -m sglang.launch_server ...)")
    _allow_uncontained(ck)
    ck.set_defaults(func=cmd_check)

    co = sub.add_parser("corpus", help="check every declared backport (backports/): each release as published, "
                        "with each fix ported, and with each port partial")
    co.add_argument("--release", action="append", type=arguments.version,
                    help="only this release's backport (repeatable)")
    co.add_argument("--references", choices=classify.REFERENCES, default="published",
                    help="judge against the published base and head results (default), or the fresh ones in runs/")
    _allow_uncontained(co)
    co.set_defaults(func=cmd_corpus)

    dr = sub.add_parser("drift", help="rerun a release cell on newer torch/transformers; advisory")
    dr.add_argument("experiment", type=arguments.name)
    dr.add_argument("side", choices=registry.SIDES)
    dr.add_argument("--torch", type=arguments.version_or_latest, default=drift.LATEST,
                    help="torch version (default: the newest on PyPI)")
    dr.add_argument("--torchvision", type=arguments.version_or_latest, default=drift.LATEST)
    dr.add_argument("--transformers", type=arguments.version_or_latest,
                    help="also move transformers (a version, or 'latest')")
    _allow_uncontained(dr)
    dr.set_defaults(func=cmd_drift)

    pub = sub.add_parser("publish", help="the only writer of results/: copy fresh, confirmed results of a kind "
                         "(and sweep/mutation tables) there, write the report, update SHA256SUMS.txt")
    pub.add_argument("--kind", default="release", choices=["release", "git"])
    pub.add_argument("--allow-unconfirmed", action="store_true",
                     help="publish even if the fresh differential is not confirmed (the report says so)")
    pub.set_defaults(func=cmd_publish)

    mu = sub.add_parser("mutate", help="run the probe under each declared mutant of the fix; name survivors")
    mu.add_argument("experiment", type=arguments.name)
    mu.add_argument("--mutant", action="append", metavar="ID", type=arguments.mutant,
                    help="only this mutant (repeatable; a table of some mutants is not publishable)")
    mu.add_argument("--cold", action="store_true",
                    help="a fresh probe process in the release cell's environment instead of a warm engine child")
    _allow_uncontained(mu)
    mu.set_defaults(func=cmd_mutate)

    up = sub.add_parser("upstream", help="run the PR's own test files (from the head tree) on one side's tree")
    up.add_argument("experiment", type=arguments.name)
    up.add_argument("side", choices=registry.SIDES)
    up.add_argument("--kind", choices=list(cells.SESSION_OF_KIND), default=None,
                    help="whose tree and environment: git, release or path (default: $PDEVIDENCE_UPSTREAM_KIND, else git)")
    up.add_argument("--tests", type=arguments.directory, metavar="DIR",
                    help=f"an SGLang checkout (or a directory) holding the test files; default ${upstream.TESTS_ENV}, "
                    "else the head commit's tree (SGLANG_REPO or GitHub)")
    up.add_argument("--ref", type=arguments.ref, help="override the side's tree: a version, a commit SHA or a directory")
    _allow_uncontained(up)
    up.set_defaults(func=cmd_upstream)

    ca = sub.add_parser("cache", help="what pdevidence's caches hold and what each part is for; get the space back")
    verbs = ca.add_subparsers(dest="verb", required=True)
    verbs.add_parser("info", help="where each part lives, its size and last use").add_argument(
        "--json", action="store_true", help="as JSON")
    pr = verbs.add_parser("prune", help="remove what nothing the registry can use, and what is old or over a budget")
    pr.add_argument("--older-than", type=arguments.duration, metavar="DURATION", help="not used for this long: 30d, 12h")
    pr.add_argument("--max-size", type=arguments.size, metavar="SIZE", help="least recently used first until this fits: 20G")
    verbs.add_parser("clean", help="remove every entry (what a running run uses stays)")
    ca.set_defaults(func=cmd_cache)
    return p


def evidence_digest(root: Path) -> str | None:
    """The digest of the published set a project carries: the SHA-256 of its SHA256SUMS.txt, which lists every
    published file, probe, registry and closure by its own SHA-256."""
    sums = root / integrity.SUMS_FILE
    return sha256_file(sums) if sums.is_file() else None


def version_text(root: Path) -> str:
    digest = evidence_digest(root)
    where = "installed copy" if paths.bundled(root) else "checkout"
    if digest is None:
        return f"pdevidence {__version__}\nevidence: none ({integrity.SUMS_FILE} is missing from {root})"
    return (f"pdevidence {__version__}\nevidence: sha256:{digest} (the {integrity.SUMS_FILE} of the {where} at "
            f"{root}; `pdevidence verify` checks every file it lists)")


class _Version(argparse.Action):
    """``--version``: the tool's and its evidence's, for whichever --root comes before it."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(getattr(namespace, "root", None) or PROJECT))
        parser.exit()


# Commands that write the project's own files (published evidence, sums, locks): never an installed copy's.
WRITES_PROJECT = ("publish", "checksums", "lock-cpu", "lock-trees")
# Options (or positionals) whose value the registry must know, by the attribute argparse stores them in.
EXPERIMENT_OPTIONS = {"cell": "experiment", "drift": "experiment", "mutate": "experiment", "upstream": "experiment",
                      "sweep": "--experiment", "sweep-merge": "--experiment"}


def _unknown(option: str, value: str, known: list[str], what: str) -> HarnessError:
    return usage(f"{option} {value!r} is not {what}", expected=f"one of: {', '.join(known) or '(none declared)'}")


def check_arguments(args) -> None:
    """What argparse alone cannot check, checked before anything runs: names the registry must know, a --ref
    that fits its tree kind, a commit a clone must resolve; and an installed copy's files stay as installed."""
    if args.command in WRITES_PROJECT and paths.bundled(args.root):
        raise usage(f"`pdevidence {args.command}` writes the project's files, and {args.root} is the copy an "
                    "installed pdevidence carries", todo="run it in a checkout of pdevidence (or pass --root <checkout>)")
    option = EXPERIMENT_OPTIONS.get(args.command)
    reg = registry.load(args.root) if option or args.command == "sweep" else None
    names = getattr(args, "experiment", None)
    for value in ([names] if isinstance(names, str) else names or []):
        if value not in reg.experiments:
            raise _unknown(option, value, sorted(reg.experiments), "an experiment of the registry")
    if getattr(args, "era", None) and args.era not in sweep_parts.era_names(reg):
        raise _unknown("--era", args.era, sweep_parts.era_names(reg), "an era of the registry")
    for value in getattr(args, "mutant", None) or []:
        known = sorted(reg.experiment(args.experiment).mutants)
        if value not in known:
            raise _unknown("--mutant", value, known, f"a mutant of {args.experiment}")
    if getattr(args, "ref", None):
        kind = args.kind or settings.get("PDEVIDENCE_UPSTREAM_KIND")
        fits = {"release": arguments.version, "git": arguments.commit, "path": arguments.directory}[kind]
        try:
            fits(args.ref)
        except argparse.ArgumentTypeError as exc:
            raise usage(f"--ref: {exc} (a {kind} tree)") from None
        if kind == "git":
            _resolvable("--ref", args.ref)
    for sha in getattr(args, "git", None) or []:
        _resolvable("--git", sha)
    if args.command == "corpus":
        declared = sorted(path.name.removeprefix(backports.FILE_PREFIX).removesuffix(".toml")
                          for path in backports.files(args.root))
        for release in args.release or []:
            if release not in declared:
                raise _unknown("--release", release, declared, "a release with a declared backport")


def _resolvable(option: str, ref: str) -> None:
    """A commit other than by its full SHA needs a clone to resolve it."""
    if not arguments.full_sha(ref) and not settings.get("SGLANG_REPO"):
        raise usage(f"{option} {ref!r} is not a full 40-hex commit SHA and there is no clone to resolve it",
                    todo="pass the full SHA, or set SGLANG_REPO=<clone> so the ref can be resolved")


def enter_scratch(root: Path) -> None:
    """This run is in the cache, the work directory and the runs of the project at ``root`` from now on; what dead
    runs left there goes first (core/debris.py). Every command enters all three: a run writing in one it did not
    enter could have its temporaries taken for a dead run's."""
    cache, work, runs = paths.cache_dir(), work_dir(root), runs_dir(root)
    places = {**cache_lane.places(cache, work), runs: [debris.Place(d, cache_lane.LEFTOVERS)
                                                      for d in (runs, runs / "check", runs / "sweep", runs / "mutate")]}
    for scratch, inside in places.items():
        try:
            debris.enter(scratch, inside)
        except OSError as exc:
            raise HarnessError(f"cannot work in {exc.filename or scratch}: {exc.strerror}",
                               expected="a cache, work and runs directory this user can write",
                               todo="fix its permissions, or point PDEVIDENCE_CACHE, PDEVIDENCE_WORK and "
                               "PDEVIDENCE_RUNS at directories you can write") from None
    cache_lane.remove_old_bytecode(cache)


def main(argv: list[str] | None = None) -> int:
    """Every command's exit code as docs/operators/exit-codes.md documents it; argparse's own errors (a malformed
    value: the option and the value named) are 2, --help and --version 0."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else USAGE

    def command() -> int:
        settings.check_all()  # a bad setting is one usage error up front, naming the variable
        check_arguments(args)
        paths.bytecode_beside_sources(args.root)
        with debris.run(), sandbox.uncontained_allowed(getattr(args, "allow_uncontained", False)):
            enter_scratch(args.root)
            return args.func(args)

    children.become_subreaper()  # what a killed child leaves behind is reparented here and reaped
    try:
        with children.stop_on_signals():
            return boundary(command, where=f"`pdevidence {args.command}`")
    except children.Interrupted as exc:
        print(f"{exc}: child processes stopped, no result written by the interrupted cells", file=sys.stderr)
        return exc.exit_code
