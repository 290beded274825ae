"""The NIXL deferred-release probe's stand-ins record each ack against the writes still landing; the scenarios read it.

No SGLang, no numpy: ``probes/_nixl.py`` is loaded as a cell loads it, with small managers written here in place
of SGLang's ``NixlKVManager`` (one that never acks an abort, as the trees before PR #35360; one that acks once its
room has drained, as the fixed ones; one that acks at once, whatever is in flight). What is tested is the
probe's own recording: an ack sent while a posted write has not completed is ``in_flight``, a write posted after
an ack is ``after_ack``, scripted transfer states answer in order, the server's variable is set only while a
manager reads it, and what a tree lacks is recorded (or is the scenario's error, never an absence).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from types import SimpleNamespace

import pytest

from conftest import PROJECT

GATE = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"


# ---------------------------------------------------------------- the tree's types, in miniature


class KVPoll(enum.IntEnum):
    Failed = 0
    WaitingForInput = 2
    Transferring = 3
    Success = 4


@dataclasses.dataclass
class Chunk:
    room: int
    prefill_kv_indices: list
    index_slice: slice
    is_last_chunk: bool
    prefill_aux_index: int | None
    state_indices: list | None
    staging_counted: bool = False


@dataclasses.dataclass
class TransferInfo:
    room: int
    endpoint: str
    dst_port: int
    agent_name: str
    dst_kv_indices: list
    dst_aux_index: int


class Gate:
    """The tree's ``envs`` entry: read from the environment at each ``get``."""

    def get(self):
        return os.environ.get(GATE, "false") == "true"


CONN = SimpleNamespace(threading=None)


class Manager:
    """A NIXL KV manager in miniature, answering an abort as the trees before #35360 do: never acked."""

    def check_status(self, room):
        return self.request_status.get(room, KVPoll.WaitingForInput)

    def update_status(self, room, status):
        if self.request_status.get(room) != KVPoll.Failed:
            self.request_status[room] = status

    def record_failure(self, room, reason):
        self.failure_records[room] = reason

    def _handle_abort_notification(self, msg):
        room, ip, port = int(msg[1]), msg[2].decode(), int(msg[3])
        active = room in self.request_status and self.check_status(room) != KVPoll.Success
        if active:
            self.update_status(room, KVPoll.Failed)
        self.on_abort(room, ip, port, active)
        return True

    def on_abort(self, room, ip, port, active):
        pass

    def _ack(self, room):
        self._send_multipart_locked("tcp://x", [b"ABORT_ACK", str(room).encode(), str(self.attn_tp_rank).encode()])

    def transfer_worker(self, queue):
        while True:
            chunk = queue.get()
            room = chunk.room
            try:
                self._staging_outstanding[room] += 1
                if self.check_status(room) == KVPoll.Failed:
                    self._staging_outstanding.pop(room, None)
                    self.on_drained(room)
                    continue
                info = self.transfer_infos[room][next(iter(self.transfer_infos[room]))]
                handles = [self.send_kvcache(info.agent_name, chunk.prefill_kv_indices, [], info.dst_kv_indices, 0, "")]
                if chunk.is_last_chunk:
                    handles.append(self.send_aux())
                while not all(self.agent.check_xfer_state(h) == "DONE" for h in handles):
                    if any(h.states[0] == "ERR" for h in handles):
                        raise RuntimeError("ERR")
                self._staging_outstanding[room] -= 1
                self.on_drained(room)
                if chunk.is_last_chunk:
                    self.update_status(room, KVPoll.Success)
            except Exception as exc:
                self.exceptions[room] = exc
                self.update_status(room, KVPoll.Failed)

    def on_drained(self, room):
        pass

    def _start_decode_listener_thread(self):
        def listener():
            while True:
                msg = self.server_socket.recv_multipart()
                if msg[0] == b"ABORT_ACK":
                    self.note_abort_ack(int(msg[1]), int(msg[2]))

        CONN.threading.Thread(target=listener, daemon=True).start()

    def note_abort_ack(self, room, rank):
        pass


class Drained(Manager):
    """Acks an aborted room once nothing is outstanding for it, once (#35360)."""

    def on_abort(self, room, ip, port, active):
        if self.enable_deferred_decode_kv_release and active:
            self._deferred_ack_targets[room] = (ip, port)
            self.on_drained(room)

    def on_drained(self, room):
        if self._staging_outstanding.get(room, 0) == 0 and self._deferred_ack_targets.pop(room, None):
            self._ack(room)

    def register_deferred_abort_room(self, room):
        self._deferred_abort_ack_tracker[room] = set()

    def note_abort_ack(self, room, rank):
        if room in self._deferred_abort_ack_tracker:
            self._deferred_abort_ack_tracker[room].add(rank)


@dataclasses.dataclass(frozen=True)
class AbortNotification:
    """0.5.22's ABORT frame: the decode's ack generation appended where it armed one."""

    room: int
    decode_ip: str | None = None
    decode_port: int | None = None
    generation: int | None = None

    def to_zmq(self):
        tail = [] if self.generation is None else [str(self.generation).encode()]
        return [b"ABORT", str(self.room).encode(), self.decode_ip.encode(), str(self.decode_port).encode(), *tail]


@dataclasses.dataclass
class AckState:
    generation: int
    prefill_ranks: set


class Generational(Drained):
    """0.5.22: acks only an ABORT that carries the decode's generation; the decode keeps its acks per generation."""

    def _handle_abort_notification(self, msg):
        self.generation = int(msg[4]) if len(msg) > 4 else None
        return super()._handle_abort_notification(msg)

    def on_abort(self, room, ip, port, active):
        if self.generation is not None:
            super().on_abort(room, ip, port, active)

    def register_deferred_abort_room(self, room):
        self._deferred_abort_ack_tracker[room] = AckState(1, set())
        return 1

    def note_abort_ack(self, room, rank):
        if room in self._deferred_abort_ack_tracker:
            self._deferred_abort_ack_tracker[room].prefill_ranks.add(rank)


class Eager(Drained):
    """Acks at the abort, whatever is still in flight."""

    def on_abort(self, room, ip, port, active):
        if active:
            self._ack(room)


class Sender:
    def clear(self):
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)


class Direct:
    """A NIXL prefill manager before the transfer worker (up to 0.5.11), in miniature: nothing handles an ``ABORT``;
    ``add_transfer_request`` posts a chunk's writes at once and hands their handles to the sender."""

    def check_status(self, room):
        return self.request_status[room]

    def update_status(self, room, status):
        self.request_status[room] = status

    def add_transfer_request(self, room, kv_indices, index_slice, is_last, chunk_id, aux_index=None):
        info = next(iter(self.transfer_infos[room].values()))
        handles = [self.send_kvcache(info.agent_name, kv_indices, [], info.dst_kv_indices[index_slice], 0, "")]
        if is_last:
            handles.append(self.send_aux(info.agent_name, aux_index, [], info.dst_aux_index, ""))
        return handles


class DirectSender:
    """Its sender: ``send`` hands each chunk to ``add_transfer_request``; once the last is posted, ``poll`` reads the
    posted writes' states."""

    def init(self, num_kv_indices, aux_index=None):
        self.num_kv_indices, self.aux_index = num_kv_indices, aux_index

    def send(self, kv_indices):
        index_slice = slice(self.curr_idx, self.curr_idx + len(kv_indices))
        self.curr_idx += len(kv_indices)
        self.has_sent = self.curr_idx == self.num_kv_indices
        self.xfer_handles += self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, index_slice,
                                                              self.has_sent, self.chunk_id, self.aux_index)
        self.chunk_id += 1

    def poll(self):
        if not self.has_sent:
            return self.kv_mgr.check_status(self.bootstrap_room)
        states = [self.kv_mgr.agent.check_xfer_state(h) for h in self.xfer_handles]
        return KVPoll.Success if all(state == "DONE" for state in states) else KVPoll.WaitingForInput


class Decode:
    """The decode side X9 drives (``_transferqueue.World``: the tree's transfer queue and NIXL receiver) in
    miniature. ``frees``: the client abort gives the request's slots back at once (0.5.10 to 0.5.18); else the
    receiver ignores it and the request keeps them, still queued (0.5.5.post1 to 0.5.9)."""

    frees = False

    def __init__(self):
        self.slots, self.freed_slots = 0, 0

    def admit(self, rid, room, *, tokens):
        self.slots = tokens
        return SimpleNamespace(sent=[])  # a receiver that tells no prefill rank

    def abort(self, rid):
        self.freed_slots = self.slots if self.frees else 0

    def next_request_while_writing(self, *, tokens):
        pass

    def freed(self, rid):
        return self.freed_slots

    def kept(self, rid):
        return self.freed_slots == 0

    def last_write(self, rid):
        return {"written_after_free": self.freed_slots, "written_into_other": self.freed_slots}

    def receive(self, *messages):
        pass

    def iterate(self):
        pass

    def error(self):
        return None

    def double_freed(self):
        return 0


class Frees(Decode):
    frees = True


@pytest.fixture
def nixl(fresh_probe, monkeypatch):
    """``_nixl`` loaded as a cell loads it, its ``sg`` filled as ``prepare`` fills it on a tree with #35049's
    flag; the probe loaded after it imports this copy. The module's numpy answers its two calls with lists."""
    module = fresh_probe("_nixl.py")
    monkeypatch.setitem(sys.modules, "_nixl", module)
    monkeypatch.delenv(GATE, raising=False)
    module.sg.__dict__.update(conn=CONN, Manager=Drained, KVPoll=KVPoll,
                              Mode=SimpleNamespace(PREFILL="prefill", DECODE="decode"), Chunk=Chunk,
                              TransferInfo=TransferInfo, RegisterInfo=None, Sender=Sender, gate=Gate(), Notification=None,
                              np=SimpleNamespace(int32="int32", arange=lambda a, b, dtype=None: list(range(a, b))),
                              unobserved=None, absent={}, handles_abort=True, worker=True, ready=True)
    return module


def scenario(fresh_probe, sid, manager, nixl):
    """One scenario of the probe, as the kit runs it, on ``manager``; what it observed."""
    probe = fresh_probe("probe_deferred_release_nixl_differential.py")
    nixl.sg.Manager = manager
    (found,) = [s for s in probe.SCENARIOS.scenarios if s.id == sid]
    observed = {}
    found.run(observed)
    return observed


# ---------------------------------------------------------------- the stand-ins' recording


def test_an_ack_sent_while_a_posted_write_runs_is_in_flight_and_a_write_after_it_is_after_ack(nixl):
    world = nixl.World()
    running = world._post("kv", [1, 2])
    world._send("tcp://x", [b"ABORT_ACK", b"7", b"0"])
    later = world._post("aux", [])
    assert world.acks[0]["in_flight"] is True
    assert (running.after_ack, later.after_ack) == (False, True)
    assert running.pages == [1, 2]


def test_a_room_s_status_sent_the_ack_s_way_is_no_ack(nixl):
    """0.5.23 sends the room's KV status through the same send as its acks."""
    world = nixl.World()
    world._send("tcp://x", [b"KV_STATUS", b"7", b"4", b"0", b""])
    assert world.acks == [] and world.statuses == [[b"KV_STATUS", b"7", b"4", b"0", b""]]


def test_the_sender_is_cleared_as_its_constructor_leaves_it(nixl, monkeypatch):
    """0.5.23's clear reads the sender's conclude_state."""
    class ConcludingSender(Sender):
        def clear(self):
            assert self.conclude_state is None
            super().clear()

    monkeypatch.setattr(nixl.sg, "Sender", ConcludingSender)
    manager = SimpleNamespace(request_status={7: KVPoll.Success})
    nixl.clear(manager, 7)
    assert manager.request_status == {}


def test_a_posted_write_answers_its_scripted_states_in_order_the_last_one_repeating(nixl):
    world = nixl.World()
    polled = []
    world.script("PROC", "DONE", on_poll=lambda: polled.append(world.in_flight()))
    handle = world._post("kv", [])
    states = [world._check_xfer_state(handle) for _ in range(3)]
    assert states == ["PROC", "DONE", "DONE"]
    assert polled == [True]  # the hook ran once, at the first poll, while the write still ran
    assert handle.finished and not world.in_flight()


def test_an_unscripted_write_is_done_at_its_first_poll_and_an_error_settles_it(nixl):
    world = nixl.World()
    world.script("ERR")
    failed, plain = world._post("kv", []), world._post("aux", [])
    assert world._check_xfer_state(failed) == "ERR" and failed.finished
    assert world._check_xfer_state(plain) == "DONE"


def test_the_variable_is_set_only_while_the_manager_reads_its_flag(nixl, monkeypatch):
    monkeypatch.setenv(GATE, "operator's")
    assert nixl.World(gate=True).prefill().enable_deferred_decode_kv_release is True
    assert nixl.World(gate=False).prefill().enable_deferred_decode_kv_release is False
    assert os.environ[GATE] == "operator's"  # restored
    monkeypatch.delenv(GATE)
    with nixl.gated(True):
        assert os.environ[GATE] == "true"
    assert GATE not in os.environ


def test_a_tree_without_the_flag_gets_none_and_reads_as_such(nixl):
    nixl.sg.gate = None
    manager = nixl.World().prefill()
    assert not hasattr(manager, "enable_deferred_decode_kv_release")
    assert nixl.deferred_enabled(manager) is None


def test_the_listener_runs_on_the_probe_s_thread_until_its_script_ends(nixl):
    decode = nixl.World().decode()
    nixl.hold(decode, 7)
    nixl.listen(decode, [[b"ABORT_ACK", b"7", b"0"], [b"ABORT_ACK", b"7", b"1"], [b"ABORT_ACK", b"8", b"0"]])
    assert nixl.ranks_acked(decode, 7) == 2 and nixl.ranks_acked(decode, 8) == 0
    assert CONN.threading is None  # the module's threading is put back


def test_a_decode_manager_without_a_listener_cannot_be_observed(nixl):
    class NoListener(Manager):
        _start_decode_listener_thread = None

    nixl.sg.Manager = NoListener
    with pytest.raises(nixl.CannotObserve, match="no listener thread"):
        nixl.listen(nixl.World().decode(), [])


# ---------------------------------------------------------------- the scenarios on managers written here


@pytest.mark.parametrize("manager, expected", [
    (Manager, {"acks_sent": 0, "acks_at_abort": 0, "acks_while_writing": 0}),
    (Drained, {"acks_sent": 1, "acks_at_abort": 0, "acks_while_writing": 0}),
    (Eager, {"acks_sent": 1, "acks_at_abort": 1, "acks_while_writing": 1}),
])
def test_x1_an_abort_mid_chunk_is_acked_only_once_the_chunk_in_flight_completes(fresh_probe, nixl, manager,
                                                                                 expected):
    observed = scenario(fresh_probe, "X1", manager, nixl)
    assert {k: observed[k] for k in expected} == expected
    assert observed["writes"] == 1 and observed["writes_after_ack"] == 0  # the chunk after the abort is skipped
    assert observed["worker_error"] is None and observed["targets_held"] == 0


@pytest.mark.parametrize("manager, acks", [(Manager, 0), (Drained, 1)])
def test_x2_a_quiescent_room_is_acked_by_the_abort_itself(fresh_probe, nixl, manager, acks):
    observed = scenario(fresh_probe, "X2", manager, nixl)
    assert (observed["acks_at_abort"], observed["acks_sent"], observed["writes"]) == (acks, acks, 0)


def test_x5_the_error_path_leaves_the_sibling_write_running_and_unacked(fresh_probe, nixl):
    observed = scenario(fresh_probe, "X5", Drained, nixl)
    assert observed["worker_error"] == "RuntimeError"
    assert observed["siblings_settled"] is False and observed["acks_sent"] == 0
    assert observed["targets_held"] == 1  # registered at the abort, never drained


@pytest.mark.parametrize("manager, ranks", [(Manager, (0, 0)), (Drained, (1, 2))])
def test_x6_the_decode_counts_each_prefill_rank_once(fresh_probe, nixl, manager, ranks):
    observed = scenario(fresh_probe, "X6", manager, nixl)
    assert (observed["decode_ranks_acked_after_first"], observed["decode_ranks_acked"]) == ranks
    assert observed["acks_while_writing"] == 0 and observed["writes_after_ack"] == 0


@pytest.mark.parametrize("sid, acks", [("X1", 1), ("X2", 1)])
def test_a_generational_tree_gets_the_abort_with_the_generation_its_decode_armed(fresh_probe, nixl, sid, acks):
    """0.5.22 on: the ABORT is the tree's own frame, carrying the generation a deferring decode armed."""
    nixl.sg.Notification = AbortNotification
    assert scenario(fresh_probe, sid, Generational, nixl)["acks_sent"] == acks


def test_a_generational_decode_counts_the_ranks_of_its_generation(fresh_probe, nixl):
    nixl.sg.Notification = AbortNotification
    observed = scenario(fresh_probe, "X6", Generational, nixl)
    assert (observed["decode_ranks_acked_after_first"], observed["decode_ranks_acked"]) == (1, 2)


def test_an_abort_from_a_decode_that_does_not_defer_carries_no_generation(nixl):
    nixl.sg.Notification = AbortNotification
    off = SimpleNamespace(enable_deferred_decode_kv_release=False)
    assert nixl.abort_frames(off, 7) == [b"ABORT", b"7", nixl.DECODE_IP.encode(), str(nixl.DECODE_PORT).encode()]


def test_x7_reads_the_tree_s_flag_with_the_variable_unset(fresh_probe, nixl):
    observed = scenario(fresh_probe, "X7", Drained, nixl)
    assert observed["deferred_enabled"] is False and observed["acks_sent"] == 0


def test_x8_a_completed_transfer_succeeds_unacked(fresh_probe, nixl):
    observed = scenario(fresh_probe, "X8", Drained, nixl)
    assert observed["room_succeeded"] is True
    assert (observed["writes"], observed["acks_sent"]) == (3, 0)


# ---------------------------------------------------------------- what a tree lacks


@pytest.mark.parametrize("fact", [{"nixl_manager": "absent"}, {"nixl_abort_handler": "absent"}])
def test_what_a_tree_lacks_is_recorded_and_the_scenario_stops_there(fresh_probe, nixl, fact):
    nixl.sg.absent = fact
    assert scenario(fresh_probe, "X1", Drained, nixl) == fact


def test_what_could_not_be_observed_is_the_scenario_s_error_never_an_absence(fresh_probe, nixl):
    nixl.sg.unobserved = "the tree's NIXL manager has no transfer_worker"
    with pytest.raises(nixl.CannotObserve, match="no transfer_worker"):
        scenario(fresh_probe, "X8", Drained, nixl)


def test_the_registry_names_every_key_the_probe_observes_on_head():
    """Every key the expectations name is one the probe writes (a renamed key would never be compared)."""
    source = (PROJECT / "probes" / "probe_deferred_release_nixl_differential.py").read_text()
    from pdevidence import registry

    exp = registry.load(PROJECT).experiment("deferred_release_nixl")
    keys = {k for e in exp.expect.values() for k in {**e.base, **e.head}}
    assert keys and all(k in source for k in keys)


# ---------------------------------------------------------------- the real thing


@pytest.mark.sglang
def test_real_base_never_acks_and_head_acks_each_abort_once_drained(release_matrix):
    """Alone proves, on the real bracket (0.5.18, 0.5.19): the base never answers an abort; the head acks a
    room once its chunk in flight completes (never while a write runs, none posted after), a quiescent or
    concluded room at once, each prefill rank once, and nothing with the variable unset or without an abort;
    through the tree's decode queue, the base frees the aborted request's slots under the prefill's last write
    and the head only after that rank's ack."""
    observed = {}
    for side in ("base", "head"):
        scenarios = release_matrix.scenarios("deferred_release_nixl", side)
        assert all(sc["error"] is None for sc in scenarios.values()), scenarios
        observed[side] = {sid: sc["observed"] for sid, sc in scenarios.items()}
    base, head = observed["base"], observed["head"]
    assert all(base[sid]["acks_sent"] == 0 for sid in base if sid != "X10")  # X10 drives the decode alone
    assert (head["X1"]["acks_sent"], head["X1"]["acks_at_abort"], head["X1"]["writes_after_ack"]) == (1, 0, 0)
    assert head["X2"]["acks_at_abort"] == head["X3"]["acks_at_abort"] == 1
    assert (head["X6"]["decode_ranks_acked_after_first"], head["X6"]["decode_ranks_acked"]) == (1, 2)
    assert all(head[sid]["acks_while_writing"] == 0 for sid in head if sid not in ("X9", "X10"))  # they count slots
    assert head["X4"]["acks_sent"] == head["X5"]["acks_sent"] == head["X7"]["acks_sent"] == head["X8"]["acks_sent"] == 0
    assert head["X7"]["deferred_enabled"] is False and base["X7"]["deferred_enabled"] is None
    # the whole loop through the tree's decode queue: the base frees the 4 slots under the last write
    assert (base["X9"]["freed_before_last_write"], base["X9"]["written_into_other"]) == (4, 4)
    assert (head["X9"]["freed_before_last_write"], head["X9"]["written_after_free"]) == (0, 0)
    assert head["X9"]["freed_total"] == 4 and head["X9"]["acks_sent"] == 1
    # a client abort and a day without the transfer ending: both decodes give the request up (a hold ends at its
    # deadline), so the day-late write lands in the next request's slots on both sides
    assert base["X10"]["gave_up"] is head["X10"]["gave_up"] is True
    assert base["X10"]["written_into_other"] == head["X10"]["written_into_other"] == 8


@pytest.mark.sglang
@pytest.mark.scheduled  # two eras older than the brackets': the weekly lane's
@pytest.mark.parametrize("release, taken, answer", [("0.5.8", False, "not affected"), ("0.5.10", True, "pre-fix")])
def test_real_prefill_senders_write_as_the_decode_keeps_or_frees_the_aborted_slots(tmp_path, release, taken, answer):
    """Alone proves, on 0.5.8 and 0.5.10 (no NIXL transfer worker, no ABORT handler): X9 drives the prefill rank's
    sender, whose writes land with nothing acked. 0.5.8's decode took no step on the abort (the slots still held as
    they land): not affected; 0.5.10's freed them before the last write, into the next request: pre-fix."""
    import json

    from real_runs import cli_run

    from pdevidence import registry
    from pdevidence.judge.classify import judge

    done = cli_run(tmp_path, "cell", "release", "deferred_release_nixl", "base", "--ref", release, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((tmp_path / f"deferred_release_nixl.base.release-{release}.json").read_text())
    x9 = doc["scenarios"]["X9"]
    assert x9["error"] is None, x9
    assert x9["observed"]["nixl_transfer_worker"] == x9["observed"]["nixl_abort_handler"] == "absent"
    assert x9["observed"]["abort_taken"] is taken and x9["observed"]["acks_sent"] == 0
    freed = 4 if taken else 0
    assert x9["observed"]["freed_before_last_write"] == x9["observed"]["written_into_other"] == freed
    assert doc["scenarios"]["X10"]["observed"]["gave_up"] is True  # its waiting timeout, as on both sides
    exp = registry.load(PROJECT).experiment("deferred_release_nixl")
    base, head = (json.loads((PROJECT / "results" / f"deferred_release_nixl.{side}.release-{exp.releases[side]}.json")
                             .read_text()) for side in ("base", "head"))
    assert judge(doc, base, head, exp).classification.value == answer


# ---------------------------------------------------------------- older layouts


def _conn_with_receiver(poll):
    import importlib.machinery
    import types

    conn = types.ModuleType("sglang.srt.disaggregation.nixl.conn")
    conn.__spec__ = importlib.machinery.ModuleSpec(conn.__name__, None)
    conn.NixlKVReceiver = type("NixlKVReceiver", (), {"poll": poll})
    return conn


def _never_gives_up(self):
    return self.kv_mgr.check_status(self.bootstrap_room)


def _times_out(self):
    return self.kv_mgr.waiting_timeout


@pytest.mark.parametrize("poll", [_never_gives_up, _times_out])
def test_a_nixl_receiver_without_abort_is_recorded_whatever_its_poll_reads(fresh_probe, monkeypatch, poll):
    """Up to 0.5.5 the NIXL decode receiver has no abort(): whether it times out is not read off its source, and
    no scenario drives a timeout: the scenarios record what they lack."""
    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__version__="0.0.test"))
    monkeypatch.setitem(sys.modules, "sglang.srt.disaggregation.nixl.conn", _conn_with_receiver(poll))
    module = fresh_probe("_nixl.py")
    assert module.prepare() == "0.0.test"
    assert module.sg.absent == {"receiver_abort": "absent"}


NEVER_GAVE_UP = {"double_freed": 0, "freed_total": 0, "gave_up": False, "written_after_free": 0, "written_into_other": 0}


@pytest.mark.parametrize(("x10", "answer"), [
    (None, "neither"),  # X10 never observed: unknown
    (NEVER_GAVE_UP, "not affected"),
    ({**NEVER_GAVE_UP, "gave_up": True}, "neither"),  # it gave up: the scenarios set aside nothing decide
], ids=["undriven", "never-gives-up", "gave-up"])
def test_the_registry_reads_a_nixl_receiver_without_abort_by_what_x10_observed(x10, answer):
    """Up to 0.5.5 the NIXL decode receiver has no abort(): not affected only where X10, driven, saw the decode keep
    the request through a client abort and a day without the transfer ending."""
    import json

    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("deferred_release_nixl")
    base, head = (json.loads((PROJECT / "results" / f"deferred_release_nixl.{side}.release-{exp.releases[side]}.json")
                             .read_text()) for side in ("base", "head"))
    doc = json.loads(json.dumps(base))
    for sid, sc in doc["scenarios"].items():
        sc.update(error=None, observed=dict(x10) if sid == "X10" and x10 else {"receiver_abort": "absent"})
    assert judge(doc, base, head, exp).classification.value == answer


@pytest.mark.parametrize("absent", [{"receiver_abort": "absent"}, {"nixl_abort_handler": "absent"}])
def test_x10_drives_the_decode_of_a_tree_lacking_the_prefill_s_or_the_receiver_s_abort(fresh_probe, nixl, monkeypatch,
                                                                                       absent):
    """X10 is the decode's alone: only a tree without NIXL stops it; elsewhere a decode queue the driver could not
    prepare is the scenario's error, never an absence."""
    probe = fresh_probe("probe_deferred_release_nixl_differential.py")
    monkeypatch.setattr(probe._transferqueue.sg, "ready", False, raising=False)
    monkeypatch.setattr(probe._transferqueue.sg, "missing", "no DecodeTransferQueue", raising=False)
    (x10,) = [s for s in probe.SCENARIOS.scenarios if s.id == "X10"]
    nixl.sg.absent, observed = {"nixl_manager": "absent"}, {}
    x10.run(observed)
    assert observed == {"nixl_manager": "absent"}
    nixl.sg.absent = absent
    with pytest.raises(probe._transferqueue.CannotDrive, match="no DecodeTransferQueue"):
        x10.run({})


def test_the_whole_loop_runs_on_a_prefill_rank_that_handles_no_abort_and_says_so(nixl):
    """0.5.12 to 0.5.15.post1: the decode aborts (and frees) while the prefill's worker still writes; X9 runs the
    loop with nothing told on the prefill side, recording why; without a worker or a decode queue it stops."""
    nixl.sg.absent = {"nixl_abort_handler": "absent"}
    observed = {}
    assert nixl.require_loop(observed) is True and observed == {"nixl_abort_handler": "absent"}
    nixl.sg.ready = False
    assert nixl.require_loop({}) is False
    nixl.sg.unobserved = "no transfer_worker"
    with pytest.raises(nixl.CannotObserve, match="no transfer_worker"):
        nixl.require_loop({})


# ---------------------------------------------------------------- up to 0.5.11: the sender posts its chunks itself


@pytest.fixture
def direct(nixl):
    """``nixl`` as ``prepare`` leaves it on 0.5.6 to 0.5.11: no ABORT handler, no transfer worker."""
    nixl.sg.__dict__.update(Manager=Direct, Sender=DirectSender, Chunk=None, worker=False, handles_abort=False,
                            absent={"nixl_abort_handler": "absent"})
    return nixl


def test_a_sender_posting_its_chunks_itself_is_polled_until_its_writes_land(direct):
    world = direct.World()
    manager = world.prefill()
    running = []
    world.script("PROC", "PROC", "DONE", on_poll=lambda: running.append(world.in_flight()))
    direct.bootstrap(manager, 7, pages=4)
    direct.transfer(manager, 7, pages=4)
    assert [(w.kind, w.pages) for w in world.writes] == [("kv", [1070, 1071]), ("kv", [1072, 1073]), ("aux", [])]
    assert running == [True]  # a write was in flight when its states were first read
    assert not world.in_flight() and world.acks == []


def test_a_sender_whose_writes_never_land_cannot_be_observed(direct):
    world = direct.World()
    manager = world.prefill()
    world.script("PROC")
    direct.bootstrap(manager, 7, pages=4)
    with pytest.raises(direct.CannotObserve, match="never ended"):
        direct.transfer(manager, 7, pages=4)


def test_a_tree_with_a_transfer_worker_writes_through_it(nixl):
    world = nixl.World()
    manager = world.prefill()
    nixl.bootstrap(manager, 7, pages=4)
    nixl.transfer(manager, 7, pages=4)
    assert [w.kind for w in world.writes] == ["kv", "kv", "aux"]
    assert manager.check_status(7) == KVPoll.Success  # the worker's: its last chunk concluded the room


@pytest.mark.parametrize("queued, gave_up, kept", [(True, False, True), (False, False, False), (True, True, False)],
                         ids=["waiting", "left-the-queue", "gave-up"])
def test_a_request_is_kept_only_while_queued_and_not_given_up(fresh_probe, queued, gave_up, kept):
    """``_transferqueue.World.kept``, which X9's ``abort_taken`` negates: a request held for a deferred release has
    left the transfer queue; one freed or ended gave up; only one still waiting, untouched, is kept."""
    tq = fresh_probe("_transferqueue.py")
    decode_req = object()
    world = SimpleNamespace(requests={"r": SimpleNamespace(decode_req=decode_req)},
                            queue=SimpleNamespace(queue=[object(), decode_req] if queued else [object()]),
                            gave_up=lambda rid: gave_up)
    assert tq.World.kept(world, "r") is kept


def x9(fresh_probe, monkeypatch, decode):
    """X9 as the kit runs it, its decode side ``decode`` (the tree's queue and receiver in miniature)."""
    probe = fresh_probe("probe_deferred_release_nixl_differential.py")
    monkeypatch.setattr(probe._transferqueue, "World", decode)
    (found,) = [s for s in probe.SCENARIOS.scenarios if s.id == "X9"]
    observed = {}
    found.run(observed)
    return observed


@pytest.mark.parametrize("decode, taken", [(Decode, False), (Frees, True)])
def test_x9_drives_a_prefill_rank_without_a_worker_through_its_sender_and_records_what_it_lacks(
        fresh_probe, monkeypatch, direct, decode, taken):
    observed = x9(fresh_probe, monkeypatch, decode)
    assert observed["nixl_transfer_worker"] == observed["nixl_abort_handler"] == "absent"
    assert observed["abort_taken"] is taken and observed["freed_before_last_write"] == (4 if taken else 0)
    assert observed["acks_sent"] == 0 and observed["abort_sent"] == 0


def test_x9_without_a_write_posted_cannot_be_observed(fresh_probe, monkeypatch, direct):
    class Silent(Direct):
        def add_transfer_request(self, *args, **kwargs):
            return []

    direct.sg.Manager = Silent
    with pytest.raises(direct.CannotObserve, match="posted no write"):
        x9(fresh_probe, monkeypatch, Decode)


@pytest.mark.parametrize("decode, answer", [(Decode, "not affected"), (Frees, "pre-fix")])
def test_the_registry_reads_a_tree_without_a_worker_by_what_its_decode_did_at_the_abort(
        fresh_probe, monkeypatch, direct, decode, answer):
    """Without a worker: not affected where X9 saw the decode keep the request's slots through the client abort and
    the prefill's write (0.5.5.post1 to 0.5.9: nothing goes back under it); a decode that frees them there with
    nothing acked is pre-fix (0.5.10, 0.5.11)."""
    import json

    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("deferred_release_nixl")
    base, head = (json.loads((PROJECT / "results" / f"deferred_release_nixl.{side}.release-{exp.releases[side]}.json")
                             .read_text()) for side in ("base", "head"))
    doc = json.loads(json.dumps(base))
    for sid, sc in doc["scenarios"].items():
        sc["observed"] = {"nixl_abort_handler": "absent"} if sid not in ("X9", "X10") else sc["observed"]
    doc["scenarios"]["X9"]["observed"] = x9(fresh_probe, monkeypatch, decode)
    judged = judge(doc, base, head, exp)
    assert judged.classification.value == answer
    assert bool(judged.evidence) is (answer == "not affected")


def _stub_tree(monkeypatch, manager):
    """A tree's modules as ``prepare`` imports them, with ``manager`` as its NIXL manager."""
    import importlib.machinery
    import types

    def module(name, **attrs):
        found = types.ModuleType(name)
        found.__spec__ = importlib.machinery.ModuleSpec(name, None)
        found.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, found)

    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__version__="0.0.test"))
    module("sglang.srt.disaggregation.nixl.conn", NixlKVManager=manager, NixlKVSender=DirectSender,
           NixlKVReceiver=type("NixlKVReceiver", (), {"abort": lambda self: None}), TransferInfo=TransferInfo,
           np=SimpleNamespace())
    module("sglang.srt.disaggregation.base.conn", KVPoll=KVPoll)
    module("sglang.srt.disaggregation.utils", DisaggregationMode=SimpleNamespace(PREFILL="prefill", DECODE="decode"))
    module("sglang.srt.environ", envs=SimpleNamespace())


def test_a_tree_without_a_worker_or_an_abort_handler_is_prepared_for_x9_alone(fresh_probe, monkeypatch):
    _stub_tree(monkeypatch, Direct)
    module = fresh_probe("_nixl.py")
    assert module.prepare() == "0.0.test"
    assert module.sg.ready and module.sg.worker is False and module.sg.Chunk is None
    observed = {}
    assert module.require_loop(observed) is True
    assert observed == {"nixl_abort_handler": "absent", "nixl_transfer_worker": "absent"}
    assert module.require({}) is False  # X1-X8 drive the handler and the worker


@pytest.mark.parametrize("manager", [
    type("HandlerWithoutWorker", (Direct,), {"_handle_abort_notification": lambda self, msg: None}),
    type("NoWay", (), {}),  # neither a worker nor add_transfer_request
], ids=["handler-without-worker", "nothing-posts"])
def test_a_prefill_that_cannot_be_driven_is_the_scenarios_error(fresh_probe, monkeypatch, manager):
    _stub_tree(monkeypatch, manager)
    module = fresh_probe("_nixl.py")
    module.prepare()
    with pytest.raises(module.CannotObserve, match="no transfer_worker"):
        module.require_loop({})


def test_a_chunk_is_built_with_the_last_flag_as_the_tree_names_it(nixl):
    """0.5.12's TransferKVChunk names it ``is_last``; later ones ``is_last_chunk``."""
    @dataclasses.dataclass
    class OldChunk:
        room: int
        prefill_kv_indices: list
        index_slice: slice
        is_last: bool
        prefill_aux_index: int | None

    nixl.sg.Chunk = OldChunk
    assert nixl.chunk(7, 1, last=True).is_last is True


def test_a_nixl_prefill_without_an_abort_handler_is_judged_by_the_whole_loop():
    import json

    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("deferred_release_nixl")
    base, head = (json.loads((PROJECT / "results" / f"deferred_release_nixl.{side}.release-{exp.releases[side]}.json")
                             .read_text()) for side in ("base", "head"))
    doc = json.loads(json.dumps(base))
    for sid in ("X1", "X2", "X3", "X4", "X5", "X6", "X7", "X8"):
        doc["scenarios"][sid] = {"error": None, "observed": {"nixl_abort_handler": "absent"}}
    judged = judge(doc, base, head, exp)
    assert judged.classification.value == "pre-fix"
    assert judged.scenarios["X9"].value == "pre-fix"
