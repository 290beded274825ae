"""The PR's own test files, taken from the head tree, run against each side's tree.

``upstream(<experiment>, <side>)`` copies the registry's ``upstream_tests``
(paths inside the SGLang repository) from the head commit - or from a local
directory, since release wheels carry no tests - into a scratch directory, and
runs them with pytest in the side's cell environment (the one the probe cell
builds; ``upstream_pytest``). pytest's reports become
``<experiment>.<side>.<tree>.upstream.json`` (``upstream_model``): per test its
outcome, its subtests with their parameters, and for failures and errors the
exception type; failing tests are the data, not a harness failure. The receipt
beside it records where the tests came from, their SHA-256, the pytest command,
its exit status and the SHA-256 of the log kept under ``.cells/logs/``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .. import environments
from ..cells import cells
from ..core import children, clock, settings
from ..core.errors import ENVIRONMENT, HarnessError, usage
from ..core.files import dumps, move_atomic, sha256_file, write_atomic
from ..core.locking import exclusive
from ..core.paths import runs_dir, tree_lock_file, work_dir
from ..documents import results
from ..documents.upstream_model import Outcome, TestEntry, UpstreamResult, Verdict, load, pytest_summary, summary_line
from ..registry import SIDES, Experiment, Registry
from ..sources import trees
from .upstream_pytest import run_suite

RECEIPT_SCHEMA = "pdevidence-upstream-receipt/1"
RESULT_SUFFIX = ".upstream.json"
TESTS_ENV = "PDEVIDENCE_UPSTREAM_TESTS"


# --- where the test files come from ----------------------------------------------------------


@dataclass(frozen=True)
class TestFile:
    rel: str  # the registry's path inside the SGLang repository
    origin: Path  # where it was read
    data: bytes  # exactly what is copied and run

    __test__ = False  # not a pytest class

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class TestSource:
    kind: str  # head-tree | local
    files: list[TestFile]
    details: dict = field(default_factory=dict)
    pinned: bool = False  # read from a tree pinned with a verified hash (``Tree.pinned``)

    __test__ = False

    def receipt(self) -> dict:
        return {"kind": self.kind, **self.details,
                "files": [{"path": f.rel, "read_from": str(f.origin), "sha256": f.sha256} for f in self.files]}


def _no_source(exp: Experiment, why: str) -> HarnessError:
    """The head tree could not be fetched: an environment problem (exit 3), as for any tree."""
    return HarnessError(
        f"no source for the upstream tests of {exp.name}: {why}",
        expected=f"the files {', '.join(exp.upstream_tests)} of the head commit {exp.git['head'][:12]}",
        todo=f"set {TESTS_ENV}=/path/to/sglang-checkout (or pass --tests DIR), or SGLANG_REPO=<clone that has "
        "the head commit>; release wheels carry no tests",
    )


def _check_rel(exp: Experiment, rel: str) -> PurePosixPath:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or path.suffix != ".py":
        raise usage(f"experiments.{exp.name}.upstream_tests: {rel!r} is not a relative path to a .py file "
                    "inside the SGLang repository")
    return path


def local_source(directory: Path, rels: list[str] | tuple[str, ...], exp: Experiment | None = None) -> TestSource:
    """Each path inside ``directory`` (an SGLang checkout), else its file name directly in it."""
    directory = directory.expanduser().resolve()
    if not directory.is_dir():
        raise usage(f"the upstream test directory {directory} does not exist",
                    todo=f"point {TESTS_ENV} (or --tests) at an SGLang checkout or a directory with the test files")
    files, missing = [], []
    for rel in rels:
        path = _check_rel(exp, rel) if exp else PurePosixPath(rel)
        for candidate in (directory / path, directory / path.name):
            if candidate.is_file():
                files.append(TestFile(str(path), candidate, candidate.read_bytes()))
                break
        else:
            missing.append(rel)
    if missing:
        raise usage(f"upstream test files not found in {directory}: {', '.join(missing)}",
                    expected="the registry's paths inside that directory, or the bare file names in it",
                    todo=f"point {TESTS_ENV} (or --tests) at an SGLang checkout of the head commit")
    return TestSource("local", files, {"path": str(directory), **_git_state(directory, [f.origin for f in files])})


def _git_state(directory: Path, files: list[Path]) -> dict:
    """For a directory inside a git checkout: which checkout, its HEAD, and whether the test
    files differ from that HEAD (modified or untracked). A checkout git cannot read is refused:
    the receipt would otherwise say where the tests came from without knowing."""
    def git(*args: str, unborn_ok: bool = False) -> str:
        done = children.run(["git", "-C", str(directory), *args], capture_output=True, text=True)
        if unborn_ok and done.returncode == 1 and not done.stderr.strip():  # --verify --quiet: no such commit
            return ""
        if done.returncode != 0:
            raise HarnessError(f"`git {' '.join(args)}` failed ({done.returncode}) in the checkout holding "
                               f"{directory}: {done.stderr.strip() or 'no message'}",
                               expected="a git checkout git can read, or a directory outside any checkout",
                               todo=f"repair the checkout (`git -C {directory} status` shows what git refuses), "
                                    f"or copy the test files to a directory outside it and pass that to --tests")
        return done.stdout.strip()

    # Not inside any checkout: nothing to record. A `.git` above it that git refuses is an error, not "no checkout".
    if not shutil.which("git") or not any((d / ".git").exists() for d in (directory.resolve(), *directory.resolve().parents)):
        return {"git_head": None}
    if git("rev-parse", "--is-inside-work-tree") != "true":  # e.g. inside a .git directory
        return {"git_head": None}
    status = git("status", "--porcelain", "--untracked-files=all", "--", *map(str, files))
    head = git("rev-parse", "--verify", "--quiet", "HEAD^{commit}", unborn_ok=True)  # none before a first commit
    return {"git_toplevel": git("rev-parse", "--show-toplevel"), "git_head": head or None,
            "files_differ_from_head": bool(status)}


def head_tree_source(registry: Registry, exp: Experiment) -> TestSource:
    """The files of the experiment's head commit (SGLANG_REPO clone, or the GitHub archive)."""
    try:
        tree = trees.git_tree(exp.git["head"], trees.LockFile(tree_lock_file(registry.root)),
                              clone=settings.get("SGLANG_REPO"), whole=True)  # its test files
    except HarnessError as exc:
        if exc.code != ENVIRONMENT:
            raise
        raise _no_source(exp, f"the head tree is not available ({exc.what.splitlines()[0]})") from None
    files, missing = [], []
    for rel in exp.upstream_tests:
        path = tree.repo_root / _check_rel(exp, rel)
        if path.is_file():
            files.append(TestFile(rel, path, path.read_bytes()))
        else:
            missing.append(rel)
    if missing:
        raise usage(f"the head commit {exp.git['head'][:12]} has no {', '.join(missing)}",
                    todo=f"fix experiments.{exp.name}.upstream_tests in the registry")
    return TestSource("head-tree", files, {"head": tree.resolved, "tree": tree.receipt()}, tree.pinned)


def resolve_source(registry: Registry, exp: Experiment, tests_dir: Path | None = None) -> TestSource:
    """``tests_dir`` (--tests), else $PDEVIDENCE_UPSTREAM_TESTS, else the head git tree."""
    if not exp.upstream_tests:
        raise usage(f"experiment {exp.name!r} lists no upstream_tests",
                    todo=f"add upstream_tests = [\"test/...py\"] to [experiments.{exp.name}]")
    directory = tests_dir or settings.get(TESTS_ENV)
    if directory:
        return local_source(directory, exp.upstream_tests, exp)
    return head_tree_source(registry, exp)


# --- the cell: tree, environment, run, result and receipt ------------------------------------


def result_name(experiment: str, side: str, label: str) -> str:
    return results.result_name(experiment, side, label, RESULT_SUFFIX)


def cell_name(experiment: str, side: str) -> str:
    return f"upstream({experiment}, {side})"


@dataclass
class UpstreamOutcome:
    name: str
    result: Path
    receipt: Path
    doc: UpstreamResult


def run_upstream(registry: Registry, cell: cells.Cell, *, tests_dir: Path | None = None,
                 out_dir: Path | None = None, log=print) -> UpstreamOutcome:
    exp = registry.experiment(cell.experiment)
    name = cell_name(cell.experiment, cell.side)
    source = resolve_source(registry, exp, tests_dir)  # before any environment is built
    log(f"{name}: {len(source.files)} test file(s) from "
        + (f"the head tree {source.details['head'][:12]}" if source.kind == "head-tree" else source.details["path"]))
    tree = cells.resolve_tree(registry, cell)
    slug = cells.cell_slug(registry, cell, tree)
    result = (out_dir or runs_dir(registry.root)) / result_name(cell.experiment, cell.side, tree.label())
    receipt_file = results.receipt_path(result)
    work = work_dir(registry.root)
    # The probe cell's lock: its environment may be rebuilt by either run, never by both at once.
    with exclusive(work / "locks" / f"{slug}.lock", f"cell {name}"):
        staging = cells.staging_dir(result)
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted run left
        try:
            doc = _run_staged(registry, cell, name, source, tree, slug, staging, result, log)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log(f"{name}: {describe(doc)}; wrote {result}")
    return UpstreamOutcome(name, result, receipt_file, doc)


def _run_staged(registry: Registry, cell: cells.Cell, name: str, source: TestSource, tree: trees.Tree, slug: str,
                staging: Path, dest: Path, log) -> UpstreamResult:
    """Run and write the pair under ``staging``, then swap it in: the previous pair stays until
    the new one is complete (a failure or Ctrl-C leaves it as it was)."""
    work = work_dir(registry.root)
    result = staging / dest.name
    receipt_file = results.receipt_path(result)
    staging.mkdir(parents=True)
    started = clock.now()
    env = environments.cell_environment(registry, tree, slug)
    log(f"{name}: {'reusing' if env.reused else 'built'} environment {env.path}")
    log(f"{name}: running pytest on {tree.label()}")
    run = run_suite(env.interpreter, source.files, work / "logs" / f"{slug}.upstream.log",
                    trusted=tree.pinned and source.pinned, env=env.probe_env)
    packages = env.packages()  # before the result: no result without its receipt
    doc = UpstreamResult(cell.experiment, cell.side, tree.result_tree(),
                         {f.rel: f.sha256 for f in source.files}, run.tests)
    write_atomic(result, dumps(doc.to_json()))
    finished = clock.now()
    receipt = {
        "schema": RECEIPT_SCHEMA,
        "cell": name,
        "experiment": cell.experiment,
        "side": cell.side,
        "tree": tree.receipt(),
        "tests_source": source.receipt(),
        "result": {"file": result.name, "sha256": sha256_file(result)},
        "log": {"file": str(run.log), "sha256": run.log_sha256},
        "command": run.command,
        "pytest_exit_status": run.exit_status,
        "containment": run.containment,
        "messages": run.messages,
        "environment": {"path": str(env.path), "reused": env.reused, "interpreter": str(env.interpreter),
                        "setup_commands": env.commands},
        "torch": {"build": env.torch_build(), "channel": env.torch.channel, "note": env.torch.note},
        "packages": packages,
        "started": started.isoformat(timespec="seconds"),
        "pytest_started": run.started.isoformat(timespec="seconds"),
        "pytest_finished": run.finished.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 3),
    }
    write_atomic(receipt_file, dumps(receipt))
    # Result first: between the renames the receipt does not vouch for the result, never the reverse.
    move_atomic(result, dest)
    move_atomic(receipt_file, results.receipt_path(dest))
    return doc


def describe(doc: UpstreamResult) -> str:
    """pytest's own summary line, then the exception types."""
    line = summary_line(doc.tests)
    if doc.types:
        line += " (" + ", ".join(f"{k} {v}" for k, v in doc.types.items()) + ")"
    return line


# --- base vs head, for compare/report -------------------------------------------------------

PINS = "pins"  # an entry's ``tree`` for the registry's base/head pair


def _pinned_label(exp: Experiment, side: str, kind: str) -> str | None:
    pin = exp.git.get(side) if kind == "git" else exp.releases.get(side)
    return trees.tree_label(kind, pin) if pin else None


def summarize(runs: Path, registry: Registry, kinds: tuple[str, ...] = ("release", "git")) -> list[dict]:
    """Per experiment: one entry per tree kind pairing the registry's base and head pins, then one
    per other tree a result was written for (``upstream --ref``), labelled with that tree.

    Reads ``runs/<experiment>.<side>.<tree>.upstream.json`` only; runs nothing.
    """
    out = []
    for exp in registry.experiments.values():
        found = {(side, path.name[len(f"{exp.name}.{side}."):-len(RESULT_SUFFIX)]): path
                 for side in SIDES for path in runs.glob(f"{exp.name}.{side}.*{RESULT_SUFFIX}")}
        for kind in kinds:
            labels = {side: _pinned_label(exp, side, kind) for side in SIDES}
            pinned = {side: (label, found.pop((side, label))) if (side, label) in found else None
                      for side, label in labels.items()}
            if any(pinned.values()):
                out.append(_entry(exp, kind, PINS, f"{kind} pins", _load_sides(exp, pinned)))
        for label in sorted({label for _, label in found}):
            sides = _load_sides(exp, {side: (label, found[side, label]) if (side, label) in found else None
                                      for side in SIDES})
            kind = next(doc.tree["kind"] for _, doc in filter(None, sides.values()))
            if kind in kinds:
                out.append(_entry(exp, kind, label, label, sides))
    return out


def _load_sides(exp: Experiment, paths: dict[str, tuple[str, Path] | None]) \
        -> dict[str, tuple[str, UpstreamResult] | None]:
    """Each side's (label, file) -> (file name, result), checked against what its name says."""
    return {side: (found[1].name, load(found[1], experiment=exp.name, side=side, label=found[0])) if found else None
            for side, found in paths.items()}


def _key(test: TestEntry) -> tuple[str, str]:
    # A test can have a failure and a teardown error: tell them apart by phase.
    return test.nodeid, test.phase if test.outcome is Outcome.ERROR else ""


def _outcomes(doc: UpstreamResult | None) -> dict[tuple[str, str, str], dict]:
    """Every test and subtest of a side, keyed so that the other side's same test meets it."""
    shown = {}
    for t in doc.tests if doc else ():
        shown[(*_key(t), "")] = {"outcome": t.outcome.value, "type": t.type}
        for s in t.subtests:
            shown[(t.nodeid, "", s.key())] = {"outcome": s.outcome.value, "type": s.type}
    return shown


def _verdict(base: UpstreamResult | None, head: UpstreamResult | None, tree: str) -> Verdict:
    if tree == PINS and (base is None or head is None):
        return Verdict.INCOMPLETE
    present = [doc for doc in (base, head) if doc]
    if any(not doc.tests for doc in present):
        return Verdict.NO_TESTS
    if tree != PINS:  # one tree: its tests pass or they do not, whichever side ran them
        return Verdict.TREE_FAILS if any(doc.bad for doc in present) else Verdict.TREE_PASSES
    if head.bad:
        return Verdict.FAIL_ON_HEAD
    return Verdict.FIXED_BY_HEAD if base.bad else Verdict.BOTH_PASS


def _entry(exp: Experiment, kind: str, tree: str, label: str,
           docs: dict[str, tuple[str, UpstreamResult] | None]) -> dict:
    sides = {side: {"file": found[0], "tree": found[1].tree, "totals": found[1].totals,
                    "subtest_totals": found[1].subtest_totals, "pytest_summary": pytest_summary(found[1].tests),
                    "types": found[1].types, "files": found[1].files} if found else None
             for side, found in docs.items()}
    base, head = (docs[side][1] if docs[side] else None for side in SIDES)
    shown = {side: _outcomes(doc) for side, doc in zip(SIDES, (base, head))}
    changed = []  # base vs head: nothing to compare until both sides ran
    for key in sorted(set(shown["base"]) | set(shown["head"])) if base and head else ():
        row = {side: shown[side].get(key) for side in SIDES}
        if row["base"] != row["head"]:
            subtest = dict(zip(("msg", "params"), json.loads(key[2]))) if key[2] else None
            changed.append({"nodeid": key[0], "subtest": subtest, **row})
    return {
        "experiment": exp.name,
        "pr": exp.pr,
        "kind": kind,
        "tree": tree,
        "label": label,
        "verdict": _verdict(base, head, tree).value,
        "same_test_files": bool(base and head and base.files == head.files),
        "sides": sides,
        "changed": changed,
    }
