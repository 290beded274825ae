"""The transfer stand-ins record every message and write on one clock; the abort_notify probe reads them.

No SGLang: ``probes/_kvtransfer.py`` is tested on its own, and the probe is run on a miniature of
SGLang's Mooncake connection written here, in two builds: one that tells the prefill side of a decode
abort and skips the chunks of a failed room (as PR #27372 does), and one that does neither (as the
trees before it). What is tested is the probe's own reading: which messages went where, which
chunks were written after the abort, and that a connection module that does not import is an error
of every scenario, never an absence.
"""

from __future__ import annotations

import importlib
import struct
import sys
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

PROJECT = Path(__file__).resolve().parents[1]
PROBES = PROJECT / "probes"
sys.path.insert(0, str(PROBES))

import _kvtransfer as kvt  # noqa: E402

# ---------------------------------------------------------------- the stand-ins on their own


def test_bus_delivers_in_order_then_ends_the_loop():
    bus = kvt.Bus(kvt.Timeline())
    sock = bus.zmq.Context().socket(1)  # the kind is only noted
    sock.connect("tcp://h:1")
    sock.send_multipart([b"A", b"1"])
    sock.send_multipart([b"B"])
    inbox = bus.inbox("tcp://h:1")
    assert inbox.recv_multipart() == [b"A", b"1"]
    assert inbox.recv_multipart() == [b"B"]
    with pytest.raises(kvt.ScriptEnded):
        inbox.recv_multipart()
    assert [m.head for m in bus.messages(to="tcp://h:1")] == [b"A", b"B"]
    assert bus.messages(b"B")[0].at > bus.messages(b"A")[0].at


def test_a_socket_bound_again_receives_on_every_endpoint_in_order():
    """Up to 0.4.10 a manager's thread binds its inbox anew (a fresh port): what decode addressed to the port the
    bootstrap server named must still arrive, as on a ZeroMQ socket bound twice."""
    bus = kvt.Bus(kvt.Timeline())
    inbox = bus.inbox("tcp://h:1")
    bus.deliver("tcp://h:1", [b"A"])
    inbox.bind("tcp://h:2")
    bus.deliver("tcp://h:2", [b"B"])
    bus.deliver("tcp://h:1", [b"C"])
    assert [inbox.recv_multipart() for _ in range(3)] == [[b"A"], [b"B"], [b"C"]]
    with pytest.raises(kvt.ScriptEnded):
        inbox.recv_multipart()


def test_writes_name_the_queue_item_being_worked_on():
    """However many engine calls a tree makes for one chunk (one per layer up to 0.4.10), they name one item."""
    timeline = kvt.Timeline()
    queue, engine = kvt.ScriptedQueue(timeline), kvt.TransferEngine(timeline)
    queue.put("first")
    queue.put("second")
    queue.get()
    engine.transfer_sync("s", 0, 1000, 64)
    engine.transfer_sync("s", 0, 2000, 64)
    queue.get()
    engine.batch_transfer_sync("s", [0, 0], [1064, 2064], [64, 64])
    assert [w.chunk for w in engine.writes] == [1, 1, 2, 2]


def test_script_ended_passes_an_except_exception():
    """A tree's loop wraps every Exception; the end of the script must still end it."""
    def loop():
        try:
            kvt.ScriptedQueue().get()
        except Exception:  # what a transfer worker does
            raise RuntimeError("wrapped")

    with pytest.raises(kvt.ScriptEnded):
        loop()


def test_engine_records_writes_and_the_pages_after_a_mark():
    timeline = kvt.Timeline()
    engine = kvt.TransferEngine(timeline)
    engine.batch_transfer_sync("s", [0], [1000 + 2 * 64], [2 * 64])
    timeline.mark("abort")
    engine.transfer_sync("s", 0, 1000 + 5 * 64, 64)
    assert engine.pages(1000, 64, region=4096) == [2, 3, 5]
    assert engine.pages(1000, 64, region=4096, since="abort") == [5]


def test_threads_run_named_loops_record_errors_and_restore_threading():
    module = SimpleNamespace(threading=threading)
    ran = []

    def bootstrap_thread():
        ran.append("bootstrap")
        raise kvt.ScriptEnded()

    def heartbeat_checker():
        ran.append("heartbeat")

    def decode_thread():
        raise IndexError("frame")

    with kvt.threads(module, run=("bootstrap_thread", "decode_thread")) as seen:
        for target in (bootstrap_thread, heartbeat_checker, decode_thread):
            module.threading.Thread(target=target, daemon=True).start()
        assert module.threading.Lock is threading.Lock
    assert ran == ["bootstrap"]
    assert seen.skipped == ["heartbeat_checker"]
    assert seen.errors == ["decode_thread:IndexError"]
    assert module.threading is threading


def test_bootstrap_server_answers_route_queries_and_records_them():
    server = kvt.BootstrapServer(lambda path, query: {"rank_port": 6000 + int(query["target_pp_rank"])}
                                 if path == "/route" else None)
    found = server.requests.get("http://h:8998/route?engine_rank=0&target_pp_rank=1", timeout=5)
    missing = server.requests.get("http://h:8998/elsewhere")
    assert (found.status_code, found.json()) == (200, {"rank_port": 6001})
    assert missing.status_code == 404
    assert server.asked == [("/route", {"engine_rank": "0", "target_pp_rank": "1"}), ("/elsewhere", {})]


def test_free_recorder_orders_frees_on_the_clock():
    timeline = kvt.Timeline()
    free = kvt.FreeRecorder(timeline, "kv")
    free([1, 2])
    cut = timeline.mark("last_write")
    free(SimpleNamespace(tolist=lambda: [3]))
    assert free.freed() == [1, 2, 3]
    assert free.freed(before=cut) == [1, 2]


# ---------------------------------------------------------------- a miniature Mooncake connection


class KVPoll:
    Failed, Bootstrapping, WaitingForInput, Transferring, Success = range(5)


class Mode(Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class KVArgs:
    pass


@dataclass
class ServerArgs:
    model_path: str = ""
    disaggregation_mode: str = "null"


def mooncake_module(*, fixed: bool, armed: bool = False, per_layer: bool = False) -> ModuleType:
    """A connection module in miniature, the probe's interface only. ``fixed``: the receiver sends ABORT to
    each prefill rank once, the prefill loop fails a room it knows that has not succeeded and answers
    ABORT_ACK, the worker skips failed or unknown rooms. Unfixed: none of it (an ABORT frame is unparseable).
    ``armed`` (0.5.22): a receiver that published its destinations appends an ack generation to its ABORT,
    and the prefill loop acks only such ABORTs. ``per_layer`` (up to 0.4.10): the worker writes a chunk with
    one engine call per layer."""
    mod = ModuleType("sglang.srt.disaggregation.mooncake.conn")
    mod.zmq = SimpleNamespace(Context=lambda: None, PUSH=1)
    mod.threading = threading
    mod.np = SimpleNamespace(int32="int32", array=lambda values, dtype=None: list(values),
                             arange=lambda start, stop, dtype=None: list(range(start, stop)))  # lists for arrays

    class Manager:
        def update_status(self, room, status):
            if room not in self.request_status:
                if status != KVPoll.Failed:
                    self.request_status[room] = status
            else:
                old = self.request_status[room]
                self.request_status[room] = status if status == KVPoll.Failed else max(old, status)

        def check_status(self, room):
            return self.request_status[room]

        def record_failure(self, room, reason):
            self.failure_records[room] = reason

        def get_session_id(self):
            return self.engine.get_session_id()

        def _connect(self, endpoint):
            sock = mod.zmq.Context().socket(1)  # PUSH
            sock.connect(endpoint)
            return sock

        def start_prefill_thread(self):
            def bootstrap_thread():
                while True:
                    msg = self.server_socket.recv_multipart()
                    if fixed and msg[0] == b"ABORT":
                        room = int(msg[1])
                        if room in self.request_status and self.check_status(room) != KVPoll.Success:
                            self.update_status(room, KVPoll.Failed)
                        if not armed or len(msg) > 4:
                            self._connect(f"tcp://{msg[2].decode()}:{msg[3].decode()}").send_multipart(
                                [b"ABORT_ACK", msg[1]])
                        continue
                    if msg[0] == b"None":
                        self.decode_kv_args_table[msg[3].decode()] = struct.unpack(f"{len(msg[4]) // 8}Q", msg[4])
                        continue
                    room = int(msg[0])
                    pages = [int(p) for p in msg[4].decode().split(",")]
                    self.transfer_infos.setdefault(room, {})[msg[3].decode()] = (msg[1].decode(), msg[2].decode(),
                                                                                 pages)
                    self.update_status(room, KVPoll.WaitingForInput)

            mod.threading.Thread(target=bootstrap_thread).start()

        def start_decode_thread(self):
            def decode_thread():
                while True:
                    room, status, rank = (int(x) for x in self.server_socket.recv_multipart())
                    self.update_status(room, status)

            def heartbeat_checker():
                raise AssertionError("the heartbeat must not run")

            mod.threading.Thread(target=decode_thread).start()
            mod.threading.Thread(target=heartbeat_checker).start()

        def add_transfer_request(self, room, kv_indices, index_slice, is_last_chunk, aux_index=None):
            if room not in self.request_status or self.check_status(room) == KVPoll.Failed:
                return
            self.transfer_queues[0].put((room, list(kv_indices), index_slice, is_last_chunk))

        def transfer_worker(self, queue, executor):
            while True:
                room, src, index_slice, last = queue.get()
                if fixed and (room not in self.request_status or self.check_status(room) == KVPoll.Failed):
                    continue
                for session, (ip, port, pages) in self.transfer_infos.get(room, {}).items():
                    ptrs = self.decode_kv_args_table[session]
                    layers = len(self.kv_args.kv_data_ptrs) // 2
                    start = self.kv_args.prefill_start_layer
                    dsts = [ptrs[layer] + pages[index_slice][0] * 64 for layer in range(start, start + layers)]
                    if per_layer:
                        for dst in dsts:
                            self.engine.transfer_sync(session, 0, dst, 64 * len(src))
                    else:
                        self.engine.batch_transfer_sync(session, [0] * layers, dsts, [64 * len(src)] * layers)
                    if last:
                        self.update_status(room, KVPoll.Success)
                        self._connect(f"tcp://{ip}:{port}").send_multipart(
                            [str(room).encode(), str(KVPoll.Success).encode(), str(self.pp_rank).encode()])

    class Receiver:
        _ctx = None
        _socket_cache: dict = {}

        def __init__(self, mgr, bootstrap_addr, bootstrap_room):
            self.kv_mgr, self.bootstrap_room = mgr, bootstrap_room
            self.session_id = mgr.get_session_id()
            self.conclude_state = None
            self.init_time = None
            self.abort_notified = False
            mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

        @classmethod
        def _connect_to_bootstrap_server(cls, info):
            sock = cls._ctx.socket(1)
            sock.connect(f"tcp://{info['rank_ip']}:{info['rank_port']}")
            return sock

        def _register_kv_args(self):
            for info in self.bootstrap_infos:
                self._connect_to_bootstrap_server(info).send_multipart(
                    [b"None", self.kv_mgr.local_ip.encode(), str(self.kv_mgr.rank_port).encode(),
                     self.session_id.encode(), struct.pack(f"{len(self.kv_mgr.kv_args.kv_data_ptrs)}Q",
                                                           *self.kv_mgr.kv_args.kv_data_ptrs)])

        def send_metadata(self, kv_indices, aux_index=None):
            for info in self.bootstrap_infos:
                self._connect_to_bootstrap_server(info).send_multipart(
                    [str(self.bootstrap_room).encode(), self.kv_mgr.local_ip.encode(),
                     str(self.kv_mgr.rank_port).encode(), self.session_id.encode(),
                     ",".join(str(int(p)) for p in kv_indices).encode()])
            self.init_time = 0.0

        def _notify(self):
            if fixed and not self.abort_notified:
                for info in self.bootstrap_infos:
                    generation = [b"1"] if armed and self.init_time is not None else []
                    self._connect_to_bootstrap_server(info).send_multipart(
                        [b"ABORT", str(self.bootstrap_room).encode(), self.kv_mgr.local_ip.encode(),
                         str(self.kv_mgr.rank_port).encode(), *generation])
                self.abort_notified = True

        def abort(self):
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
            self.conclude_state = KVPoll.Failed
            self._notify()

        def poll(self):
            if self.conclude_state is not None:
                return self.conclude_state
            status = self.kv_mgr.check_status(self.bootstrap_room)
            if status == KVPoll.WaitingForInput and self.init_time is not None and self.init_time < 1e9:
                self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
                self._notify()
                return KVPoll.Failed
            return status

        def failure_exception(self):
            raise RuntimeError("transfer failed")

    mod.MooncakeKVManager, mod.MooncakeKVReceiver = Manager, Receiver
    return mod


def layout_fetching(mooncake: ModuleType) -> ModuleType:
    """The main line from 2274bfebb1 to 4455d17619 (2026-02/03, between 0.5.9 and 0.5.10), in miniature: the
    receiver's constructor asks the bootstrap server for the prefill side's layout and builds its common module's
    ``PrefillServerInfo`` from the answer, which refuses a key it does not define (the tree then retries, sleeping
    a second a try, and fails the room); it asserts it was given the prefill DP rank."""
    common = ModuleType("sglang.srt.disaggregation.common.conn")
    common.requests = None  # the probe's bootstrap server stands in
    common.fetched = []  # each layout the receivers built

    @dataclass
    class PrefillServerInfo:
        attn_tp_size: int
        attn_cp_size: int
        dp_size: int
        pp_size: int
        page_size: int | None
        kv_cache_dtype: str | None
        follow_bootstrap_room: bool

    class Receiver(mooncake.MooncakeKVReceiver):
        def __init__(self, mgr, bootstrap_addr, bootstrap_room, prefill_dp_rank=None):
            super().__init__(mgr, bootstrap_addr, bootstrap_room)
            answer = common.requests.get(f"http://{bootstrap_addr}/route?prefill_dp_rank=-1&target_tp_rank=-1")
            try:
                common.fetched.append(PrefillServerInfo(**answer.json()))
            except TypeError:  # after its retries
                mgr.update_status(bootstrap_room, KVPoll.Failed)
                self.bootstrap_infos = None
                return
            assert prefill_dp_rank is not None, "prefill_dp_rank must be resolved before creating receiver"

    common.PrefillServerInfo, mooncake.MooncakeKVReceiver = PrefillServerInfo, Receiver
    return common


RECEIVER_ABORTS = ("N1", "N2", "N3", "N6", "N7", "N8", "N10")  # the scenarios that abort the receiver


class DecodeAlone:
    """N12's world in miniature (``_transferqueue.World`` is tested with deferred_release's): a decode whose client
    abort ends the request and gives its 8 slots back, as every tree from 0.4.9.post1 does, unless ``never_gives_up``
    (no abort(), no waiting timeout: up to 0.4.9); the next request then holds them under the prefill's last write."""

    never_gives_up = False

    def __init__(self, *, gate: bool):
        self.clock = SimpleNamespace(now=0.0)
        self.aborted = False

    def admit(self, rid, room):
        pass

    def waiting(self, rid):
        pass

    def abort(self, rid):
        self.aborted = not self.never_gives_up

    def iterate(self):
        pass

    def next_request_while_writing(self):
        pass

    def gave_up(self, rid):
        return self.aborted

    def last_write(self, rid):
        hit = 8 if self.aborted else 0
        return {"written_after_free": hit, "written_into_other": hit}

    def error(self):
        return None


@pytest.fixture
def probe(monkeypatch):
    """The probe module loaded fresh, on a fake ``sglang`` whose connection module (and, where the test gives one,
    its common module) each test installs; N12's decode is ``DecodeAlone``."""
    import _transferqueue
    monkeypatch.setattr(_transferqueue, "prepare", lambda adapt: None)
    monkeypatch.setattr(_transferqueue, "publish", lambda adapt: None)
    monkeypatch.setattr(_transferqueue, "World", DecodeAlone)

    def install(mooncake: ModuleType | None, common: ModuleType | None = None, *, pd_package: bool = False):
        base = ModuleType("sglang.srt.disaggregation.base.conn")
        base.KVArgs, base.KVPoll = KVArgs, KVPoll
        utils = ModuleType("sglang.srt.disaggregation.utils")
        utils.DisaggregationMode = Mode
        server_args = ModuleType("sglang.srt.server_args")
        server_args.ServerArgs = ServerArgs
        srt = ModuleType("sglang.srt")
        srt.server_args = server_args
        modules = {"sglang": ModuleType("sglang"), "sglang.srt": srt, "sglang.srt.server_args": server_args,
                   "sglang.srt.disaggregation.base.conn": base, "sglang.srt.disaggregation.utils": utils}
        modules["sglang"].__version__ = "0.0.test"
        for given in (mooncake, common):
            if given is not None:
                modules[given.__name__] = given
        if pd_package:  # a PD package that holds no backend package: what import finds there is all there is
            modules["sglang.srt.disaggregation"] = ModuleType("sglang.srt.disaggregation")
            modules["sglang.srt.disaggregation"].__path__ = []
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        if mooncake is None:
            monkeypatch.setitem(sys.modules, "sglang.srt.disaggregation.mooncake.conn", None)  # import fails
        module = importlib.import_module("probe_abort_notify_differential")
        module = importlib.reload(module)
        assert module.prepare() == "0.0.test"
        return module

    return install


def run(module, sid: str) -> dict:
    from _probekit import run_scenario
    sc = next(s for s in module.SCENARIOS.scenarios if s.id == sid)
    return run_scenario(sc)


def test_a_fixed_tree_tells_the_prefill_rank_and_nothing_is_written_after_the_abort(probe):
    result = run(probe(mooncake_module(fixed=True)), "N2")
    assert result["error"] is None
    observed = result["observed"]
    assert (observed["abort_sent"], observed["abort_acks"], observed["prefill_failed"]) == (1, 1, 1)
    assert (observed["chunks_written"], observed["chunks_after_abort"], observed["pages_after_abort"]) == (1, 0, 0)
    assert observed["decode_poll"] == "Failed"
    assert observed["room_status"] == "Failed"


def test_an_abort_carrying_an_ack_generation_is_counted_as_armed(probe):
    """0.5.22: only a receiver that published its destinations arms (and is acked); one that never did is not."""
    module = probe(mooncake_module(fixed=True, armed=True))
    published = run(module, "N1")["observed"]
    assert (published["abort_sent"], published["aborts_armed"], published["abort_acks"]) == (1, 1, 1)
    never_published = run(module, "N8")["observed"]
    assert (never_published["abort_sent"], never_published["abort_acks"]) == (1, 0)
    assert run(probe(mooncake_module(fixed=True)), "N1")["observed"]["aborts_armed"] == 0


def test_an_unfixed_tree_writes_the_queued_chunks_into_the_aborted_pages(probe):
    observed = run(probe(mooncake_module(fixed=False)), "N2")["observed"]
    assert observed["abort_sent"] == 0
    assert observed["chunks_after_abort"] == 2
    assert observed["pages_after_abort"] == 4  # pages 22-25 of the request, written after decode gave up
    assert observed["room_status"] == "Success"


def test_every_prefill_rank_is_told_once_even_when_aborted_twice(probe):
    module = probe(mooncake_module(fixed=True))
    two_ranks = run(module, "N6")["observed"]
    assert (two_ranks["abort_sent"], two_ranks["abort_ranks"], two_ranks["prefill_failed"]) == (2, 2, 2)
    twice = run(module, "N7")["observed"]
    assert twice["abort_max_per_rank"] == 1


def test_controls_see_the_whole_transfer(probe):
    module = probe(mooncake_module(fixed=True))
    complete = run(module, "N9")["observed"]
    assert (complete["chunks_written"], complete["abort_sent"], complete["decode_poll"]) == (3, 0, "Success")
    beside = run(module, "N10")["observed"]
    assert (beside["other_room_pages"], beside["other_room_status"]) == (6, "Success")


def test_the_tree_s_own_loop_failing_is_recorded_as_the_tree_s_error(probe):
    """An unfixed prefill loop cannot read an ABORT frame: the tree's error, named, not the probe's."""
    result = run(probe(mooncake_module(fixed=False)), "N11")
    assert result["error"] is None
    assert result["observed"]["tree_error"] == "bootstrap_thread:ValueError"


def test_a_loop_failing_on_what_the_stand_ins_lack_is_the_scenario_s_error(probe):
    """Nothing written because a loop died on an attribute the stand-ins lack must not read as a fixed tree."""
    mooncake = mooncake_module(fixed=True)

    def start_prefill_thread(self):
        def bootstrap_thread():
            self.server_socket.recv_multipart()
            return self.not_carried  # what an older tree's loop reads and the probe's manager lacks

        mooncake.threading.Thread(target=bootstrap_thread).start()

    mooncake.MooncakeKVManager.start_prefill_thread = start_prefill_thread
    result = run(probe(mooncake), "N2")
    assert result["observed"] == {}
    assert result["error"]["type"] == "CannotDrive"
    assert "not_carried" in result["error"]["message"]


def test_a_connection_that_does_not_import_is_every_scenario_s_error(probe):
    module = probe(None)
    for sc in module.SCENARIOS.scenarios:
        result = run(module, sc.id)
        assert result["observed"] == {}
        assert "does not import here" in result["error"]["message"]


def test_a_receiver_fetching_the_prefill_layout_itself_gets_it_in_its_tree_s_shape_at_once(probe):
    """Between 0.5.9 and 0.5.10 the receiver builds the tree's PrefillServerInfo from the bootstrap server's answer:
    one key it does not define and every receiver retried for 20 s (230 s a probe) and then could not drive."""
    mooncake = mooncake_module(fixed=False)
    common = layout_fetching(mooncake)
    result = run(probe(mooncake, common), "N2")
    assert result["error"] is None
    assert result["observed"]["chunks_after_abort"] == 2
    assert [(info.pp_size, info.follow_bootstrap_room) for info in common.fetched] == [(1, True)]


# ---------------------------------------------------------------- older layouts


def test_a_chunk_written_with_one_engine_call_per_layer_is_one_chunk(probe):
    observed = run(probe(mooncake_module(fixed=False, per_layer=True)), "N2")["observed"]
    assert (observed["chunks_written"], observed["chunks_after_abort"], observed["pages_after_abort"]) == (3, 2, 4)


def test_a_receiver_asking_the_network_for_its_address_is_given_the_decode_s(probe):
    """Up to 0.4.7.post1 the receiver names itself to the prefill side by its module's ``get_local_ip_by_remote``
    (a route towards a public address, which a sandbox lacks: it raises): the decode host's address, recorded."""
    mooncake = mooncake_module(fixed=False)

    def no_route():
        raise ValueError("Can not get local ip")

    mooncake.get_local_ip_by_remote = no_route
    send_metadata = mooncake.MooncakeKVReceiver.send_metadata

    def asking(self, kv_indices, aux_index=None):
        self.kv_mgr.local_ip = mooncake.get_local_ip_by_remote()
        send_metadata(self, kv_indices, aux_index)

    mooncake.MooncakeKVReceiver.send_metadata = asking
    module = probe(mooncake)
    result = run(module, "N9")
    assert result["error"] is None
    assert result["observed"]["decode_poll"] == "Success"
    assert "own-address-asked" in module.SCENARIOS.adaptations
    assert mooncake.get_local_ip_by_remote is no_route  # the stand-in lives for the transport's block only


def one_transfer_loop(mooncake: ModuleType) -> ModuleType:
    """Up to 0.4.6.post5, in miniature: the prefill manager has one transfer queue and no ``transfer_worker``; its
    bootstrap loop's starter also starts its one transfer loop, which takes every chunk queued so far."""
    manager = mooncake.MooncakeKVManager
    start_bootstrap, worker = manager.start_prefill_thread, manager.transfer_worker

    def start_prefill_thread(self):
        start_bootstrap(self)

        def transfer_thread():
            worker(self, self.transfer_queue, self.executor)

        mooncake.threading.Thread(target=transfer_thread).start()

    def add_transfer_request(self, room, kv_indices, index_slice, is_last_chunk, aux_index=None):
        self.transfer_queue.put((room, list(kv_indices), index_slice, is_last_chunk))

    del manager.transfer_worker
    manager.start_prefill_thread, manager.add_transfer_request = start_prefill_thread, add_transfer_request
    return mooncake


def test_a_prefill_with_one_transfer_loop_is_driven_through_it(probe):
    """The queued chunks are written by the loop the tree starts, after its bootstrap loop read what decode sent."""
    module = probe(one_transfer_loop(mooncake_module(fixed=False)))
    unfixed = run(module, "N2")
    assert unfixed["error"] is None
    assert (unfixed["observed"]["chunks_written"], unfixed["observed"]["chunks_after_abort"]) == (3, 2)
    complete = run(module, "N9")["observed"]
    assert (complete["chunks_written"], complete["decode_poll"], complete["room_status"]) == (3, "Success", "Success")


def test_a_transfer_loop_the_tree_ended_by_raising_takes_nothing_more(probe):
    """0.4.6's failure path raises a NameError out of its one transfer loop: that thread died; the chunks queued
    later stay queued however often the probe reads again, and the tree's error is named."""
    mooncake = mooncake_module(fixed=False)
    start_bootstrap, worker = mooncake.MooncakeKVManager.start_prefill_thread, mooncake.MooncakeKVManager.transfer_worker
    one_transfer_loop(mooncake)

    class DiesAfterOneChunk:
        def __init__(self, queue):
            self.queue, self.taken = queue, 0

        def get(self):
            if self.taken:
                raise NameError("name 'executor' is not defined")
            self.taken += 1
            return self.queue.get()

    def start_prefill_thread(self):
        start_bootstrap(self)

        def transfer_thread():
            worker(self, DiesAfterOneChunk(self.transfer_queue), self.executor)

        mooncake.threading.Thread(target=transfer_thread).start()

    mooncake.MooncakeKVManager.start_prefill_thread = start_prefill_thread
    observed = run(probe(mooncake), "N9")["observed"]
    assert (observed["chunks_written"], observed["tree_error"]) == (1, "transfer_thread:NameError")


def test_a_receiver_that_knows_no_pipeline_stages_records_so_and_n6_stops(probe):
    """Up to 0.4.10.post2 a receiver bootstraps with one prefill rank per tensor-parallel rank: N6's second stage is never
    part of the transfer, and the scenario says so instead of failing on a transfer that never started."""
    mooncake = mooncake_module(fixed=False)
    init = mooncake.MooncakeKVReceiver.__init__

    def one_stage(self, mgr, bootstrap_addr, bootstrap_room):
        init(self, mgr, bootstrap_addr, bootstrap_room)
        self.bootstrap_infos = [{"rank_ip": "10.0.1.1", "rank_port": 16000, "is_dummy": False}]

    mooncake.MooncakeKVReceiver.__init__ = one_stage
    result = run(probe(mooncake), "N6")
    assert result == {**result, "error": None, "observed": {"stages_bootstrapped": 1}}
    assert run(probe(mooncake_module(fixed=False)), "N6")["observed"]["stages_bootstrapped"] == 2


def test_a_receiver_that_never_gives_up_is_driven_through_n4_and_n12_never_read_off_its_source(probe, monkeypatch):
    """No abort() and no waiting timeout (up to 0.4.9): the scenarios that abort record that the receiver cannot;
    N4 drives the poll past the wait and N12 a client abort and a day, and see it never give up: observations, never
    a tree fact for an answer."""
    mooncake = mooncake_module(fixed=False)
    del mooncake.MooncakeKVReceiver.abort
    mooncake.MooncakeKVReceiver.poll = lambda self: self.kv_mgr.check_status(self.bootstrap_room)
    monkeypatch.setattr(DecodeAlone, "never_gives_up", True)
    module = probe(mooncake)
    for sc in module.SCENARIOS.scenarios:
        result = run(module, sc.id)
        assert result["error"] is None
        assert (result["observed"] == {"receiver_abort": "absent"}) == (sc.id in RECEIVER_ABORTS)
    assert run(module, "N4")["observed"]["timeout_poll"] == "WaitingForInput"
    assert run(module, "N12")["observed"] == {"gave_up": False, "written_after_free": 0, "written_into_other": 0}


def test_a_decode_that_gives_up_hands_its_pages_under_the_last_write_on_both_sides(probe):
    """N12 is a control: a client abort and a day end the request on every tree that can abort or time out, fixed
    or not (the fix stops the prefill writing, N1-N4; whether a write a day late lands is no part of it)."""
    for fixed in (False, True):
        result = run(probe(mooncake_module(fixed=fixed)), "N12")
        assert result == {**result, "error": None,
                          "observed": {"gave_up": True, "written_after_free": 8, "written_into_other": 8}}


def test_a_decode_world_that_saw_the_tree_raise_is_n12_s_error(probe, monkeypatch):
    monkeypatch.setattr(DecodeAlone, "error", lambda self: "abort_request:KeyError")
    result = run(probe(mooncake_module(fixed=False)), "N12")
    assert "abort_request:KeyError" in result["error"]["message"]


def test_a_receiver_that_only_times_out_is_driven_through_its_timeout(probe):
    """No abort() but a waiting timeout (0.4.9.post1 to 0.4.9.post4): the scenarios that abort record that the
    receiver cannot; N4's timeout still runs, and shows the queued chunks written after decode gave up."""
    mooncake = mooncake_module(fixed=False)
    del mooncake.MooncakeKVReceiver.abort
    poll = mooncake.MooncakeKVReceiver.poll

    def timed_poll(self):
        if self.init_time is not None and time.time() - self.init_time >= self.kv_mgr.waiting_timeout:
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)  # gives up; tells no prefill rank
        return poll(self)

    mooncake.MooncakeKVReceiver.poll = timed_poll
    module = probe(mooncake)
    for sc in module.SCENARIOS.scenarios:
        result = run(module, sc.id)
        assert result["error"] is None
        assert (result["observed"] == {"receiver_abort": "absent"}) == (sc.id in RECEIVER_ABORTS)
    timed_out = run(module, "N4")["observed"]
    assert (timed_out["timeout_poll"], timed_out["abort_sent"], timed_out["chunks_after_abort"]) == ("Failed", 0, 2)


def test_a_pd_tree_without_a_mooncake_package_is_recorded_never_an_import_error(probe):
    module = probe(None, pd_package=True)
    for sc in module.SCENARIOS.scenarios:
        result = run(module, sc.id)
        assert (result["error"], result["observed"]) == (None, {"mooncake_manager": "absent"})


def _judged(observed: dict[str, dict]) -> object:
    """The published base release's result with some scenarios' observations replaced, judged by the registry."""
    import json

    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("abort_notify")
    results = PROJECT / "results"
    base, head = (json.loads((results / f"abort_notify.{side}.release-{exp.releases[side]}.json").read_text())
                  for side in ("base", "head"))
    doc = json.loads(json.dumps(base))
    for sid, keys in observed.items():
        doc["scenarios"][sid] = {"error": None, "observed": keys}
    return judge(doc, base, head, exp)


def test_a_tree_without_a_mooncake_package_is_not_affected():
    judged = _judged({"N1": {"mooncake_manager": "absent"}})
    assert judged.classification.value == "not affected"
    assert judged.justification.value == "vulnerable_code_not_present"


NEVER_GAVE_UP = {"N12": {"gave_up": False, "written_after_free": 0, "written_into_other": 0}}


def test_a_decode_that_never_gives_up_is_not_affected_on_what_n12_saw():
    """0.4.5.post1 to 0.4.9: N4's poll past the wait still waits (set aside: its chunks land in pages the decode
    holds), N12's decode keeps the request a day after a client abort: nothing of the fix's question can happen."""
    never = {**{sid: {"receiver_abort": "absent"} for sid in RECEIVER_ABORTS},
             "N4": {"timeout_poll": "WaitingForInput", "abort_sent": 0, "chunks_after_abort": 2, "pages_after_abort": 4}}
    judged = _judged({**never, **NEVER_GAVE_UP})
    assert judged.classification.value == "not affected"
    assert judged.shown_by == ["N12"]
    # without N12's observation the waiting N4 decides nothing: unknown, never pre-fix
    unseen = _judged({**never, "N12": {"gave_up": True, "written_after_free": 8, "written_into_other": 8}})
    assert unseen.classification.value == "neither"
    assert unseen.scenarios["N4"].value == "not deciding"


def test_a_decode_that_never_gave_up_in_a_scenario_that_raised_is_no_all_clear():
    from pdevidence import registry
    from pdevidence.judge.classify import not_affected

    exp = registry.load(PROJECT).experiment("abort_notify")
    raised = {"N12": {"error": {"type": "RuntimeError", "message": "the tree raised in abort_request:KeyError"},
                      "observed": NEVER_GAVE_UP["N12"]}}
    assert not_affected({"scenarios": raised}, exp) == []
    assert [rule.id for rule in not_affected({"scenarios": {"N12": {"error": None, **raised["N12"]} | {"error": None}}}, exp)] \
        == ["decode_never_gives_up"]


def test_a_receiver_that_only_times_out_is_judged_by_its_timeout():
    judged = _judged({sid: {"receiver_abort": "absent"} for sid in RECEIVER_ABORTS})
    assert judged.classification.value == "pre-fix"
    assert judged.scenarios["N4"].value == "pre-fix"
    assert all(judged.scenarios[sid].value == "not deciding" for sid in RECEIVER_ABORTS if sid in judged.scenarios)


def test_one_stage_only_sets_n6_aside_and_the_one_rank_scenarios_decide():
    judged = _judged({"N6": {"stages_bootstrapped": 1}})
    assert judged.classification.value == "pre-fix"
    assert judged.scenarios["N6"].value == "not deciding"
    assert _judged({"N6": {"stages_bootstrapped": 2}}).classification.value == "neither"
