"""What the two decode-offload probes share: the real manager, built and driven as a decode worker does.

Both experiments (``offload_slots``, PR #24226; ``offload_rid``, PR #37026) probe SGLang's real
``DecodeKVCacheOffloadManager`` (``sglang.srt.disaggregation.decode_kvcache_offload_manager``): its
real constructor and methods, on real ``Req`` objects. A ``World`` holds the recording stand-ins at
the boundary the manager talks to, and nothing else:

- the token allocator: records every KV slot given back, when (``phase``: decoding, at finish, on an
  acknowledgement), whether it was still in a live (unfinished) request's ``req_to_token`` row (the
  reuse window) and whether a device-to-host copy not yet acknowledged was still reading it;
- the request-to-token pool: a real CPU tensor of rows; releasing a row clears the request's row
  index, as SGLang's pool does;
- the cache controller: device-to-host writes are recorded and land (their acknowledgement queued)
  only when the scenario says so; storage backups are acknowledged at once; page hashes chain a
  digest of the tokens;
- the host pool (built under the tree's name for it), the tree cache (its protected size;
  ``free_kv_row`` gives each range back through the allocator; ``cache_finished_req`` of the
  finish-only trees gives the row back the same way; ``unlock`` / ``unpin`` of a radix-owned prefix
  do nothing) and the tensor-parallel world size (1). Where a tree picks the host pool's class from
  the device pool (``get_mha_host_pool_cls``, 0.5.14 to 0.5.17), that choice answers the stand-in.

Each is built from the tree's own class (``STANDINS``): every method the class defines that the
stand-in does not write is a recorder, so no name the tree's own idiom calls is missing.

The scenarios call the manager as the tree's output processor does: a decode step offloads an
unfinished request; at finish ``offload_kv_cache``, and where it wrote nothing
``finalize_release_on_finish`` (trees without it: the tree cache's ``cache_finished_req``); a copy
landing is ``check_offload_progress``. Whether the tree offloads while decoding at all is observed by
running its own decode-step output processing with a recording manager (``_decode_step.py``): the
finish-only trees (0.5.3 to 0.5.9) record ``decode_offload: "absent"`` and their scenarios stop there;
where that cannot be observed, every scenario records why as its error. A tree whose server cannot
be asked to offload decode KV at all (its ``ServerArgs`` has no
``disaggregation_decode_enable_offload_kvcache``: 0.5.2 and older) records ``offload_manager:
"absent"``; one that has the option but not the manager's module is an error too, never an absence.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import queue
from types import SimpleNamespace
from typing import Any, Callable

import _decode_step
from _decode_step import CannotObserve, DecodeOffload
from _probekit import Collaborators, ScenarioSet, publish_server_args, server_args, stand_in, swapped

MANAGER_MODULE = "sglang.srt.disaggregation.decode_kvcache_offload_manager"
PAGE = 4  # page size, and so the offload stride (SGLANG_HICACHE_DECODE_OFFLOAD_STRIDE unset)
ROWS = 8
ROW_LEN = 64
# The server option that turns the decode worker's KV offload on (0.5.3 on): a tree without it cannot offload.
OFFLOAD_OPTION = "disaggregation_decode_enable_offload_kvcache"
HOST_POOL_NAMES = ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost", "build_kv_host_pool")
# The tree's classes each stand-in is built from, wherever a release keeps them: every method they
# define answers as a recorder, so a fix written in any tree's idiom reaches its collaborators.
STANDINS = Collaborators(
    allocator=("sglang.srt.mem_cache.allocator:TokenToKVPoolAllocator",
               "sglang.srt.mem_cache.allocator:BaseTokenToKVPoolAllocator"),
    req_to_token_pool=("sglang.srt.mem_cache.memory_pool:ReqToTokenPool",),
    tree_cache=("sglang.srt.mem_cache.hiradix_cache:HiRadixCache", "sglang.srt.mem_cache.radix_cache:RadixCache",
                "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache"),
    cache_controller=("sglang.srt.managers.cache_controller:HiCacheController",),
    host_pool=tuple(f"{MANAGER_MODULE}:{name}" for name in HOST_POOL_NAMES)
    + ("sglang.srt.mem_cache.memory_pool_host:HostKVCache", "sglang.srt.mem_cache.pool_host.base:HostKVCache"),
)
# 0.5.14 to 0.5.17 pick the MHA host pool's class from the device pool (its head_dim): the class is the stand-in.
HOST_POOL_CLASS_OF = "get_mha_host_pool_cls"

sg = SimpleNamespace(ready=False)


def prepare(scenarios: ScenarioSet) -> str:
    """Import what the scenarios use, and observe whether the tree offloads while decoding; a tree without
    the offload option, or one whose decode offload cannot be observed, is left for the scenarios to record."""
    import sglang
    import torch
    from sglang.srt.server_args import ServerArgs

    sg.torch = torch
    sg.module = None
    sg.option = OFFLOAD_OPTION in inspect.signature(ServerArgs).parameters  # a dataclass up to 0.5.19
    sg.unobserved = None
    if not sg.option:
        return sglang.__version__
    try:
        spec = importlib.util.find_spec(MANAGER_MODULE)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        sg.unobserved = (f"the tree's ServerArgs has {OFFLOAD_OPTION}, but {MANAGER_MODULE} is not found: "
                         "whether it offloads decode KV cannot be observed")
        return sglang.__version__
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sg.server_args = server_args(ServerArgs, scenarios.adapted, model_path="dummy", disaggregation_mode="decode",
                                 page_size=PAGE, **{OFFLOAD_OPTION: True})
    publish_server_args(sg.server_args, scenarios.adapted, role="test")
    sg.module = importlib.import_module(MANAGER_MODULE)
    sg.Manager = sg.module.DecodeKVCacheOffloadManager
    sg.Req, sg.SamplingParams = Req, SamplingParams
    sg.FINISH_ABORT, sg.FINISH_LENGTH = FINISH_ABORT, FINISH_LENGTH
    sg.SPEC_NONE = SpeculativeAlgorithm.NONE
    ReqKvInfo = getattr(schedule_batch, "ReqKvInfo", None)
    sg.ReqKvInfo = ReqKvInfo
    sg.kv_on_record = ReqKvInfo is not None and hasattr(ReqKvInfo, "holds_kv")  # 0.5.19 on: req.kv.req_pool_idx

    class ProbeKVPool(MHATokenToKVPool):
        """Only the pool's type: the manager asks whether the device pool is an MHA one."""

        def __init__(self):  # no device buffers
            pass

    sg.KVPool = ProbeKVPool
    STANDINS.find()
    try:
        sg.decode_offload = _decode_step.observe(sg, lambda **attrs: stand_in((sg.Manager,), "manager", **attrs))
    except CannotObserve as exc:
        sg.unobserved = f"whether the tree offloads while decoding cannot be observed: {exc}"
    else:
        if sg.decode_offload is DecodeOffload.ABSENT:
            scenarios.adapted("offload-at-finish-only")
    sg.ready = True
    return sglang.__version__


def tree_facts(observed: dict) -> bool:
    """Record what the tree lacks; True when the scenario can go on. Where that could not be observed, the
    scenario is an error (``CannotObserve``), never an absence."""
    if not sg.option:
        observed["offload_manager"] = "absent"
        return False
    if sg.unobserved is not None:
        raise CannotObserve(sg.unobserved)
    observed["decode_offload"] = sg.decode_offload.value
    return sg.decode_offload is DecodeOffload.PRESENT


class Ack(tuple):
    """A landed write as the manager unpacks it: ``(op, finish_event, node_ids)`` up to 0.5.18, attributes later."""

    @property
    def finish_event(self):
        return self[1]

    @property
    def node_ids(self):
        return self[2]


class World:
    """The stand-ins of one scenario and what they saw."""

    def __init__(self):
        torch = sg.torch
        self.phase = "decode"
        self.reqs: list[Any] = []
        self.req_to_token = torch.zeros((ROWS, ROW_LEN), dtype=torch.int64)
        self.frees: list[dict[str, Any]] = []
        self.rows_released: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []  # device-to-host copies, in order
        self.backups: list[dict[str, Any]] = []
        self.host_freed = 0
        self.host_next = 0
        self.errors: list[str] = []
        world = self

        self.allocator = STANDINS.make("allocator", "allocator", page_size=PAGE, free=self._free,
                                       free_full=self._free, get_kvcache=lambda: world.kv_pool,
                                       available_size=lambda: 1 << 20)
        self.kv_pool = sg.KVPool()
        self.req_to_token_pool = STANDINS.make("req_to_token_pool", "req_to_token_pool",
                                               req_to_token=self.req_to_token, free=self._free_row,
                                               size=ROWS, max_context_len=ROW_LEN)
        self.tree_cache = STANDINS.make("tree_cache", "tree_cache", protected_size_=1000,
                                        free_kv_row=self._free_kv_row, unlock=lambda lock: None,
                                        unpin=lambda req: None,
                                        dec_lock_ref=lambda *a, **k: None,
                                        cache_finished_req=self._cache_finished_req,
                                        req_to_token_pool=self.req_to_token_pool,
                                        token_to_kv_pool_allocator=self.allocator)
        self.manager = self._build()

    # --- the manager, built by its real constructor -----------------------------------------
    def _build(self) -> Any:
        world = self

        class Controller:
            def __init__(self, *args, **kwargs):
                self.ack_write_queue: list = []
                self.ack_backup_queue: queue.Queue = queue.Queue()

            def write(self, device_indices, node_id, **kwargs):
                slots = [int(x) for x in device_indices.tolist()]
                host = sg.torch.arange(world.host_next, world.host_next + len(slots), dtype=sg.torch.int64)
                world.host_next += len(slots)
                world.writes.append({"node_id": node_id, "slots": slots, "landed": False, "phase": world.phase})
                return host

            def write_storage(self, host_indices, tokens, hash_value=None, **kwargs):
                op = SimpleNamespace(id=len(world.backups) + 1)
                world.backups.append({"tokens": [int(t) for t in tokens], "hashes": list(hash_value or [])})
                self.ack_backup_queue.put(op)
                return op.id

            def get_hash_str(self, tokens, prior_hash=None):
                text = f"{prior_hash or ''}|{','.join(str(int(t)) for t in tokens)}"
                return hashlib.sha256(text.encode()).hexdigest()[:16]

        def host_pool(*args, **kwargs):
            return STANDINS.make("host_pool", "host_pool", free=world._host_free, destroy=lambda: None)

        names = {"HiCacheController": STANDINS.make_class("cache_controller", Controller, "cache_controller")}
        names.update({name: host_pool for name in HOST_POOL_NAMES if hasattr(sg.module, name)})
        if hasattr(sg.module, HOST_POOL_CLASS_OF):
            names[HOST_POOL_CLASS_OF] = lambda kv_cache: host_pool
        params = inspect.signature(sg.Manager.__init__).parameters
        kwargs = {"req_to_token_pool": self.req_to_token_pool, "token_to_kv_pool_allocator": self.allocator,
                  "tp_group": None, "tree_cache": self.tree_cache, "server_args": sg.server_args}
        with swapped(sg.module, **names), swapped(sg.torch.distributed, get_world_size=lambda group=None: 1):
            manager = sg.Manager(**{k: v for k, v in kwargs.items() if k in params})
        self.controller = manager.cache_controller
        return manager

    # --- the stand-ins' recording ----------------------------------------------------------
    def _in_flight(self) -> set[int]:
        return {slot for w in self.writes if not w["landed"] for slot in w["slots"]}

    def _live(self) -> set[int]:
        live = set()
        for req in self.reqs:
            row = row_of(req)
            if row is not None and row >= 0 and not req.finished():
                live.update(int(x) for x in self.req_to_token[row, :committed_of(req)].tolist())
        return live

    def _free(self, indices, *args, **kwargs):
        slots = [int(x) for x in indices.tolist()] if hasattr(indices, "tolist") else [int(x) for x in indices]
        live, flight = self._live(), self._in_flight()
        for slot in slots:
            self.frees.append({"slot": slot, "phase": self.phase, "live": slot in live, "in_flight": slot in flight})

    def _free_kv_row(self, kv, ranges):
        for start, end in ranges:
            self._free(self.req_to_token[kv.req_pool_idx, start:end])

    def _free_row(self, req_or_row):
        row = req_or_row if isinstance(req_or_row, int) else row_of(req_or_row)
        self.rows_released.append({"row": row, "phase": self.phase,
                                   "in_flight": any(s in self._in_flight() for s in self._row_slots(row))})
        if not isinstance(req_or_row, int):
            set_row(req_or_row, None)

    def _row_slots(self, row) -> list[int]:
        if row is None or row < 0:
            return []
        return [int(x) for x in self.req_to_token[row].tolist() if x]

    def _cache_finished_req(self, req, *args, **kwargs):
        self._free(self.req_to_token[row_of(req), :committed_of(req)])
        self._free_row(req)

    def _host_free(self, indices):
        self.host_freed += len(indices)

    # --- requests and the decode worker's calls --------------------------------------------
    def new_req(self, rid: str, *, row: int, prompt: int, first_token: int = 0, radix: int = 0) -> Any:
        """A request admitted with ``prompt`` tokens, its KV at slots ``100*(row+1) + position``."""
        ids = [first_token + i for i in range(prompt)]
        req = sg.Req(rid, "", ids, sg.SamplingParams(max_new_tokens=64))
        self.req_to_token[row] = sg.torch.arange(ROW_LEN, dtype=sg.torch.int64) + 100 * (row + 1)
        set_row(req, row)
        req.prefix_indices = self.req_to_token[row, :radix].clone()
        if sg.kv_on_record:
            req.kv.cache_protected_len = radix
        req.output_ids = []
        set_committed(req, prompt)
        self.reqs.append(req)
        return req

    def decode(self, req, tokens: int, *, offload: bool = True) -> Any:
        """``tokens`` decode steps, each offloading the (unfinished) request as the output processor does."""
        result = None
        for _ in range(tokens):
            req.output_ids.append(1000 + len(req.output_ids))
            set_committed(req, len(req.origin_input_ids) + len(req.output_ids) - 1)
            if offload:
                self.phase = "decode"
                result = self.call("offload", self.manager.offload_kv_cache, req)
        return result

    def finish(self, req, *, abort: bool = False) -> Any:
        req.finished_reason = sg.FINISH_ABORT() if abort else sg.FINISH_LENGTH(length=len(req.output_ids))
        self.phase = "finish"
        wrote = self.call("offload", self.manager.offload_kv_cache, req)
        if not wrote:
            finalize = getattr(self.manager, "finalize_release_on_finish", None)
            if finalize is not None:
                self.call("finalize", finalize, req)
            else:
                self.call("finalize", self.tree_cache.cache_finished_req, req)
        return wrote

    def land(self, count: int | None = None) -> None:
        """The oldest ``count`` writes not landed yet (default: all) land, and the decode worker sees them."""
        pending = [w for w in self.writes if not w["landed"]]
        for write in pending[:count] if count is not None else pending:
            write["landed"] = True
            event = SimpleNamespace(synchronize=lambda: None)
            self.controller.ack_write_queue.append(Ack((None, event, [write["node_id"]])))
        self.phase = "ack"
        self.call("progress", self.manager.check_offload_progress)

    def call(self, what: str, fn: Callable[..., Any], *args) -> Any:
        """A manager call; an exception it raises is what the tree did (recorded by type), not a probe error."""
        try:
            return fn(*args)
        except Exception as exc:
            self.errors.append(f"{what}:{type(exc).__name__}")
            return None

    # --- observations ----------------------------------------------------------------------
    def freed(self, *, phase: str | None = None, row: int | None = None, **flags: bool) -> int:
        slots = self._row_slots(row) if row is not None else None
        return sum(1 for f in self.frees
                   if (phase is None or f["phase"] == phase) and (slots is None or f["slot"] in slots)
                   and all(f[k] == v for k, v in flags.items()))

    def double_freed(self) -> int:
        seen: dict[int, int] = {}
        for f in self.frees:
            seen[f["slot"]] = seen.get(f["slot"], 0) + 1
        return sum(n - 1 for n in seen.values() if n > 1)

    def written(self, phase: str | None = None) -> int:
        return sum(1 for w in self.writes if phase is None or w["phase"] == phase)

    def error(self) -> str | None:
        return ",".join(self.errors) or None


def row_of(req) -> int | None:
    return req.kv.req_pool_idx if sg.kv_on_record else req.req_pool_idx


def set_row(req, row) -> None:
    if sg.kv_on_record:
        req.kv.req_pool_idx = row
    else:
        req.req_pool_idx = row


def committed_of(req) -> int:
    holder = req.kv if sg.kv_on_record else req
    return getattr(holder, "kv_committed_len", None) or len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)


def set_committed(req, length: int) -> None:
    """The KV the request holds: committed and allocated up to ``length`` (no over-allocation)."""
    holder = req.kv if sg.kv_on_record else req
    for name in ("kv_committed_len", "kv_allocated_len"):
        if hasattr(holder, name):
            setattr(holder, name, length)
    kv = getattr(req, "kv", None)
    if not sg.kv_on_record and sg.ReqKvInfo is not None:
        if not isinstance(kv, sg.ReqKvInfo):  # 0.5.17/0.5.18: the allocation is on req.kv
            req.kv = kv = sg.ReqKvInfo(kv_allocated_len=length, swa_evicted_seqlen=0)
        kv.kv_allocated_len = length
