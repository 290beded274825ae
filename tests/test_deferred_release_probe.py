"""The transfer-queue driver records which slots go back, and when against the prefill's last write; the
deferred_release scenarios read it.

No SGLang, no torch: ``probes/_transferqueue.py`` is loaded as a cell loads it, its ``sg`` filled with
miniatures written here in place of SGLang's: a transfer queue that releases an aborted request at its
poll (as the trees before PR #35049 do, and today's with the gate unset), one that holds it until every
notified prefill rank acks or its deadline passes (as the fixed ones do with the gate set), a receiver
that tells each prefill rank of an abort once, a manager whose receive loop notes the acks, and prefill
loops that ack an abort at once (before the fix) or only once nothing of the room writes.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
import types
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from conftest import PROJECT

GATE = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
TIMEOUT = 30.0


class KVPoll(enum.IntEnum):
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class EnvBool:
    def get(self) -> bool:
        return os.environ.get(GATE, "false").lower() == "true"


class Envs:
    SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool()


CONN = SimpleNamespace(threading=None)  # the backend module: the driver swaps its threading
DECODE = SimpleNamespace(time=time)  # the queue's module: the driver swaps its time


class Manager:
    """The decode side of a backend manager: status table, ack tracker, and a receive loop noting acks."""

    def update_status(self, room, status):
        self.request_status[room] = status

    def register_deferred_abort_room(self, room):
        self._deferred_abort_ack_tracker[room] = set()

    def note_abort_ack(self, room, rank):
        acks = self._deferred_abort_ack_tracker.get(room)
        if acks is not None:
            acks.add(rank)

    def is_abort_release_safe(self, room, required):
        return len(self._deferred_abort_ack_tracker.get(room, ())) >= required

    def clear_deferred_abort_state(self, room):
        self._deferred_abort_ack_tracker.pop(room, None)

    def start_decode_thread(self):
        def decode_thread():
            while True:
                msg = self.server_socket.recv_multipart()
                if msg[0] == b"ABORT_ACK":
                    if self.enable_deferred_decode_kv_release:
                        self.note_abort_ack(int(msg[1]), int(msg[2]))
                    continue
                room, status, _rank = (int(frame) for frame in msg)
                self.update_status(room, KVPoll(status))

        def heartbeat_checker():
            raise AssertionError("a heartbeat checker must never run in a probe")

        CONN.threading.Thread(target=decode_thread).start()
        CONN.threading.Thread(target=heartbeat_checker).start()


class PrefillManager(Manager):
    """The prefill side's loop: told of an abort, it acks at once (``early``, two frames, as before PR #35049), or,
    with the gate, sends a three-frame drain ack only once nothing of the room writes."""

    early = False

    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                msg = self.server_socket.recv_multipart()
                if msg[0].decode() == "ABORT":
                    room, endpoint = int(msg[1]), f"tcp://{msg[2].decode()}:{int(msg[3])}"
                    if self.early or not self.enable_deferred_decode_kv_release:
                        self._connect(endpoint).send_multipart([b"ABORT_ACK", msg[1]])
                    elif self._staging_outstanding.get(room, 0) == 0:
                        self._connect(endpoint).send_multipart([b"ABORT_ACK", msg[1], b"0"])

        CONN.threading.Thread(target=bootstrap_thread).start()


class HandlerPrefill(Manager):
    """0.5.22's prefill loop: it hands an ABORT to the manager's handler, which acks (echoing the decode's
    generation) only an ABORT that carries one, once nothing of the room writes."""

    def _handle_abort_notification(self, msg):
        if msg[0] != b"ABORT":
            return False
        if len(msg) > 4 and self._staging_outstanding.get(int(msg[1]), 0) == 0:
            self._connect(f"tcp://{msg[2].decode()}:{int(msg[3])}").send_multipart([b"ABORT_ACK", msg[1], b"0",
                                                                                    msg[4]])
        return True

    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                self._handle_abort_notification(self.server_socket.recv_multipart())

        CONN.threading.Thread(target=bootstrap_thread).start()


@dataclass(frozen=True)
class AbortNotification:
    """0.5.22's ABORT frame: the decode's ack generation appended where it armed one."""

    room: int
    decode_ip: str
    decode_port: int
    generation: int | None = None

    def to_zmq(self):
        tail = [] if self.generation is None else [str(self.generation).encode()]
        return [b"ABORT", str(self.room).encode(), self.decode_ip.encode(), str(self.decode_port).encode(), *tail]


class EarlyPrefill(PrefillManager):
    early = True


class PrefillBlind(Manager):
    """A prefill loop that knows no abort (before PR #27372): every message but a registration is a room's
    transfer info, its room a number (0.4.6) and its eighth frame the count of decode ranks (0.5.12)."""

    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                msg = self.server_socket.recv_multipart()
                if msg[0].decode() != "None":
                    self.transfer_infos[int(msg[0])] = int(msg[7])

        CONN.threading.Thread(target=bootstrap_thread).start()


class PrefillBlindByCount(PrefillBlind):
    """0.5.12's order: the count of decode ranks first, then the room."""

    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                msg = self.server_socket.recv_multipart()
                if msg[0].decode() != "None":
                    self.transfer_infos[msg[0]] = int(msg[7].decode())

        CONN.threading.Thread(target=bootstrap_thread).start()


class PrefillFailingInAHelper(Manager):
    """A loop that handles the ABORT, but a helper it calls fails: the scenario's error, never "absent"."""

    def parse(self, msg):
        return int(msg[9])

    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                self.parse(self.server_socket.recv_multipart())

        CONN.threading.Thread(target=bootstrap_thread).start()


def wait_ran_out(receiver) -> bool:
    """The receiver waited ``WaitingForInput`` longer than its manager allows, by its module's clock."""
    return (receiver.kv_mgr.request_status[receiver.bootstrap_room] == KVPoll.WaitingForInput
            and time.time() - receiver.init_time >= receiver.kv_mgr.waiting_timeout)


class Receiver:
    """Tells every prefill rank of an abort, once, and of a wait that ran out (as 0.5.13 on); polls the manager's
    status."""

    def abort(self):
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed
        if not self.abort_notified:
            for info in self.bootstrap_infos:
                sock, _lock = self._connect_to_bootstrap_server(info)
                sock.send_multipart([b"ABORT", str(self.bootstrap_room).encode()])
            self.abort_notified = True

    def poll(self):
        if self.conclude_state is None and wait_ran_out(self):
            self.abort()
        return self.conclude_state or self.kv_mgr.request_status[self.bootstrap_room]


class TimingOutReceiver:
    """0.4.9.post1 to 0.4.9.post4: no abort(); a wait that ran out concludes the transfer failed, telling no one."""

    def poll(self):
        if self.conclude_state is None and wait_ran_out(self):
            self.conclude_state = KVPoll.Failed
        return self.kv_mgr.request_status[self.bootstrap_room] if self.conclude_state is None else self.conclude_state


class PatientReceiver:
    """Up to 0.4.9: no abort(), no waiting timeout: the transfer ends when the prefill says so."""

    def poll(self):
        return self.kv_mgr.request_status[self.bootstrap_room]


@dataclass
class DecodeRequest:
    req: object
    kv_receiver: object
    metadata_buffer_index: int = -1


class Queue:
    """A transfer queue in miniature. ``holds``: an aborted request waits for its acks or its deadline."""

    holds = True

    def __init__(self, gloo_group, req_to_metadata_buffer_idx_allocator, tp_rank, metadata_buffers, scheduler,
                 tree_cache):
        self.queue, self._deferred_releases = [], []
        self.meta, self.tree_cache = req_to_metadata_buffer_idx_allocator, tree_cache
        self.enable_deferred_kv_release = Envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.get()
        self.hold = self.holds and self.enable_deferred_kv_release
        self.deferred_kv_release_timeout = TIMEOUT

    def pop_transferred(self):
        for decode_req in [d for d in self.queue if d.kv_receiver.poll() == KVPoll.Failed]:
            self.queue.remove(decode_req)
            decode_req.req.finished_reason = "transfer failed"  # prepare_abort: the client is told
            if self.hold and decode_req.kv_receiver.abort_notified:
                deadline = DECODE.time.monotonic() + TIMEOUT
                self._deferred_releases.append((decode_req, deadline, len(decode_req.kv_receiver.bootstrap_infos)))
            else:
                self._release(decode_req)
        return []

    def resolve_deferred_releases(self):
        """As the tree's: a held release that raises is logged and the others go on."""
        now, held = DECODE.time.monotonic(), []
        for decode_req, deadline, required in self._deferred_releases:
            mgr = decode_req.kv_receiver.kv_mgr
            if mgr.is_abort_release_safe(decode_req.req.bootstrap_room, required) or now >= deadline:
                try:
                    self._release(decode_req)
                except Exception:
                    pass
            else:
                held.append((decode_req, deadline, required))
        self._deferred_releases = held

    def _release(self, decode_req):
        self.tree_cache.cache_finished_req(decode_req.req)
        self.meta.free(decode_req.metadata_buffer_index)


class EarlyQueue(Queue):
    holds = False


class RunningHeldQueue(Queue):
    """An over-broad hold: a request whose transfer still runs is held too, so it goes back at the deadline."""

    def pop_transferred(self):
        for decode_req in [d for d in self.queue if d.kv_receiver.poll() == KVPoll.Transferring]:
            self.queue.remove(decode_req)
            self._deferred_releases.append((decode_req, DECODE.time.monotonic() + TIMEOUT, 1))
        return super().pop_transferred()


def process_decode_queue(scheduler):
    scheduler.disagg_decode_transfer_queue.resolve_deferred_releases()
    scheduler.disagg_decode_transfer_queue.pop_transferred()


class Scheduler:
    def abort_request(self, recv_req):
        for decode_req in self.disagg_decode_transfer_queue.queue:
            if decode_req.req.rid.startswith(recv_req.rid):
                receiver = decode_req.kv_receiver
                receiver.abort()
                if receiver.kv_mgr.enable_deferred_decode_kv_release and receiver.abort_notified:
                    receiver.kv_mgr.register_deferred_abort_room(decode_req.req.bootstrap_room)


class OldScheduler:
    """Up to 0.4.9.post4: a client abort reaches the waiting queue (and the running batch), never the transfer queue."""

    def abort_request(self, recv_req):
        self.waiting_queue[:] = [req for req in self.waiting_queue if not req.rid.startswith(recv_req.rid)]


class Req:
    def __init__(self, rid, text, ids, sampling_params):
        self.rid, self.origin_input_ids = rid, ids
        self.finished_reason = None

    def finished(self):
        return self.finished_reason is not None


def fake_torch():
    return SimpleNamespace(zeros=lambda shape, dtype=None: [[0] * shape[1] for _ in range(shape[0])],
                           int64="int64", distributed=SimpleNamespace(all_reduce=None, get_world_size=None))


@pytest.fixture
def tq(fresh_probe, monkeypatch):
    """``_transferqueue`` loaded as a cell loads it, its ``sg`` filled as ``prepare`` fills it; the probe loaded
    after it imports this copy."""
    module = fresh_probe("_transferqueue.py")
    monkeypatch.setitem(sys.modules, "_transferqueue", module)
    monkeypatch.delenv(GATE, raising=False)
    monkeypatch.setattr(DECODE, "DecodeTransferQueue", Queue, raising=False)
    monkeypatch.setattr(DECODE, "SchedulerDisaggregationDecodeMixin",
                        SimpleNamespace(process_decode_queue=process_decode_queue), raising=False)
    module.sg.__dict__.update(
        torch=fake_torch(), backend="mooncake", missing=None, decode=DECODE, conn=CONN, Queue=Queue,
        DecodeRequest=DecodeRequest, Receiver=Receiver, Manager=Manager, KVPoll=KVPoll, DECODE="decode", PREFILL="prefill",
        AbortReq=lambda rid: SimpleNamespace(rid=rid), Req=Req, SamplingParams=lambda **kw: None,
        Scheduler=Scheduler, ReqKvInfo=None, kv_on_record=False, pool_frees_request=True, envs=Envs(), server_args=None,
        nothing_preallocated=[], stage_metrics=lambda: None, ready=True)
    return module


def run(fresh_probe, sid: str) -> dict:
    """One scenario of the probe, as the kit runs it: what it observed, or its error."""
    probe = fresh_probe("probe_deferred_release_differential.py")
    (found,) = [s for s in probe.SCENARIOS.scenarios if s.id == sid]
    return sys.modules["_probekit"].run_scenario(found)


# ---------------------------------------------------------------- the driver's recording


def test_slots_given_back_go_to_the_next_request_and_a_late_write_then_lands_in_its_kv(tq):
    world = tq.World(gate=False)
    world.admit("aborted", 7)
    world.abort("aborted")
    world.iterate()
    assert world.freed("aborted") == 8 and world.meta_freed("aborted") == 1
    assert world.bystander("next") == world.requests["aborted"].slots
    assert world.last_write("aborted") == {"written_after_free": 8, "written_into_other": 8}


def test_held_slots_are_not_handed_out_and_a_late_write_hits_only_them(tq):
    world = tq.World(gate=True)
    world.admit("aborted", 7)
    world.abort("aborted")
    world.iterate()
    assert world.held() == 1 and world.freed("aborted") == 0
    assert not set(world.bystander("next")) & set(world.requests["aborted"].slots)
    assert world.last_write("aborted") == {"written_after_free": 0, "written_into_other": 0}


def test_an_ack_reaches_the_manager_only_from_a_rank_that_was_sent_an_abort(tq):
    world = tq.World(gate=True, ranks=2)
    world.admit("aborted", 7)
    delivered = []
    world.receive = lambda *messages: delivered.extend(messages)
    world.ack("aborted", 0)  # nothing was sent yet: a rank acks only an ABORT it received
    assert delivered == []
    world.abort("aborted")
    assert world.aborts_sent("aborted") == 2
    world.ack("aborted", 1)
    assert delivered == [[b"ABORT_ACK", b"7", b"1"]]


def test_an_ack_echoes_the_generation_the_rank_s_abort_carried(tq):
    """0.5.22: the decode arms a generation and puts it in its ABORT; a drain ack without it is ignored."""
    world = tq.World(gate=True)
    entry = world.admit("aborted", 7)
    delivered = []
    world.receive = lambda *messages: delivered.extend(messages)
    entry.sent.append((0, [b"ABORT", b"7", b"192.0.2.2", b"17000", b"3"]))
    world.ack("aborted", 0)
    assert delivered == [[b"ABORT_ACK", b"7", b"0", b"3"]]


def test_the_gate_is_set_only_while_the_world_is_driven_and_the_old_value_comes_back(tq, monkeypatch):
    monkeypatch.setenv(GATE, "0")
    with tq.gated(True):
        assert os.environ[GATE] == "true"
    with tq.gated(False):
        assert GATE not in os.environ
    assert os.environ[GATE] == "0"
    monkeypatch.delenv(GATE)
    tq.World(gate=True)
    assert GATE not in os.environ


def test_the_queue_reads_the_probe_s_clock_only_while_driven(tq):
    world = tq.World()
    world.clock.now = 5.0
    with world.driving():
        assert DECODE.time.monotonic() == 5.0
        assert DECODE.time.sleep is time.sleep  # everything else is the real module's
    assert DECODE.time is time


def test_only_the_manager_s_receive_loop_runs_and_its_script_ends_it(tq):
    world = tq.World()
    world.admit("r", 7)
    world.status("r", KVPoll.Success)  # the heartbeat checker, had it run, would raise
    assert world.manager.request_status[7] == KVPoll.Success and world.error() is None


def test_an_exception_of_the_tree_is_recorded_by_call_and_type(tq):
    world = tq.World()

    def broken(*args):
        raise KeyError("room")

    assert world.call("iterate", broken) is None
    assert world.error() == "iterate:KeyError"


def test_a_tree_whose_transfer_queue_could_not_be_prepared_cannot_be_driven(tq):
    tq.sg.ready, tq.sg.missing = False, "sglang.srt.disaggregation.decode has no DecodeTransferQueue"
    with pytest.raises(tq.CannotDrive, match="has no DecodeTransferQueue"):
        tq.World()


# ---------------------------------------------------------------- the scenarios on queues written here


@pytest.mark.parametrize("queue, expected", [
    (EarlyQueue, {"freed_before_last_write": 8, "meta_freed_before_last_write": 1, "written_into_other": 8}),
    (Queue, {"freed_before_last_write": 0, "meta_freed_before_last_write": 0, "written_into_other": 0}),
])
def test_d1_counts_the_slots_given_back_before_the_prefill_s_last_write(fresh_probe, tq, queue, expected):
    tq.sg.Queue = queue
    found = run(fresh_probe, "D1")
    assert found["error"] is None
    assert {k: found["observed"][k] for k in expected} == expected
    assert found["observed"]["freed_total"] == 8  # given back in the end, either way


def test_d3_holds_until_the_last_of_two_ranks_acks(fresh_probe, tq):
    observed = run(fresh_probe, "D3")["observed"]
    assert observed["abort_sent"] == 2 and observed["freed_after_first_ack"] == 0
    assert observed["written_into_other"] == 0 and observed["freed_total"] == 8


def test_d4_acks_that_never_come_release_at_the_deadline(fresh_probe, tq):
    observed = run(fresh_probe, "D4")["observed"]
    assert (observed["freed_before_timeout"], observed["freed_after_timeout"]) == (0, 8)


def test_d8_the_gate_unset_releases_at_once_on_a_holding_queue(fresh_probe, tq):
    observed = run(fresh_probe, "D8")["observed"]
    assert observed["freed_before_last_write"] == 8 and observed["written_into_other"] == 8
    assert observed["gate_default_on"] is False


def test_d8_records_a_queue_that_holds_by_default(fresh_probe, tq, monkeypatch):
    """0.5.21 turns the hold on with the variable unset: D8 says so (the registry then sets D8 aside)."""
    monkeypatch.setattr(EnvBool, "get", lambda self: os.environ.get(GATE, "true").lower() == "true")
    observed = run(fresh_probe, "D8")["observed"]
    assert observed["gate_default_on"] is True and observed["freed_before_last_write"] == 0


def test_a_tree_giving_the_row_back_through_the_cache_s_row_methods_frees_those_slots(tq):
    """0.5.21's release_kv_cache frees position ranges of the request's row (``free_kv_row``)."""
    world = tq.World(gate=False)
    entry = world.admit("aborted", 7)
    entry.req.kv = SimpleNamespace(req_pool_idx=0)
    world.tree_cache.free_kv_row(entry.req.kv, [(0, 3), (5, 8)])
    assert world.freed("aborted") == 6
    assert world.bystander("next", tokens=6) == entry.slots[:3] + entry.slots[5:]


@pytest.mark.parametrize("frees_request, row_after", [(True, None), (False, 0)])
def test_the_cache_clears_the_request_s_row_only_where_the_tree_s_pool_does(tq, frees_request, row_after):
    """0.5.9 on, ``ReqToTokenPool.free`` takes the request and clears its row; before, it takes the row's index and
    0.5.8's ``release_kv_cache`` asserts (unless the cache is Mamba's) that the row is still there."""
    tq.sg.pool_frees_request = frees_request
    world = tq.World(gate=False)
    entry = world.admit("aborted", 7)
    world.tree_cache.cache_finished_req(entry.req, is_insert=False)
    assert world.freed("aborted") == 8 and entry.req.req_pool_idx == row_after


def test_a_thread_the_manager_s_base_class_starts_runs_inline(tq, monkeypatch):
    """0.5.21 starts the heartbeat checker from the shared base class's module, not the backend's."""
    base = types.ModuleType("fake_common_conn")
    base.threading = threading
    monkeypatch.setitem(sys.modules, base.__name__, base)
    common = type("CommonKVManager", (), {"__module__": base.__name__})
    monkeypatch.setattr(tq.sg, "Manager", type("MooncakeKVManager", (common,), {}))
    with tq.inline_threads():
        assert base.threading.Thread is tq.InlineThread
    assert base.threading is threading


@pytest.mark.parametrize("queue, freed", [(Queue, 0), (RunningHeldQueue, 8)])
def test_d7_a_hold_of_a_transfer_still_running_shows_once_its_deadline_passed(fresh_probe, tq, queue, freed):
    tq.sg.Queue = queue
    observed = run(fresh_probe, "D7")["observed"]
    assert (observed["abort_sent"], observed["freed_total"]) == (0, freed)


def test_d6_a_failure_the_prefill_reported_is_released_at_once(fresh_probe, tq):
    observed = run(fresh_probe, "D6")["observed"]
    assert observed == {"abort_sent": 0, "freed_at_failure": 8, "freed_total": 8, "meta_freed": 1,
                        "double_freed": 0}


def test_a_scenario_in_which_the_tree_raised_is_an_error_never_an_answer(fresh_probe, tq, monkeypatch):
    monkeypatch.setattr(Receiver, "abort", lambda self: (_ for _ in ()).throw(RuntimeError("socket")))
    found = run(fresh_probe, "D1")
    assert found["error"]["type"] == "TreeRaised" and "abort:RuntimeError" in found["error"]["message"]


def test_a_stand_in_that_raised_where_the_tree_caught_it_is_the_scenario_s_error_never_an_answer(
        fresh_probe, tq, monkeypatch):
    """The held release frees the metadata slot through the probe's allocator: its failure, which the tree's loop
    swallows, must not read as a metadata slot never given back."""
    def under_built(self, idx):
        raise IndexError("no metadata slot")

    monkeypatch.setattr(tq.World, "_free_meta", under_built)
    found = run(fresh_probe, "D1")
    assert found["error"]["type"] == "StandInFailed"
    assert "in iterate" in found["error"]["message"] and "under_built:IndexError" in found["error"]["message"]


@pytest.mark.parametrize("manager, expected", [
    (EarlyPrefill, {"P1": {"acks_at_abort": 1, "drain_acks_at_abort": 0},
                    "P2": {"acks_at_abort": 1, "drain_acks_at_abort": 0}}),
    (PrefillManager, {"P1": {"acks_at_abort": 0, "drain_acks_at_abort": 0},
                      "P2": {"acks_at_abort": 1, "drain_acks_at_abort": 1}}),
])
def test_p1_p2_count_the_acks_a_prefill_rank_sends_when_told_while_writing_and_after(fresh_probe, tq, manager,
                                                                                      expected):
    tq.sg.Manager = manager
    assert {sid: run(fresh_probe, sid)["observed"] for sid in ("P1", "P2")} == expected


@pytest.mark.parametrize("gate, acks", [(True, 1), (False, 0)])
def test_a_prefill_loop_handing_the_abort_to_its_handler_is_told_with_the_generation_decode_armed(
        fresh_probe, tq, monkeypatch, gate, acks):
    """0.5.22: the loop names no "ABORT" itself; the ABORT is the tree's own frame, armed where release defers."""
    tq.sg.Manager = HandlerPrefill
    monkeypatch.setattr(CONN, "AbortNotification", AbortNotification, raising=False)
    prefill = tq.Prefill(gate=gate)
    prefill.room(7, KVPoll.Success)
    prefill.told(7)
    assert prefill.misread is None and prefill.acks(drained=True) == acks


def test_a_queue_taking_its_group_from_the_runtime_context_gets_a_one_rank_attention_group(tq, monkeypatch):
    """0.5.22's DecodeTransferQueue takes no gloo_group: it reads the attention-TP group the process groups write."""
    stamped, published = {}, []
    context = types.ModuleType("sglang.srt.runtime_context")
    context.SpawnRanks = lambda world_rank: ("ranks", world_rank)
    context.publish = lambda args, role, ranks: published.append(ranks)
    context.get_parallel = lambda: SimpleNamespace(override_permanently=stamped.update)
    srt = types.ModuleType("sglang.srt")
    srt.runtime_context = context
    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    monkeypatch.setitem(sys.modules, "sglang.srt", srt)
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", context)
    adapted = []

    class ContextQueue(Queue):
        def __init__(self, req_to_metadata_buffer_idx_allocator, metadata_buffers, scheduler, tree_cache):
            super().__init__(None, req_to_metadata_buffer_idx_allocator, 0, metadata_buffers, scheduler, tree_cache)

    for queue, stamps in ((Queue, {}), (ContextQueue, {"world_size": 1, "cpu_group": None})):
        monkeypatch.setattr(tq.sg, "Queue", queue)
        stamped.clear()
        tq.publish(adapted.append)
        assert {k: getattr(v, k) for v in stamped.values() for k in ("world_size", "cpu_group")} == stamps
    assert adapted.count("one-rank-attention-group") == 1 and published == [("ranks", 0)] * 2


def test_a_freed_metadata_slot_is_reset_through_clear_slot_as_0_5_23_resets_it(tq):
    world = tq.World(gate=False)
    world.metadata_buffers.bootstrap_room[2] = [7]
    world.metadata_buffers.clear_slot(2)
    assert world.metadata_buffers.bootstrap_room[2] == 0


def test_the_cache_is_told_of_a_release_as_0_5_22_tells_it(tq):
    """0.5.22's release_kv_cache passes ``checkpointed`` by keyword (0.5.21: positionally)."""
    world = tq.World(gate=False)
    world.tree_cache.on_release(object(), checkpointed=False)
    world.tree_cache.on_release(object(), False)


@pytest.mark.parametrize("blind", [PrefillBlind, PrefillBlindByCount])
def test_a_prefill_loop_that_takes_the_abort_for_a_bootstrap_message_handles_none(fresh_probe, tq, blind):
    """Driven, not read: told of the abort, the loop fails on the ABORT's frames in itself (the room read as a
    number: ValueError; a frame the ABORT does not carry: IndexError), so it handles no ABORT."""
    tq.sg.Manager = blind
    for sid in ("P1", "P2"):
        found = run(fresh_probe, sid)
        assert (found["observed"], found["error"]) == ({"abort_handled": "absent"}, None)


def test_a_loop_failing_in_a_helper_it_calls_is_the_scenario_s_error_not_a_loop_without_abort(fresh_probe, tq):
    tq.sg.Manager = PrefillFailingInAHelper
    found = run(fresh_probe, "P1")
    assert found["observed"] == {} and "told:IndexError" in found["error"]["message"]


# ---------------------------------------------------------------- older layouts


@pytest.mark.parametrize("lacks_mooncake, receiver, fact", [
    (True, Receiver, {"mooncake_manager": "absent"}),
    (False, PatientReceiver, {"receiver_abort": "absent"}),
    (False, TimingOutReceiver, {"receiver_abort": "absent"}),
])
def test_a_tree_lacking_what_a_scenario_drives_records_so_and_d9_d10_still_drive_one_without_abort(
        fresh_probe, tq, monkeypatch, lacks_mooncake, receiver, fact):
    """No Mooncake package (PD's transfer a placeholder): every scenario records it. A receiver with no abort(): the
    scenarios that abort it record that; D9 (its wait) and D10 (a client abort, a day) drive it all the same."""
    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__version__="0.0.test"))
    monkeypatch.setattr(tq, "lacks_backend", lambda backend: lacks_mooncake)
    monkeypatch.setattr(tq, "prepare", lambda adapt, backend="mooncake": None)  # sg is the fixture's
    monkeypatch.setattr(tq.sg, "Receiver", receiver)
    monkeypatch.setattr(tq.sg, "Scheduler", OldScheduler)
    probe = fresh_probe("probe_deferred_release_differential.py")
    assert probe.prepare() == "0.0.test"
    driven = set() if lacks_mooncake else {"D9", "D10"}
    for sc in probe.SCENARIOS.scenarios:
        found = sys.modules["_probekit"].run_scenario(sc)
        assert found["error"] is None
        assert (found["observed"] == fact) is (sc.id not in driven)
        assert (fact.keys() & found["observed"].keys() == set()) is (sc.id in driven)
    monkeypatch.setattr(tq, "lacks_backend", lambda backend: False)
    monkeypatch.setattr(tq.sg, "Receiver", Receiver)
    probe.prepare()
    assert "receiver_abort" not in sys.modules["_probekit"].run_scenario(probe.SCENARIOS.scenarios[0])["observed"]


@pytest.mark.parametrize("queue, receiver, expected", [
    (EarlyQueue, Receiver, {"timed_out": True, "abort_sent": 1, "freed_before_last_write": 8, "written_into_other": 8}),
    (Queue, Receiver, {"timed_out": True, "abort_sent": 1, "freed_before_last_write": 0, "written_into_other": 0}),
    (Queue, TimingOutReceiver, {"timed_out": True, "abort_sent": 0, "freed_before_last_write": 8,
                                "written_into_other": 8}),  # told no one, so nothing holds it
    (Queue, PatientReceiver, {"timed_out": False, "abort_sent": 0, "freed_before_last_write": 0,
                              "written_into_other": 0}),
])
def test_d9_a_wait_that_runs_out_mid_transfer_gives_the_slots_back_at_once_or_holds_them_past_the_last_write(
        fresh_probe, tq, queue, receiver, expected):
    tq.sg.Queue, tq.sg.Receiver = queue, receiver
    found = run(fresh_probe, "D9")
    assert found["error"] is None
    assert {k: found["observed"][k] for k in expected} == expected
    assert found["observed"]["freed_total"] == (8 if expected["timed_out"] else 0)  # a hold ends at its deadline


class SlotsBackWhileRunningQueue(Queue):
    """Gives a request's slots back while its transfer still runs, without ending the request."""

    def pop_transferred(self):
        for decode_req in self.queue:
            if not getattr(decode_req, "given_back", False):
                decode_req.given_back = True
                self.tree_cache.cache_finished_req(decode_req.req)
        return []


@pytest.mark.parametrize("queue, receiver, gave_up", [
    (Queue, Receiver, True),  # aborted: held, then given back at the hold's deadline
    (Queue, TimingOutReceiver, True),  # the abort never reaches it; its wait runs out
    (Queue, PatientReceiver, False),  # neither: the request keeps its slots
    (SlotsBackWhileRunningQueue, PatientReceiver, True),  # never ended, but its slots went back: given up
])
def test_d10_a_decode_gives_a_client_aborted_request_up_within_a_day_unless_it_never_gives_up(
        fresh_probe, tq, queue, receiver, gave_up):
    tq.sg.Queue, tq.sg.Receiver = queue, receiver
    if not hasattr(receiver, "abort"):
        tq.sg.Scheduler = OldScheduler
    found = run(fresh_probe, "D10")
    assert found["error"] is None and found["observed"]["gave_up"] is gave_up
    assert found["observed"]["written_into_other"] == found["observed"]["freed_total"] == (8 if gave_up else 0)


# D9 and D10 as 0.4.9.post1 to 0.4.9.post4 record them (a wait that runs out, telling no one) and as the trees up to
# 0.4.9 do (the decode never gives up).
TIMES_OUT = {"D9": {"abort_sent": 0, "double_freed": 0, "freed_before_last_write": 8, "freed_total": 8, "meta_freed": 1,
                    "meta_freed_before_last_write": 1, "timed_out": True, "written_after_free": 8,
                    "written_into_other": 8},
             "D10": {"double_freed": 0, "freed_total": 8, "gave_up": True, "meta_freed": 1, "written_after_free": 8,
                     "written_into_other": 8}}
NEVER = {"D9": {"abort_sent": 0, "double_freed": 0, "freed_before_last_write": 0, "freed_total": 0, "meta_freed": 0,
                "meta_freed_before_last_write": 0, "timed_out": False, "written_after_free": 0,
                "written_into_other": 0},
         "D10": {"double_freed": 0, "freed_total": 0, "gave_up": False, "meta_freed": 0, "written_after_free": 0,
                 "written_into_other": 0}}


@pytest.mark.parametrize(("fact", "driven", "answer"), [
    ({"mooncake_manager": "absent"}, {}, "not affected"),
    ({"receiver_abort": "absent"}, {}, "neither"),  # D9 and D10 never observed: unknown
    ({"receiver_abort": "absent"}, TIMES_OUT, "pre-fix"),
    ({"receiver_abort": "absent"}, NEVER, "not affected"),
    # D10 gave up (a control departed) or was never driven: D9 alone holds the slots as the fix does, but never
    # timed out (it departs where both sides agree): not the fixed code, and no all-clear
    ({"receiver_abort": "absent"}, {"D9": NEVER["D9"], "D10": {**NEVER["D10"], "gave_up": True}}, "deviates"),
    ({"receiver_abort": "absent"}, {"D9": NEVER["D9"]}, "deviates"),
], ids=["no-mooncake", "no-abort-undriven", "times-out", "never-gives-up", "gave-up", "d9-alone"])
def test_the_registry_reads_old_trees_by_what_d9_and_d10_observed(fact, driven, answer):
    """A tree without Mooncake is not affected; one whose receiver has no abort() is read by D9 (its wait running
    out) and D10 (a client abort, a day): pre-fix where the wait gives the slots back under the last write, not
    affected only where D10 saw the decode never give up."""
    import json

    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("deferred_release")
    base, head = (json.loads((PROJECT / "results" / f"deferred_release.{side}.release-{exp.releases[side]}.json")
                             .read_text()) for side in ("base", "head"))
    doc = json.loads(json.dumps(base))
    for sid, sc in doc["scenarios"].items():
        sc.update(error=None, observed=dict(driven.get(sid, fact)))
    assert judge(doc, base, head, exp).classification.value == answer


# ---------------------------------------------------------------- trees with no envs (0.4.x)


class GateReadingManager(Manager):
    """A port of #35049 into a tree with no ``envs`` (0.4.10's): its constructor reads the gate its own way. The
    driver never runs it (``object.__new__``): whether it names the gate is what the driver asks of it."""

    def __init__(self):
        from sglang.srt.utils import get_bool_env_var

        self.enable_deferred_decode_kv_release = get_bool_env_var("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE")


class GatelessManager(Manager):
    """A release with no ``envs`` (0.4.x as published): its constructor reads variables, none of them the gate."""

    def __init__(self):
        self.waiting_timeout = int(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300"))


def get_bool_env_var(name, default="false"):
    """0.4.x's ``sglang.srt.utils.get_bool_env_var``."""
    return os.getenv(name, default).lower() in ("true", "1")


@pytest.fixture
def no_envs(tq, monkeypatch):
    """A tree with no ``sglang.srt.environ``: its ``sglang.srt.utils`` holds the boolean reader its code calls."""
    utils = SimpleNamespace(get_bool_env_var=get_bool_env_var)
    for name, module in (("sglang", SimpleNamespace(__path__=[])), ("sglang.srt", SimpleNamespace(__path__=[])),
                         ("sglang.srt.utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(tq.sg, "envs", None)
    return tq


@pytest.mark.parametrize("read", [True, False], ids=["its-own-reading", "gate-off-as-before"])
def test_a_port_in_a_tree_without_envs_is_driven_with_its_manager_s_gate_as_the_tree_reads_it(fresh_probe, no_envs,
                                                                                            read):
    """0.4.10's port reads the gate with get_bool_env_var (no envs): the manager stand-ins carry it as that reads
    it, and the result names the reader. Left off (as before), the port's manager drops the acks its queue waits
    for: held past the last ack, never given back within the scenario (what the corpus could not tell)."""
    tq, adapted = no_envs, []
    tq.sg.Manager = GateReadingManager
    if read:
        tq.read_gate_where(adapted.append)
    assert adapted == (["gate-via-get_bool_env_var"] if read else [])
    assert tq.World(gate=True).manager.enable_deferred_decode_kv_release is read
    assert tq.World(gate=False).manager.enable_deferred_decode_kv_release is False
    assert tq.Prefill(gate=True).manager.enable_deferred_decode_kv_release is read
    assert tq.gate_default() is None  # a default is an argument of the tree's call, not a declaration read here
    found = run(fresh_probe, "D1")
    assert found["error"] is None
    assert (found["observed"]["freed_before_last_write"], found["observed"]["freed_total"]) == (0, 8 if read else 0)


def test_a_tree_without_envs_or_a_get_bool_env_var_is_read_from_os_environ_as_that_helper_would(no_envs,
                                                                                                monkeypatch):
    tq, adapted = no_envs, []
    monkeypatch.setitem(sys.modules, "sglang.srt.utils", None)  # no such module: the import fails
    tq.sg.Manager = GateReadingManager
    tq.read_gate_where(adapted.append)
    assert adapted == ["gate-via-os-environ"]
    assert tq.World(gate=True).manager.enable_deferred_decode_kv_release is True
    monkeypatch.setenv(GATE, "1")
    assert tq._tree_gate() is True
    monkeypatch.setenv(GATE, "yes")  # get_bool_env_var reads anything but true/1 as false
    assert tq._tree_gate() is False


@pytest.mark.parametrize("manager", [Manager, GatelessManager], ids=["no-constructor", "reads-no-gate"])
def test_a_tree_without_envs_whose_manager_reads_no_gate_keeps_it_off_and_names_no_reader(no_envs, manager):
    """Every release with no envs (0.4.x, 0.5.0 to 0.5.2): nothing in the tree reads the gate, so the stand-ins
    carry it off whatever the environment, and the result gains no adaptation: as before this reading."""
    tq, adapted = no_envs, []
    tq.sg.Manager = manager
    tq.read_gate_where(adapted.append)
    assert adapted == [] and tq.sg.gate_reader is None
    assert tq.World(gate=True).manager.enable_deferred_decode_kv_release is False
    assert tq.Prefill(gate=True).manager.enable_deferred_decode_kv_release is False


def test_a_tree_with_envs_takes_the_gate_from_it_and_asks_nothing_of_its_manager(tq, monkeypatch):
    """0.5.3 on (and every port there): the tree's envs decides, as before; no constructor is read."""
    def never(*args, **kwargs):
        raise AssertionError("a tree with envs must not be asked how its manager reads the gate")

    monkeypatch.setattr(tq, "class_fact", never)
    tq.sg.Manager, adapted = GateReadingManager, []
    tq.read_gate_where(adapted.append)
    assert adapted == [] and tq.sg.gate_reader is None
    assert tq.World(gate=True).manager.enable_deferred_decode_kv_release is True
    assert tq.World(gate=False).manager.enable_deferred_decode_kv_release is False


class EngineRankPrefill(PrefillManager):
    """0.4.10's port: the drain ack names the rank its transfer worker reports a status with (kv_args.engine_rank)."""

    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                msg = self.server_socket.recv_multipart()
                if msg[0] == b"ABORT" and self._staging_outstanding.get(int(msg[1]), 0) == 0:
                    rank = str(self.kv_args.engine_rank).encode()
                    self._connect(f"tcp://{msg[2].decode()}:{int(msg[3])}").send_multipart([b"ABORT_ACK", msg[1],
                                                                                            rank])

        CONN.threading.Thread(target=bootstrap_thread).start()


def test_a_prefill_rank_naming_itself_by_its_engine_rank_sends_its_drain_ack(fresh_probe, tq):
    tq.sg.Manager = EngineRankPrefill
    found = run(fresh_probe, "P2")
    assert (found["observed"], found["error"]) == ({"acks_at_abort": 1, "drain_acks_at_abort": 1}, None)
