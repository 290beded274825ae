"""Differential probe for experiment swa_tail: a decode preallocation over recycled full pages (PR #25805).

On a PD decode server with a hybrid sliding-window pool and page size > 1, SGLang's real
``DecodePreallocQueue._pre_alloc`` allocates a transferred request's full KV for its whole prompt and SWA KV
only for the window's tail (``SWATokenToKVPoolAllocator.alloc_extend_swa_tail``). Before the fix the full
slots outside the tail kept whatever ``full_to_swa_index_mapping`` said before: a full page recycled from a
speculative (MTP) draft, whose allocation the allocator's ``restore_state`` took back without clearing its
mapping, still named an SWA page, often the one the tail then got. When the window slid past those slots,
``free_swa`` gave that page back under the live request; the next allocation got it too, and the request's
finish freed it again. The fix clears the mapping of the slots outside the tail. How the pool and allocator
are built and observed, and the one kernel answered by its module's CPU implementation: ``_swa.py``'s docstring.

Page size 4, 32 full and 32 SWA slots, a sliding window of 4 tokens. Each scenario is a script (``SCRIPTS``):
the requests (``B`` decoding, ``X`` transferred and preallocated, ``Y`` a later one) and the steps a decode
server takes with them, in order, and where it observes which keys. Scenarios:

- T1 a draft step of ``B`` (allocated and taken back), then ``X``'s preallocation (8 tokens, tail 4);
- T2 T1, then the window slides past ``X``'s first page (``free_swa`` of its slots outside the tail);
- T3 T2, then ``Y`` allocates a page, ``X`` finishes, then ``Y`` finishes;
- T4 control: ``X``'s preallocation and window slide on a pool no draft touched;
- T5 control: page size 1 (the preallocation allocates SWA for every token; T3's steps but the slide: from
  0.5.23 a ``free`` of slots whose SWA peer was already freed is outside the allocator's contract at page
  size 1, its callers use ``free_full`` there);
- T6 control: a model without sliding-window layers (one paged allocator): T3's steps.

Keys: ``swa_taken`` (SWA slots ``X``'s preallocation took), ``swa_mapped`` (``X``'s full slots whose mapping
names an SWA slot), ``live_in_free`` (SWA pages in the free lists that a live request's mapping names: given
back under it), ``live_page_reissued`` (SWA pages handed out while another live request's mapping named
them), ``double_freed`` (SWA pages in the free lists twice), ``swa_free`` / ``full_free`` (free slots),
``free_refused`` (``AssertionError`` where ``free``'s own check found more free slots than the pool has, else
null). Tree facts (recorded by every scenario, the controls' too: they control the paged decode path):
``swa_allocator: "absent"``, ``swa_pool: "abstract"``, ``paged_swa: "absent"`` (``_swa.py``), ``tail_prealloc:
"absent"`` (the tree's preallocation took SWA slots for every token of the prompt: no tail allocation, up to
0.5.11); ``draft_restore: "absent"`` (the tree's allocator has no ``backup_state``/``restore_state``, from
0.5.17: its drafts' pages come back by ``free``, which the draft steps then take; whether a recycled page
still names an SWA page is then what ``free`` left, observed by the same keys).

    python probes/probe_swa_tail_differential.py --side head --tree-kind release --tree-ref 0.5.13
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

SCENARIOS = ScenarioSet("swa_tail")
PROMPT = 8
WINDOW = 4  # tail: the last page

MEASURES: dict[str, Callable[[World], Any]] = {
    "swa_mapped": lambda w: w.swa_mapped("X"),
    "live_in_free": World.live_in_free,
    "live_page_reissued": lambda w: w.reissued,
    "double_freed": World.double_freed,
    "swa_free": World.swa_free,
    "full_free": World.full_free,
}
observe = observer(MEASURES)


class TailAbsent(Exception):
    """The tree's preallocation took SWA slots for the whole prompt: it has no tail allocation."""


@dataclass(frozen=True)
class Draft:
    """A speculative draft step of live request ``name``: ``tokens`` slots allocated, then given back (the
    allocator's state restored, or, where it keeps none, the slots freed)."""
    name: str
    tokens: int = 4

    def run(self, world: World, observed: Observed) -> None:
        if not world.draft(self.name, self.tokens):
            observed["draft_restore"] = "absent"


@dataclass(frozen=True)
class PreAlloc:
    """The decode server preallocates transferred request ``name`` (``PROMPT`` tokens, window ``WINDOW``);
    ``swa_taken`` is recorded, and a tree that took SWA for every token records ``tail_prealloc: "absent"``
    (where the tail is the whole prompt, page size 1 or no SWA pool, nothing is concluded)."""
    name: str = "X"
    concludes: bool = True

    def run(self, world: World, observed: Observed) -> None:
        observed["swa_taken"] = taken = world.pre_alloc(self.name, PROMPT, WINDOW)
        if self.concludes and taken == PROMPT:
            observed["tail_prealloc"] = "absent"
            raise TailAbsent


@dataclass(frozen=True)
class Slide:
    """The window slides past request ``name``'s first ``stop`` slots: ``free_swa`` of them."""
    name: str = "X"
    stop: int = PROMPT - WINDOW

    def run(self, world: World, observed: Observed) -> None:
        if world.swa:
            world.free_swa(self.name, 0, self.stop)


RECYCLED = (Alloc("B", 4), Draft("B"), PreAlloc(), observe("swa_mapped", "live_in_free"))
SLID = RECYCLED + (Slide(), observe("live_in_free", "swa_free", suffix="_after_slide"))
FINISHED = (Alloc("Y", 4), observe("live_page_reissued"), Finish("X"), observe("live_in_free", suffix="_after_x"),
            Finish("Y"), observe("double_freed", "swa_free", "full_free"))
SCRIPTS = (
    Script("T1", "a draft step taken back, then a preallocation over its recycled page", RECYCLED),
    Script("T2", "T1, then the window slides past the preallocated request's first page", SLID),
    Script("T3", "T2, then a new request allocates a page, the preallocated one finishes, then the new one",
           SLID + FINISHED),
    Script("T4", "control: a preallocation and window slide on a pool no draft touched", (
        Alloc("B", 4), PreAlloc(), observe("swa_mapped", "live_in_free"),
        Slide(), observe("live_in_free", "swa_free", suffix="_after_slide"))),
    Script("T5", "control: page size 1, T3's steps but the slide", (
        Alloc("B", 4), Draft("B"), PreAlloc(concludes=False)) + FINISHED, page=1),
    Script("T6", "control: a model without sliding-window layers, T3's steps", (
        Alloc("B", 4), Draft("B"), PreAlloc(concludes=False)) + FINISHED, swa=False),
)


def prepare() -> str:
    return _swa.prepare(SCENARIOS, decode=True)


def play(script: Script, observed: Observed) -> None:
    """Record the tree's facts; where it has the hybrid paged pool the decode path needs (the controls too: they
    are the path's controls), run the script on a fresh world."""
    if not tree_facts(observed) or not tree_facts(observed, swa=script.swa):
        return
    world = World(page=script.page, swa=script.swa)
    try:
        for step in script.steps:
            step.run(world, observed)
    except TailAbsent:
        return


for _script in SCRIPTS:
    SCENARIOS.scenario(_script.id, _script.title)(functools.partial(play, _script))


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
