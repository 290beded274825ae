"""Same answers contained: the bracket releases give byte-identical results in the sandbox and out of it.

Slow (``--sglang``): the session's bracket sweep (``bracket_sweep``: every bracket release through the warm
engine, contained by bubblewrap) is held to the same releases through the warm engine uncontained
(``PDEVIDENCE_SANDBOX=none``: pinned releases may run uncontained); and each experiment's head cell of the session's
release matrix (``release_matrix``: a lone probe in a fresh process, contained) to that probe run alone again
with the cell's arguments, uncontained (each era's newest bracket release by default, the rest in the scheduled
lane: each fixture probes only what the session's tests ask for). Every result document must be byte-identical
to its uncontained twin: the sandbox takes the network, the home directory and the rest of the machine away from
SGLang, and none of that may change what the probes observe. And the issue's own case, a hostile copy of a real release, gets
nothing out; and a git cell, on a commit a test makes of a real release's sources, runs contained too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.version import Version

from pdevidence import environments, registry
from pdevidence.cells import probe_run, warm
from pdevidence.core.paths import PROJECT, cache_dir, tree_lock_file, work_dir
from pdevidence.sources import trees
from pdevidence.sources.importable import importable_dir
from real_runs import bracket_releases, cli_run, each_era_newest

pytestmark = pytest.mark.sglang

REG = registry.load(PROJECT)
BRACKETS = bracket_releases(REG)
HEADS = [(name, exp.releases["head"]) for name, exp in REG.experiments.items()]
EACH_ERA = each_era_newest(REG)  # held to its uncontained twin by default, the other bracket releases when scheduled


def lane_of(version: str) -> tuple[pytest.MarkDecorator, ...]:
    return () if version in EACH_ERA else (pytest.mark.scheduled,)


def asked(request: pytest.FixtureRequest, parameter: str) -> set[str]:
    """The values of ``parameter`` the session's tests that use this fixture run with (a lane skips the others)."""
    return {item.callspec.params[parameter] for item in request.session.items
            if request.fixturename in item.fixturenames and not item.get_closest_marker("skip")}


def tree_args(tree: trees.Tree) -> dict[str, str]:
    return {"side": "sweep", "tree_kind": tree.kind, "tree_ref": tree.ref, "tree_resolved": tree.resolved}


@pytest.fixture(scope="module")
def uncontained_engine(request, tmp_path_factory) -> Path:
    """The bracket releases the lane asks for through the warm engine, uncontained and reprobed: where each result
    is written."""
    lock = trees.LockFile(tree_lock_file(REG.root))
    brackets = [trees.release_tree(v, REG.python, lock) for v in sorted(asked(request, "version"), key=Version)]
    assert all(tree.pinned for tree in brackets)  # so they may run uncontained below, as the operator's releases
    out = tmp_path_factory.mktemp("uncontained")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PDEVIDENCE_SANDBOX", "none")
        outcomes = warm.probe_trees(REG, brackets, list(REG.experiments), {t.label(): tree_args(t) for t in brackets},
                                    out_dir=out, force=True, log=lambda msg: None)
    assert {o.containment["tool"] for per in outcomes.values() for o in per.values()} == {"none"}
    return out


@pytest.fixture(scope="module")
def uncontained_cells(request, release_matrix, tmp_path_factory) -> dict[str, Path]:
    """Each experiment's head cell the lane asks for run again uncontained, as the cell ran it (its side, its tree's
    arguments, its environment): per experiment, the result it wrote."""
    lock = trees.LockFile(tree_lock_file(REG.root))
    out = tmp_path_factory.mktemp("uncontained-cells")

    def run_alone(name: str, version: str) -> tuple[str, Path]:
        tree = trees.release_tree(version, REG.python, lock)
        env = environments.cell_environment(REG, tree, f"contained.{tree.label()}")  # the cell's, from the cache
        dest = out / f"{name}.head.{tree.label()}.json"
        ran = probe_run.run_probe(env.interpreter, REG.experiment(name).probe,
                                  ["--side", "head", "--tree-kind", tree.kind, "--tree-ref", tree.ref,
                                   "--tree-resolved", tree.resolved],
                                  dest, work_dir(REG.root) / "logs" / f"uncontained.{name}.log",
                                  experiment=name, side="head", trusted=True, env=env.probe_env)
        assert ran.containment["tool"] == "none"
        return name, dest

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PDEVIDENCE_SANDBOX", "none")
        with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time, as cells run
            wanted = asked(request, "experiment")
            return dict(pool.map(lambda item: run_alone(*item), [head for head in HEADS if head[0] in wanted]))


@pytest.mark.parametrize("version", [pytest.param(v, marks=lane_of(v)) for v in BRACKETS])
@pytest.mark.parametrize("experiment", list(REG.experiments))
def test_the_warm_engine_contained_writes_the_bytes_it_writes_uncontained(bracket_sweep, uncontained_engine,
                                                                         version, experiment):
    """Alone proves: the sandbox changes nothing the warm engine's children observe, on every bracket release."""
    uncontained = (uncontained_engine / f"release-{version}" / f"{experiment}.json").read_bytes()
    assert b'"scenarios"' in uncontained
    assert bracket_sweep.result(version, experiment).read_bytes() == uncontained


@pytest.mark.parametrize(("experiment", "version"), [pytest.param(*head, marks=lane_of(head[1])) for head in HEADS])
def test_a_lone_probe_contained_writes_the_bytes_it_writes_uncontained(release_matrix, uncontained_cells,
                                                                      experiment, version):
    """Alone proves: the sandbox changes nothing a lone probe (a cell's) observes: each experiment's head cell,
    contained by bubblewrap in the matrix, and the same probe uncontained write the same bytes."""
    cell = release_matrix.runs / f"{experiment}.head.release-{version}.json"
    receipt = json.loads(cell.with_name(cell.name.replace(".json", ".receipt.json")).read_text())
    assert receipt["containment"]["tool"] == "bubblewrap"
    uncontained = uncontained_cells[experiment].read_bytes()
    assert b'"scenarios"' in uncontained
    assert cell.read_bytes() == uncontained


def test_a_hostile_copy_of_a_release_gets_nothing_out_and_answers_cannot_run(tmp_path, monkeypatch):
    """Alone proves: a tree that is not pinned runs contained whatever is asked, and what SGLang's own import
    tries gets nothing out. The issue's case: a copy of the newest bracket release whose ``sglang/__init__.py``
    first writes into $HOME and /tmp and connects to a listener on 127.0.0.1 through ``_socket``, probed as
    `check --path` probes it."""
    reg = REG
    release = trees.release_tree(BRACKETS[-1], reg.python, trees.LockFile(tree_lock_file(reg.root)))
    copy = tmp_path / f"hostile-{BRACKETS[-1]}"
    shutil.copytree(importable_dir(release, environments.find_python(reg.python).path), copy / "python")
    home = tmp_path / "home"
    home.mkdir()
    # The probe's home is empty; the harness keeps the machine's caches (its own, uv's, pyenv's interpreters), read
    # where they are: an empty home would have uv download and build the whole closure again into it (6 GB).
    uv_cache = subprocess.run([environments.uv_executable(), "cache", "dir"], capture_output=True, text=True,
                              check=True).stdout.strip()
    monkeypatch.setenv("UV_CACHE_DIR", uv_cache)
    monkeypatch.setenv("PDEVIDENCE_CACHE", str(cache_dir()))
    monkeypatch.setenv("PYENV_ROOT", environments.pyenv_root())
    monkeypatch.setenv("HOME", str(home))
    token = f"pdevidence-escaped-{os.getpid()}"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.5)
        init = copy / "python" / "sglang" / "__init__.py"
        init.write_text(f"""import os as _os, _socket as _raw
open(_os.path.join(_os.path.expanduser("~"), {token!r}), "w").write("escaped")
open("/tmp/{token}", "w").write("escaped")
_raw.socket(_raw.AF_INET, _raw.SOCK_STREAM).connect({listener.getsockname()!r})
""" + init.read_text())
        tree = trees.path_tree(copy)
        assert not tree.pinned
        found = warm.probe_trees(reg, [tree], list(reg.experiments), {tree.label(): tree_args(tree)},
                                 out_dir=tmp_path / "out", log=lambda msg: None)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody came
    for outcome in found[tree.label()].values():
        assert outcome.doc is None and outcome.error.startswith("ConnectionRefusedError"), outcome.error
        assert outcome.containment["tool"] == "bubblewrap"
    assert not (home / token).exists() and not Path("/tmp", token).exists()


def commit_release_sources(version: str, repo: Path) -> str:
    """A commit of release ``version``'s ``sglang/`` as SGLang's repository lays it out (``python/sglang/``), made
    the same on every run (fixed author, dates, no bytecode): its SHA is the same, its exported tree reused."""
    release = trees.release_tree(version, REG.python, trees.LockFile(tree_lock_file(REG.root)))
    shutil.copytree(importable_dir(release, environments.find_python(REG.python).path) / "sglang",
                    repo / "python" / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    when = "2026-01-01T00:00:00+00:00"
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", f"sglang {version}"], ["rev-parse", "HEAD"]):
        done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], env=env,
                              capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_git_cell_runs_its_commit_contained_and_answers_as_the_release_it_holds(tmp_path, release_matrix):
    """Alone proves: a git cell (an exported commit, never built) runs its probe in the sandbox, like every other
    tree, and observes what the release cell of the same sources (the session's release matrix's) observes. CI has
    no clone of SGLang: the test commits offload_slots' head release into a repository of its own and points
    SGLANG_REPO at it."""
    version = REG.experiment("offload_slots").releases["head"]
    sha = commit_release_sources(version, tmp_path / "sglang")
    runs = tmp_path / "runs"
    contained = {"PDEVIDENCE_SANDBOX": "bubblewrap", "SGLANG_REPO": str(tmp_path / "sglang")}
    done = cli_run(runs, "cell", "git", "offload_slots", "head", "--ref", sha, extra_env=contained)
    assert done.returncode == 0, done.stdout + done.stderr

    git_cell = runs / f"offload_slots.head.git-{sha[:12]}.json"
    receipt = json.loads(git_cell.with_name(git_cell.name.replace(".json", ".receipt.json")).read_text())
    assert receipt["tree"]["kind"] == "git" and receipt["tree"]["source"] == "clone"
    assert receipt["containment"]["tool"] == "bubblewrap" and receipt["containment"]["why_not"] is None
    assert not [c for c in receipt["commands"] if "install" in c] and "sglang" not in receipt["packages"]
    answers = {kind: {k: v for k, v in doc.items() if k != "tree"}
               for kind, doc in (("git", json.loads(git_cell.read_text())),
                                 ("release", release_matrix.result("offload_slots", "head")))}
    assert answers["git"]["scenarios"] and answers["git"] == answers["release"]
