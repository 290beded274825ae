"""Differential probe for experiment deferred_release_nixl: a NIXL prefill rank acks an abort once drained (#35360).

When a decode request aborts mid-transfer, the decode side tells each prefill rank (``ABORT``) and
gives the request's KV pages back; with the NIXL backend, a prefill rank could still have a write
in flight into those pages, or post one after. With deferred release on
(``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``), #35360 makes the NIXL prefill rank answer
``ABORT_ACK`` only when nothing is outstanding for the room: at once when it is quiescent, else when
the transfer worker completes the last outstanding chunk (counted at dequeue, so a chunk being
processed counts); never on a transfer error (sibling writes may still land: the decode side falls
back to its timeout); and for an unknown or concluded room only when nothing is still counted. The
decode listener records each rank's ack. How the managers are built and driven: ``_nixl.py``.

Room 7, chunks of 2 pages. Scenarios:

- X1 abort while the first of two chunks is in flight (the second is queued after);
- X2 abort of a quiescent room (before its first chunk), then its chunk is dequeued;
- X3 abort after the last chunk completed (the room concluded);
- X4 abort of a room the sender cleared after its last chunk's KV write failed, the sibling aux write
  still running (the chunk is still counted);
- X5 abort while the last chunk is in flight, then its KV write fails while the aux write still runs
  (the error path);
- X6 two prefill ranks, each aborted mid-chunk, and the decode listener reading their acks (rank 0's twice);
- X7 control: X2 with the variable unset (the default: off up to 0.5.20);
- X8 control: a transfer that completes, no abort;
- X9 the whole loop: the tree's ``DecodeTransferQueue`` with a NIXL receiver aborts mid-transfer (two
  iterations, another request admitted), the prefill rank gets the receiver's own ``ABORT`` frames
  mid-chunk, the chunk lands, its ``ABORT_ACK`` frames reach the decode listener, one iteration
  (``_transferqueue.py``, shared with ``deferred_release``). The prefill rank writes through its transfer
  worker, or, up to 0.5.11 (no worker), through its sender, whose ``send`` posts each chunk's transfers at once
  (the manager's ``add_transfer_request``) and whose ``poll`` reads their states until they land;
- X10 control: the decode alone, as X9 builds it: the client aborts a request whose transfer never ends (the
  receiver's transfer started, no notification ever comes); a day later another request comes in and the last
  write lands: given up on both sides (a hold ends at its deadline), while a decode that never gives up keeps the
  slots through it.

Keys: ``acks_sent`` (``ABORT_ACK`` messages), ``acks_at_abort`` (sent by the abort handler itself),
``acks_while_writing`` (sent while a posted write had not completed), ``writes`` (transfers posted),
``writes_after_ack``, ``targets_held`` (rooms whose ack target the prefill manager still holds at the
end), ``worker_error`` (the exception type the transfer worker recorded, else null),
``decode_ranks_acked`` (ranks the decode side counts as drained; ``_after_first`` after one ack),
X9 (counts of the aborted request's 4 slots): ``abort_sent``, ``freed_before_last_write``,
``written_after_free``, ``written_into_other``, ``freed_total``, ``double_freed``, and ``abort_taken`` (by the
next request's admission the decode acted on the abort: the request left its transfer queue, ended, or gave a slot
back; false where its receiver ignores the abort and the request keeps its slots, still queued: 0.5.5.post1 to
0.5.9, whose receiver's ``abort()`` is the base class's);
X10: ``gave_up`` (the decode ended the request or gave any of its 8 slots back), ``written_after_free``,
``written_into_other``, ``freed_total``, ``double_freed``;
``deferred_enabled`` (X7: the tree's flag with the variable unset; null before #35049), ``room_succeeded``,
``siblings_settled`` (X4, X5: every posted write completed by the end: the error path waits for them from 0.5.20).
Tree facts, the scenario stopping there: ``nixl_manager: "absent"`` (no NIXL backend),
``receiver_abort: "absent"`` (its decode receiver has no ``abort()``, up to 0.5.5: X10 drives that decode all the
same) and ``nixl_abort_handler: "absent"`` (its prefill manager handles no ``ABORT``: up to 0.5.15; X9 still runs,
the prefill rank told nothing, as nothing in it would answer; X10, the decode's alone, runs on every NIXL tree);
X9 also records ``nixl_transfer_worker: "absent"`` where the prefill manager has no transfer worker (up to 0.5.11:
its sender posts the chunks itself) and runs on.

    python probes/probe_deferred_release_nixl_differential.py --side head --tree-kind release --tree-ref 0.5.19
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _nixl  # noqa: E402
import _transferqueue  # noqa: E402
from _nixl import World, abort, bootstrap, chunk, clear, require, work, worker_error  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402

SCENARIOS = ScenarioSet("deferred_release_nixl")
ROOM = 7


def prepare() -> str:
    version = _nixl.prepare()
    if _nixl.sg.conn is not None:  # the decode side (X9, X10) wherever the NIXL backend imports
        _transferqueue.prepare(SCENARIOS.adapted, backend="nixl")
    return version


def prefill_keys(world: World, manager, observed: Observed, *, at_abort: int | None = None) -> None:
    observed.update(acks_sent=len(world.acks), acks_while_writing=sum(a["in_flight"] for a in world.acks),
                    writes=len(world.writes), writes_after_ack=sum(w.after_ack for w in world.writes),
                    worker_error=worker_error(manager, ROOM),
                    targets_held=len(getattr(manager, "_deferred_ack_targets", {})))
    if at_abort is not None:
        observed["acks_at_abort"] = at_abort


def on_a_prefill_rank(scenario_id: str, title: str, *, gate: bool = True):
    """A scenario on one prefill rank's manager (its world's gate set, or unset with ``gate=False``); where the
    tree has no NIXL abort handler to drive, the scenario records that instead."""
    def register(fn: Callable[[Observed, World, Any], None]):
        @SCENARIOS.scenario(scenario_id, title)
        def run(observed: Observed) -> None:
            if require(observed):
                world = World(gate=gate)
                fn(observed, world, world.prefill())
        return fn
    return register


def abort_mid_chunk(world: World, manager) -> int:
    """The first of two chunks is posted; the decode's ABORT arrives while it is in flight; the
    second chunk is dequeued after. Returns the acks the abort handler sent."""
    seen = {}

    def arrives():
        before = len(world.acks)
        abort(manager, ROOM)
        seen["at_abort"] = len(world.acks) - before

    world.script("PROC", "PROC", "DONE", on_poll=arrives)
    bootstrap(manager, ROOM, pages=4)
    work(manager, chunk(ROOM, 0, last=False), chunk(ROOM, 1, last=True))
    return seen.get("at_abort", 0)


@on_a_prefill_rank("X1", "abort while the first of two chunks is in flight; the second is dequeued after")
def x1(observed: Observed, world: World, manager) -> None:
    at_abort = abort_mid_chunk(world, manager)
    prefill_keys(world, manager, observed, at_abort=at_abort)


def abort_quiescent(observed: Observed, world: World, manager) -> None:
    """The room is bootstrapped, nothing written yet; the decode's ABORT arrives; then its one chunk is dequeued."""
    bootstrap(manager, ROOM, pages=2)
    abort(manager, ROOM)
    at_abort = len(world.acks)
    work(manager, chunk(ROOM, 0, last=True))
    prefill_keys(world, manager, observed, at_abort=at_abort)


@on_a_prefill_rank("X2", "abort of a quiescent room (before its first chunk), then its chunk is dequeued")
def x2(observed: Observed, world: World, manager) -> None:
    abort_quiescent(observed, world, manager)


@on_a_prefill_rank("X3", "abort after the last chunk completed (the room concluded)")
def x3(observed: Observed, world: World, manager) -> None:
    bootstrap(manager, ROOM, pages=2)
    work(manager, chunk(ROOM, 0, last=True))
    abort(manager, ROOM)
    prefill_keys(world, manager, observed, at_abort=len(world.acks))


def error_with_sibling(world: World, on_poll=None) -> None:
    """The last chunk's KV write fails (``ERR`` at its second poll) while its sibling aux write still runs."""
    world.script("PROC", "ERR", on_poll=on_poll)
    world.script("PROC", "PROC", "PROC", "DONE")


@on_a_prefill_rank("X4", "abort of a room cleared after a transfer error, its sibling write still running")
def x4(observed: Observed, world: World, manager) -> None:
    error_with_sibling(world)
    bootstrap(manager, ROOM, pages=2)
    work(manager, chunk(ROOM, 0, last=True))
    clear(manager, ROOM)
    abort(manager, ROOM)
    prefill_keys(world, manager, observed)
    observed["siblings_settled"] = not world.in_flight()


@on_a_prefill_rank("X5", "abort while the last chunk is in flight, then its KV write fails while its sibling runs")
def x5(observed: Observed, world: World, manager) -> None:
    error_with_sibling(world, on_poll=lambda: abort(manager, ROOM))
    bootstrap(manager, ROOM, pages=2)
    work(manager, chunk(ROOM, 0, last=True))
    prefill_keys(world, manager, observed)
    observed["siblings_settled"] = not world.in_flight()


@SCENARIOS.scenario("X6", "two prefill ranks aborted mid-chunk; the decode listener reads their acks (rank 0's twice)")
def x6(observed: Observed) -> None:
    if not require(observed):
        return
    worlds = [World(), World()]  # one per prefill rank: its own transfers and acks
    ranks = [world.prefill(rank=rank) for rank, world in enumerate(worlds)]
    decode = worlds[0].decode()
    _nixl.hold(decode, ROOM)
    for world, manager in zip(worlds, ranks):
        abort_mid_chunk(world, manager)
    acks = [a["parts"] for world in worlds for a in world.acks]
    _nixl.listen(decode, acks[:1] * 2)
    observed["decode_ranks_acked_after_first"] = _nixl.ranks_acked(decode, ROOM)
    _nixl.listen(decode, acks[1:])
    observed.update(acks_sent=len(acks),
                    acks_while_writing=sum(a["in_flight"] for world in worlds for a in world.acks),
                    writes_after_ack=sum(w.after_ack for world in worlds for w in world.writes),
                    decode_ranks_acked=_nixl.ranks_acked(decode, ROOM))


@on_a_prefill_rank("X7", "control: X2 with the deferred-release variable unset (the default)", gate=False)
def x7(observed: Observed, world: World, manager) -> None:
    abort_quiescent(observed, world, manager)
    observed["deferred_enabled"] = _nixl.deferred_enabled(manager)


@on_a_prefill_rank("X8", "control: a two-chunk transfer that completes, no abort")
def x8(observed: Observed, world: World, manager) -> None:
    bootstrap(manager, ROOM, pages=4)
    work(manager, chunk(ROOM, 0, last=False), chunk(ROOM, 1, last=True))
    prefill_keys(world, manager, observed)
    observed["room_succeeded"] = manager.check_status(ROOM) == _nixl.sg.KVPoll.Success


@SCENARIOS.scenario("X9", "the whole loop: a NIXL receiver in the decode queue aborts mid-transfer; the prefill rank "
                          "gets its ABORT mid-chunk; the write lands; its ack reaches the decode listener")
def x9(observed: Observed) -> None:
    if not _nixl.require_loop(observed):
        return
    decode = _transferqueue.World()  # the tree's DecodeTransferQueue, NIXL receiver and manager, gate on
    entry = decode.admit("aborted", ROOM, tokens=4)
    decode.abort("aborted")
    aborts = [frames for _, frames in entry.sent if frames[:1] == [b"ABORT"]]
    decode.next_request_while_writing(tokens=4)
    observed.update(abort_sent=len(aborts), freed_before_last_write=decode.freed("aborted"),
                    abort_taken=not decode.kept("aborted"))
    world = World()
    prefill = world.prefill()
    told = (lambda: [prefill._handle_abort_notification(f) for f in aborts]) if _nixl.sg.handles_abort else None
    world.script("PROC", "DONE", on_poll=told)
    bootstrap(prefill, ROOM, pages=4)
    _nixl.transfer(prefill, ROOM, pages=4)
    if not world.writes:
        raise _nixl.CannotObserve("the prefill rank posted no write: what lands after the decode's free is unseen")
    observed.update(decode.last_write("aborted"))  # the chunk in flight has landed
    decode.receive(*[a["parts"] for a in world.acks])
    decode.iterate()
    if decode.error() is not None:
        raise RuntimeError(f"the tree raised in {decode.error()}")  # incomplete: no answer
    observed.update(acks_sent=len(world.acks), freed_total=decode.freed("aborted"),
                    double_freed=decode.double_freed())


@SCENARIOS.scenario("X10", "control: the client aborts a request whose NIXL transfer never completes; a day later "
                           "another request comes in, then the prefill's last write lands")
def x10(observed: Observed) -> None:
    if "nixl_manager" in _nixl.sg.absent:
        observed.update(_nixl.sg.absent)
        return
    decode = _transferqueue.World()  # the tree's DecodeTransferQueue and NIXL receiver, gate on
    observed.update(_transferqueue.given_up_in_a_day(decode, "aborted", ROOM))
    if decode.error() is not None:
        raise RuntimeError(f"the tree raised in {decode.error()}")  # incomplete: no answer
    observed.update(freed_total=decode.freed("aborted"), double_freed=decode.double_freed())


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
