"""Differential probe for experiment deferred_release: decode KV pages given back under a prefill write (PR #35049).

In PD disaggregation the prefill server writes a request's KV straight into slots the decode server
pre-allocated. When decode aborts the request mid-transfer, its ``DecodeTransferQueue`` gave the slots
(and the metadata slot) back at the next poll, while a prefill write could still land in them: the
next request admitted received those slots, and the late write went into its KV. The fix holds a
request aborted by decode (its receiver notified the prefill ranks, ``abort_notified``) until every
notified prefill rank acknowledges that its transfer drained (``ABORT_ACK`` with its rank), or a
timeout fires (``resolve_deferred_releases``, each scheduler iteration); a failure the prefill side
reported still releases at once, by design. Only with ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``
true (off by default): the scenarios run with it set, as a decode server's environment would, except
D8, run with it unset. How the queue is built and driven, and the stand-ins: ``_transferqueue.py``.

A request holds 8 token slots; two scheduler iterations after the abort another request is
admitted (it takes the most recently freed slots first), then the prefill side's last write into the aborted
request's slots lands, then its ranks ack. Scenarios:

- D1 decode aborts mid-transfer (one prefill rank);
- D2 decode aborts after the prefill finished writing (the room succeeded): its ack comes at once;
- D3 two prefill ranks: one acks, the other writes last and acks later;
- D4 acks that never come: held until the timeout, then released;
- D5 a stale ack of the room's previous request arrives before the abort: it must not count;
- D6 control: the prefill side reports a failure (it stopped writing): released at once, by design;
- D7 control: a transfer still running, no abort, past a hold's deadline: nothing is given back;
- D8 control: D1 with the gate unset (the default): today's server releases at once, as before the fix
  (``gate_default_on``: the variable's default as the tree's ``envs`` declares it; null before the fix and in a
  tree with no ``envs``, a port's, true where the tree turns the hold on by default, 0.5.21);
- D9 no abort: the decode's own wait for the transfer runs out (its receiver's waiting timeout, polled by the
  queue) mid-transfer; after the acks, past a hold's deadline (0.5.19 arms no ack for a wait that ran out);
- D10 control: the client aborts (the scheduler's ``abort_request``) a request whose transfer never ends; a day
  later another request comes in and the last write lands: given up on both sides (a hold ends at its deadline),
  while a decode that never gives up keeps the slots through it;
- P1 a prefill rank (its real manager's receive loop, the gate set) told of the abort while a chunk of the
  room still writes; P2 told after the room succeeded (nothing writes).

Keys (counts of the aborted request's 8 slots unless named otherwise): ``abort_sent`` (``ABORT``
messages its receiver sent to the prefill ranks), ``freed_before_last_write`` /
``meta_freed_before_last_write`` (slots / the metadata slot given back before the prefill's last
write), ``written_after_free`` and ``written_into_other`` (slots of that write already given back /
held by another request: the corruption), ``freed_after_first_ack``, ``freed_before_timeout``,
``freed_after_timeout``, ``freed_total``, ``meta_freed`` (times its metadata slot went back),
``double_freed``; D9: ``timed_out`` (the decode gave up when its wait ran out); D10: ``gave_up`` (by the end it
ended the request or gave any of its slots back); P1/P2: ``acks_at_abort`` (``ABORT_ACK`` messages the rank sent
at once) and ``drain_acks_at_abort`` (those carrying its rank: a drain ack), or ``abort_handled: "absent"`` where the
rank's loop, told of the abort, took the ``ABORT`` for a bootstrap message and failed on its frames: it handles
none (before 0.5.13). Tree facts: ``mooncake_manager: "absent"`` (no Mooncake backend: PD's transfer a
placeholder, 0.4.4.post2 to 0.4.5), every scenario stopping there; ``receiver_abort: "absent"`` (the decode receiver
has no ``abort()``, up to 0.4.9.post4), the scenarios that abort the receiver (all but D9 and D10) stopping there:
D9 and D10 observe what such a decode does (0.4.9.post1 on: its wait runs out; before: it never gives up).
A call of the tree that raised, or a stand-in that raised in one (even where the tree caught it), ends the
scenario as an error (never an answer).

    python probes/probe_deferred_release_differential.py --side head --tree-kind release --tree-ref 0.5.19
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _transferqueue  # noqa: E402
from _probekit import Observed, ScenarioSet, main  # noqa: E402
from _transferqueue import Prefill, World  # noqa: E402

SCENARIOS = ScenarioSet("deferred_release")
ROOM = 4242


class TreeRaised(RuntimeError):
    """A call of the tree raised: what the scenario observed is incomplete, so it is no answer."""


ABSENT: dict[str, str] = {}  # what the tree lacks for any transfer into decode pages: every scenario records it
CANNOT_ABORT: dict[str, str] = {}  # what it lacks for a decode abort: the scenarios that abort record it


def prepare() -> str:
    """The transfer queue's world; a tree without Mooncake (its PD transfer a placeholder, 0.4.4.post2 to 0.4.5) has
    no transfer into decode pages, a tree fact. One whose receiver has no ``abort()`` (up to 0.4.9.post4) cannot be
    aborted as D1-D8 abort it: they record so; D9 drives its waiting timeout, and D10 a client abort and a wait
    that never ends, so that what such a decode does is observed, never read off its source."""
    import sglang

    ABSENT.clear()
    CANNOT_ABORT.clear()
    if _transferqueue.lacks_backend("mooncake"):
        ABSENT["mooncake_manager"] = "absent"
        return sglang.__version__
    _transferqueue.prepare(SCENARIOS.adapted)
    receiver = _transferqueue.sg.Receiver if _transferqueue.sg.ready else None
    if receiver is not None and not hasattr(receiver, "abort"):
        CANNOT_ABORT["receiver_abort"] = "absent"
    return sglang.__version__


def lacking(*, aborts: bool = True) -> dict[str, str]:
    """What the tree lacks for a scenario: a transfer at all, and for one that ``aborts`` the receiver, its abort."""
    return {**ABSENT, **(CANNOT_ABORT if aborts else {})}


# A scenario of the set, which on a tree lacking what it drives records what it lacks and ends.
scenario = SCENARIOS.guarded(lacking)


def finish(w: World, observed: Observed, rid: str = "aborted") -> None:
    """The totals every scenario records; a tree call that raised makes the scenario an error."""
    if w.error() is not None:
        raise TreeRaised(f"the tree raised in {w.error()}")
    observed.update(freed_total=w.freed(rid), meta_freed=w.meta_freed(rid), double_freed=w.double_freed())


def write_lands_then_acks(w: World, observed: Observed, ranks: Iterable[int]) -> None:
    """The prefill's last write into the aborted request's slots lands; then ``ranks`` ack; one more iteration."""
    observed.update(w.last_write("aborted"))
    for rank in ranks:
        w.ack("aborted", rank)
    w.iterate()
    finish(w, observed)


def abort_mid_transfer(observed: Observed, w: World) -> None:
    """Decode aborts while the prefill still writes; another request comes in; the last write lands; acks."""
    w.admit("aborted", ROOM)
    w.abort("aborted")
    observed["abort_sent"] = w.aborts_sent("aborted")
    w.next_request_while_writing()
    observed.update(freed_before_last_write=w.freed("aborted"),
                    meta_freed_before_last_write=w.meta_freed("aborted"))
    write_lands_then_acks(w, observed, range(w.ranks))


@scenario("D1", "decode aborts mid-transfer: another request comes in, the prefill's last write lands, then its ack")
def d1(observed: Observed) -> None:
    abort_mid_transfer(observed, World())


@scenario("D2", "decode aborts after the prefill finished writing: its ack comes at once")
def d2(observed: Observed) -> None:
    w = World()
    w.admit("aborted", ROOM)
    w.status("aborted", _transferqueue.sg.KVPoll.Success)
    w.abort("aborted")
    observed["abort_sent"] = w.aborts_sent("aborted")
    w.ack("aborted", 0)
    w.iterate()
    observed["freed_after_first_iteration"] = w.freed("aborted")
    w.iterate()
    finish(w, observed)


@scenario("D3", "two prefill ranks: one acks, the other writes last and acks later")
def d3(observed: Observed) -> None:
    w = World(ranks=2)
    w.admit("aborted", ROOM)
    w.abort("aborted")
    observed["abort_sent"] = w.aborts_sent("aborted")
    w.iterate()
    w.ack("aborted", 0)
    w.iterate()
    w.bystander("next")
    observed["freed_after_first_ack"] = w.freed("aborted")
    write_lands_then_acks(w, observed, [1])


@scenario("D4", "acks that never come: held until the timeout, then released")
def d4(observed: Observed) -> None:
    w = World()
    w.admit("aborted", ROOM)
    w.abort("aborted")
    w.iterate()
    w.clock.now += w.timeout() - 1
    w.iterate()
    observed["freed_before_timeout"] = w.freed("aborted")
    w.clock.now += 2
    w.iterate()
    observed["freed_after_timeout"] = w.freed("aborted")
    finish(w, observed)


@scenario("D5", "a stale ack of the room's previous request arrives before the abort: it must not count")
def d5(observed: Observed) -> None:
    w = World()
    w.admit("aborted", ROOM)
    w.ack("aborted", 0)  # a late duplicate of the ack a previous request on this room drew
    w.abort("aborted")
    w.next_request_while_writing()
    observed["freed_before_last_write"] = w.freed("aborted")
    write_lands_then_acks(w, observed, [0])


@scenario("D6", "control: the prefill side reports a failure (it stopped writing): released at once")
def d6(observed: Observed) -> None:
    w = World()
    w.admit("aborted", ROOM)
    w.status("aborted", _transferqueue.sg.KVPoll.Failed)
    w.iterate()
    observed.update(abort_sent=w.aborts_sent("aborted"), freed_at_failure=w.freed("aborted"))
    finish(w, observed)


@scenario("D7", "control: a transfer still running, no abort, past a hold's deadline: nothing is given back")
def d7(observed: Observed) -> None:
    w = World()
    w.admit("aborted", ROOM)
    w.iterate()
    w.clock.now += w.timeout() + 1  # a hold the queue made of the running request would expire here
    w.iterate()
    observed["abort_sent"] = w.aborts_sent("aborted")
    finish(w, observed)


@scenario("D8", "control: D1 with the gate unset (the default): released at once")
def d8(observed: Observed) -> None:
    observed["gate_default_on"] = _transferqueue.gate_default()
    abort_mid_transfer(observed, World(gate=False))


@scenario("D9", "the decode's wait times out mid-transfer: another request comes in, the prefill's last write lands, "
                "then its ack; then past a hold's deadline", aborts=False)
def d9(observed: Observed) -> None:
    w = World()
    w.admit("aborted", ROOM)
    w.waiting("aborted")
    w.iterate()
    w.clock.now += _transferqueue.WAITING_TIMEOUT + 1
    w.iterate()
    observed.update(timed_out=w.gave_up("aborted"), abort_sent=w.aborts_sent("aborted"))
    w.next_request_while_writing()
    observed.update(freed_before_last_write=w.freed("aborted"),
                    meta_freed_before_last_write=w.meta_freed("aborted"))
    observed.update(w.last_write("aborted"))
    for rank in range(w.ranks):
        w.ack("aborted", rank)
    w.iterate()
    w.clock.now += w.timeout() + 1  # the timed-out wait armed no ack (0.5.19): its hold ends at the deadline
    w.iterate()
    finish(w, observed)


@scenario("D10", "control: the client aborts a request whose transfer never completes; a day later another request "
                 "comes in, then the prefill's last write lands", aborts=False)
def d10(observed: Observed) -> None:
    w = World()
    observed.update(_transferqueue.given_up_in_a_day(w, "aborted", ROOM))
    finish(w, observed)


def prefill_told(observed: Observed, status_name: str, in_flight: int) -> None:
    """A prefill rank is told of the abort while the room is in ``status_name``, ``in_flight`` chunks writing."""
    prefill = Prefill()
    prefill.room(ROOM, getattr(_transferqueue.sg.KVPoll, status_name), in_flight=in_flight)
    prefill.told(ROOM)
    if prefill.misread is not None:  # its loop took the ABORT for a bootstrap message: it handles none
        observed["abort_handled"] = "absent"
        return
    if prefill.error() is not None:
        raise TreeRaised(f"the tree raised in {prefill.error()}")
    observed.update(acks_at_abort=prefill.acks(), drain_acks_at_abort=prefill.acks(drained=True))


@scenario("P1", "a prefill rank told of the abort while a chunk of the room still writes: no ack yet")
def p1(observed: Observed) -> None:
    prefill_told(observed, "Transferring", 1)


@scenario("P2", "a prefill rank told of the abort after the room succeeded (nothing writes): a drain ack at once")
def p2(observed: Observed) -> None:
    prefill_told(observed, "Success", 0)


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
