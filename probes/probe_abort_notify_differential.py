"""Differential probe for experiment abort_notify: the prefill side told of a decode abort stops writing (PR #27372).

In PD disaggregation with Mooncake, the prefill server writes a request's KV straight into pages the
decode server allocated for it. Before the fix, a decode-side abort (or a wait that timed out) only
marked the room failed on the decode side: the prefill side never heard of it and kept writing the
chunks it had queued into pages decode had given back. The fix: the decode receiver sends ``ABORT``
for the room to every prefill rank it bootstrapped with, once (``abort_notified``), from ``abort()``
and from the waiting timeout; Mooncake's prefill manager marks the room failed (not one that already
succeeded, nor one it does not know) and answers ``ABORT_ACK``; its transfer worker skips the chunks
of rooms failed or unknown.

Real classes probed: ``MooncakeKVReceiver`` (and ``CommonKVReceiver`` under it), ``MooncakeKVManager``
on both sides (built by ``object.__new__`` with the attributes its methods read: its constructor
binds sockets and starts an engine), driven through their own methods: ``_register_kv_args`` and
``send_metadata`` (decode to prefill, through the bus), the prefill manager's bootstrap loop
(``start_prefill_thread``) and ``add_transfer_request`` and ``transfer_worker``, the decode manager's
status loop (``start_decode_thread``), and the receiver's ``abort``, ``poll`` and
``failure_exception``. Stand-ins (``_kvtransfer.py``): ZeroMQ (every message on one bus), the
transfer engine (each write's destination pages), the transfer queue and thread pool, the threads
(the loops run on the probe's thread until their scripted input ends; the heartbeat never starts).
The bootstrap server is a stand-in too: up to 0.5.9 (on the main line, to 2026-03) the receiver's
constructor asks it which prefill ranks serve the room, answered in the tree's shape; from 0.5.10
``init(prefill_dp_rank)`` reads what the decode manager learnt earlier, and the probe sets that answer on
the receiver as ``init`` sets it. Each prefill rank learns
of the room as the prefill sender's constructor tells it (status Bootstrapping). A request of 6 pages goes in 3 chunks of 2.

Scenarios: N1 abort before any chunk; N2 mid-transfer (1 chunk written, 2 queued); N3 abort after the
last chunk (the room succeeded); N4 the wait times out mid-transfer (``poll``); N5 the prefill side
fails the transfer (control: decode's failure path sends nothing, by design); N6 two prefill ranks
(pipeline stages), mid-transfer (a tree whose receiver bootstraps with one of them only, before PD knew
pipeline stages, records just that: ``stages_bootstrapped``); N7 aborted twice; N8 a room the prefill rank never heard of; N9 control: a transfer
that completes; N10 control: a room never aborted beside one aborted mid-transfer; N11 control: an
``ABORT`` (as a fixed decode sends it) for a room that already succeeded; N12 control: the decode alone, as its
scheduler drives it (``probes/_transferqueue.py``, deferred_release's D10): a client abort of a request whose
transfer never ends, a day, another request, then the prefill's last write.

Keys: ``abort_sent`` (ABORT messages), ``abort_ranks`` (prefill ranks that got one),
``abort_max_per_rank``, ``abort_acks`` (ABORT_ACK messages to decode), ``aborts_armed`` (N1: ABORT messages
that carry the decode's ack generation, 0.5.22 on: a prefill rank acks only those), ``prefill_failed`` (prefill
ranks whose room is failed), ``room_status`` (the room on the prefill rank(s), a KVPoll name, or
``"unknown"``), ``chunks_written`` / ``chunks_after_abort`` (chunks the engine wrote, all / after the
abort: each queue item once, however many engine calls the tree makes for it), ``pages_after_abort`` (decode pages written after it, per layer), ``decode_poll`` (what the
receiver's ``poll`` answers at the end), ``other_room_chunks`` (N10), ``failure_raised`` (N5: the type
``failure_exception`` raised), ``tree_error`` (``<loop>:<exception type>`` where one of the tree's loops
failed on what the scenario sent it, e.g. a frame it cannot parse, else null), ``stages_bootstrapped`` (N6: the
prefill ranks the receiver bootstrapped with), ``gave_up`` (N12: the decode ended the request or gave any of its
pages back), ``written_after_free`` / ``written_into_other`` (N12: pages of the prefill's last write that the decode
had given back / that another request then held). Tree facts, every scenario stopping there:
``mooncake_manager: "absent"`` (no Mooncake backend: PD's transfer a placeholder, 0.4.4.post2 to 0.4.5); and,
where the decode receiver has no ``abort()`` (up to 0.4.9.post4), ``receiver_abort: "absent"`` in the scenarios
that abort it: N4 still drives the waiting timeout, its only give-up (a tree without one, up to 0.4.9, still waits:
``timeout_poll: "WaitingForInput"``), and N12 a client abort and a day, which such a decode never gives up on
(``gave_up: false``). Up to 0.4.7.post1 the receiver asks the network for the address it gives the prefill side
(adaptation ``own-address-asked``: the decode's is given). A loop that fails on a
stand-in (an attribute or call it lacks), or any of the probe's own calls into the tree that raises, is
the scenario's error: never an observation.

    python probes/probe_abort_notify_differential.py --side head --tree-kind release --tree-ref 0.5.13
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import threading
import time
import typing
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _kvtransfer as kvt  # noqa: E402
import _transferqueue  # noqa: E402
from _probekit import Collaborators, Observed, ScenarioSet, main, publish_server_args, server_args, swapped  # noqa: E402

SCENARIOS = ScenarioSet("abort_notify")
MOONCAKE = "sglang.srt.disaggregation.mooncake.conn"
COMMON = "sglang.srt.disaggregation.common.conn"
STANDINS = Collaborators(
    kv_args=("sglang.srt.disaggregation.base.conn:KVArgs",),
    pp_group=("sglang.srt.distributed.parallel_state:GroupCoordinator",),
)

DECODE_IP, DECODE_PORT = "10.0.0.9", 17000
PREFILL_IP, PREFILL_PORT = "10.0.1.1", 16000
BOOTSTRAP_ADDR = "10.0.1.1:8998"
ROOM, OTHER_ROOM = 4242, 4343
ITEM = 64  # bytes per page and layer
LAYERS = 2
REGION = 1 << 20  # one layer's buffer
DECODE_BASE, PREFILL_BASE, AUX_BASE = 1 << 32, 1 << 36, 1 << 40
CHUNKS = ((0, 2), (2, 4), (4, 6))  # page ranges of a 6-page request
DECODE_PAGES = list(range(20, 26))  # where decode receives the request's KV
OTHER_PAGES = list(range(30, 36))  # and another room's (N10)
PAGES = {ROOM: DECODE_PAGES, OTHER_ROOM: OTHER_PAGES}
WAITING_TIMEOUT = 300.0
ABORT_FRAMES = 4  # tag, room, decode ip, decode port; 0.5.22 appends the ack generation when decode awaits an ack

sg = SimpleNamespace(missing=None, absent={}, cannot_abort={})


class CannotDrive(RuntimeError):
    """The tree's loop asked a stand-in for something it does not carry: no observation, the scenario's error."""


def under_built(exc: BaseException) -> bool:
    """Whether a loop of the tree failed on the probe's stand-ins (an attribute or a call they lack; a transfer
    worker wraps its error in a RuntimeError naming it), not on what the scenario sent it."""
    return isinstance(exc, (AttributeError, TypeError)) or "has no attribute" in str(exc)


def prepare() -> str:
    """Import the tree's Mooncake connection; a tree where it does not import leaves each scenario to say why.
    What the tree lacks is a tree fact (``sg.absent``): no Mooncake backend at all (its PD transfer a placeholder
    that moves nothing, 0.4.4.post2 to 0.4.5), or a decode receiver that cannot abort (no ``abort()``)."""
    import sglang

    if lacks_mooncake():
        sg.absent = {"mooncake_manager": "absent"}
        return sglang.__version__
    try:
        sg.mooncake = importlib.import_module(MOONCAKE)
    except Exception as exc:  # the scenarios record it: no answer, never an absence
        sg.missing = f"{MOONCAKE} does not import here ({type(exc).__name__}: {exc})"
        return sglang.__version__
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.utils import DisaggregationMode

    sg.common = sys.modules.get(COMMON)
    sg.KVPoll, sg.Mode = KVPoll, DisaggregationMode
    sg.Manager = getattr(sg.mooncake, "MooncakeKVManager", None)
    sg.Receiver = getattr(sg.mooncake, "MooncakeKVReceiver", None)
    if sg.Manager is None or sg.Receiver is None:
        sg.missing = f"{MOONCAKE} has no MooncakeKVManager or MooncakeKVReceiver"
    elif not hasattr(sg.Receiver, "abort"):  # a waiting timeout is then decode's only give-up, if any: N4 drives it
        sg.cannot_abort = {"receiver_abort": "absent"}
    sg.np = getattr(sg.mooncake, "np", None)  # the index arrays the tree's own numpy makes
    if sg.np is None:
        sg.missing = f"{MOONCAKE} imports no numpy as np: the probe cannot make the index arrays it takes"
    STANDINS.find()
    from sglang.srt.server_args import ServerArgs

    # The server's arguments, as a scheduler publishes them (later trees read the page size and parallel layout
    # from the runtime context): a decode server's defaults.
    _transferqueue.prepare(SCENARIOS.adapted)  # N12's decode; its server args are published again below
    sg.server_args = server_args(ServerArgs, SCENARIOS.adapted, model_path="dummy", disaggregation_mode="decode")
    publish_server_args(sg.server_args, SCENARIOS.adapted, role="test")
    return sglang.__version__


def lacks_mooncake() -> bool:
    """Whether the tree's PD package holds no Mooncake backend: read from what it holds; in doubt, no (the import
    then says what is wrong)."""
    try:
        return importlib.util.find_spec(MOONCAKE.rsplit(".", 1)[0]) is None
    except (ImportError, ValueError):
        return False


def tree_env(name: str, default: Any) -> Any:
    """A setting as the tree reads it (its ``envs`` registry, where it has one), else ``default``."""
    envs = getattr(sg.mooncake, "envs", None)
    return getattr(envs, name).get() if hasattr(envs, name) else default


def poll_name(value: Any) -> str:
    names = {getattr(sg.KVPoll, n): n for n in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring",
                                                "Success")}
    return names.get(value, repr(value))


def kv_args(*, layers: int, base: int, start_layer: int = 0) -> Any:
    """A plain MHA pool's transfer arguments (no layer ids: the pool has no get_kv_layer_ids; no state buffers)."""
    ptrs = [base + i * REGION for i in range(2 * layers)]  # K of each layer, then V of each layer
    return STANDINS.make("kv_args", "kv_args", engine_rank=0, kv_data_ptrs=ptrs, kv_data_lens=[REGION] * len(ptrs),
                         kv_item_lens=[ITEM] * len(ptrs), aux_data_ptrs=[AUX_BASE + base], aux_data_lens=[4096],
                         aux_item_lens=[16], state_types=[], state_data_ptrs=[], state_data_lens=[],
                         state_item_lens=[], state_dim_per_tensor=[], state_layer_ids=[], state_slice_outer_counts=[],
                         state_conv_shard_groups=[], kv_layer_ids=[], kv_cache_dtype_str="auto",
                         is_hybrid_mla_backend=False, mla_compression_ratios=None, ib_device=None, ib_traffic_class=None,
                         gpu_id=0, kv_head_num=1, total_kv_head_num=1, page_size=1, system_dp_rank=0, pp_rank=0,
                         prefill_start_layer=start_layer, prefill_end_layer=start_layer + layers,
                         prefill_pp_size=1, decode_tp_size=1)


def lacking(*, aborts: bool = True) -> Observed:
    """What the tree lacks for a scenario (``sg.absent``), and for one that ``aborts`` the receiver what a tree whose
    receiver cannot abort lacks (``sg.cannot_abort``): recorded in the scenario's place."""
    return {**sg.absent, **(sg.cannot_abort if aborts else {})}


scenario = SCENARIOS.guarded(lacking)


class World:
    """One decode rank and ``ranks`` prefill ranks (pipeline stages, one layer each where there are two)."""

    def __init__(self, ranks: int = 1):
        if sg.missing:
            raise RuntimeError(sg.missing)
        self.timeline = kvt.Timeline()
        self.bus = kvt.Bus(self.timeline)
        self.errors: list[str] = []
        self.decode_endpoint = kvt.endpoint(DECODE_IP, DECODE_PORT)
        self.decode = self._manager(sg.Mode.DECODE, DECODE_IP, DECODE_PORT, kv_args(layers=LAYERS, base=DECODE_BASE),
                                    kvt.TransferEngine(self.timeline, session_id=f"{DECODE_IP}:{DECODE_PORT}"))
        self.prefills = []
        for rank in range(ranks):
            layers = LAYERS // ranks
            mgr = self._manager(sg.Mode.PREFILL, PREFILL_IP, PREFILL_PORT + rank,
                                kv_args(layers=layers, base=PREFILL_BASE, start_layer=rank * layers),
                                kvt.TransferEngine(self.timeline, session_id=f"{PREFILL_IP}:{PREFILL_PORT + rank}"))
            mgr.pp_size, mgr.pp_rank = ranks, rank
            mgr.pp_group = STANDINS.make("pp_group", "pp_group", rank_in_group=rank, world_size=ranks,
                                         is_first_rank=rank == 0, is_last_rank=rank == ranks - 1)
            self.prefills.append(mgr)
        self.receivers: dict[int, Any] = {}

    # --- the tree's managers, as their constructors leave them (no sockets bound, no threads) -----
    def _manager(self, mode, ip: str, port: int, args: Any, engine: kvt.TransferEngine) -> Any:
        mgr = object.__new__(sg.Manager)
        common = dict(
            kv_args=args, disaggregation_mode=mode, is_mla_backend=False, is_hybrid_mla_backend=False, engine=engine, local_ip=ip, rank_port=port,
            server_socket=self.bus.inbox(kvt.endpoint(ip, port)), request_status={}, failure_records={},
            failure_lock=threading.Lock(), attn_tp_size=1, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0,
            attn_dp_size=1, attn_dp_rank=0, enable_dp_attention=False, tp_size=1, dp_size=1, pp_size=1, pp_rank=0, system_dp_size=1, system_dp_rank=0,
            enable_staging=False, _staging_ctx=None, enable_trace=False, enable_custom_mem_pool=False,
            custom_mem_pool_type=None, kv_item_lens_sum=ITEM * len(args.kv_item_lens), state_item_lens_sum=0,
            bootstrap_host=ip, bootstrap_port=8998, dist_init_addr=None, enable_all_cp_ranks_for_transfer=False,
            server_args=sg.server_args,  # each manager's own side is its disaggregation_mode
        )
        # What later trees' constructors also set (0.5.18 on): pipeline-context parallelism 1, the deferred release
        # as the tree's environment leaves it (off unless set), their socket caches on the bus.
        common.update(
            kv_cache_dtype_str="auto", dsv41_spec_layout=None, _kv_replica_factor=1, dcp_size=1, dcp_rank=0,
            _dcp_pack_buffers=None, _dcp_pack_max_tokens=None, _zmq_ctx=self.bus.context(), _socket_cache={},
            _monitor_cache={}, _socket_send_locks={}, _socket_lock=threading.Lock(), _deferred_ack_targets={},
            _deferred_ack_fanout_snapshots={}, _staging_handler=None, _deferred_abort_ack_tracker={},
            _heartbeat_shutdown=threading.Event(), _prefill_recompute_executor_lock=threading.Lock(),
            _prefill_recompute_sessions=threading.local(), _stopped=False, _worker_threads=[],
            _staging_outstanding=defaultdict(int), _deferred_ack_poisoned_rooms=set(),  # 0.5.22 on
            max_transfer_batch_indices=tree_env("SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES", None),
            enable_deferred_decode_kv_release=bool(tree_env("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", False))
            and bool(getattr(sg.Manager, "supports_deferred_decode_kv_release", False)),
        )
        if mode is sg.Mode.PREFILL:
            common.update(transfer_infos={}, req_to_decode_prefix_len={}, decode_kv_args_table={},
                          is_dummy_cp_rank=False, bootstrap_timeout=WAITING_TIMEOUT, session_failures=defaultdict(int),
                          failed_sessions=set(), session_lock=threading.Lock(),
                          enable_failed_session_probe=False,
                          failed_session_probes={}, state_layout_rejections={},  # 0.5.22 on (probes: 0.5.23 on)
                          state_strides_validated=set())
            if hasattr(sg.Manager, "transfer_worker"):
                common.update(transfer_queues=[kvt.ScriptedQueue(self.timeline)], executors=[kvt.InlineExecutor()])
            else:  # up to 0.4.6.post5: one queue, one pool, one transfer loop
                common.update(transfer_queue=kvt.ScriptedQueue(self.timeline), executor=kvt.InlineExecutor())
        else:
            common.update(connection_pool={}, connection_lock=threading.Lock(), required_prefill_response_num_table={},
                          prefill_info_table={}, heartbeat_failures={}, session_pool={},
                          session_pool_lock=threading.Lock(), addr_to_rooms_tracker=defaultdict(set),
                          prefill_response_tracker=defaultdict(set), heartbeat_interval=2.0, max_failures=1,
                          waiting_timeout=WAITING_TIMEOUT, prefill_attn_tp_size_table={}, prefill_tp_size_table={},
                          prefill_dp_size_table={}, prefill_pp_size_table={}, prefill_page_size_table={},
                          _deferred_abort_generation=0)  # 0.5.22 on
        for name, value in common.items():
            setattr(mgr, name, value)
        return mgr

    @contextlib.contextmanager
    def transport(self):
        """ZeroMQ is the bus, and the tree's threads run on this thread, for one block of calls."""
        modules = [m for m in (sg.mooncake, sg.common) if m is not None]
        saved_zmq = {m: m.zmq for m in modules if hasattr(m, "zmq")}
        server = self.server = kvt.BootstrapServer(self.route)
        saved_requests = {m: m.requests for m in modules if hasattr(m, "requests")}
        owners = [klass for klass in sg.Receiver.__mro__ if "_ctx" in vars(klass) or "_socket_cache" in vars(klass)]
        saved_cls = {klass: dict(vars(klass)) for klass in owners}
        cached = getattr(sg.Manager, "_connect", None)
        with contextlib.ExitStack() as stack:
            for m in saved_zmq:
                m.zmq = self.bus.zmq
            for m in saved_requests:
                m.requests = server.requests
            for m in modules:
                if hasattr(m, "get_local_ip_by_remote"):
                    stack.enter_context(swapped(m, get_local_ip_by_remote=own_address))
            for klass in owners:
                for name, value in (("_ctx", self.bus.context()), ("_socket_cache", {}), ("_socket_locks", {})):
                    if name in vars(klass):
                        setattr(klass, name, value)
            if hasattr(cached, "cache_clear"):
                cached.cache_clear()  # the manager caches its sockets; none may outlive this bus
            # up to 0.4.6.post5 the prefill's bootstrap loop also starts its one transfer loop, after it
            loops = ("bootstrap_thread", "decode_thread", "transfer_thread")
            self.threads = [stack.enter_context(kvt.threads(m, run=loops))
                            for m in modules if hasattr(m, "threading")]
            try:
                yield
            finally:
                for m, value in saved_zmq.items():
                    m.zmq = value
                for m, value in saved_requests.items():
                    m.requests = value
                for klass, before in saved_cls.items():
                    for name in ("_ctx", "_socket_cache", "_socket_locks"):
                        if name in before:
                            setattr(klass, name, before[name])
                if hasattr(cached, "cache_clear"):
                    cached.cache_clear()
                for seen in self.threads:
                    for name, exc in zip(seen.errors, seen.raised):
                        if under_built(exc):
                            raise CannotDrive(f"the tree's {name.split(':')[0]} asked for what the probe's stand-ins "
                                              f"lack: {exc}") from exc
                        self.errors.append(name)

    def call(self, what: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """A call into the tree, run until its scripted input ends; anything it raises is the scenario's error
        (these are the probe's steps, which a tree it drives right never refuses)."""
        try:
            return fn(*args, **kwargs)
        except kvt.ScriptEnded:
            return None

    # --- a request's life, step by step ------------------------------------------------------
    def route(self, path: str, query: dict[str, str]) -> dict | None:
        """The bootstrap server: the prefill side's parallel layout (``engine_rank=-1``), else the rank serving a
        pipeline stage (one rank per stage, tensor and data parallel size 1)."""
        if query.get("engine_rank") == "-1" or query.get("target_tp_rank") == "-1":
            ranks = len(self.prefills)
            layout = {"prefill_attn_tp_size": 1, "prefill_tp_size": 1, "prefill_dp_size": 1, "prefill_pp_size": ranks,
                      "prefill_page_size": 1, "attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": ranks,
                      "page_size": 1, "kv_cache_dtype": getattr(sg.server_args, "kv_cache_dtype", None),
                      "follow_bootstrap_room": True}
            # From d160c5b9bb (2026-02) the receiver builds the tree's PrefillServerInfo from the answer, which
            # refuses a key it does not define (then retries for 20 s): answer its fields only, as its server does.
            info = getattr(sg.common, "PrefillServerInfo", None)
            if dataclasses.is_dataclass(info):
                return {f.name: layout[f.name] for f in dataclasses.fields(info) if f.name in layout}
            return layout
        stage = int(query.get("target_pp_rank", 0))
        return {"rank_ip": PREFILL_IP, "rank_port": PREFILL_PORT + stage} if stage < len(self.prefills) else None

    def receiver(self, room: int = ROOM) -> Any:
        """The decode receiver of ``room``, bootstrapped with every prefill rank, its KV buffers registered with each.
        Up to 0.5.9 its constructor does that, asking the bootstrap server (up to 0.4.5.post3 for one rank, whose
        ``init`` then sends the buffers with the indices: nothing to register); from 0.5.10 ``init(prefill_dp_rank)``
        does, from layouts the decode manager learnt earlier: the probe sets the answer as ``init`` sets it."""
        # A constructor that takes the prefill DP rank (to 4455d17619, 2026-03; from 2274bfebb1 it asserts one was
        # given) gets it as the decode scheduler resolves it: one DP rank, 0.
        takes_rank = "prefill_dp_rank" in inspect.signature(sg.Receiver).parameters
        recv = sg.Receiver(self.decode, BOOTSTRAP_ADDR, room, **({"prefill_dp_rank": 0} if takes_rank else {}))
        if not {"bootstrap_infos", "bootstrap_info"} & set(vars(recv)):
            recv.bootstrap_infos = [{"rank_ip": PREFILL_IP, "rank_port": PREFILL_PORT + r, "is_dummy": False}
                                    for r in range(len(self.prefills))]
            recv.required_dst_info_num = 1
            recv.required_prefill_response_num = len(self.prefills)
            recv.prefill_dp_rank = 0
            self.decode.required_prefill_response_num_table[room] = len(self.prefills)
            self.call("register", recv._register_kv_args)
            self.decode.update_status(room, sg.KVPoll.WaitingForInput)
        self.receivers[room] = recv
        return recv

    def started(self, room: int = ROOM) -> None:
        """The transfer can begin: decode and every prefill rank wait for input. Else no scenario step after this
        means anything (nothing written because nothing was asked would read as a fix): the scenario's error."""
        decode = poll_name(self.decode.request_status.get(room))
        prefill = [poll_name(m.request_status.get(room)) for m in self.prefills]
        if decode != "WaitingForInput" or any(p != "WaitingForInput" for p in prefill):
            raise CannotDrive(f"the transfer never started: the decode side is {decode}, the prefill rank(s) {prefill}; "
                              f"the bootstrap server was asked {[path for path, _ in self.server.asked]}")

    def registered(self) -> None:
        """Every prefill rank holds the decode rank's registration (its KV buffers); else as ``started``."""
        if not all(getattr(m, "decode_kv_args_table", None) for m in self.prefills):
            raise CannotDrive("the decode rank's registration never reached every prefill rank; the bootstrap server "
                              f"was asked {[path for path, _ in self.server.asked]}")

    def prefill_knows(self, room: int = ROOM) -> None:
        for mgr in self.prefills:
            mgr.update_status(room, sg.KVPoll.Bootstrapping)

    def metadata(self, room: int = ROOM) -> None:
        recv = self.receivers[room]
        send = getattr(recv, "send_metadata", None) or recv.init  # init(kv_indices, aux_index) up to 0.5.9
        self.call("send_metadata", send, sg.np.array(PAGES[room], dtype=index_dtype(send)), 3)

    def prefill_reads(self) -> None:
        """Each prefill rank's bootstrap loop reads what decode sent it."""
        for mgr in self.prefills:
            self.prefill_loops("bootstrap", mgr)

    def prefill_loops(self, what: str, mgr: Any) -> None:
        """The prefill manager's loops, as its thread starter runs them (up to 0.4.6.post5 also its one transfer loop:
        once the tree's code ended that loop by raising, the thread died, and nothing runs it again)."""
        self.call(what, mgr.start_prefill_thread)
        for seen in self.threads:
            if any(e.startswith("transfer_thread:") for e in seen.errors):
                seen.run = seen.run - {"transfer_thread"}

    def queue(self, chunk: int, room: int = ROOM) -> None:
        start, end = CHUNKS[chunk]
        last = chunk == len(CHUNKS) - 1
        for mgr in self.prefills:
            self.call("add_transfer_request", mgr.add_transfer_request, room,
                      sg.np.arange(start, end, dtype=sg.np.int32), slice(start, end), last,
                      aux_index=7 if last else None)

    def work(self) -> None:
        """Each prefill rank's transfer worker takes every queued chunk (up to 0.4.6.post5 its one transfer loop, which
        its bootstrap loop's starter starts: that loop finds nothing new to read)."""
        for mgr in self.prefills:
            if not hasattr(mgr, "transfer_worker"):
                self.prefill_loops("transfer_thread", mgr)
                continue
            for queue, executor in zip(mgr.transfer_queues, mgr.executors):
                self.call("transfer_worker", mgr.transfer_worker, queue, executor)

    def decode_reads(self) -> None:
        self.call("decode_thread", self.decode.start_decode_thread)

    def abort(self, room: int = ROOM) -> None:
        self.timeline.mark("abort")
        self.call("abort", self.receivers[room].abort)

    # --- observations -----------------------------------------------------------------------
    def kv_writes(self, *, since: str | None = None) -> list[kvt.Write]:
        engines = [m.engine for m in self.prefills]
        return [w for e in engines for w in e.writes
                if DECODE_BASE <= w.dst < DECODE_BASE + 2 * LAYERS * REGION
                and (since is None or self.timeline.after(since, w.at))]

    def chunks(self, *, since: str | None = None) -> int:
        """Chunks the engines wrote (each rank's queue item, however many engine calls the tree made for it)."""
        return len({(w.session, w.chunk) for w in self.kv_writes(since=since)})

    def pages(self, *, since: str | None = None) -> set[int]:
        """The decode pages written (in any layer's K or V buffer)."""
        return {page for w in self.kv_writes(since=since)
                for page in range((w.dst - DECODE_BASE) % REGION // ITEM,
                                  (w.dst - DECODE_BASE) % REGION // ITEM + max(w.length // ITEM, 1))}

    def pages_written(self, pages: list[int]) -> int:
        return len(self.pages() & set(pages))

    def aborts(self, observed: Observed) -> None:
        sent = self.bus.messages(b"ABORT")
        per_rank = defaultdict(int)
        for m in sent:
            per_rank[m.to] += 1
        observed.update(abort_sent=len(sent), abort_ranks=len(per_rank), abort_max_per_rank=max(per_rank.values(),
                                                                                                 default=0),
                        abort_acks=len(self.bus.messages(b"ABORT_ACK", to=self.decode_endpoint)))

    def aborts_armed(self) -> int:
        """ABORT messages that carry the decode's ack generation (0.5.22 on)."""
        return sum(1 for m in self.bus.messages(b"ABORT") if len(m.frames) > ABORT_FRAMES)

    def prefill_state(self, observed: Observed, room: int = ROOM) -> None:
        statuses = [m.request_status.get(room) for m in self.prefills]
        names = {"unknown" if s is None else poll_name(s) for s in statuses}
        observed.update(prefill_failed=sum(1 for s in statuses if s == sg.KVPoll.Failed),
                        room_status=",".join(sorted(names)))

    def finish(self, observed: Observed, room: int = ROOM) -> None:
        self.aborts(observed)
        self.prefill_state(observed, room)
        observed.update(chunks_written=self.chunks(), chunks_after_abort=self.chunks(since="abort"),
                        pages_after_abort=len(self.pages(since="abort")))
        recv = self.receivers.get(room)
        if recv is not None:
            observed["decode_poll"] = poll_name(self.call("poll", recv.poll))
        observed["tree_error"] = ",".join(self.errors) or None


def index_dtype(send: Callable[..., Any]) -> Any:
    """The width of the page indices the receiver sends, as its signature declares them (``NDArray[np.int64]`` up to
    0.4.6.post5, whose prefill side reads 8 bytes an index; ``np.int32`` after): a decode scheduler hands it those."""
    try:
        declared = typing.get_type_hints(send).get("kv_indices")
        return typing.get_args(typing.get_args(declared)[1])[0]
    except (NameError, TypeError, IndexError):  # undeclared or unresolvable: the width every later tree takes
        return sg.np.int32


def own_address() -> str:
    """The address the decode receiver gives the prefill side for itself, where it asks the network for it (up to
    0.4.7.post1: a route towards a public address, which a sandbox has none of): its host's, the decode's."""
    SCENARIOS.adapted("own-address-asked")
    return DECODE_IP


def transfer(world: World, *, chunks_before: int, queued_after: int = 0) -> None:
    """Bootstrap, then ``chunks_before`` chunks written and ``queued_after`` more queued, not yet taken."""
    world.prefill_knows()
    world.receiver()
    world.metadata()
    world.prefill_reads()
    world.started()
    for chunk in range(chunks_before):
        world.queue(chunk)
        world.work()
    for chunk in range(chunks_before, chunks_before + queued_after):
        world.queue(chunk)


def aborted(observed: Observed, *, chunks_before: int, queued_after: int = 0, twice: bool = False) -> None:
    """After ``transfer``, decode aborts (``twice``: the same receiver once more, the abort's moment the first); the
    prefill ranks read the ABORT, then their workers take what is queued."""
    world = World()
    with world.transport():
        transfer(world, chunks_before=chunks_before, queued_after=queued_after)
        world.abort()
        if twice:
            world.call("abort", world.receivers[ROOM].abort)
        world.prefill_reads()
        world.work()
    world.finish(observed)


@scenario("N1", "decode aborts after bootstrap, before the prefill side queues any chunk")
def n1(observed: Observed) -> None:
    world = World()
    with world.transport():
        transfer(world, chunks_before=0)
        world.abort()
        world.prefill_reads()
        for chunk in range(len(CHUNKS)):
            world.queue(chunk)
        world.work()
    world.finish(observed)
    observed["aborts_armed"] = world.aborts_armed()  # a tree fact: which trees arm (not_deciding reads it)


@scenario("N2", "decode aborts mid-transfer: one chunk written, two queued")
def n2(observed: Observed) -> None:
    aborted(observed, chunks_before=1, queued_after=2)


@scenario("N3", "decode aborts after the last chunk: the room already succeeded on the prefill side")
def n3(observed: Observed) -> None:
    aborted(observed, chunks_before=len(CHUNKS))


@scenario("N4", "the decode wait times out mid-transfer (poll), with two chunks still queued", aborts=False)
def n4(observed: Observed) -> None:
    world = World()
    with world.transport():
        transfer(world, chunks_before=1, queued_after=2)
        recv = world.receivers[ROOM]
        recv.init_time = time.time() - WAITING_TIMEOUT - 1  # sent its metadata longer ago than the wait allows
        world.timeline.mark("abort")
        observed["timeout_poll"] = poll_name(world.call("poll", recv.poll))
        world.prefill_reads()
        world.work()
    world.finish(observed)


@scenario("N5", "control: the prefill side fails the transfer; decode's failure path runs", aborts=False)
def n5(observed: Observed) -> None:
    world = World()
    with world.transport():
        world.prefills[0].engine.status = -1  # the first write fails
        transfer(world, chunks_before=1, queued_after=2)
        world.work()
        world.decode_reads()
        recv = world.receivers[ROOM]
        world.timeline.mark("abort")
        observed["decode_poll_failed"] = poll_name(world.call("poll", recv.poll))
        try:
            recv.failure_exception()
            observed["failure_raised"] = None
        except Exception as exc:
            observed["failure_raised"] = type(exc).__name__
        world.prefill_reads()
    world.finish(observed)
    del observed["decode_poll"]  # the receiver was cleared by failure_exception: decode_poll_failed says it


@scenario("N6", "two prefill ranks (pipeline stages): decode aborts mid-transfer")
def n6(observed: Observed) -> None:
    world = World(ranks=2)
    with world.transport():
        world.prefill_knows()
        observed["stages_bootstrapped"] = len(world.receiver().bootstrap_infos)
        if observed["stages_bootstrapped"] < len(world.prefills):
            return  # a tree fact: its receiver knows one prefill rank per tensor-parallel rank, no pipeline stages
        world.metadata()
        world.prefill_reads()
        world.started()
        world.queue(0)
        world.work()
        for chunk in (1, 2):
            world.queue(chunk)
        world.abort()
        world.prefill_reads()
        world.work()
    world.finish(observed)


@scenario("N7", "decode aborts the same request twice, mid-transfer")
def n7(observed: Observed) -> None:
    aborted(observed, chunks_before=1, queued_after=2, twice=True)


@scenario("N8", "decode aborts a room the prefill rank never heard of")
def n8(observed: Observed) -> None:
    world = World()
    with world.transport():
        world.receiver()
        world.prefill_reads()
        world.registered()
        world.abort()
        world.prefill_reads()
    world.finish(observed)


@scenario("N9", "control: a transfer that completes, never aborted", aborts=False)
def n9(observed: Observed) -> None:
    world = World()
    with world.transport():
        transfer(world, chunks_before=len(CHUNKS))
        world.decode_reads()
    world.finish(observed)


@scenario("N10", "control: a room never aborted, its chunks queued beside one aborted mid-transfer")
def n10(observed: Observed) -> None:
    world = World()
    with world.transport():
        for room in (ROOM, OTHER_ROOM):
            world.prefill_knows(room)
            world.receiver(room)
            world.metadata(room)
        world.prefill_reads()
        for room in (ROOM, OTHER_ROOM):
            world.started(room)
        world.queue(0)
        world.work()
        for chunk in range(len(CHUNKS)):
            if chunk:
                world.queue(chunk)
            world.queue(chunk, room=OTHER_ROOM)
        world.abort()
        world.prefill_reads()
        world.work()
    world.finish(observed)
    observed.update(other_room_pages=world.pages_written(OTHER_PAGES),
                    other_room_status=poll_name(world.prefills[0].request_status.get(OTHER_ROOM)))


@scenario("N11", "control: an ABORT (as a fixed decode sends it) for a room that already succeeded", aborts=False)
def n11(observed: Observed) -> None:
    world = World()
    with world.transport():
        transfer(world, chunks_before=len(CHUNKS))
        world.timeline.mark("abort")
        world.bus.deliver(kvt.endpoint(PREFILL_IP, PREFILL_PORT),
                          [b"ABORT", str(ROOM).encode(), DECODE_IP.encode(), str(DECODE_PORT).encode()])
        world.prefill_reads()
    world.prefill_state(observed)
    observed.update(chunks_written=world.chunks(), tree_error=",".join(world.errors) or None)


@scenario("N12", "control: the decode alone, as a scheduler drives it: the client aborts a request whose transfer "
                 "never ends; a day later another request comes in, then the prefill's last write lands", aborts=False)
def n12(observed: Observed) -> None:
    if sg.missing:
        raise RuntimeError(sg.missing)
    with republished():
        w = _transferqueue.World(gate=False)  # #35049's hold (off by default up to 0.5.20) is not this fix
        observed.update(_transferqueue.given_up_in_a_day(w, "aborted", ROOM))
    if w.error() is not None:
        raise RuntimeError(f"the tree raised in {w.error()}")


@contextlib.contextmanager
def republished():
    """The decode scheduler's server args as the transfer queue's world publishes them, for one block; then this
    probe's again (the other scenarios' managers read them)."""
    _transferqueue.publish(SCENARIOS.adapted)
    try:
        yield
    finally:
        publish_server_args(sg.server_args, SCENARIOS.adapted, role="test")


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
