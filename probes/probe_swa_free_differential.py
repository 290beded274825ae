"""Differential probe for experiment swa_free: a paged SWA free that leaves its page's siblings mapped (PR #27779).

With a hybrid sliding-window pool and page size > 1, SGLang's real ``SWATokenToKVPoolAllocator.free_swa`` gave
back whole SWA pages (its paged SWA allocator frees by page) but cleared ``full_to_swa_index_mapping`` only for
the full slots it was given: the page's other slots still named it, so a later ``free_swa`` or ``free`` of a
sibling slot freed the page again, and the next allocations handed that one page to two requests. The fix
clears the mapping of every slot of each page it frees. How the pool and allocator are built and observed, and
the one kernel answered by its module's CPU implementation: ``_swa.py``'s docstring.

Page size 4, 32 full and 32 SWA slots. Each scenario is a script (``SCRIPTS``): the requests (``A``, ``B``,
``C``) a scheduler allocates and frees, in order, and where it observes which keys. Scenarios:

- F1 the PR's case: one page allocated, ``free_swa`` of its first slot, then of its second;
- F2 ``free_swa`` of a request's first slot (a window slide), then the request finishes (``free``);
- F3 F1's double free, then two new requests allocate a page each: the page freed twice goes to both;
- F4 control: ``free_swa`` of a whole page, then the request finishes;
- F5 control: page size 1 (F1 at slot granularity; not F2: from 0.5.23 a ``free`` of slots whose SWA peer
  was already freed is outside the allocator's contract at page size 1, its callers use ``free_full`` there);
- F6 control: a model without sliding-window layers (one paged allocator, no SWA pool): a request
  allocated and freed, then another.

Keys: ``swa_free`` / ``full_free`` (free slots of the SWA / full allocator after the step), ``double_freed``
(SWA pages in the free lists twice), ``stale_mapping`` (A's full slots whose mapping names an SWA slot of a
free page), ``live_page_reissued`` (SWA pages handed out while another live request's mapping named them),
``free_refused`` (``AssertionError`` where ``free``'s own check found more free slots than the pool has, after
freeing; else null).
Tree facts: ``swa_allocator: "absent"`` (no hybrid SWA allocator), ``swa_pool: "abstract"`` (its SWA pool cannot
be built: 0.4.9.post1-post2), ``paged_swa: "absent"`` (its SWA allocator is token-granular); F6: ``paged_allocator: "absent"`` (no paged allocator or MHA pool where the probe looks),
``paged_alloc: "absent"`` (its paged allocator has no page-aligned ``alloc``: up to 0.4.4.post3).

    python probes/probe_swa_free_differential.py --side head --tree-kind release --tree-ref 0.5.14
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _swa  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402
from _swa import Alloc, Finish, Script, World, observer, tree_facts  # noqa: E402

SCENARIOS = ScenarioSet("swa_free")

# What a scenario observes, by key (see the docstring): each read from the world at the step that names it.
MEASURES: dict[str, Callable[[World], Any]] = {
    "swa_free": World.swa_free,
    "full_free": World.full_free,
    "double_freed": World.double_freed,
    "stale_mapping": lambda w: w.stale_mapping("A"),
    "live_page_reissued": lambda w: w.reissued,
}
observe = observer(MEASURES)


@dataclass(frozen=True)
class FreeSwa:
    """``free_swa`` of request ``name``'s full slots ``start:stop`` (the window slid past them)."""
    name: str
    start: int
    stop: int

    def run(self, world: World, observed: Observed) -> None:
        world.free_swa(self.name, self.start, self.stop)


TOTALS = ("swa_free", "full_free", "double_freed")
SCRIPTS = (
    Script("F1", "one page, free_swa of its first slot, then of its second (the PR's case)", (
        Alloc("A", 4), FreeSwa("A", 0, 1), observe("swa_free", "stale_mapping", suffix="_first"),
        FreeSwa("A", 1, 2), observe("swa_free", "double_freed"))),
    Script("F2", "free_swa of a request's first slot, then the request finishes", (
        Alloc("A", 8), FreeSwa("A", 0, 1), observe("stale_mapping"), Finish("A"), observe(*TOTALS))),
    Script("F3", "a page freed twice, then two new requests allocate a page each", (
        Alloc("A", 4), FreeSwa("A", 0, 1), FreeSwa("A", 1, 2), Alloc("B", 4), Alloc("C", 4),
        observe("live_page_reissued", "double_freed", "swa_free"))),
    Script("F4", "control: free_swa of a whole page, then the request finishes", (
        Alloc("A", 8), FreeSwa("A", 0, 4), observe("stale_mapping"), Finish("A"), observe(*TOTALS))),
    Script("F5", "control: page size 1, free_swa of a request's first slot, then of its second", (
        Alloc("A", 4), FreeSwa("A", 0, 1), observe("swa_free", "stale_mapping", suffix="_first"),
        FreeSwa("A", 1, 2), observe("swa_free", "double_freed")), page=1),
    Script("F6", "control: a model without sliding-window layers, a request allocated and freed, then another", (
        Alloc("A", 8), Finish("A"), observe("full_free", "double_freed", suffix="_after_free"),
        Alloc("B", 8), observe("full_free", "double_freed", "live_page_reissued")), swa=False),
)


def prepare() -> str:
    return _swa.prepare(SCENARIOS)


def play(script: Script, observed: Observed) -> None:
    """Record the tree's facts; where it has what the script drives, run it on a fresh world."""
    if not tree_facts(observed, swa=script.swa, paged=script.page > 1):
        return
    world = World(page=script.page, swa=script.swa)
    for step in script.steps:
        step.run(world, observed)


for _script in SCRIPTS:
    SCENARIOS.scenario(_script.id, _script.title)(functools.partial(play, _script))


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
