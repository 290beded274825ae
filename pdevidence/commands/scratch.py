"""The scratch directories every command enters, and what dead runs left there."""

from __future__ import annotations

from pathlib import Path

from ..core import debris, paths
from ..core.errors import HarnessError
from ..core.paths import runs_dir, work_dir
from ..lanes import cache as caches


def enter_scratch(root: Path) -> None:
    """This run is in the cache, the work directory and the runs of the project at ``root`` from now on; what dead
    runs left there goes first (core/debris.py). Every command enters all three: a run writing in one it did not
    enter could have its temporaries taken for a dead run's."""
    cache, work, runs = paths.cache_dir(), work_dir(root), runs_dir(root)
    places = {**caches.places(cache, work), runs: [debris.Place(d, caches.LEFTOVERS)
                                                  for d in (runs, runs / "check", runs / "sweep", runs / "mutate")]}
    for scratch, inside in places.items():
        try:
            debris.enter(scratch, inside)
        except OSError as exc:
            raise HarnessError(f"cannot work in {exc.filename or scratch}: {exc.strerror}",
                               expected="a cache, work and runs directory this user can write",
                               todo="fix its permissions, or point PDEVIDENCE_CACHE, PDEVIDENCE_WORK and "
                               "PDEVIDENCE_RUNS at directories you can write") from None
    caches.remove_old_bytecode(cache)
