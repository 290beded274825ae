"""Differential probe for experiment retract_resume: a resumed request reads another request's metadata (PR #23346).

On a PD decode server, a transfer's first-token metadata (output id, speculative top-k, hidden states that seed
speculative decoding) lands in a slot of ``MetadataBuffers``; ``DecodeTransferQueue`` commits it to the request
with ``get_buf(idx)`` and gives the slot back. ``get_buf`` returned views into the slot, so a request that reads
its top-k and hidden states later (resumed after a retraction, or still waiting to run) read whatever the next
request's transfer wrote there. The fix returns copies. It also offloads an NSA/DSA pool's index keys with a
retracted request's KV (before, the KV only: the resumed request's pages held the index keys of the request that
took them meanwhile). How the worlds are built and driven, and the stand-ins: ``_retract.py``'s and
``_index_keys.py``'s docstrings.

Request n's transfer carries output id ``11 * n``, top-k indices ``n`` and hidden states ``n``. Metadata slots: one
(so the next request takes the slot just given back) unless a scenario says two. A request admitted with no slot
free waits, as the tree's prealloc queue leaves it: its transfer never starts. Each scenario is a script
(``SCRIPTS``): the steps a decode worker takes with requests A and B, then which keys of A it reads (the hidden
states and the top-k apart, so a copy of one of them only reads partial) and the slots left free. Scenarios:

- M1 A committed, retracted; B takes A's slot and is committed; A resumed: its hidden states and output id;
- M1k as M1: its top-k;
- M1w as M1, but B's transfer has only landed in the slot (not committed) when A resumes;
- M2 A committed; B takes the slot and is committed while A waits; then A retracted and resumed;
- M3 A committed; B's transfer lands in the slot while A still waits to run (no retraction): a late read;
- M4 control: A committed, retracted and resumed, no other request (every key, as the controls below);
- M5 control: two slots: B takes the other one, is committed; A retracted and resumed;
- M6 control: M1 on a server without speculative decoding (no top-k or hidden states held);
- I1 (the index-key half, on the tree's NSA/DSA pool and allocator: ``_index_keys.py``'s docstring) A's forward
  writes its KV and index keys, A retracted (both offloaded, its pages given back); B takes A's pages, writes its
  own and finishes; A resumed on those pages;
- I2 control: as I1 without B (the pages not reused).

Keys (whose transfer what A holds came from: ``own``, ``other``, ``none`` when A holds nothing, ``neither`` for a
value no transfer carried): ``hidden_owner`` (its hidden states), ``topk_owner`` (its top-k indices),
``topk_p_owner`` (its top-k probabilities), ``output_id_owner`` (its last output id). And ``slots_free``: the
slots ``ReqToMetadataIdxAllocator`` has free once the script ran, every committed request's given back (1; 2 of
M5's two; 0 in M1w and M3, whose B has landed but is not committed), alike on base and head: a slot never given
back lowers it. I1 and I2 read whose forward wrote what A's pages hold once resumed (``own``, ``other``, ``none``
never written, ``neither``): ``index_owner`` (its index keys), ``kv_owner`` (its latent KV, offloaded on every
tree), and ``allocator_path``: ``ok``, or ``raised TypeError`` where the retraction's offload through the tree's
allocator raised (the scenario then offloads through the pool's own methods). Tree facts:
``metadata_buffers: "absent"`` (the tree keeps no ``MetadataBuffers`` with ``get_buf``/``set_buf``), recorded in
every M scenario; ``nsa_pool: "absent"`` (no NSA/DSA pool, before 0.5.3), recorded in I1 and I2.

    python probes/probe_retract_resume_differential.py --side head --tree-kind release --tree-ref 0.5.12
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _index_keys  # noqa: E402
import _retract  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402
from _retract import World  # noqa: E402

SCENARIOS = ScenarioSet("retract_resume")
HIDDEN = ("hidden_owner", "output_id_owner")
TOPK = ("topk_owner", "topk_p_owner")
KEYS = HIDDEN + TOPK

# One step of a script: a method of World and the request it acts on.
Step = tuple[Callable[[World, str], None], str]
ADMIT, LAND, COMMIT = World.admit, World.land, lambda world, name: world.commit()
RETRACT, RESUME = World.retract, World.resume


def commit(name: str) -> tuple[Step, ...]:
    """A request admitted, its transfer landed and committed."""
    return (ADMIT, name), (LAND, name), (COMMIT, name)


@dataclass(frozen=True)
class Script:
    """A scenario: ``steps`` on a world of ``slots`` metadata slots, then ``keys`` of what A holds."""
    id: str
    title: str
    steps: tuple[Step, ...]
    keys: tuple[str, ...] = HIDDEN
    slots: int = 1
    speculative: bool = True


SCRIPTS = (
    Script("M1", "retracted, the slot reused by the next request, then resumed: hidden states",
           (*commit("A"), (RETRACT, "A"), *commit("B"), (RESUME, "A"))),
    Script("M1k", "retracted, the slot reused by the next request, then resumed: top-k",
           (*commit("A"), (RETRACT, "A"), *commit("B"), (RESUME, "A")), keys=TOPK),
    Script("M1w", "retracted, the next transfer lands in the slot (not committed), then resumed",
           (*commit("A"), (RETRACT, "A"), (ADMIT, "B"), (LAND, "B"), (RESUME, "A"))),
    Script("M2", "the slot reused while the request waits, then retracted and resumed",
           (*commit("A"), *commit("B"), (RETRACT, "A"), (RESUME, "A"))),
    Script("M3", "a late read: the next transfer lands in the slot while the request waits to run",
           (*commit("A"), (ADMIT, "B"), (LAND, "B"))),
    Script("M4", "control: retracted and resumed, the slot not reused",
           (*commit("A"), (RETRACT, "A"), (RESUME, "A")), keys=KEYS),
    Script("M5", "control: two slots, the next request takes the other one",
           (*commit("A"), *commit("B"), (RETRACT, "A"), (RESUME, "A")), keys=KEYS, slots=2),
    Script("M6", "control: as M1 without speculative decoding",
           (*commit("A"), (RETRACT, "A"), *commit("B"), (RESUME, "A")), keys=KEYS, speculative=False),
)


def prepare() -> str:
    import sglang

    _retract.prepare(SCENARIOS.adapted)
    return sglang.__version__


def play(script: Script, observed: Observed) -> None:
    """Record the tree's facts; where it has metadata buffers, run the script, read what A holds and the slots
    left free."""
    if _retract.sg.ready and _retract.metadata_buffers_absent():
        observed["metadata_buffers"] = "absent"
        return
    world = World(slots=script.slots, speculative=script.speculative)
    for step, name in script.steps:
        step(world, name)
    observed.update({key: getattr(world, key)("A") for key in script.keys})
    observed["slots_free"] = world.slots_free()


for _script in SCRIPTS:
    SCENARIOS.scenario(_script.id, _script.title)(functools.partial(play, _script))


# The index-key half: steps of ``_index_keys.World`` on requests A and B, then whose KV and index keys A holds.
IndexStep = tuple[Callable[[_index_keys.World, str], None], str]
INDEX_SCRIPTS: dict[str, tuple[str, tuple[IndexStep, ...]]] = {
    "I1": ("NSA/DSA: retracted, its pages reused by the next request, then resumed: whose index keys it holds",
           ((_index_keys.World.admit, "A"), (_index_keys.World.retract, "A"), (_index_keys.World.admit, "B"),
            (_index_keys.World.release, "B"), (_index_keys.World.resume, "A"))),
    "I2": ("control: NSA/DSA: retracted and resumed, its pages not reused",
           ((_index_keys.World.admit, "A"), (_index_keys.World.retract, "A"), (_index_keys.World.resume, "A"))),
}


def play_index(steps: tuple[IndexStep, ...], observed: Observed) -> None:
    """Record the tree's facts; where it has an NSA/DSA pool, run the steps and read what A holds."""
    if not _retract.sg.ready:
        raise _retract.CannotDrive(_retract.sg.missing or "the tree's decode side was not prepared")
    if _index_keys.pool_class() is None:
        observed["nsa_pool"] = "absent"
        return
    with _index_keys.single_threaded():
        world = _index_keys.World(SCENARIOS.adapted)
        for step, name in steps:
            step(world, name)
        observed.update(index_owner=world.index_owner("A"), kv_owner=world.kv_owner("A"),
                        allocator_path=world.allocator_path)


for _sid, (_title, _steps) in INDEX_SCRIPTS.items():
    SCENARIOS.scenario(_sid, _title)(functools.partial(play_index, _steps))


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
