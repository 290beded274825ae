"""A fork's source tree on real SGLang: checked unbuilt, it behaves as the release it was cut from.

Slow (``--sglang``): a release wheel is laid out as a fork's checkout (``python/sglang/``, no
``_version.py`` and no dist-info, as a source tree has none; a ``pyproject.toml`` whose
dependencies are the wheel's own ``Requires-Dist``; a ``setup.py`` that fails as a build needing
cargo does) and tagged as forks are: a tag setuptools-scm cannot parse, no tag at all, or an old
release's tag thousands of commits back (SGLang's main). The warm engine probes it and the release
in one call; the fork must run in the release's era, every scenario's observations and errors the same.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from test_era_choice import RELEASE_PINS
from test_forks import committed

from pdevidence import environments, registry
from pdevidence.cells import warm
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.lanes import check
from pdevidence.sources import era_choice, pins, trees
from pdevidence.sources.era_choice import Basis
from real_runs import answer_known

pytestmark = pytest.mark.sglang

VERSION = "0.5.21"


def pyproject_of(wheel: Path) -> str:
    """A source tree's ``pyproject.toml`` for the wheel: its Requires-Dist, each extra's as an optional group."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    dependencies, groups = [], {}
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        extra = re.search(r'extra == "([^"]+)"', str(requirement.marker or ""))
        (groups.setdefault(extra[1], []) if extra else dependencies).append(f"{requirement.name}{requirement.specifier}")
    listed = "".join(f"{json.dumps(group)} = {json.dumps(items)}\n" for group, items in groups.items())
    return (f'[project]\nname = "sglang"\ndynamic = ["version"]\ndependencies = {json.dumps(dependencies)}\n\n'
            f"[project.optional-dependencies]\n{listed}")


def lay_out_fork(release: trees.Tree, fork: Path, tag: str | None, past: int = 0) -> Path:
    """The release's wheel as a fork's checkout, committed; ``tag`` on the first commit, ``past`` commits after."""
    with zipfile.ZipFile(release.install_target) as wheel:
        wheel.extractall(fork / "python")
    for built in [fork / "python" / "sglang" / "_version.py", *(fork / "python").glob("*.dist-info")]:
        shutil.rmtree(built) if built.is_dir() else built.unlink()
    (fork / "python" / "pyproject.toml").write_text(pyproject_of(release.install_target))
    (fork / "python" / "setup.py").write_text('raise SystemExit("error: could not find `cargo`")\n')
    return committed(fork, tag, past)


# (release, its fork's tag, commits past the tag, what the era is chosen by)
FORKS = [
    (VERSION, f"v{VERSION}-fork.rc1", 0, Basis.VERSION),  # a tag setuptools-scm cannot parse
    # Forks of releases outside the bracket releases' eras build theirs: the scheduled lane's.
    pytest.param("0.5.8", None, 0, Basis.PINS,  # a snapshot without tags: it used to run in today's closure
                 marks=pytest.mark.scheduled),
    # SGLang's main as a fork sees it: its nearest tag on main is thousands of commits back, in an era whose
    # transformers 4 lacks what 0.5.10 imports (PreTrainedConfig); its pins choose torch2.9-tf5.
    pytest.param("0.5.10", "v0.5.6.post2", 7527, Basis.PINS, marks=pytest.mark.scheduled),
]


@pytest.mark.parametrize(("version", "tag", "past", "basis"), FORKS)
def test_a_fork_of_a_release_checked_from_its_source_tree_behaves_as_the_release(tmp_path, monkeypatch, version,
                                                                                 tag, past, basis):
    """Alone proves: a fork's unbuilt source tree, however it is tagged, runs in its release's era (by its
    version, else by its pins) and every probe observes on it what it observes on the release."""
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    reg = registry.load(PROJECT)
    release = trees.release_tree(version, reg.python, trees.LockFile(tree_lock_file(reg.root)))
    source = trees.path_tree(lay_out_fork(release, tmp_path / "sglang-fork", tag, past))
    chosen = era_choice.choose(reg, source)
    assert chosen.basis is basis, chosen.describe()
    era = environments.era_of(reg, release)
    assert chosen.name == (era.name if era else None), chosen.describe()

    names = list(reg.experiments)
    found = warm.probe_trees(reg, [release, source], names,
                             {t.label(): check._tree_args(t) for t in (release, source)},
                             out_dir=tmp_path / "check", force=True, log=lambda msg: None)
    for name in names:
        ours, theirs = found[source.label()][name].doc, found[release.label()][name].doc
        if not answer_known(name, version) and ours is None and theirs is None:
            continue  # an offload probe on a release nobody read may not run on it: alike on both, all it can show
        assert ours is not None and theirs is not None, (found[source.label()][name].error,
                                                         found[release.label()][name].error)
        if not answer_known(name, version):  # a scenario's error may name the tree's own path: its kind must agree
            ours, theirs = ({**doc, "scenarios": {sid: {**sc, "error": error_kind(sc["error"])}
                                                  for sid, sc in doc["scenarios"].items()}} for doc in (ours, theirs))
        for key in ("scenarios", "adaptations", "stand_ins"):
            assert json.dumps(ours.get(key), sort_keys=True) == json.dumps(theirs.get(key), sort_keys=True), \
                (name, key)


def error_kind(error):
    """A scenario's error without what may name the tree's path: its type (a structured error's, or a message's
    text before its first colon)."""
    if isinstance(error, dict):
        return error.get("type")
    return error and error.split(":")[0]


@pytest.mark.scheduled  # every pinned release's wheel (dozens, downloaded): the registry's data, not a bracket
def test_every_pinned_releases_own_requirements_choose_the_era_its_version_is_in():
    """Alone proves: what ``test_era_choice.RELEASE_PINS`` states (the fast tests' era choice by pins), read
    again from each pinned release's wheel; a pinned release it does not name states no pins (the oldest, up to
    0.4.3.post2: their era is chosen by version alone)."""
    reg = registry.load(PROJECT)
    lock = trees.LockFile(tree_lock_file(reg.root))
    versions = sorted((key.partition("==")[2] for key in lock.pinned_keys("sglang")), key=Version)
    assert versions, "the tree lock pins no release"
    for version in versions:
        release = trees.release_tree(version, reg.python, lock)
        package = Path(tempfile.mkdtemp())
        (package / "pyproject.toml").write_text(pyproject_of(release.install_target))
        found = pins.read(package, package)
        shutil.rmtree(package)
        if version not in RELEASE_PINS:
            assert found is None, f"{version} states pins: name them in test_era_choice.RELEASE_PINS"
            continue
        assert found is not None, version
        torch, transformers, kernel_package, kernel = RELEASE_PINS[version]
        assert (found.torch, found.transformers, found.kernel_package, found.kernel) == \
            (torch, transformers, kernel_package, kernel), version
