"""Differential probe for experiment offload_slots: KV slots given back under a decoding request (PR #24226).

With decode-side KV offload on, SGLang's real ``DecodeKVCacheOffloadManager`` gave a request's
prefill-aligned KV slots back to the allocator on its first incremental offload, while the request
still decoded and attended to them (a concurrent prefill could reuse them), and an acknowledged
chunk's slots while decoding too; at finish, the first acknowledgement released the request's
slots while a later device-to-host copy was still reading some of them. The fix frees every slot
in ``_release_finished_req`` only, once the request's in-flight copies (``offload_inflight``) have
drained. How the manager is built and driven, and the stand-ins: ``_offload.py``'s docstring.

Page size 4; a request's slot at row position ``p`` is ``100 * (row + 1) + p``. Each scenario is a script
(``SCRIPTS``): one request and the steps the decode worker takes with it, and where it observes which keys.
Scenarios:

- O1 incremental offload while decoding (10-token prompt: 8 prefill-aligned slots; three decode
  steps write positions 8-11), then that copy lands while the request still decodes;
- O2 finish with two copies in flight (one written while decoding, one at finish), then the first
  acknowledgement, then the second;
- O3 finish after the acknowledgements (no copy in flight at finish);
- O4 an abort while a copy is in flight, then its acknowledgement;
- O5 a radix-owned prefix (the first 4 slots matched from the tree): what goes back while decoding;
- O6 a request with no output yet (aborted at once): control;
- O7 a prompt shorter than a page (nothing prefill-aligned): control.

Keys (counts of slots unless named otherwise): ``offload_written`` (copies written),
``freed_while_decoding`` / ``freed_on_ack_while_decoding`` / ``freed_at_finish`` (slots given back by
that step), ``live_freed`` (given back while still in an unfinished request's ``req_to_token``
row: the reuse window), ``in_flight_freed`` (given back while a copy not yet acknowledged still
reads them), ``row_released_in_flight`` (the request's row released with such a copy),
``freed_total``, ``double_freed``, ``rows_released``, ``radix_freed_while_decoding``,
``manager_error`` (``<call>:<exception type>`` where the tree's manager raised, else null). Tree
facts: ``offload_manager: "absent"`` (the tree's server has no decode offload option, so no manager runs),
``decode_offload: "absent"`` (observed: its decode step offloads only finished requests, 0.5.3 to 0.5.9)
or ``"present"``; where that cannot be observed, every scenario's error says why.

    python probes/probe_offload_slots_differential.py --side head --tree-kind release --tree-ref 0.5.13
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _offload  # noqa: E402
from _offload import World, tree_facts  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402

SCENARIOS = ScenarioSet("offload_slots")
PROMPT = 10  # 8 prefill-aligned slots at page size 4
RADIX = 4  # O5: the prompt's first slots, matched from the tree (row 0's slots 100 to 103)

# What a scenario observes, by key (see the docstring): each read from the world at the step that names it.
MEASURES: dict[str, Callable[[World], Any]] = {
    "offload_written": World.written,
    "freed_while_decoding": lambda w: w.freed(phase="decode"),
    "freed_on_ack_while_decoding": lambda w: w.freed(phase="ack"),
    "freed_at_finish": lambda w: w.freed(phase="finish"),
    "live_freed": lambda w: w.freed(live=True),
    "in_flight_freed": lambda w: w.freed(in_flight=True),
    "row_released_in_flight": lambda w: sum(r["in_flight"] for r in w.rows_released),
    "radix_freed_while_decoding": lambda w: sum(1 for f in w.frees if f["phase"] == "decode"
                                                and f["slot"] in range(100, 100 + RADIX)),
    "freed_total": lambda w: w.freed(),
    "double_freed": World.double_freed,
    "rows_released": lambda w: len(w.rows_released),
    "manager_error": World.error,
}
TOTALS = ("freed_total", "double_freed", "rows_released", "manager_error")


@dataclass(frozen=True)
class Observe:
    """Record ``keys`` as the world stands now."""
    keys: tuple[str, ...]

    def run(self, world: World, req: Any, observed: Observed) -> None:
        observed.update({key: MEASURES[key](world) for key in self.keys})


def observe(*keys: str) -> Observe:
    unknown = [key for key in keys if key not in MEASURES]
    if unknown:  # a typo must fail at import, not read as a scenario's error on every tree
        raise KeyError(f"no measure {unknown}; measures: {sorted(MEASURES)}")
    return Observe(keys)


@dataclass(frozen=True)
class Decode:
    """``tokens`` decode steps, each offloading the request (``offload=False``: not offloaded, as a finishing step)."""
    tokens: int
    offload: bool = True

    def run(self, world: World, req: Any, observed: Observed) -> None:
        world.decode(req, self.tokens, offload=self.offload)


@dataclass(frozen=True)
class Finish:
    """The request finishes (``abort``: is aborted) and the decode worker offloads or releases it."""
    abort: bool = False

    def run(self, world: World, req: Any, observed: Observed) -> None:
        world.finish(req, abort=self.abort)


@dataclass(frozen=True)
class Land:
    """The oldest ``count`` copies in flight land (None: all), and the decode worker sees them."""
    count: int | None = None

    def run(self, world: World, req: Any, observed: Observed) -> None:
        world.land(self.count)


@dataclass(frozen=True)
class OffloadOnce:
    """One offload of the request as it stands (no decode step): ``offload_written`` is whether it wrote."""

    def run(self, world: World, req: Any, observed: Observed) -> None:
        observed["offload_written"] = int(bool(world.call("offload", world.manager.offload_kv_cache, req)))


Step = Observe | Decode | Finish | Land | OffloadOnce


@dataclass(frozen=True)
class Script:
    """A scenario: one request (``prompt`` tokens, its first ``radix`` slots owned by the tree) in row 0, driven
    through ``steps``."""
    id: str
    title: str
    steps: tuple[Step, ...]
    prompt: int = PROMPT
    radix: int = 0


SCRIPTS = (
    Script("O1", "incremental offload while decoding, then its copy lands while the request still decodes", (
        Decode(3), observe("offload_written", "freed_while_decoding"),
        Land(), observe("freed_on_ack_while_decoding", "live_freed", "manager_error"))),
    Script("O2", "finish with two copies in flight, then the first acknowledgement, then the second", (
        Decode(6),  # writes positions 8-11 at the third step
        Decode(1, offload=False),  # the finishing step's token
        Finish(),  # writes positions 12-15
        observe("offload_written", "freed_at_finish"),
        Land(1), observe("in_flight_freed", "row_released_in_flight"),
        Land(), observe(*TOTALS))),
    Script("O3", "finish after the acknowledgements: no copy in flight", (
        Decode(3), Land(), Decode(2), Finish(), observe("freed_at_finish", "live_freed", "in_flight_freed"),
        Land(), observe(*TOTALS))),
    Script("O4", "an abort while a copy is in flight, then its acknowledgement", (
        Decode(3), Finish(abort=True), observe("freed_at_finish", "row_released_in_flight"),
        Land(), observe(*TOTALS))),
    Script("O5", "a radix-owned prefix: what goes back while the request decodes", (
        Decode(3), observe("offload_written", "freed_while_decoding", "radix_freed_while_decoding", "manager_error")),
        radix=RADIX),
    Script("O6", "control: a request with no output yet, aborted", (
        OffloadOnce(), Finish(abort=True), observe("live_freed", "in_flight_freed"),
        Land(), observe(*TOTALS))),
    Script("O7", "control: a prompt shorter than a page, offloaded while decoding", (
        Decode(3), observe("offload_written", "freed_while_decoding", "manager_error")),
        prompt=3),
)


def prepare() -> str:
    return _offload.prepare(SCENARIOS)


def play(script: Script, observed: Observed) -> None:
    """Record the tree's facts; where it offloads while decoding, run the script on a fresh world."""
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req(f"probe-{script.id.lower()}", row=0, prompt=script.prompt, radix=script.radix)
    for step in script.steps:
        step.run(world, req, observed)


for _script in SCRIPTS:
    SCENARIOS.scenario(_script.id, _script.title)(functools.partial(play, _script))


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
