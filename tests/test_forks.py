"""Forks and source trees: checked as they are, never built; their version read from the commit.

The forks here are git repositories the tests build: a tiny ``python/sglang`` package, a
``pyproject.toml`` whose version setuptools-scm would take from a tag it cannot parse
(``v0.5.10-npu.rc1``), a ``setup.py`` that fails as a build needing cargo would, and a Rust
crate. The warm engine runs with this interpreter (no SGLang, no environment built).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project, result_doc, with_real_probes, write_cell
from test_engine import DOOR_PROBE

from pdevidence import cli, environments, registry
from pdevidence.cells import allprobes
from pdevidence.core import errors
from pdevidence.documents import integrity
from pdevidence.lanes import check
from pdevidence.registry import TorchChannel
from pdevidence.sources import era_choice, trees, version
from pdevidence.sources.version import TreeVersion

ROOT = Path(__file__).resolve().parent.parent
ERAS = REGISTRY + """
[eras.npu]
releases = ">=0.5.10,<0.5.11"
constraints = "constraints/npu.txt"

[eras.old]
releases = ">=0.5.6,<0.5.10"
constraints = "constraints/old.txt"
"""
# Each closure as uv compiles it: what it installs of torch and transformers decides which fork's pins fit it.
CLOSURES = {"npu.txt": ("2.9.1", "5.3.0"), "old.txt": ("2.9.1", "4.57.1"), "cells.txt": ("2.14.1", "5.12.1")}


def write_closures(root: Path) -> None:
    for name, (torch, transformers) in CLOSURES.items():
        (root / "constraints" / name).write_text(f"torch=={torch} \\\n    --hash=sha256:00\n"
                                                 f"transformers=={transformers} \\\n    --hash=sha256:00\n")
# As SGLang's python/sglang/version.py since setuptools-scm: a build writes _version.py; a source tree has none.
SCM_VERSION_PY = """
try:
    from sglang._version import __version__
except ImportError:
    __version__ = "0.0.0.dev0"
"""
SCM_PYPROJECT = """
[build-system]
requires = ["setuptools>=64", "setuptools-scm>=8", "setuptools-rust"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
dynamic = ["version"]

[tool.setuptools_scm]
root = ".."
"""
FAILING_SETUP = 'raise SystemExit("error: could not find `cargo`: rust/sglang-grpc needs a Rust toolchain")\n'


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "init.defaultBranch=main", *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_fork(root: Path, *, guard: bool, tag: str | None = "v0.5.10-npu.rc1", extra_import: str = "",
              pins: tuple[str, ...] = ()) -> Path:
    """A fork checkout whose build would fail: setuptools-scm on an unparseable tag, cargo for a Rust crate;
    ``pins`` are its pyproject's dependencies."""
    package = root / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"{extra_import}\nfrom sglang.version import __version__\nGUARD = {guard}\n")
    (package / "version.py").write_text(SCM_VERSION_PY)
    dependencies = f"dependencies = {list(pins)!r}\n".replace("'", '"')
    (root / "python" / "pyproject.toml").write_text(SCM_PYPROJECT.replace('dynamic = ["version"]\n',
                                                                          f'dynamic = ["version"]\n{dependencies}'))
    (root / "python" / "setup.py").write_text(FAILING_SETUP)
    (root / "rust" / "sglang-grpc").mkdir(parents=True)
    (root / "rust" / "sglang-grpc" / "Cargo.toml").write_text('[package]\nname = "sglang-grpc"\n')
    (root / ".gitignore").write_text("__pycache__/\n")
    if tag is not None:
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "fork")
        git(root, "tag", tag)
    return root


@pytest.fixture(autouse=True)
def quiet_git(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))


# --- the version a tree tells -------------------------------------------------------------------


@pytest.mark.parametrize(("told", "read"), [
    ("0.5.21", ("0.5.21", None)),
    ("v0.5.10-npu.rc1", ("0.5.10", "npu.rc1")),
    ("v0.5.10-npu.rc1-3-gabc1234", ("0.5.10", "npu.rc1")),  # three commits past the tag
    ("0.5.10rc1", ("0.5.10rc1", None)),
    ("v0.5.20+backport", ("0.5.20", "backport")),
    ("0.5.9_ascend", ("0.5.9", "ascend")),
    ("nightly", None),
])
def test_a_version_or_tag_is_read_leniently_keeping_what_follows_the_release(told, read):
    assert version.lenient(told) == read


def test_a_literal_version_py_wins_then_a_static_pyproject_then_the_commits_tag(tmp_path):
    fork = make_fork(tmp_path / "fork", guard=True)
    python = fork / "python"
    assert version.read(python, fork, repo=fork, rev="HEAD") == TreeVersion(
        "0.5.10", "npu.rc1", "git describe --tags", "v0.5.10-npu.rc1")
    (python / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.9"\n')
    assert version.read(python, fork, repo=fork, rev="HEAD") == TreeVersion(
        "0.5.9", None, "python/pyproject.toml", "0.5.9")
    (python / "sglang" / "version.py").write_text('__version__ = "0.4.8.post1"\n')
    assert version.read(python, fork, repo=fork, rev="HEAD") == TreeVersion(
        "0.4.8.post1", None, "python/sglang/version.py", "0.4.8.post1")


def test_a_tree_without_a_version_literal_or_a_version_tag_tells_none(tmp_path):
    fork = make_fork(tmp_path / "fork", guard=True, tag="npu-nightly")
    assert version.read(fork / "python", fork, repo=fork, rev="HEAD") is None
    assert version.read(fork / "python", fork, repo=None, rev="HEAD") is None


# What setuptools-scm (vcs-versioning) writes as sglang/_version.py when a wheel or a source build is made.
SCM_WRITTEN = """# file generated by vcs-versioning
# don't change, don't track in version control
from __future__ import annotations

__all__ = ["__version__", "__version_tuple__", "version", "version_tuple", "__commit_id__", "commit_id"]

version: str
__version__: str

__version__ = version = '{version}'
__version_tuple__ = version_tuple = ({tuple})

__commit_id__ = commit_id = None
"""


def unpacked_wheel(root: Path, version_: str) -> Path:
    """An unpacked wheel of a setuptools-scm release: its version.py imports _version.py, which holds the literal."""
    package = root / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from sglang.version import __version__\nGUARD = True\n")
    (package / "version.py").write_text(SCM_VERSION_PY)
    (package / "_version.py").write_text(SCM_WRITTEN.format(version=version_, tuple=version_.replace(".", ", ")))
    (root / f"sglang-{version_}.dist-info").mkdir()
    return root


def test_the_version_setuptools_scm_wrote_is_read_from_its_file_as_text_and_chooses_the_era(tmp_path):
    tree = unpacked_wheel(tmp_path / "unpacked", "0.5.10")
    assert version.read(tree, tree, repo=None, rev="HEAD") == TreeVersion("0.5.10", None, "sglang/_version.py",
                                                                          "0.5.10")
    root = make_project(tmp_path / "project", ERAS)
    write_closures(root)
    path = trees.path_tree(tree)
    assert environments.era_of(registry.load(root), path).name == "npu"
    (tree / "sglang" / "version.py").write_text('__version__ = "0.5.9"\n')  # a literal of its own still wins
    assert version.read(tree, tree, repo=None, rev="HEAD").source == "sglang/version.py"


def test_a_dist_infos_version_is_its_metadata_header_and_nothing_in_its_description(tmp_path):
    metadata = tmp_path / "METADATA"
    metadata.write_text("Metadata-Version: 2.4\nName: sglang\nSummary: a\n  folded summary\nVersion: 0.5.12\n\n"
                        "Version: 9.9.9 is only prose in the description\n")
    assert version.metadata_version(metadata) == "0.5.12"
    metadata.write_text("Metadata-Version: 2.4\nName: sglang\n\nVersion: 9.9.9\n")
    assert version.metadata_version(metadata) is None
    assert version.metadata_version(tmp_path / "missing") is None


def test_source_trees_carry_the_version_their_commit_tells(tmp_path, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path / "fork", guard=True)
    git(fork, "commit", "-q", "--allow-empty", "-m", "past the tag")
    path = trees.path_tree(fork)
    assert path.install_target == fork / "python"
    assert (path.version.version, path.version.local) == ("0.5.10", "npu.rc1")
    assert path.version.source == "git describe --tags"
    assert path.version.told.startswith("v0.5.10-npu.rc1-1-g")
    lock = trees.LockFile(tmp_path / "trees.lock.json", tmp_path / "seen.json")
    exported = trees.git_tree(git(fork, "rev-parse", "HEAD~1"), lock, clone=fork)
    assert exported.version == TreeVersion("0.5.10", "npu.rc1", "git describe --tags", "v0.5.10-npu.rc1")
    assert (exported.install_target / "sglang" / "__init__.py").exists()


def test_a_directory_holding_sglang_directly_is_a_source_tree_too(tmp_path):
    fork = make_fork(tmp_path / "fork", guard=True, tag=None)
    assert trees.path_tree(fork / "python").install_target == fork / "python"


def test_the_era_follows_a_source_trees_version_and_today_runs_one_that_tells_none(tmp_path):
    root = make_project(tmp_path / "project", ERAS)
    write_closures(root)
    reg = registry.load(root)
    told = trees.path_tree(make_fork(tmp_path / "fork", guard=True))
    untold = trees.path_tree(make_fork(tmp_path / "untold", guard=True, tag="nightly"))
    assert environments.era_of(reg, told).name == "npu"
    assert environments.era_of(reg, untold) is None


def test_a_trees_own_version_moves_it_to_another_era_only_when_it_is_a_release_of_another_era(tmp_path):
    root = make_project(tmp_path / "project", ERAS)
    write_closures(root)
    reg = registry.load(root)
    untold = trees.path_tree(make_fork(tmp_path / "untold", guard=True, tag=None))  # today's closure
    moved = era_choice.in_own_era(reg, untold, "0.5.10")
    assert moved.version == TreeVersion("0.5.10", None, "sglang.__version__, as the probes could not run in "
                                        "today's closure", "0.5.10")
    assert environments.era_of(reg, moved).name == "npu"
    assert era_choice.in_own_era(reg, untold, "0.0.0.dev0") is None  # a build's fallback names no release
    assert era_choice.in_own_era(reg, untold, "0.5.30") is None  # no era holds it, no lock pins it: no release
    tagged = trees.path_tree(make_fork(tmp_path / "tagged", guard=True))  # era npu, by its tag
    assert era_choice.in_own_era(reg, tagged, "0.5.10") is None


def test_a_source_tree_whose_probes_could_not_run_runs_again_in_the_era_its_version_names(tmp_path, monkeypatch):
    """As an unpacked setuptools-scm wheel whose files told no version: today's closure lacks its kernel, one
    probe still reports its sglang.__version__, and that release's era is where every probe answers."""
    second = REGISTRY[REGISTRY.index("[experiments.demo]"):].replace("experiments.demo", "experiments.other")
    root = make_project(tmp_path / "project", ERAS + second.replace("pr = 1", "pr = 2"))
    write_closures(root)
    reg = registry.load(root)
    fork = make_fork(tmp_path / "fork", guard=True, tag=None)
    probed_in = []

    def probe_trees(reg_, trees_, names, args, **kw):
        era = environments.era_of(reg_, trees_[0])
        probed_in.append(era.name if era else None)
        ran = allprobes.Outcome("demo", doc={"sglang_version": "0.5.10"})
        kernel = allprobes.Outcome("other", doc={"sglang_version": "0.5.10"}) if era else \
            allprobes.Outcome("other", error="ModuleNotFoundError: No module named 'sgl_kernel'")
        return {trees_[0].label(): {"demo": ran, "other": kernel}}

    def judge(exp, outcome, *args):
        return check.ExperimentCheck(exp.name, exp.pr, check.Status.FIXED if outcome.doc else check.Status.CANNOT_RUN)

    monkeypatch.setattr(check.warm, "probe_trees", probe_trees)
    monkeypatch.setattr(check, "references", lambda *a, **kw: SimpleNamespace(base={}, head={}))
    monkeypatch.setattr(check, "judge", judge)
    logged = []
    [found] = check.run_all(reg, [check.resolve(reg, path=fork)], log=logged.append)
    assert probed_in == [None, "npu"]
    assert [e.status for e in found.experiments] == [check.Status.FIXED, check.Status.FIXED]
    assert (found.target.era, found.target.era_choice.basis) == ("npu", era_choice.Basis.VERSION)
    assert check.describe(found).endswith("version 0.5.10, from sglang.__version__, as the probes could not run "
                                          "in today's closure, run in era npu")
    assert any("probing it again in npu" in line for line in logged)


# --- check on a fork: the warm engine, nothing built ----------------------------------------------


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A project with an era for 0.5.10; this interpreter stands for every closure environment, and
    building any environment (the step a source tree used to take) fails the test."""
    root = with_real_probes(make_project(tmp_path / "project", ERAS), DOOR_PROBE)
    write_closures(root)
    write_cell(root / "results", "base", result_doc("base", "1.0.0"))
    write_cell(root / "results", "head", result_doc("head", "1.1.0"))
    integrity.regenerate(root)
    for name, value in {"PDEVIDENCE_WORK": tmp_path / "work", "PDEVIDENCE_RUNS": tmp_path / "runs",
                        "PDEVIDENCE_CACHE": tmp_path / "cache"}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # the harness must set it for a work tree
    eras = []
    env = SimpleNamespace(interpreter=Path(sys.executable), path=tmp_path / "closure-env",
                          torch=SimpleNamespace(channel=TorchChannel.PYPI))

    def closure_environment(reg, era=None, log=None):
        eras.append(era.name if era else None)
        return env

    def no_build(*args, **kw):
        raise AssertionError("a source tree was built into an environment")

    monkeypatch.setattr(environments, "closure_environment", closure_environment)
    monkeypatch.setattr(environments, "cell_environment", no_build)
    monkeypatch.setattr(environments, "ensure", no_build)
    monkeypatch.setattr(environments, "find_python", lambda v: SimpleNamespace(identity=lambda: "cpython-3.12.1"))
    return SimpleNamespace(root=root, eras=eras, tmp=tmp_path)


def check_header(capsys) -> str:
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sglang check:"))


def run_check(world, capsys, *argv: str) -> tuple[int, dict | list, str]:
    code = cli.main(["--root", str(world.root), "check", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def snapshot(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.lstat().st_mtime_ns for p in sorted(directory.rglob("*"))}


def test_a_fork_whose_build_would_fail_is_checked_in_the_era_of_its_tag(world, capsys):
    fork = make_fork(world.tmp / "fork", guard=True)
    before = snapshot(fork)
    code, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert code == errors.CONFIRMED
    assert doc["experiments"][0]["status"] == "fixed"
    assert doc["target"]["source_version"] == {"version": "0.5.10", "local": "npu.rc1",
                                               "source": "git describe --tags", "told": "v0.5.10-npu.rc1"}
    assert doc["target"]["era"] == "npu" and world.eras == ["npu"]
    assert doc["target"]["sglang_version"] == "0.0.0.dev0"  # what the unbuilt tree's own fallback says
    assert problems("check", doc) == []
    assert snapshot(fork) == before  # nothing built, no bytecode: the work tree is as it was


def test_the_table_says_which_version_a_source_tree_reports_and_where_it_came_from(world, capsys):
    fork = make_fork(world.tmp / "fork", guard=False)
    code = cli.main(["--root", str(world.root), "check", "--path", str(fork)])
    header = check_header(capsys)
    assert code == errors.BEHAVIOUR_DIFFERS
    assert header == (f"sglang check: path {fork} at {git(fork, 'rev-parse', 'HEAD')}: version 0.5.10 (npu.rc1), "
                      "from git describe --tags: v0.5.10-npu.rc1, run in era npu; sglang.__version__ says 0.0.0.dev0")


def test_a_commit_of_a_fork_is_checked_from_its_clone_without_building_it(world, capsys, monkeypatch):
    fork = make_fork(world.tmp / "fork", guard=False)
    monkeypatch.setenv("SGLANG_REPO", str(fork))
    code, doc, err = run_check(world, capsys, "--git", "HEAD")
    assert code == errors.BEHAVIOUR_DIFFERS and doc["experiments"][0]["status"] == "affected"
    assert doc["target"]["resolved"] == git(fork, "rev-parse", "HEAD")
    assert (doc["target"]["source_version"]["version"], doc["target"]["era"]) == ("0.5.10", "npu")
    assert "engine (npu): probing git-" in err


def test_a_tree_that_tells_no_version_runs_in_todays_closure_and_says_so(world, capsys):
    fork = make_fork(world.tmp / "fork", guard=True, tag=None)  # not a git checkout, no version literal
    code, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert code == errors.CONFIRMED
    assert (doc["target"]["source_version"], doc["target"]["era"], world.eras) == (None, None, [None])
    assert problems("check", doc) == []
    cli.main(["--root", str(world.root), "check", "--path", str(fork)])
    header = check_header(capsys)
    assert header.startswith(f"sglang check: path {fork} (outside git, content {doc['target']['resolved'][6:]}): "
                             "version not told (")
    assert header.endswith("run in today's closure; sglang.__version__ says 0.0.0.dev0")


def test_a_fork_needing_a_vendor_package_at_import_cannot_run_naming_the_module(world, capsys):
    fork = make_fork(world.tmp / "fork", guard=True, extra_import="import torch_npu")
    code, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert code == errors.ENVIRONMENT
    assert doc["experiments"][0]["status"] == "cannot run"
    assert doc["experiments"][0]["error"] == "ModuleNotFoundError: No module named 'torch_npu'"


def test_a_work_tree_in_git_or_not_is_reused_while_it_holds_the_same_content(world, capsys):
    committed = make_fork(world.tmp / "fork", guard=True)
    loose = make_fork(world.tmp / "loose", guard=True, tag=None)
    run_check(world, capsys, "--path", str(committed), "--path", str(loose))
    _, docs, err = run_check(world, capsys, "--path", str(committed), "--path", str(loose))
    loose_label = f"path-local-{trees.content_digest(loose / 'python')[:12]}"
    assert f"engine (npu): 1 tree(s) unchanged, outcomes reused: path-{git(committed, 'rev-parse', 'HEAD')[:12]}" in err
    assert f"engine: 1 tree(s) unchanged, outcomes reused: {loose_label}" in err
    assert "probing" not in err
    unfixed = "from sglang.version import __version__\nGUARD = False\n"
    for tree in (committed, loose):
        (tree / "python" / "sglang" / "__init__.py").write_text(unfixed)
    code, docs, err = run_check(world, capsys, "--path", str(committed), "--path", str(loose))
    assert "probing path-" in err and "-dirty-" in err and "path-local-" in err and "reused" not in err
    assert [d["experiments"][0]["status"] for d in docs] == ["affected", "affected"]


# --- forks get the era their code needs: the version when it is the tree's own, else its pins -------------

OLD_PINS = ("torch==2.9.1", "transformers==4.57.1", "sgl-kernel==0.3.21")  # what "old"'s releases pin
NEW_PINS = ("torch==2.9.1", "transformers==5.3.0", "sglang-kernel==0.4.1")  # npu's


def committed(fork: Path, tag: str | None = None, past: int = 0) -> Path:
    """``fork`` as a git checkout: one commit, ``tag`` on it (if any), then ``past`` commits of the fork's own."""
    git(fork, "init", "-q")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "fork")
    if tag:
        git(fork, "tag", tag)
    if past:  # empty commits on top, in one git process (a loop of `git commit` takes seconds)
        head = git(fork, "rev-parse", "HEAD")
        stream = "".join(f"commit refs/heads/main\ncommitter t <t@t> {n} +0000\ndata 9\nfork work\n"
                         + (f"from {head}\n" if n == 0 else "") + "\n" for n in range(past))
        subprocess.run(["git", "-C", str(fork), "fast-import", "--quiet"], input=stream, text=True, check=True)
        git(fork, "reset", "-q", "--hard")
    return fork


def era_line(capsys) -> str:
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  era: "))


def test_a_fork_without_tags_runs_in_the_era_its_pins_choose(world, capsys):
    fork = committed(make_fork(world.tmp / "fork", guard=True, tag=None, pins=OLD_PINS))
    code, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert code == errors.CONFIRMED and world.eras == ["old"]
    target = doc["target"]
    assert (target["era"], target["source_version"]) == ("old", None)
    assert target["source_pins"] == {"torch": "2.9.1", "transformers": "4.57.1", "kernel": "0.3.21",
                                     "kernel_package": "sgl-kernel", "source": "python/pyproject.toml"}
    assert target["era_chosen_by"] == {
        "basis": "pins", "version_set_aside": None,
        "evidence": "python/pyproject.toml pins torch 2.9.1, transformers 4.57.1, sgl-kernel 0.3.21; era old's "
                    "closure has torch 2.9.1, transformers 4.57.1 (the same torch 2.9; the same transformers 4.57)"}
    assert problems("check", doc) == []
    cli.main(["--root", str(world.root), "check", "--path", str(fork)])
    assert era_line(capsys) == f"  era: old, chosen by its pins: {target['era_chosen_by']['evidence']}"


def test_a_fork_far_past_its_tag_runs_in_the_era_its_pins_choose_and_says_why(world, capsys):
    # SGLang's main as a fork sees it: the nearest tag on its history is an old release, its pins are today's.
    fork = committed(make_fork(world.tmp / "fork", guard=True, tag=None, pins=NEW_PINS), "v0.5.6.post2",
                     past=era_choice.FAR_TAG_COMMITS)
    _, near, _ = run_check(world, capsys, "--path", str(fork))
    assert near["target"]["era"] == "old" and near["target"]["era_chosen_by"]["basis"] == "version"
    assert "; its pins would choose era npu's closure (" in near["target"]["era_chosen_by"]["evidence"]
    git(fork, "commit", "-q", "--allow-empty", "-m", "one more")
    code, far, _ = run_check(world, capsys, "--path", str(fork))
    target = far["target"]
    assert code == errors.CONFIRMED and world.eras == ["old", "npu"]
    assert target["source_version"]["told"].startswith(f"v0.5.6.post2-{era_choice.FAR_TAG_COMMITS + 1}-g")
    assert (target["era"], target["era_chosen_by"]["basis"]) == ("npu", "pins")
    assert target["era_chosen_by"]["version_set_aside"] == (
        f"its nearest version tag v0.5.6.post2 is {era_choice.FAR_TAG_COMMITS + 1} commits behind "
        f"(over {era_choice.FAR_TAG_COMMITS}): the code has moved on from that release")
    assert problems("check", far) == []
    cli.main(["--root", str(world.root), "check", "--path", str(fork)])
    assert era_line(capsys).endswith(f"; version set aside: {target['era_chosen_by']['version_set_aside']}")


def test_a_fork_whose_tags_name_another_component_or_its_own_numbering_runs_by_its_pins(world, capsys):
    fork = committed(make_fork(world.tmp / "fork", guard=True, tag=None, pins=OLD_PINS), "gateway-v0.3.1")
    _, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert doc["target"]["source_version"] is None  # a router's tag is no version of SGLang
    assert (doc["target"]["era"], doc["target"]["era_chosen_by"]["basis"]) == ("old", "pins")
    git(fork, "tag", "v1.2.0")  # the vendor's own product version
    _, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert doc["target"]["source_version"]["version"] == "1.2.0"
    assert (doc["target"]["era"], doc["target"]["era_chosen_by"]["basis"]) == ("old", "pins")
    aside = doc["target"]["era_chosen_by"]["version_set_aside"]
    assert "its tag v1.2.0 names no SGLang release the harness knows" in aside


def test_a_fork_at_a_release_tag_runs_in_that_releases_era_and_says_its_pins_agree(world, capsys):
    fork = committed(make_fork(world.tmp / "fork", guard=True, tag=None, pins=OLD_PINS), "v0.5.8-vendor.1", past=3)
    code, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert code == errors.CONFIRMED and world.eras == ["old"]
    assert doc["target"]["era_chosen_by"] == {
        "basis": "version", "version_set_aside": None,
        "evidence": "version 0.5.8 is in era old (<0.5.10,>=0.5.6) (git describe --tags); its pins agree"}


def test_a_fork_with_no_version_and_no_pins_runs_in_todays_closure_saying_nothing_told_it(world, capsys):
    fork = committed(make_fork(world.tmp / "fork", guard=True, tag=None))
    _, doc, _ = run_check(world, capsys, "--path", str(fork))
    assert (doc["target"]["era"], doc["target"]["source_pins"], world.eras) == (None, None, [None])
    assert doc["target"]["era_chosen_by"]["basis"] == "none"
    cli.main(["--root", str(world.root), "check", "--path", str(fork)])
    assert era_line(capsys) == ("  era: today's closure: no version told and no pyproject.toml pin of torch, "
                                "transformers or the kernel: today's closure")


# --- many targets in one call: each its own identity ----------------------------------------------


def labels_and_answers(docs: list[dict]) -> list[tuple[str, str]]:
    return [(d["target"]["resolved"], d["experiments"][0]["status"]) for d in docs]


def run_dirs(world) -> set[str]:
    return {p.name for p in (world.tmp / "runs" / "check").iterdir()}


def test_two_trees_outside_git_each_get_their_own_name_run_directory_and_answer(world, capsys):
    fixed = make_fork(world.tmp / "fixed", guard=True, tag=None)
    unfixed = make_fork(world.tmp / "unfixed", guard=False, tag=None)
    alone = {tree: labels_and_answers([run_check(world, capsys, "--path", str(tree))[1]])[0]
             for tree in (fixed, unfixed)}
    assert [answer for _, answer in alone.values()] == ["fixed", "affected"]

    code, docs, err = run_check(world, capsys, "--path", str(fixed), "--path", str(unfixed))
    # The same names and answers together as alone, the answers reused from the runs alone.
    assert labels_and_answers(docs) == [alone[fixed], alone[unfixed]]
    assert code == errors.BEHAVIOUR_DIFFERS and "probing" not in err
    assert [d["target"]["ref"] for d in docs] == [str(fixed), str(unfixed)]
    names = {f"path-{resolved}" for resolved, _ in alone.values()}
    assert len(names) == 2 and run_dirs(world) == names
    assert [d["target"]["sha256"] for d in docs] == [trees.content_digest(t / "python") for t in (fixed, unfixed)]
    assert len(list((world.tmp / "work" / "outcomes").iterdir())) == 2  # one cache entry each
    assert problems("check", docs[0]) == []
    cli.main(["--root", str(world.root), "check", "--path", str(fixed)])
    assert check_header(capsys).startswith(f"sglang check: path {fixed} (outside git, content {alone[fixed][0][6:]}):")


def test_two_work_trees_of_one_head_with_different_changes_each_get_their_own_answer(world, capsys):
    main = make_fork(world.tmp / "main", guard=True)
    other = world.tmp / "other"
    git(main, "worktree", "add", "-q", "--detach", str(other), "HEAD")
    init = "python/sglang/__init__.py"
    (main / init).write_text((main / init).read_text() + "# a comment: still fixed\n")
    (other / init).write_text((other / init).read_text().replace("GUARD = True", "GUARD = False"))
    head = git(main, "rev-parse", "HEAD")
    assert git(other, "rev-parse", "HEAD") == head

    code, docs, err = run_check(world, capsys, "--path", str(main), "--path", str(other))
    (one, fixed), (two, affected) = labels_and_answers(docs)
    assert (fixed, affected) == ("fixed", "affected") and code == errors.BEHAVIOUR_DIFFERS
    assert one != two and one.startswith(f"{head}-dirty-") and two.startswith(f"{head}-dirty-")
    assert run_dirs(world) == {f"path-{head[:12]}-dirty-{one.rsplit('-', 1)[1]}",
                               f"path-{head[:12]}-dirty-{two.rsplit('-', 1)[1]}"}
    for tree, answer in ((other, "affected"), (main, "fixed")):  # alone, in the other order: the same answers
        assert run_check(world, capsys, "--path", str(tree))[1]["experiments"][0]["status"] == answer


def test_the_same_tree_given_twice_is_probed_once_and_answered_for_each(world, capsys):
    fork = make_fork(world.tmp / "fork", guard=True, tag=None)
    loose = make_fork(world.tmp / "loose", guard=False, tag=None)
    code, docs, err = run_check(world, capsys, "--path", str(fork), "--path", str(loose), "--path", str(fork),
                                "--path", str(loose))
    assert [answer for _, answer in labels_and_answers(docs)] == ["fixed", "affected", "fixed", "affected"]
    assert docs[0] == docs[2] and docs[1] == docs[3]
    probing = [line for line in err.splitlines() if "probing" in line]  # a source tree gets an engine of its own
    assert sum(line.count("path-") for line in probing) == 2 and len(run_dirs(world)) == 2
