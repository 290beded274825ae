"""The NIXL backend's KV managers, built and driven as a PD server's threads drive them (PR #35360).

``NixlKVManager`` (``sglang.srt.disaggregation.nixl.conn``) runs its real methods: the prefill
side's abort handler (``_handle_abort_notification``, what its bootstrap thread calls for an
``ABORT`` message), its transfer worker (``transfer_worker``, run on the probe's thread over a
scripted queue; up to 0.5.11, which have none, the sender's ``send`` and ``poll``, posting each chunk's
transfers through ``add_transfer_request`` and reading their states), the sender's ``clear``, and the
decode side's listener thread (started on the probe's thread: its ``while True`` loop reads a scripted
socket). The manager (and a sender) is made with
``object.__new__`` and the attributes its methods read: its constructor builds a NIXL agent and
registers GPU buffers, which this machine cannot do (``nixl`` is not installed in the era
environments; nothing probed imports it at module level).

Stand-ins only at the transport: the NIXL agent (``check_xfer_state`` answers each posted
transfer's scripted states, and can deliver the decode's ``ABORT`` while a transfer is in flight),
the transfer posts (``send_kvcache`` / ``send_aux``: a recorder of each write with its destination
page indices and the handle it returns), and the ZeroMQ send (``_send_multipart_locked``: each
``ABORT_ACK`` recorded with whether a posted write was still in flight). The deferred-release flag
is the tree's own ``envs`` value read while ``gated`` sets the server's variable, as
``CommonKVManager.__init__`` reads it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import threading
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, Callable

from _decode_step import CannotObserve
from _probekit import stand_in, swapped
# the gate and the decode server: the one ``_transferqueue.World`` plays in X9 (0.5.21 acks every decode peer
# of a room); the ack generation a fresh decode manager arms first
from _transferqueue import DECODE_IP, DECODE_PORT, FIRST_GENERATION, GATE, ScriptEnded, gated

CONN = "sglang.srt.disaggregation.nixl.conn"
SENDER_OF = "NixlKVSender"
AGENT = "decode-agent"
PAGES_PER_CHUNK = 2
ACK_TAG = b"ABORT_ACK"

sg = SimpleNamespace(ready=False)


def prepare() -> str:
    import sglang

    sg.conn = None
    sg.unobserved = None
    sg.absent = {}
    try:
        spec = importlib.util.find_spec(CONN)
    except ModuleNotFoundError:
        spec = None
    if spec is None:  # a PD tree before the NIXL backend
        sg.absent = {"nixl_manager": "absent"}
        return sglang.__version__
    try:
        sg.conn = importlib.import_module(CONN)
    except ImportError as exc:
        sg.unobserved = f"{CONN} does not import: {type(exc).__name__}: {exc}"
        return sglang.__version__
    receiver = getattr(sg.conn, "NixlKVReceiver", None)
    if receiver is not None and not hasattr(receiver, "abort"):  # up to 0.5.5: only X10, the decode's, drives it
        sg.absent = {"receiver_abort": "absent"}
        return sglang.__version__
    sg.Manager = getattr(sg.conn, "NixlKVManager", None)
    if sg.Manager is None:
        sg.unobserved = f"{CONN} has no NixlKVManager: what the NIXL backend does on an abort cannot be observed"
        return sglang.__version__
    sg.handles_abort = hasattr(sg.Manager, "_handle_abort_notification")
    if not sg.handles_abort:  # up to 0.5.15: NIXL ABORT handling is #30352
        sg.absent = {"nixl_abort_handler": "absent"}
    # up to 0.5.11 no transfer worker: the prefill's sender posts each chunk's transfers itself (the manager's
    # add_transfer_request) and polls them; X1-X8 drive a worker, so only X9 (no ABORT handler there) runs that way
    sg.worker = hasattr(sg.Manager, "transfer_worker")
    direct = not sg.handles_abort and hasattr(sg.Manager, "add_transfer_request")
    if not (sg.worker or direct) or not hasattr(sg.conn, "np"):
        sg.unobserved = ("the tree's NIXL manager has no transfer_worker (or its module no numpy): when its "
                         "writes drain cannot be observed")
        return sglang.__version__
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.utils import DisaggregationMode

    sg.KVPoll, sg.Mode = KVPoll, DisaggregationMode
    sg.Chunk = getattr(sg.conn, "TransferKVChunk", None)  # what the worker's queue holds (none without a worker)
    sg.TransferInfo = sg.conn.TransferInfo
    sg.RegisterInfo = getattr(sg.conn, "KVArgsRegisterInfo", None)
    sg.Sender = getattr(sg.conn, SENDER_OF)
    sg.Notification = getattr(sg.conn, "AbortNotification", None)  # 0.5.22 on: the ABORT frame carries a generation
    sg.np = sg.conn.np  # the module's own numpy (in-cell code imports only the tree): page indices as it builds them
    envs = getattr(importlib.import_module("sglang.srt.environ"), "envs", None) if _has_environ() else None
    sg.gate = getattr(envs, GATE, None)  # absent before #35049 (0.5.18 and older): nothing reads the flag
    sg.ready = True
    return sglang.__version__


def _has_environ() -> bool:
    return importlib.util.find_spec("sglang.srt.environ") is not None


def require_loop(observed: dict) -> bool:
    """X9's precondition: the tree's decode queue and a prefill rank that writes (its transfer worker, or up to
    0.5.11 its sender posting each chunk itself). A prefill manager that handles no ``ABORT`` still runs, told
    nothing (nothing in it would answer): what the tree lacks is recorded."""
    if sg.unobserved is not None:
        raise CannotObserve(sg.unobserved)
    observed.update(sg.absent)
    if sg.ready and not sg.worker:
        observed["nixl_transfer_worker"] = "absent"
    return sg.ready


def require(observed: dict) -> bool:
    """A scenario's precondition: True when it can go on. What the tree lacks is recorded (no NIXL backend; no
    NIXL ABORT handler, so the prefill side is never told of an abort); where the tree cannot be driven, the
    scenario's error says why, never an absence."""
    if sg.unobserved is not None:
        raise CannotObserve(sg.unobserved)
    observed.update(sg.absent)
    return not sg.absent


@dataclasses.dataclass
class Handle:
    """One posted NIXL transfer: the states ``check_xfer_state`` answers, in order (the last repeats)."""

    kind: str
    pages: list[int]
    states: list[str]
    on_poll: Callable[[], None] | None = None
    finished: bool = False
    after_ack: bool = False  # posted after an ABORT_ACK went out


class World:
    """The stand-ins of one scenario and what they saw, shared by its managers."""

    def __init__(self, *, gate: bool = True):
        self.gate = gate
        self.writes: list[Handle] = []
        self.acks: list[dict[str, Any]] = []
        self.statuses: list[list[bytes]] = []  # other messages to decode (a room's KV status)
        self.scripts: list[tuple[list[str], Callable[[], None] | None]] = []

    def script(self, *states: str, on_poll: Callable[[], None] | None = None) -> None:
        """The next posted write answers ``states``; ``on_poll`` runs at its first poll (another thread's act)."""
        self.scripts.append((list(states), on_poll))

    def in_flight(self) -> bool:
        return any(not w.finished for w in self.writes)

    # --- the transport stand-ins -------------------------------------------------------------
    def _post(self, kind: str, pages) -> Handle:
        states, on_poll = self.scripts.pop(0) if self.scripts else (["DONE"], None)
        handle = Handle(kind, [int(p) for p in pages], states, on_poll, after_ack=bool(self.acks))
        self.writes.append(handle)
        return handle

    def _check_xfer_state(self, handle: Handle) -> str:
        if handle.on_poll is not None:
            hook, handle.on_poll = handle.on_poll, None
            hook()
        state = handle.states.pop(0) if len(handle.states) > 1 else handle.states[0]
        handle.finished = state in ("DONE", "ERR")
        return state

    def _send(self, endpoint, parts, *args, **kwargs) -> None:
        if parts[0] != ACK_TAG:  # 0.5.23 also sends the room's KV status this way
            self.statuses.append(list(parts))
            return
        self.acks.append({"parts": list(parts), "in_flight": self.in_flight(), "tag": parts[0]})

    # --- managers ---------------------------------------------------------------------------------
    def _flag(self) -> dict[str, Any]:
        """The flag as ``CommonKVManager.__init__`` sets it: the tree's ``envs`` value (0.5.21 on: and'ed with the
        backend's ``supports_deferred_decode_kv_release``); trees before #35049 read no flag."""
        if sg.gate is None:
            return {}
        with gated(self.gate):
            on = bool(sg.gate.get()) and getattr(sg.Manager, "supports_deferred_decode_kv_release", True)
        return {"enable_deferred_decode_kv_release": on}

    def prefill(self, *, rank: int = 0) -> Any:
        """A prefill manager of attention-TP rank ``rank``, with one decode peer registered."""
        world = self
        register = {"decode_tp_size": 1, "requires_dcp_relayout": False, "kv_xfer_segments": None,
                    "dst_homogeneous_mem_kind": "VRAM", "dst_kv_ptrs": [2], "gpu_id": 0, "dst_aux_ptrs": [3],
                    "dst_state_data_ptrs": [], "staging_base_ptr": 0, "staging_total_size": 0,
                    "decode_tp_rank": 0, "agent_name": AGENT}
        dst_info = stand_in((sg.RegisterInfo,) if sg.RegisterInfo else (), "decode_kv_args", **register)
        attrs = dict(
            disaggregation_mode=sg.Mode.PREFILL, request_status={}, failure_records={},
            failure_lock=threading.Lock(), transfer_infos={}, decode_kv_args_table={AGENT: dst_info},
            exceptions={}, _staging_outstanding=defaultdict(int), _deferred_ack_targets={},
            _deferred_ack_fanout_snapshots={},  # 0.5.21 on
            _deferred_ack_poisoned_rooms=set(),  # 0.5.22 on
            _deferred_abort_ack_tracker={}, req_to_decode_prefix_len={}, enable_staging=False, _staging_ctx=None,
            _dcp_pack_buffers=None, is_mla_backend=False, is_hybrid_mla_backend=False,
            attn_tp_size=1, attn_tp_rank=rank, attn_cp_size=1, attn_cp_rank=0, pp_size=1, pp_rank=0,
            transfer_source_rank=rank, src_mem_kind="VRAM",
            # up to 0.5.11 the sender and add_transfer_request read these: one pipeline rank, no context parallelism
            pp_group=SimpleNamespace(is_last_rank=True), enable_all_cp_ranks_for_transfer=False,
            is_dummy_cp_rank=False,
            kv_args=SimpleNamespace(kv_data_ptrs=[1], page_size=1, engine_rank=rank, pp_rank=0),
            agent=SimpleNamespace(check_xfer_state=world._check_xfer_state),
            send_kvcache=lambda peer, src, ptrs, dst, *a, **k: world._post("kv", dst),
            send_aux=lambda *a, **k: world._post("aux", []),
            _send_multipart_locked=world._send, **self._flag())
        manager = object.__new__(sg.Manager)
        manager.__dict__.update(attrs)
        return manager

    def decode(self) -> Any:
        """A decode manager whose listener reads the ``ABORT_ACK`` messages the prefill managers sent."""
        attrs = dict(disaggregation_mode=sg.Mode.DECODE, request_status={}, failure_records={},
                     failure_lock=threading.Lock(), _deferred_abort_ack_tracker={}, enable_staging=False,
                     _deferred_abort_generation=0,  # 0.5.22 on
                     _staging_ctx=None, **self._flag())
        manager = object.__new__(sg.Manager)
        manager.__dict__.update(attrs)
        return manager


# --- the prefill side's calls ------------------------------------------------------------------------
def bootstrap(manager, room: int, pages: int) -> None:
    """The room as the prefill bootstrap thread leaves it: the decode's transfer info arrived."""
    names = {f.name for f in dataclasses.fields(sg.TransferInfo)}
    np = sg.np
    fields = dict(room=room, endpoint=DECODE_IP, dst_port=DECODE_PORT, agent_name=AGENT,
                  dst_kv_indices=np.arange(1000 + room * 10, 1000 + room * 10 + pages, dtype=np.int32),
                  dst_aux_index=0, required_dst_info_num=1, dst_state_indices=[])
    info = sg.TransferInfo(**{k: v for k, v in fields.items() if k in names})
    manager.transfer_infos[room] = {AGENT: info}
    manager.update_status(room, sg.KVPoll.WaitingForInput)


def chunk(room: int, index: int, *, last: bool) -> Any:
    """The ``index``-th chunk of a room's transfer (``PAGES_PER_CHUNK`` pages), as ``add_transfer_request``
    queues it."""
    np = sg.np
    start = index * PAGES_PER_CHUNK
    fields = dict(room=room, prefill_kv_indices=np.arange(start, start + PAGES_PER_CHUNK, dtype=np.int32),
                  index_slice=slice(start, start + PAGES_PER_CHUNK), is_last_chunk=last,
                  is_last=last,  # 0.5.12's name for it
                  prefill_aux_index=0 if last else None, state_indices=None, chunk_id=index)
    names = {f.name for f in dataclasses.fields(sg.Chunk)}
    return sg.Chunk(**{k: v for k, v in fields.items() if k in names})


def transfer(manager, room: int, pages: int) -> None:
    """The room's ``pages`` written in chunks of ``PAGES_PER_CHUNK`` as the tree's prefill rank writes them: its
    transfer worker (``work``), else (up to 0.5.11) its sender posting each chunk itself (``send``)."""
    if sg.worker:
        last = pages // PAGES_PER_CHUNK - 1
        work(manager, *(chunk(room, i, last=i == last) for i in range(last + 1)))
    else:
        send(manager, room, pages)


def send(manager, room: int, pages: int, *, polls: int = 16) -> None:
    """The prefill scheduler's sender of ``room`` (the tree's ``NixlKVSender``, as its constructor leaves it): each
    chunk of ``PAGES_PER_CHUNK`` pages goes through its ``send`` (up to 0.5.11: the manager's
    ``add_transfer_request`` posts its transfers at once), each followed by the scheduler's ``poll``; then polled
    until the transfer ends (its posted writes answer their scripted states)."""
    sender = object.__new__(sg.Sender)
    sender.kv_mgr, sender.bootstrap_room, sender.aux_index, sender.curr_idx = manager, room, None, 0
    sender.xfer_handles, sender.has_sent, sender.chunk_id = [], False, 0
    sender.init(pages, 0)
    np = sg.np
    for start in range(0, pages, PAGES_PER_CHUNK):
        sender.send(np.arange(start, start + PAGES_PER_CHUNK, dtype=np.int32))
        state = sender.poll()
    for _ in range(polls):
        if state not in (sg.KVPoll.WaitingForInput, sg.KVPoll.Transferring):
            return
        state = sender.poll()
    raise CannotObserve(f"the tree's NIXL sender still polls {state!r} after {polls} polls: its transfer never ended")


class ScriptedQueue:
    def __init__(self, items):
        self.items = list(items)

    def get(self, *args, **kwargs):
        if not self.items:
            raise ScriptEnded
        return self.items.pop(0)


def work(manager, *chunks) -> None:
    """The transfer worker takes ``chunks`` from its queue, in order, on the probe's thread."""
    try:
        manager.transfer_worker(ScriptedQueue(chunks))
    except ScriptEnded:
        pass


def abort(manager, room: int) -> None:
    """The decode side's ``ABORT`` for ``room``, as the prefill bootstrap thread hands it over."""
    manager._handle_abort_notification(abort_frames(manager, room))


def abort_frames(manager, room: int) -> list[bytes]:
    """The ``ABORT`` a decode rank sends mid-transfer, its deferred release set as ``manager``'s (one server
    environment). From 0.5.22 the tree builds it (``AbortNotification``) with the ack generation the decode
    armed when its release is deferred: a fresh decode manager's first is 1."""
    if sg.Notification is None:
        return [b"ABORT", str(room).encode("ascii"), DECODE_IP.encode("ascii"), str(DECODE_PORT).encode("ascii")]
    armed = getattr(manager, "enable_deferred_decode_kv_release", False)
    return sg.Notification(room=room, decode_ip=DECODE_IP, decode_port=DECODE_PORT,
                           generation=FIRST_GENERATION if armed else None).to_zmq()


def clear(manager, room: int) -> None:
    """The prefill sender concluding the room (the tree's ``NixlKVSender.clear``)."""
    sender = object.__new__(sg.Sender)
    sender.kv_mgr, sender.bootstrap_room = manager, room
    sender.conclude_state = None  # as its constructor leaves it (0.5.23's clear reads it)
    sender.clear()


def worker_error(manager, room: int) -> str | None:
    exc = manager.exceptions.get(room)
    return type(exc).__name__ if exc is not None else None


# --- the decode side ---------------------------------------------------------------------------------
class _InlineThreads:
    """The module's ``threading`` while its listener starts: the thread's body runs on the probe's thread."""

    class Thread:
        def __init__(self, target, *args, **kwargs):
            self.target = target

        def start(self):
            try:
                self.target()
            except ScriptEnded:
                pass


def listen(manager, messages: list[list[bytes]]) -> None:
    """The decode listener thread reads ``messages`` (the acks the prefill managers sent), then stops."""
    start = (getattr(manager, "_start_decode_listener_thread", None)
             or getattr(manager, "_start_decode_staging_thread", None))
    if start is None:
        raise CannotObserve("the tree's NIXL decode manager starts no listener thread")
    manager.server_socket = SimpleNamespace(recv_multipart=ScriptedQueue(messages).get)
    with swapped(sg.conn, threading=_InlineThreads):
        start()


def hold(manager, room: int) -> None:
    """The decode queue holding an aborted room's pages (0.5.19 on): ``register_deferred_abort_room``
    arms the room's ack tracker."""
    register = getattr(manager, "register_deferred_abort_room", None)
    if register is not None:
        register(room)


def ranks_acked(manager, room: int) -> int:
    """How many prefill ranks the decode manager counts as drained for ``room`` (none where it counts none):
    a set of ranks, from 0.5.22 within the room's generation state."""
    acked = manager._deferred_abort_ack_tracker.get(room, ())
    return len(getattr(acked, "prefill_ranks", acked))


def deferred_enabled(manager) -> bool | None:
    """The manager's deferred-release flag; None where the tree has none (before #35049)."""
    return getattr(manager, "enable_deferred_decode_kv_release", None)
