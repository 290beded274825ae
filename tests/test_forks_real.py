"""A fork's source tree on real SGLang: checked unbuilt, it behaves as the release it was cut from.

Slow (``--sglang``): the 0.5.21 wheel is laid out as a fork's checkout (``python/sglang/``,
no ``_version.py`` and no dist-info, as a source tree has none; a tag setuptools-scm cannot
parse; a ``setup.py`` that fails as a build needing cargo does). The warm engine probes it and
the release in one call; every scenario's observations and errors must be the same, typed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile

import pytest

from pdevidence import registry
from pdevidence.cells import warm
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.lanes import check
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

VERSION = "0.5.21"


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "init.defaultBranch=main", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_fork_of_a_release_checked_from_its_source_tree_behaves_as_the_release(tmp_path, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    reg = registry.load(PROJECT)
    release = trees.release_tree(VERSION, reg.python, trees.LockFile(tree_lock_file(reg.root)))
    fork = tmp_path / "sglang-fork"
    with zipfile.ZipFile(release.install_target) as wheel:
        wheel.extractall(fork / "python")
    for built in [fork / "python" / "sglang" / "_version.py", *(fork / "python").glob("*.dist-info")]:
        shutil.rmtree(built) if built.is_dir() else built.unlink()
    (fork / "python" / "setup.py").write_text('raise SystemExit("error: could not find `cargo`")\n')
    git(fork, "init", "-q")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "fork")
    git(fork, "tag", f"v{VERSION}-fork.rc1")
    source = trees.path_tree(fork)
    assert (source.version.version, source.version.local) == (VERSION, "fork.rc1")

    names = list(reg.experiments)
    found = warm.probe_trees(reg, [release, source], names,
                             {t.label(): check._tree_args(t) for t in (release, source)},
                             out_dir=tmp_path / "check", force=True, log=lambda msg: None)
    for name in names:
        ours, theirs = found[source.label()][name].doc, found[release.label()][name].doc
        assert ours is not None and theirs is not None, (found[source.label()][name].error,
                                                         found[release.label()][name].error)
        for key in ("scenarios", "adaptations", "stand_ins"):
            assert json.dumps(ours.get(key), sort_keys=True) == json.dumps(theirs.get(key), sort_keys=True), key
