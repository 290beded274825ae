"""The decode side of a PD transfer, driven as a decode scheduler does: the real ``DecodeTransferQueue``.

What the transfer experiments share (``deferred_release``, PR #35049; ``deferred_release_nixl``, PR #35360):
a decode worker pre-allocates a request's KV slots, the prefill side writes into them, and an abort
mid-transfer decides when those slots go back to the allocator. A ``World`` holds the tree's real
objects on the decode side:

- the real ``DecodeTransferQueue`` (``sglang.srt.disaggregation.decode``), built by its own
  constructor (which reads the gate, ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``, through
  the tree's ``envs``: ``gated`` sets it in ``os.environ`` only while the world is built and driven);
- the real receiver class of the backend (``MooncakeKVReceiver`` unless told otherwise), made with
  ``object.__new__`` and the attributes its ``abort``/``poll``/``failure_exception``/``clear`` read; its
  manager is the backend's real manager class made the same way (its ack tracker and status table are
  the tree's own methods). The manager's gate is set from the tree's own ``envs`` read under ``gated``,
  as its constructor does; in a tree with no ``envs`` (0.4.x) whose manager's constructor reads the gate
  (a port in that tree's idiom), as that tree reads a boolean variable (``_serverenv.bool_reader``: its
  ``get_bool_env_var``), the result naming the reader (adaptation ``gate-via-get_bool_env_var``);
- the scheduler's own methods on a stand-in ``self``: an abort is ``Scheduler.abort_request`` (which,
  from 0.5.19, also arms the ack tracker), an iteration is ``process_decode_queue`` (which, from 0.5.19,
  resolves held releases, then polls);
- messages from the prefill side (a status, an ``ABORT_ACK``) reach the manager through its own decode
  thread (``start_decode_thread``), run on the probe's thread over a scripted socket that ends the loop.

``Prefill`` is one prefill rank's manager, made the same way, told of an abort through its own receive loop
(``start_prefill_thread``); a chunk still writing is the room's outstanding count.

Stand-ins, at the boundary only: the ZeroMQ sockets (a recorder of ``send_multipart``; a scripted
``recv_multipart``), the gloo all-reduce of polls (one rank: the identity), the token allocator (a free
list that hands the most recently freed slots out first, as a reuse would), the tree cache
(``cache_finished_req`` gives the request's slots back and marks its KV released as the tree's pool
does), the metadata-slot allocator and buffers, the prefill-side writes (the probe says when the last
one lands) and the clock (``time`` of the queue's module, whose deadlines read ``monotonic``, and of the
receiver's, whose waiting timeout reads ``time``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from _probekit import Collaborators, Recorder, class_fact, publish_server_args, server_args, swapped
from _serverenv import bool_reader

DECODE_MODULE = "sglang.srt.disaggregation.decode"
GATE = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
GATE_ON = "true"
BACKEND_MODULES = {"mooncake": "sglang.srt.disaggregation.mooncake.conn",
                   "nixl": "sglang.srt.disaggregation.nixl.conn"}
RECEIVER_CLASSES = {"mooncake": ("MooncakeKVReceiver", "MooncakeKVManager"),
                    "nixl": ("NixlKVReceiver", "NixlKVManager")}
# The manager's method starting its decode-side receive loop: Mooncake's status thread; NIXL's listener
# (statuses come as NIXL notifications; from 0.5.19 it also reads ABORT_ACK).
RECEIVE_LOOPS = {"mooncake": "start_decode_thread", "nixl": "_start_decode_listener_thread"}
SLOTS = 64  # the token pool: slots 1..SLOTS (0 is the padding slot)
META_SLOTS = 8
DECODE_IP, DECODE_PORT = "192.0.2.2", 17000  # TEST-NET-1: never routed; no socket dials it anyway
PREFILL_IP, PREFILL_PORT = "192.0.2.1", 18000  # prefill rank r listens on PREFILL_PORT + r
DAY = 86400.0
WAITING_TIMEOUT = 300.0  # SGLANG_DISAGGREGATION_WAITING_TIMEOUT's default, as the manager's constructor reads it
FIRST_GENERATION = 1  # register_deferred_abort_room's first answer on a fresh decode manager (0.5.22 on)
BOOTSTRAP_ADDR = f"{PREFILL_IP}:8998"  # the prefill server's bootstrap server, as a request names it
STANDINS = Collaborators(
    tree_cache=("sglang.srt.mem_cache.radix_cache:RadixCache",
                "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache"),
    metadata_allocator=("sglang.srt.disaggregation.utils:ReqToMetadataIdxAllocator",),
    prealloc_queue=(f"{DECODE_MODULE}:DecodePreallocQueue",),
    scheduler=("sglang.srt.managers.scheduler:Scheduler",),
)

sg = SimpleNamespace(ready=False)


class CannotDrive(RuntimeError):
    """The tree lacks a part the driver needs: the scenario records this as its error, never as an answer."""


class StandInFailed(RuntimeError):
    """A stand-in of the probe raised inside a tree call: the probe under-built the tree's world, so what the
    scenario saw is no answer, even where the tree caught it (its deferred-release loop logs a release that
    raised and goes on, which would read as pages never given back)."""


class ScriptEnded(BaseException):
    """The scripted socket has no more messages: ends the manager's ``while True`` receive loop. A BaseException,
    so a loop's own ``except Exception`` cannot swallow it and spin."""


@contextlib.contextmanager
def gated(on: bool):
    """The gate as a server's environment sets it, for one block; the previous value comes back after."""
    saved = os.environ.get(GATE)
    if on:
        os.environ[GATE] = GATE_ON
    else:
        os.environ.pop(GATE, None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(GATE, None)
        else:
            os.environ[GATE] = saved


def lacks_backend(backend: str) -> bool:
    """Whether the tree's PD package holds no such backend package: read from what it holds; in doubt, no (its
    import then says what is wrong)."""
    try:
        return importlib.util.find_spec(BACKEND_MODULES[backend].rsplit(".", 1)[0]) is None
    except (ImportError, ValueError):
        return False


def prepare(adapt: Callable[[str], None], backend: str = "mooncake") -> None:
    """Import what a world uses, once; a part the tree lacks is left for the scenarios to record."""
    import torch
    from sglang.srt.server_args import ServerArgs

    sg.torch = torch
    sg.backend = backend
    sg.missing = None
    sg.gate_reader = None
    try:
        # the scheduler first, as a server imports it: up to 0.4.6.post4 the decode module alone meets a circular
        # import of sglang.srt.layers.linear
        importlib.import_module("sglang.srt.managers.scheduler")
        sg.decode = importlib.import_module(DECODE_MODULE)
        sg.conn = importlib.import_module(BACKEND_MODULES[backend])
    except ImportError as exc:
        sg.missing = f"{exc.name or exc} does not import: {exc}"
        return
    receiver_name, manager_name = RECEIVER_CLASSES[backend]
    for owner, name in ((sg.decode, "DecodeTransferQueue"), (sg.decode, "DecodeRequest"),
                        (sg.conn, receiver_name), (sg.conn, manager_name)):
        if not hasattr(owner, name):
            sg.missing = f"{owner.__name__} has no {name}"
            return
    sg.Queue, sg.DecodeRequest = sg.decode.DecodeTransferQueue, sg.decode.DecodeRequest
    # What the scheduler takes from the prealloc queue each iteration: (ready, failed) from 0.5.x's later
    # releases, one list before; nothing is ready in a probe either way.
    pop = getattr(getattr(sg.decode, "DecodePreallocQueue", None), "pop_preallocated", None)
    returns = str(inspect.signature(pop).return_annotation) if pop is not None else ""
    sg.nothing_preallocated = ([], []) if "tuple" in returns.lower() else []
    sg.Receiver, sg.Manager = getattr(sg.conn, receiver_name), getattr(sg.conn, manager_name)
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams

    sg.KVPoll, sg.DECODE, sg.AbortReq = KVPoll, DisaggregationMode.DECODE, AbortReq
    sg.PREFILL = DisaggregationMode.PREFILL
    sg.Req, sg.SamplingParams, sg.Scheduler = Req, SamplingParams, Scheduler
    sg.ReqKvInfo = getattr(schedule_batch, "ReqKvInfo", None)
    sg.kv_on_record = sg.ReqKvInfo is not None and hasattr(sg.ReqKvInfo, "holds_kv")  # 0.5.19 on
    sg.pool_frees_request = _pool_frees_request()
    try:  # the tree's environment variables (0.5.x); older trees read os.environ where they read any
        sg.envs = getattr(importlib.import_module("sglang.srt.environ"), "envs", None)
    except ImportError:
        sg.envs = None
    read_gate_where(adapt)
    # page_size: what a server resolves its default to (trees whose args fall back to the dataclass defaults
    # would hold None, which 0.5.x's release_kv_cache compares)
    sg.server_args = server_args(ServerArgs, adapt, model_path="dummy", disaggregation_mode="decode",
                                 disaggregation_transfer_backend=backend, page_size=1)
    publish(adapt)
    try:  # 0.5.20 on: the scheduler's loop stages are timed by a recorder it always holds (off without metrics)
        stages = importlib.import_module("sglang.srt.observability.scheduler_stage_metrics")
        sg.stage_metrics = lambda: stages.SchedulerStageMetricsRecorder(enabled=False)
    except ImportError:
        sg.stage_metrics = lambda: None
    STANDINS.find()
    sg.ready = True


def publish(adapt: Callable[[str], None]) -> None:
    """The server args, published as the decode scheduler's process does. From 0.5.21 the queue reads its TP
    rank from the runtime context, which the launcher's rank bundle writes: this process is TP rank 0."""
    try:
        from sglang.srt import runtime_context
    except ImportError:  # before 0.5.15: no runtime context
        runtime_context = None
    spawn_ranks = getattr(runtime_context, "SpawnRanks", None)
    if spawn_ranks is None:
        publish_server_args(sg.server_args, adapt, role="test")
        return
    adapt("publish-rank-bundle")
    runtime_context.publish(sg.server_args, role="test", ranks=spawn_ranks(world_rank=0))
    if "gloo_group" not in inspect.signature(sg.Queue.__init__).parameters:
        # 0.5.22: the queue takes its gloo group from the attention-TP group that building the process groups
        # writes; one rank's, whose cpu group (None, as older queues were handed) only the one-rank
        # all-reduce of ``World.driving`` reads
        adapt("one-rank-attention-group")
        runtime_context.get_parallel().override_permanently(
            attn_tp_group=SimpleNamespace(cpu_group=None, world_size=1))


def gate_in_tree() -> bool:
    """Whether the tree's ``envs`` defines the gate (0.5.19 on)."""
    return sg.envs is not None and hasattr(type(sg.envs), GATE)


def gate_default() -> bool | None:
    """The gate as the tree's ``envs`` reads it with the variable unset: its declared default, which a mutant
    of the code reading it leaves alone (None where the tree's ``envs`` defines no such variable: before 0.5.19,
    and in a tree with no ``envs``, whose default is an argument of its reader's call, no declaration read here)."""
    if not gate_in_tree():
        return None
    with gated(False):
        return _tree_gate()


def read_gate_where(adapt: Callable[[str], None]) -> None:
    """Where the manager stand-ins take their gate from besides the tree's ``envs``: a tree with no ``envs`` whose
    manager's constructor (its own or a base class's) names the gate reads it its own way (a port of #35049 into
    0.4.x reads it with ``get_bool_env_var``), so the stand-ins read it as that tree reads a boolean variable, and
    the result names the reader. Nowhere else: a tree whose manager reads no gate keeps it False, as before."""
    sg.gate_reader = None
    if sg.envs is not None or not any(
            class_fact(init, GATE, why="the gate a manager stand-in carries, set as its constructor sets it")
            for init in _constructors(sg.Manager)):
        return
    read, how = bool_reader()
    sg.gate_reader = read
    adapt(f"gate-via-{how.replace('.', '-')}")


def _constructors(cls: type) -> list[Callable[..., Any]]:
    """The ``__init__`` each class of ``cls``'s MRO defines in Python (the built-in ``object.__init__`` aside)."""
    found = (klass.__dict__.get("__init__") for klass in cls.__mro__)
    return [init for init in found if inspect.isfunction(init)]


def _tree_gate() -> bool:
    """The gate as the tree reads it now: through its own ``envs`` where that defines the variable, else with the
    tree's own boolean reader where its manager reads one (``read_gate_where``); False where the tree reads no
    such variable."""
    if gate_in_tree():
        return bool(getattr(sg.envs, GATE).get())
    reader = getattr(sg, "gate_reader", None)
    return bool(reader(GATE)) if reader is not None else False


class Clock:
    """The ``time`` of the queue's module (its deadlines read ``monotonic``) and of the receiver's (its waiting
    timeout reads ``time``): both are the probe's; everything else is the real module's."""

    def __init__(self, real: Any):
        self._real = real
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class ScriptedSocket:
    """The manager's server socket: hands out the scripted messages, then ends the receive loop."""

    def __init__(self, messages: list[list[bytes]]):
        self.messages = list(messages)

    def bind(self, *args) -> None:  # older managers bind their socket as the receive loop starts
        pass

    def recv_multipart(self) -> list[bytes]:
        if not self.messages:
            raise ScriptEnded()
        return self.messages.pop(0)


class InlineThread:
    """``threading.Thread`` in the backend's module: the manager's receive loop runs on the probe's thread at
    ``start``; any other thread it starts (a heartbeat checker) never runs."""

    # the decode and the prefill manager's receive loops (Mooncake), NIXL's decode listener
    RUNS = ("decode_thread", "bootstrap_thread", "decode_listener_thread")

    def __init__(self, target: Callable[[], None], *args, **kwargs):
        self.target = target

    def start(self) -> None:
        if getattr(self.target, "__name__", "") not in self.RUNS:
            return
        try:
            self.target()
        except ScriptEnded:
            pass


def _raised_in(exc: BaseException, functions: tuple[str, ...]) -> bool:
    """Whether ``exc`` was raised in one of the named functions itself (the innermost Python frame), not in
    anything they called: a frame the loop parses, not a stand-in it reached."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name in functions


@contextlib.contextmanager
def inline_threads():
    """``InlineThread`` as ``threading.Thread`` of every module the manager's classes live in: a loop 0.5.21
    moved to the shared base class (the heartbeat checker) starts from there."""
    modules = [sg.conn, *(inspect.getmodule(cls) for cls in sg.Manager.__mro__)]
    threaded = {id(module): module for module in modules if hasattr(module, "threading")}
    inline = SimpleNamespace(Thread=InlineThread, Lock=threading.Lock, Event=threading.Event)
    with contextlib.ExitStack() as stack:
        for module in threaded.values():
            stack.enter_context(swapped(module, threading=inline))
        yield


@dataclass
class Request:
    """One request on the decode side: its real ``Req``, receiver and ``DecodeRequest``, and its slots."""

    rid: str
    room: int
    slots: list[int]
    req: Any
    receiver: Any
    decode_req: Any
    meta: int
    sent: list[tuple[int, list[bytes]]] = field(default_factory=list)  # (prefill rank, frames) its receiver sent


class World:
    """The stand-ins of one scenario and what they saw."""

    def __init__(self, *, gate: bool = True, ranks: int = 1):
        if not sg.ready:
            raise CannotDrive(sg.missing or "the tree's transfer queue was not prepared")
        self.gate, self.ranks = gate, ranks
        self.free_list = list(range(1, SLOTS + 1))
        self.holders: dict[int, str] = {}  # slot -> rid of the live request holding it
        self.frees: list[dict[str, Any]] = []
        self.meta_free = list(range(META_SLOTS))
        self.meta_frees: list[int] = []
        self.requests: dict[str, Request] = {}
        self.writes: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.standin_failures: list[str] = []  # "name:Type: message" of each stand-in call that raised
        self.clock = Clock(time)
        torch = sg.torch
        rooms = torch.zeros((META_SLOTS, 1), dtype=torch.int64)
        # 0.5.23 resets a freed slot through clear_slot: its room (no checksum is kept, nothing else is observed)
        self.metadata_buffers = SimpleNamespace(bootstrap_room=rooms, clear_slot=self._standin(self._clear_slot))
        self.meta_allocator = STANDINS.make("metadata_allocator", "metadata_allocator",
                                            free=self._standin(self._free_meta), alloc=self._standin(self._alloc_meta),
                                            available_size=lambda: len(self.meta_free))
        self.tree_cache = STANDINS.make(
            "tree_cache", "tree_cache", cache_finished_req=self._standin(self._cache_finished_req),
            supports_mamba=lambda: False,
            page_size=1,
            # 0.5.21's release_kv_cache gives the row back through the cache's row methods, then marks the
            # request released itself: no streaming session claims the row, no tree lock, pages of one slot
            # (0.5.22 tells on_release whether it checkpointed, by keyword)
            claim_kv_row=lambda req: False, free_kv_row=self._standin(self._free_kv_row), unpin=lambda req: None,
            on_release=lambda req, *args, **kwargs: None, token_to_kv_pool_allocator=SimpleNamespace(page_size=1),
            req_to_token_pool=SimpleNamespace(free=self._standin(_free_row)))
        self.prealloc = STANDINS.make("prealloc_queue", "prealloc_queue", queue=[], retracted_queue=[],
                                      pop_preallocated=lambda *a, **k: sg.nothing_preallocated,
                                      resume_retracted_reqs=lambda *a, **k: [],
                                      note_destinations_queued=lambda *a, **k: None)
        self.scheduler = STANDINS.make(
            "scheduler", "scheduler", spec_algorithm=None, enable_decode_hicache=False, enable_hisparse=False,
            enable_hicache_storage=False, enable_metrics=False, metrics_reporter=SimpleNamespace(enable_metrics=False),
            output_streamer=SimpleNamespace(stream_output=Recorder("stream_output")),
            disaggregation_mode=sg.DECODE, disagg_decode_prealloc_queue=self.prealloc, waiting_queue=[],
            chunked_req=None, mm_receiver=None, dllm_config=None, running_batch=SimpleNamespace(reqs=[]),
            last_batch=None, cur_batch=None, collect_inflight_reqs=lambda: set(),
            grammar_manager=SimpleNamespace(abort_requests=Recorder("abort_requests")),
            grammar_queue=[], polling_count=0, polling_interval=1,
            decode_offload_manager=None, tree_cache=self.tree_cache, server_args=sg.server_args,
            ps=SimpleNamespace(pp_size=1), pp_size=1, scheduler_stage_metrics=sg.stage_metrics(),
            num_tokens_pre_allocated=0)  # 0.4.6 to 0.4.6.post4 count, each iteration, the tokens preallocated
        self.manager = self._manager()
        with self.driving():
            params = inspect.signature(sg.Queue.__init__).parameters
            kwargs = {"gloo_group": None, "req_to_metadata_buffer_idx_allocator": self.meta_allocator,
                      "tp_rank": 0, "metadata_buffers": self.metadata_buffers, "scheduler": self.scheduler,
                      "tree_cache": self.tree_cache}
            self.queue = sg.Queue(**{k: v for k, v in kwargs.items() if k in params})
        self.scheduler.disagg_decode_transfer_queue = self.queue

    # --- the tree's objects ------------------------------------------------------------------
    def _manager(self) -> Any:
        """The backend's real manager class, with the decode side's state its methods read."""
        manager = object.__new__(sg.Manager)
        with gated(self.gate):
            gate = _tree_gate()
        for name, value in {
            "request_status": {}, "failure_records": {}, "failure_lock": threading.Lock(),
            "required_prefill_response_num_table": {}, "prefill_response_tracker": defaultdict(set),
            "_deferred_abort_ack_tracker": {}, "enable_deferred_decode_kv_release": gate,
            "_deferred_abort_generation": 0,  # 0.5.22 on
            "local_ip": DECODE_IP, "rank_port": DECODE_PORT, "disaggregation_mode": sg.DECODE,
            "enable_staging": False, "_staging_handler": None, "addr_to_rooms_tracker": defaultdict(set),
            "is_mla_backend": False,  # 0.4.x's receive loop counts the responses it awaits by it
            "waiting_timeout": WAITING_TIMEOUT,  # what the receiver's wait allows (0.4.9.post1 on)
            "connection_pool": {}, "connection_lock": threading.Lock(),  # receivers' cached bootstrap infos
            # 0.5.21's receive loops: a blocking recv unless role switching is on, until the manager stops
            "server_args": sg.server_args, "_stopped": False, "_worker_threads": [],
            "transfer_statuses": {},  # NIXL's decode side: each room's notifications (its receiver's clear pops it)
            "agent": SimpleNamespace(get_new_notifs=dict),  # NIXL's decode agent: no notification has come
        }.items():
            object.__setattr__(manager, name, value)
        return manager

    @contextlib.contextmanager
    def driving(self):
        """The gate as this world's server sets it, the probe's clock, and a one-rank all-reduce."""
        dist = sg.torch.distributed
        # the queue's module (a tree with no deadline imports no time) and the receiver's, whose wait times out
        timed = {id(m): m for m in (sg.decode, *map(inspect.getmodule, sg.Receiver.__mro__)) if hasattr(m, "time")}
        one_rank = {"all_reduce": lambda tensor, *a, **k: None, "get_world_size": lambda *a, **k: 1}
        with contextlib.ExitStack() as stack:
            stack.enter_context(gated(self.gate))
            for module in timed.values():
                stack.enter_context(swapped(module, time=self.clock))
            stack.enter_context(swapped(dist, **one_rank))
            yield

    def admit(self, rid: str, room: int, *, tokens: int = 8) -> Request:
        """A request whose KV the prefill side is transferring: slots allocated, receiver bootstrapped."""
        slots = [self.free_list.pop(0) for _ in range(tokens)]
        for slot in slots:
            self.holders[slot] = rid
        req = sg.Req(rid, "", list(range(tokens)), sg.SamplingParams(max_new_tokens=16))
        req.bootstrap_room = room
        _hold_kv(req, row=len(self.requests), length=tokens)
        receiver = object.__new__(sg.Receiver)
        entry = Request(rid, room, slots, req, receiver, None, self._alloc_meta())

        def connect(bootstrap_info, *a, **k):
            rank = bootstrap_info["rank_port"] - PREFILL_PORT
            socket = SimpleNamespace(send_multipart=lambda frames: entry.sent.append((rank, list(frames))))
            return socket, threading.Lock()

        infos = [{"rank_ip": PREFILL_IP, "rank_port": PREFILL_PORT + rank} for rank in range(self.ranks)]
        for name, value in {"kv_mgr": self.manager, "bootstrap_room": room, "conclude_state": None,
                            "abort_notified": False, "bootstrap_infos": infos, "require_staging": False,
                            "started_transfer": False,  # NIXL's poll: no notification to drain before one
                            # its metadata went to the prefill ranks, which may now write (0.5.21 arms the ack
                            # tracker at an abort only then)
                            "init_time": self.clock.time(),
                            "bootstrap_addr": BOOTSTRAP_ADDR,
                            # the bootstrap infos it put in the manager's pool, which a timed-out wait drops
                            # (0.5.19 on): none, its ranks are given above
                            "_connection_pool_entries": {},
                            "_connect_to_bootstrap_server": connect}.items():
            object.__setattr__(receiver, name, value)
        self.manager.request_status[room] = sg.KVPoll.Transferring
        self.manager.addr_to_rooms_tracker[BOOTSTRAP_ADDR].add(room)
        self.manager.required_prefill_response_num_table[room] = self.ranks
        entry.decode_req = sg.DecodeRequest(req=req, kv_receiver=receiver, metadata_buffer_index=entry.meta)
        self.requests[rid] = entry
        self.queue.queue.append(entry.decode_req)
        return entry

    def waiting(self, rid: str) -> None:
        """The receiver sent its metadata (its ``init``) and waits, timing the wait, while the prefill writes: the room
        is ``WaitingForInput`` (Mooncake's, until the prefill's status says the transfer ended) and the transfer
        started (NIXL's receiver then drains its agent's notifications, none of which has come)."""
        self.manager.request_status[self.requests[rid].room] = sg.KVPoll.WaitingForInput
        object.__setattr__(self.requests[rid].receiver, "started_transfer", True)

    def bystander(self, rid: str, *, tokens: int = 8) -> list[int]:
        """Another request admitted now: it takes the most recently freed slots first."""
        slots = [self.free_list.pop(0) for _ in range(tokens)]
        for slot in slots:
            self.holders[slot] = rid
        return slots

    def next_request_while_writing(self, *, tokens: int = 8) -> list[int]:
        """Two scheduler iterations pass with the prefill's write still in flight, then another request ("next")
        is admitted: the slots it takes are those the aborted request gave back, if it gave any."""
        self.iterate()
        self.iterate()
        return self.bystander("next", tokens=tokens)

    # --- what the scheduler and the prefill side do --------------------------------------------
    def abort(self, rid: str) -> None:
        """The client aborts: the scheduler's own ``abort_request``."""
        with self.driving():
            self.call("abort", sg.Scheduler.abort_request, self.scheduler, sg.AbortReq(rid=rid))

    def iterate(self) -> None:
        """One decode scheduler iteration over the transfer queue: the scheduler's own ``process_decode_queue``."""
        with self.driving():
            self.call("iterate", sg.decode.SchedulerDisaggregationDecodeMixin.process_decode_queue, self.scheduler)

    def receive(self, *messages: list[bytes]) -> None:
        """Messages from the prefill ranks, through the manager's own decode thread."""
        self.manager.server_socket = ScriptedSocket(list(messages))
        with self.driving(), inline_threads():
            start = getattr(self.manager, RECEIVE_LOOPS[sg.backend], None)
            if start is None:  # NIXL before 0.5.19: no listener reads ABORT_ACK, so none is received
                return
            self.call("receive", start)

    def ack(self, rid: str, rank: int) -> None:
        """A prefill rank's drain ack for the request's room (the 3-frame ``ABORT_ACK``): it answers an ``ABORT``,
        so a rank the tree never told (a tree without the notification, up to 0.5.12) sends none. From 0.5.22 it
        echoes the ack generation the ``ABORT`` carried (its fifth frame), as the prefill manager does."""
        told = [frames for to, frames in self.requests[rid].sent if to == rank and frames[:1] == [b"ABORT"]]
        if told:
            generation = told[-1][4:5]
            self.receive([b"ABORT_ACK", str(self.requests[rid].room).encode(), str(rank).encode(), *generation])

    def status(self, rid: str, poll: Any, rank: int = 0) -> None:
        """A prefill rank's transfer status for the request's room (``Success`` / ``Failed``)."""
        self.receive([str(self.requests[rid].room).encode(), str(int(poll)).encode(), str(rank).encode()])

    def last_write(self, rid: str) -> dict[str, int]:
        """The prefill side's last write into the request's slots lands now: what it hit."""
        entry = self.requests[rid]
        freed = {f["slot"] for f in self.frees if f["rid"] == rid}
        hit = {"written_after_free": sum(1 for s in entry.slots if s in freed),
               "written_into_other": sum(1 for s in entry.slots if self.holders.get(s) not in (None, rid))}
        self.writes.append(hit)
        return hit

    def call(self, what: str, fn: Callable[..., Any], *args) -> Any:
        """A tree call; an exception it raises is what the tree did (recorded by type), not a probe error. A stand-in
        that raised during it, caught by the tree or not, ends the scenario with ``StandInFailed``."""
        failed = len(self.standin_failures)
        try:
            result = fn(*args)
        except Exception as exc:
            self.errors.append(f"{what}:{type(exc).__name__}")
            result = None
        if self.standin_failures[failed:]:
            raise StandInFailed(f"a stand-in of the probe raised in {what}: {'; '.join(self.standin_failures[failed:])}")
        return result

    # --- the stand-ins' recording ----------------------------------------------------------------
    def _standin(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as the tree calls it: a failure is kept for ``call`` to raise, since the tree may catch it."""
        @functools.wraps(fn)
        def kept(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                self.standin_failures.append(f"{getattr(fn, '__name__', 'stand-in')}:{type(exc).__name__}: {exc}")
                raise
        return kept

    def _cache_finished_req(self, req, *args, **kwargs) -> None:
        self._give_back(self.requests[req.rid], self.requests[req.rid].slots)
        _release_kv(req)

    def _free_kv_row(self, kv, ranges: list[tuple[int, int]]) -> None:
        """0.5.21's ``free_kv_row``: the half-open position ranges of the row ``kv`` holds go back."""
        entry = next(e for e in self.requests.values() if e.req.kv is kv)
        self._give_back(entry, [slot for start, end in ranges for slot in entry.slots[start:end]])

    def _give_back(self, entry: Request, slots: list[int]) -> None:
        for slot in slots:
            self.frees.append({"slot": slot, "rid": entry.rid})
            if self.holders.get(slot) == entry.rid:
                del self.holders[slot]
        self.free_list[:0] = slots  # the next allocation takes these first

    def _clear_slot(self, idx: int) -> None:
        self.metadata_buffers.bootstrap_room[idx] = 0

    def _alloc_meta(self) -> int:
        return self.meta_free.pop(0)

    def _free_meta(self, idx: int) -> None:
        self.meta_frees.append(int(idx))
        self.meta_free.append(int(idx))

    # --- observations ------------------------------------------------------------------------
    def freed(self, rid: str) -> int:
        return sum(1 for f in self.frees if f["rid"] == rid)

    def double_freed(self) -> int:
        seen: dict[int, int] = {}
        for f in self.frees:
            seen[f["slot"]] = seen.get(f["slot"], 0) + 1
        return sum(n - 1 for n in seen.values() if n > 1)

    def gave_up(self, rid: str) -> bool:
        """Whether the decode gave up on the request's transfer: ended the request (its client is told) or gave
        any of its slots back."""
        return bool(self.requests[rid].req.finished()) or self.freed(rid) > 0

    def kept(self, rid: str) -> bool:
        """Whether the request is still in the transfer queue, unfinished and holding every slot: the decode took no
        step on it (an abort its receiver ignored leaves it so)."""
        entry = self.requests[rid]
        return any(queued is entry.decode_req for queued in self.queue.queue) and not self.gave_up(rid)

    def meta_freed(self, rid: str) -> int:
        return self.meta_frees.count(self.requests[rid].meta)

    def aborts_sent(self, rid: str) -> int:
        return sum(1 for _, frames in self.requests[rid].sent if frames[:1] == [b"ABORT"])

    def held(self) -> int:
        """Requests the queue holds for a deferred release (0 where the tree has no such hold)."""
        return len(getattr(self.queue, "_deferred_releases", ()))

    def timeout(self) -> float:
        return float(getattr(self.queue, "deferred_kv_release_timeout", 30.0))

    def error(self) -> str | None:
        return ",".join(self.errors) or None


def given_up_in_a_day(w: World, rid: str, room: int) -> dict[str, Any]:
    """The client aborts (the scheduler's ``abort_request``) a request whose transfer never ends; a day later (past
    any waiting timeout and any hold's deadline) another request comes in and the prefill's last write lands: whether
    the decode gave the request up, and what that write hit."""
    w.admit(rid, room)
    w.waiting(rid)
    w.abort(rid)
    w.iterate()
    w.clock.now += DAY
    w.next_request_while_writing()
    return {"gave_up": w.gave_up(rid), **w.last_write(rid)}


def _hold_kv(req, *, row: int, length: int) -> None:
    """The request holds ``length`` committed slots in row ``row``, in the tree's layout."""
    if sg.kv_on_record:  # 0.5.19 on: the row and lengths are on req.kv
        req.kv.req_pool_idx = row
        req.kv.kv_committed_len = req.kv.kv_allocated_len = length
        return
    req.req_pool_idx = row
    for name in ("kv_committed_len", "kv_allocated_len"):
        if hasattr(req, name):
            setattr(req, name, length)
    if sg.ReqKvInfo is not None:  # 0.5.17/0.5.18: the allocation is on req.kv
        req.kv = sg.ReqKvInfo(kv_allocated_len=length, swa_evicted_seqlen=0)
        if hasattr(req.kv, "kv_committed_len"):
            req.kv.kv_committed_len = length


def _free_row(req) -> None:
    """``ReqToTokenPool.free`` (which ``release_kv_cache`` calls from 0.5.x): the request's row goes back, in the
    tree's layout (no probe observes rows)."""
    (req.kv if sg.kv_on_record else req).req_pool_idx = None


def _pool_frees_request() -> bool:
    """Whether the tree's ``ReqToTokenPool.free`` takes the request (and clears its row, 0.5.9 on) rather than the
    row's index, leaving the request as it is (0.5.8's ``release_kv_cache`` asserts the row is still there)."""
    pool = getattr(importlib.import_module("sglang.srt.mem_cache.memory_pool"), "ReqToTokenPool", None)
    free = getattr(pool, "free", None)
    return free is not None and "req" in inspect.signature(free).parameters


def _release_kv(req) -> None:
    """What the tree's pool does when the tree cache gives a finished request's row back."""
    if sg.kv_on_record:
        req.kv.req_pool_idx = None
        req.kv.mark_kv_released()
        return
    if sg.pool_frees_request:
        req.req_pool_idx = None
    if sg.ReqKvInfo is not None:
        req.kv = None


class Prefill:
    """One prefill rank's manager (the backend's real class, ``object.__new__`` and the attributes its receive
    loop reads), told of a decode abort through its own loop (``start_prefill_thread``): what it answers, when.
    A chunk in flight is the room's outstanding count, as the tree's transfer worker keeps it."""

    def __init__(self, *, gate: bool = True):
        if not sg.ready:
            raise CannotDrive(sg.missing or "the tree's transfer queue was not prepared")
        self.gate = gate
        self.sent: list[list[bytes]] = []
        self.errors: list[str] = []
        manager = object.__new__(sg.Manager)
        with gated(gate):
            on = _tree_gate()
        for name, value in {
            "request_status": {}, "failure_records": {}, "failure_lock": threading.Lock(),
            "enable_deferred_decode_kv_release": on, "_deferred_ack_targets": {},
            "_deferred_ack_poisoned_rooms": set(),  # 0.5.22 on
            "_staging_outstanding": defaultdict(int), "_socket_send_locks": defaultdict(threading.Lock),
            "attn_tp_rank": 0, "attn_cp_rank": 0, "attn_cp_size": 1, "pp_rank": 0, "pp_size": 1,
            "disaggregation_mode": sg.PREFILL, "local_ip": PREFILL_IP, "rank_port": PREFILL_PORT,
            "transfer_infos": {}, "enable_staging": False,
            "kv_args": SimpleNamespace(engine_rank=0),  # 0.4.x's worker names its rank (a drain ack's) by it
            # 0.5.21: its receive loop's state; a held ack also goes to the room's other decode peers
            "server_args": sg.server_args, "_stopped": False, "_worker_threads": [],
            "_deferred_ack_fanout_snapshots": {},
            "_connect": lambda endpoint, is_ipv6=False: SimpleNamespace(send_multipart=self.sent.append),
            "_bind_server_socket": lambda: None,  # 0.4.9 to 0.5.3 bind as the loop starts: the socket is scripted
        }.items():
            object.__setattr__(manager, name, value)
        self.manager = manager
        self.misread: str | None = None

    def room(self, room: int, status: Any, *, in_flight: int = 0) -> None:
        self.manager.request_status[room] = status
        self.manager._staging_outstanding[room] = in_flight

    def told(self, room: int) -> None:
        """Decode's ``ABORT`` for the room reaches this rank's receive loop. A loop that handles no ``ABORT``
        (before PR #27372, 0.5.13) takes it for a bootstrap message and fails on its frames in the loop itself:
        the frame ``ABORT`` read as a room number (``ValueError``) or frames an ``ABORT`` does not carry
        (``IndexError``). That is ``misread``, the tree's answer; any other failure is the scenario's error."""
        self.manager.server_socket = ScriptedSocket([self._abort(room)])
        with gated(self.gate), inline_threads():
            try:
                self.manager.start_prefill_thread()
            except (ValueError, IndexError) as exc:
                if _raised_in(exc, InlineThread.RUNS):
                    self.misread = type(exc).__name__
                else:
                    self.errors.append(f"told:{type(exc).__name__}")
            except Exception as exc:
                self.errors.append(f"told:{type(exc).__name__}")

    def _abort(self, room: int) -> list[bytes]:
        """The ``ABORT`` a decode rank sends mid-transfer, in this world's server environment. From 0.5.22 the tree
        builds it (``AbortNotification``) with the ack generation the decode armed where it defers release."""
        notification = getattr(sg.conn, "AbortNotification", None)
        if notification is None:
            return [b"ABORT", str(room).encode(), DECODE_IP.encode(), str(DECODE_PORT).encode()]
        armed = self.manager.enable_deferred_decode_kv_release
        return notification(room=room, decode_ip=DECODE_IP, decode_port=DECODE_PORT,
                            generation=FIRST_GENERATION if armed else None).to_zmq()

    def acks(self, *, drained: bool = False) -> int:
        """``ABORT_ACK`` messages sent to decode; ``drained``: only the three-frame ones (a rank's drain ack)."""
        return sum(1 for parts in self.sent if parts[:1] == [b"ABORT_ACK"] and (not drained or len(parts) >= 3))

    def error(self) -> str | None:
        return ",".join(self.errors) or None
