"""The registry's first PD release, held to the wheels PyPI serves (each verified as a release tree is).

A tree has PD disaggregation as the probes decide it (``_probekit.lacks_pd``): it holds the package
``PD_PACKAGE``. Here that one definition is read from each wheel's file list instead of an import.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from pdevidence import registry
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.lanes import sweep
from pdevidence.sources import trees

# 0.4.0 is older than any PD work; every release from there to the declared first one is read.
SINCE = "0.4.0"


def probekit_constant(name: str) -> str:
    """A literal of probes/_probekit.py, read without importing the kit (it is the cell's, not the harness's)."""
    tree = ast.parse((PROJECT / "probes" / "_probekit.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets))


def ships_pd(wheel: Path) -> bool:
    package = probekit_constant("PD_PACKAGE").replace(".", "/") + "/"
    with zipfile.ZipFile(wheel) as archive:
        return any(name.startswith(package) for name in archive.namelist())


@pytest.mark.sglang
def test_pd_first_release_is_the_oldest_wheel_that_holds_the_package_the_probes_look_for():
    """Alone proves: the registry's first PD release and release floor are what the wheels PyPI serves hold
    (read from the wheels, no probe run)."""
    reg = registry.load(PROJECT)
    lock = trees.LockFile(tree_lock_file(PROJECT))
    first = Version(reg.pd_first_release)
    window = [v for v in sweep.releases(trees.index_files("sglang"), reg.python, SINCE) if Version(v) <= first]
    assert len(window) > 5 and window[-1] == reg.pd_first_release  # post-releases included: a real decision
    shipping = [v for v in window if ships_pd(trees.release_tree(v, reg.python, lock).install_target)]
    assert shipping == [reg.pd_first_release]
    before = [v for v in window if Version(v) < first]
    assert before[-1] == reg.release_floor  # the sweep starts at the last release without it
