"""Differential probe for experiment offload_slots: KV slots given back under a decoding request (PR #24226).

With decode-side KV offload on, SGLang's real ``DecodeKVCacheOffloadManager`` gave a request's
prefill-aligned KV slots back to the allocator on its first incremental offload, while the request
still decoded and attended to them (a concurrent prefill could reuse them), and an acknowledged
chunk's slots while decoding too; at finish, the first acknowledgement released the request's
slots while a later device-to-host copy was still reading some of them. The fix frees every slot
in ``_release_finished_req`` only, once the request's in-flight copies (``offload_inflight``) have
drained. How the manager is built and driven, and the stand-ins: ``_offload.py``'s docstring.

Page size 4; a request's slot at row position ``p`` is ``100 * (row + 1) + p``. Scenarios:

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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _offload  # noqa: E402
from _offload import World, tree_facts  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402

SCENARIOS = ScenarioSet("offload_slots")
PROMPT = 10  # 8 prefill-aligned slots at page size 4


def prepare() -> str:
    return _offload.prepare(SCENARIOS)


def totals(world: World, observed: Observed) -> None:
    observed.update(freed_total=world.freed(), double_freed=world.double_freed(),
                    rows_released=len(world.rows_released), manager_error=world.error())


@SCENARIOS.scenario("O1", "incremental offload while decoding, then its copy lands while the request still decodes")
def o1(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o1", row=0, prompt=PROMPT)
    world.decode(req, 3)
    observed.update(offload_written=world.written("decode"), freed_while_decoding=world.freed(phase="decode"))
    world.land()
    observed.update(freed_on_ack_while_decoding=world.freed(phase="ack"), live_freed=world.freed(live=True),
                    manager_error=world.error())


@SCENARIOS.scenario("O2", "finish with two copies in flight, then the first acknowledgement, then the second")
def o2(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o2", row=0, prompt=PROMPT)
    world.decode(req, 6)  # writes positions 8-11 at the third step
    world.decode(req, 1, offload=False)  # the finishing step's token
    world.finish(req)  # writes positions 12-15
    observed.update(offload_written=world.written(), freed_at_finish=world.freed(phase="finish"))
    world.land(1)
    observed.update(in_flight_freed=world.freed(in_flight=True),
                    row_released_in_flight=sum(r["in_flight"] for r in world.rows_released))
    world.land()
    totals(world, observed)


@SCENARIOS.scenario("O3", "finish after the acknowledgements: no copy in flight")
def o3(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o3", row=0, prompt=PROMPT)
    world.decode(req, 3)
    world.land()
    world.decode(req, 2)
    world.finish(req)
    observed.update(freed_at_finish=world.freed(phase="finish"), live_freed=world.freed(live=True),
                    in_flight_freed=world.freed(in_flight=True))
    world.land()
    totals(world, observed)


@SCENARIOS.scenario("O4", "an abort while a copy is in flight, then its acknowledgement")
def o4(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o4", row=0, prompt=PROMPT)
    world.decode(req, 3)
    world.finish(req, abort=True)
    observed.update(freed_at_finish=world.freed(phase="finish"),
                    row_released_in_flight=sum(r["in_flight"] for r in world.rows_released))
    world.land()
    totals(world, observed)


@SCENARIOS.scenario("O5", "a radix-owned prefix: what goes back while the request decodes")
def o5(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o5", row=0, prompt=PROMPT, radix=4)
    world.decode(req, 3)
    radix = {100 + p for p in range(4)}
    observed.update(offload_written=world.written("decode"), freed_while_decoding=world.freed(phase="decode"),
                    radix_freed_while_decoding=sum(1 for f in world.frees
                                                   if f["phase"] == "decode" and f["slot"] in radix),
                    manager_error=world.error())


@SCENARIOS.scenario("O6", "control: a request with no output yet, aborted")
def o6(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o6", row=0, prompt=PROMPT)
    wrote = world.call("offload", world.manager.offload_kv_cache, req)
    observed["offload_written"] = int(bool(wrote))
    world.finish(req, abort=True)
    observed.update(live_freed=world.freed(live=True), in_flight_freed=world.freed(in_flight=True))
    world.land()
    totals(world, observed)


@SCENARIOS.scenario("O7", "control: a prompt shorter than a page, offloaded while decoding")
def o7(observed: Observed) -> None:
    if not tree_facts(observed):
        return
    world = World()
    req = world.new_req("probe-o7", row=0, prompt=3)
    world.decode(req, 3)
    observed.update(offload_written=world.written("decode"), freed_while_decoding=world.freed(phase="decode"),
                    manager_error=world.error())


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
