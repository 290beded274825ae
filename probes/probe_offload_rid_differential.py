"""Differential probe for experiment offload_rid: decode offload state per request, not per rid (PR #37026).

SGLang's real ``DecodeKVCacheOffloadManager`` kept its offload progress (``offloaded_state``) and
in-flight counters (``offload_inflight``) by ``rid``. A finished request whose last copy is still in
flight keeps both; a new request reusing its rid then inherited its progress (its first offload
starts past KV it never wrote), and the old request's late acknowledgement moved the new request's
counter and hash chain, and left the old request unreleased. The fix keys both by the ``Req``. How
the manager is built and driven, and the stand-ins: ``_offload.py``'s docstring.

Page size 4; request A (row 0) and request B (row 1) have 10-token prompts (8 prefill-aligned
slots) with different tokens. Scenarios:

- R1 A decodes three steps (a copy of positions 8-11 in flight) and finishes; B arrives with A's
  rid and decodes seven steps; A's late acknowledgement lands; then B's; B finishes;
- R2 control: as R1, B with its own rid;
- R3 control: as R1, but A's acknowledgement lands (A released) before B arrives;
- R4 as R1, but A decodes six steps and its finish writes the last copy (positions 12-15): A's
  state is kept until that copy lands even on trees that release a finished request without
  waiting for its copies (before PR #24226), so the rid is shared there too.

R1 and R4 observe the new request B (what it inherits: the ``new_*`` keys); R1o and R4o run the
same sequence and observe the old request A (whether its own acknowledgement releases it: the
``old_*`` keys). Each request's side is a scenario of its own, so a fix that isolates one of
them and not the other reads as partial, not as matching neither side.

Keys: ``new_first_write_start`` (row position of B's first device-to-host copy, null if none while
decoding), ``new_offloaded`` (B's slots copied while decoding), ``new_empty_writes`` (copies of no slot issued
while B decodes: progress carried over from A), ``old_released_on_ack`` (A's row
released by its own late acknowledgement), ``old_released`` (A's row released by the end),
``new_hash_from_old`` (B's first storage backup chains from one of A's page hashes),
``new_freed`` (B's slots given back by the end), ``double_freed``, ``manager_error``. Tree facts
as in offload_slots: ``offload_manager: "absent"``, ``decode_offload: "absent"`` / ``"present"``;
``inflight_wait: "absent"`` where the manager counts no copies in flight (before PR #24226: it
releases a finished request at finish, so in R1 the old request is gone before the rid is reused).

    python probes/probe_offload_rid_differential.py --side head --tree-kind release --tree-ref 0.5.19
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _offload  # noqa: E402
from _offload import World, tree_facts  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402

SCENARIOS = ScenarioSet("offload_rid")
PROMPT = 10
RID = "probe-offload-rid"
NEW_KEYS = ("new_first_write_start", "new_offloaded", "new_empty_writes", "new_hash_from_old", "new_freed")
OLD_KEYS = ("old_released_on_ack", "old_released")


def prepare() -> str:
    return _offload.prepare(SCENARIOS)


def reuse(observed: Observed, *, new_rid: str, old_drained_first: bool, old_finish_writes: bool = False) -> None:
    if not tree_facts(observed):
        return
    if not hasattr(_offload.sg.Manager, "_has_inflight_offload"):
        observed["inflight_wait"] = "absent"  # before PR #24226: a finished request is released at once
    world = World()
    old = world.new_req(RID, row=0, prompt=PROMPT)
    if old_finish_writes:
        world.decode(old, 6)  # a copy of positions 8-11 at the third step
        world.decode(old, 1, offload=False)  # the finishing step's token: the finish copies 12-15
    else:
        world.decode(old, 3)
    world.finish(old)
    if old_drained_first:
        world.land()
    old_pending = sum(1 for w in world.writes if not w["landed"])
    new = world.new_req(new_rid, row=1, prompt=PROMPT, first_token=500)
    new_slots = world._row_slots(1)
    writes_before = len(world.writes)
    world.decode(new, 7)
    new_writes = [w for w in world.writes[writes_before:] if w["slots"] and w["slots"][0] in new_slots]
    observed["new_first_write_start"] = new_slots.index(new_writes[0]["slots"][0]) if new_writes else None
    observed["new_offloaded"] = sum(len(w["slots"]) for w in new_writes)
    observed["new_empty_writes"] = sum(1 for w in world.writes[writes_before:] if not w["slots"])
    if not old_drained_first:
        released = len(world.rows_released)
        world.land(old_pending)  # the old request's late acknowledgements
        observed["old_released_on_ack"] = sum(1 for r in world.rows_released[released:] if r["row"] == 0)
    world.land()  # the new request's copies, while it decodes
    old_hashes = {h for b in world.backups if b["tokens"] and b["tokens"][0] < 500 for h in b["hashes"]}
    new_backups = [b for b in world.backups if b["tokens"] and 500 <= b["tokens"][0] < 1000]
    if new_backups and new_backups[0]["hashes"]:
        first = new_backups[0]
        hash_of = world.controller.get_hash_str
        observed["new_hash_from_old"] = any(hash_of(first["tokens"][:_offload.PAGE], h) == first["hashes"][0]
                                            for h in old_hashes)
    else:
        observed["new_hash_from_old"] = None
    world.decode(new, 1, offload=False)
    world.finish(new)
    world.land()
    observed["old_released"] = sum(1 for r in world.rows_released if r["row"] == 0)
    observed["new_freed"] = sum(1 for f in world.frees if f["slot"] in new_slots)
    observed.update(double_freed=world.double_freed(), manager_error=world.error())


def one_side(observed: Observed, side: tuple[str, ...], **how) -> None:
    """``reuse`` with only one request's keys kept (the tree's facts and the manager's errors always)."""
    seen: dict = {}
    reuse(seen, **how)
    hidden = set(NEW_KEYS + OLD_KEYS) - set(side)
    for key, value in seen.items():
        if key not in hidden:
            observed[key] = value


@SCENARIOS.scenario("R1", "a new request reuses a finished request's rid while that request's copy is in flight: "
                          "the new request")
def r1(observed: Observed) -> None:
    one_side(observed, NEW_KEYS, new_rid=RID, old_drained_first=False)


@SCENARIOS.scenario("R1o", "as R1: the old request, its copy acknowledged after its rid was reused")
def r1o(observed: Observed) -> None:
    one_side(observed, OLD_KEYS, new_rid=RID, old_drained_first=False)


@SCENARIOS.scenario("R2", "control: the same sequence with a new rid")
def r2(observed: Observed) -> None:
    reuse(observed, new_rid=RID + "-new", old_drained_first=False)


@SCENARIOS.scenario("R3", "control: the rid reused after the old request's copies drained")
def r3(observed: Observed) -> None:
    reuse(observed, new_rid=RID, old_drained_first=True)


@SCENARIOS.scenario("R4", "the rid reused while the old request's own finish copy is in flight: the new request")
def r4(observed: Observed) -> None:
    one_side(observed, NEW_KEYS, new_rid=RID, old_drained_first=False, old_finish_writes=True)


@SCENARIOS.scenario("R4o", "as R4: the old request, its finish copy acknowledged after its rid was reused")
def r4o(observed: Observed) -> None:
    one_side(observed, OLD_KEYS, new_rid=RID, old_drained_first=False, old_finish_writes=True)


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
