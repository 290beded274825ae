"""The registry's first PD release, held to the wheels PyPI serves (each verified as a release tree is)."""

from __future__ import annotations

import pytest
from packaging.version import Version

from pdevidence import registry
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.lanes import sweep
from pdevidence.sources import pd_release, trees

# 0.4.0 is older than any PD work; every release from there to the declared first one is read.
SINCE = "0.4.0"


@pytest.mark.sglang
def test_pd_first_release_is_the_oldest_wheel_that_ships_both_doors():
    """Alone proves: the registry's first PD release and release floor are what the wheels PyPI serves hold
    (read from the wheels, no probe run)."""
    reg = registry.load(PROJECT)
    lock = trees.LockFile(tree_lock_file(PROJECT))
    first = Version(reg.pd_first_release)
    window = [v for v in sweep.releases(trees.index_files("sglang"), reg.python, SINCE) if Version(v) <= first]
    assert len(window) > 5 and window[-1] == reg.pd_first_release  # post-releases included: a real decision
    assert pd_release.first_pd_release(window, reg.python, lock) == reg.pd_first_release
    before = [v for v in window if Version(v) < first]
    assert before[-1] == reg.release_floor  # the sweep starts at the last release without it
