"""A decode worker's metadata slots across a retraction, driven as its scheduler does (experiment retract_resume).

A transfer's first-token metadata (output id, speculative top-k and hidden states) arrives in one slot of the
decode side's ``MetadataBuffers``; ``DecodeTransferQueue.pop_transferred`` commits it to the request and gives
the slot back, and the next request's transfer writes the same slot. What a ``World`` holds is the tree's own:

- ``MetadataBuffers`` (the slots; a transfer landing is the tree's ``set_buf`` of the prefill side's request,
  the layout both sides share) and ``ReqToMetadataIdxAllocator`` (which slot the next request gets);
- ``DecodeTransferQueue`` built by its constructor, whose ``pop_transferred`` commits and frees the slot;
- the retraction: ``ScheduleBatch.release_req`` on a decode server (offloads the KV to the host, releases it,
  resets the request); trees without it (before 0.5.3) retract inline in ``retract_decode``, whose decode half
  is the request's own ``offload_kv_cache`` and ``reset_for_retract``, run here (adaptation
  ``retract-inline``);
- the resumption: ``DecodePreallocQueue.resume_retracted_reqs`` (its ``_pre_alloc`` and the request's
  ``load_kv_cache``) on a queue made with ``object.__new__`` and the state those read, over the tree's
  ``DecodeReqToTokenPool``.

Stand-ins, at the boundary only: the KV receiver (its poll says whether the transfer landed), the gloo
all-reduce of polls (one rank), the token allocator (hands out slots 100 on, copies to and from the host as
recorders) and its KV pool, the tree cache and the scheduler with its batch-result processor (recorders of the tree's classes).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from array import array
from types import SimpleNamespace
from typing import Any, Callable

from _probekit import Collaborators, Recorder, publish_server_args, served_req, server_args, swapped

DECODE_MODULE = "sglang.srt.disaggregation.decode"
HIDDEN = 8  # the hidden size the buffers are built with
TOPK = 4  # the speculative top-k a transfer carries
ROWS = 4  # request rows of the token pool
CONTEXT = 64
PROMPT = 6
ROOM = 9000  # request n's bootstrap room is ROOM + n
STANDINS = Collaborators(
    allocator=("sglang.srt.mem_cache.allocator:BaseTokenToKVPoolAllocator",
               "sglang.srt.mem_cache.memory_pool:TokenToKVPoolAllocator"),
    tree_cache=("sglang.srt.mem_cache.radix_cache:RadixCache",
                "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache"),
    kv_pool=("sglang.srt.mem_cache.memory_pool:KVCache",),
    scheduler=("sglang.srt.managers.scheduler:Scheduler",),
    batch_result_processor=("sglang.srt.managers.scheduler_components.batch_result_processor:"
                            "SchedulerBatchResultProcessor",),
    receiver=("sglang.srt.disaggregation.base.conn:BaseKVReceiver",),
)

sg = SimpleNamespace(ready=False, missing=None)


class CannotDrive(RuntimeError):
    """The tree lacks a part the driver needs: the scenario records this as its error, never as an answer."""


def prepare(adapt: Callable[[str], None]) -> None:
    """Import what a world uses, once; what the tree lacks is left for the scenarios to record."""
    import torch
    from sglang.srt.server_args import ServerArgs

    sg.torch, sg.adapt = torch, adapt
    try:
        importlib.import_module("sglang.srt.managers.scheduler")  # first, as a server does (circular imports)
        sg.decode = importlib.import_module(DECODE_MODULE)
        sg.utils = importlib.import_module("sglang.srt.disaggregation.utils")
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except ImportError as exc:
        sg.missing = f"{exc.name or exc} does not import: {exc}"
        return
    # the poll states as the decode module names them (``disaggregation.base`` from 0.4.5, ``conn`` before)
    sg.KVPoll, sg.Req, sg.ScheduleBatch, sg.SamplingParams = sg.decode.KVPoll, Req, ScheduleBatch, SamplingParams
    sg.SPEC = {True: SpeculativeAlgorithm.EAGLE, False: SpeculativeAlgorithm.NONE}
    # 0.5.18 on: a retraction backs the KV up as a host copy of the request ("cpu_tensor") or into the tree cache's
    # host pool; the request's copy is the one every older tree makes (the metadata read is the same either way)
    backup = ({"disaggregation_decode_retraction_backup": "cpu_tensor"}
              if "disaggregation_decode_retraction_backup" in inspect.signature(ServerArgs).parameters else {})
    sg.server_args = server_args(ServerArgs, adapt, model_path="dummy", disaggregation_mode="decode", page_size=1,
                                 **backup)
    _publish(adapt)
    STANDINS.find()
    sg.ready = True


def _publish(adapt: Callable[[str], None]) -> None:
    """The server args, published as the decode scheduler's process does (as ``_transferqueue`` does): from 0.5.21
    the transfer queue reads its TP rank from the runtime context, which the launcher's rank bundle writes (this
    process is rank 0), and from 0.5.22 its gloo group from the attention-TP group (one rank's, whose cpu group
    only the one-rank all-reduce of ``World.one_rank`` reads)."""
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
    if "gloo_group" not in inspect.signature(sg.decode.DecodeTransferQueue.__init__).parameters:
        adapt("one-rank-attention-group")
        runtime_context.get_parallel().override_permanently(
            attn_tp_group=SimpleNamespace(cpu_group=None, world_size=1))


def metadata_buffers_absent() -> bool:
    """Whether the tree's PD utilities hold no ``MetadataBuffers`` with ``get_buf`` and ``set_buf`` (0.4.4.post2 to
    0.4.7 keep bare tensors and read them by item): no slot views to hand a request."""
    cls = getattr(sg.utils, "MetadataBuffers", None)
    return cls is None or not all(callable(getattr(cls, name, None)) for name in ("get_buf", "set_buf"))


def _req_to_token_pool_class() -> type:
    """The decode worker's request-to-token pool: its own ``DecodeReqToTokenPool``, or the scheduler's plain
    ``ReqToTokenPool`` in trees that have none (up to 0.4.7; adaptation ``plain-req-to-token-pool``)."""
    pool = getattr(sg.decode, "DecodeReqToTokenPool", None)
    if pool is None:
        sg.adapt("plain-req-to-token-pool")
        pool = importlib.import_module("sglang.srt.mem_cache.memory_pool").ReqToTokenPool
    return pool


def _served(rid: str) -> Any:
    """A request of the probe's prompt as a server hands it over (both sides of a transfer make one)."""
    req = served_req(sg.Req, sg.SamplingParams, rid, list(range(1, PROMPT + 1)), max_new_tokens=16)
    if isinstance(req.output_ids, array):  # 0.5.21 on: token ids are arrays, the prompt as the scheduler makes it
        req.origin_input_ids = array(req.output_ids.typecode, req.origin_input_ids)
    return req


def _build(cls: type, **kwargs: Any) -> Any:
    """``cls`` built by its own constructor, given those of ``kwargs`` it takes."""
    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in params})


class Request:
    """One request on the decode side: its real ``Req``, its tag (what its transfer carries) and its slot."""

    def __init__(self, name: str, number: int, req: Any, slot: int):
        self.name, self.number, self.req, self.slot = name, number, req, slot
        self.landed = False
        self.decode_req: Any = None

    @property
    def token(self) -> int:
        return 11 * self.number

    @property
    def value(self) -> float:
        return float(self.number)


class World:
    """The tree's objects and the stand-ins of one scenario."""

    def __init__(self, *, slots: int, speculative: bool = True):
        if not sg.ready:
            raise CannotDrive(sg.missing or "the tree's decode side was not prepared")
        if metadata_buffers_absent():
            raise CannotDrive("the tree has no MetadataBuffers")
        torch = sg.torch
        self.requests: dict[str, Request] = {}
        self.next_kv = 100
        # the hidden states' dtype is ``dtype`` up to 0.5.1, ``hidden_states_dtype`` after
        self.buffers = _build(sg.utils.MetadataBuffers, size=slots, hidden_size=HIDDEN, dtype=torch.float32,
                              hidden_states_dtype=torch.float32, max_top_logprobs_num=TOPK,
                              max_sampling_mask_tokens=TOPK)  # 0.5.21 on (its sampling mask stays off)
        self.meta_allocator = _build(sg.utils.ReqToMetadataIdxAllocator, size=slots)
        # the KV pool: plain MHA, whose host copy carries no mamba state (0.5.21 on asks)
        kv_pool = STANDINS.make("kv_pool", "kv_pool", page_size=1, cpu_copy_carries_mamba=False)
        self.allocator = STANDINS.make(
            "allocator", "allocator", page_size=1, device="cpu", available_size=lambda: 1000,
            alloc=self._alloc, alloc_extend=lambda *a, extend_num_tokens, **k: self._alloc(extend_num_tokens),
            get_cpu_copy=Recorder("get_cpu_copy", returns="host-copy"), load_cpu_copy=Recorder("load_cpu_copy"),
            free=Recorder("free"), get_kvcache=lambda: kv_pool,
            prealloc_fits=lambda *a, **k: True)  # 0.5.21 on asks the allocator whether a resumption fits: it does
        self.tree_cache = STANDINS.make(
            "tree_cache", "tree_cache", page_size=1, disable=True, supports_mamba=lambda: False,
            evictable_size=lambda: 0, protected_size=lambda: 0, token_to_kv_pool_allocator=self.allocator)
        self.req_to_token_pool = _build(_req_to_token_pool_class(), size=ROWS, max_context_len=CONTEXT,
                                        device="cpu", enable_memory_saver=False, pre_alloc_size=0)
        self.tree_cache.req_to_token_pool = self.req_to_token_pool
        self.scheduler = STANDINS.make(
            "scheduler", "scheduler", spec_algorithm=sg.SPEC[speculative], server_args=sg.server_args,
            enable_hisparse=False, enable_decode_hicache=False, enable_metrics=False, hisparse_coordinator=None,
            running_batch=SimpleNamespace(reqs=[]), waiting_queue=[], last_batch=None, tree_cache=self.tree_cache,
            # the budget asks whether the model is hybrid SWA: 0.5.1 as is_hybrid, 0.5.6 to 0.5.8 as is_hybrid_swa
            model_config=SimpleNamespace(is_hybrid=False, is_hybrid_swa=False),
            kv_checksum_computer=None,  # 0.5.21 on: KV checksums off, as by default
            enable_overlap=False,  # 0.5.23's pre-allocation asks: the normal (not overlapped) event loop
            # 0.5.21 on: a committed first token is counted (reasoning tokens) by the scheduler's result processor
            batch_result_processor=STANDINS.make("batch_result_processor", "batch_result_processor"),
            metrics_reporter=SimpleNamespace(enable_metrics=False),
            output_streamer=SimpleNamespace(stream_output=Recorder("stream_output")))
        self.transfer = _build(sg.decode.DecodeTransferQueue, gloo_group=None,
                               req_to_metadata_buffer_idx_allocator=self.meta_allocator, tp_rank=0,
                               metadata_buffers=self.buffers, scheduler=self.scheduler, tree_cache=self.tree_cache)
        self.prealloc = object.__new__(sg.decode.DecodePreallocQueue)
        for name, value in {"req_to_token_pool": self.req_to_token_pool, "token_to_kv_pool_allocator": self.allocator,
                            "token_to_kv_pool": self.allocator.get_kvcache(), "draft_token_to_kv_pool": None,
                            "scheduler": self.scheduler, "transfer_queue": self.transfer, "tree_cache": self.tree_cache,
                            "metadata_buffers": self.buffers, "num_reserved_decode_tokens": 1, "queue": [],
                            "retracted_queue": [], "pending_reqs": [], "max_total_num_tokens": 1000,
                            "is_mla_backend": False,
                            "req_to_metadata_buffer_idx_allocator": self.meta_allocator}.items():
            setattr(self.prealloc, name, value)

    def _alloc(self, need: int, *args, **kwargs) -> Any:
        start, self.next_kv = self.next_kv, self.next_kv + need
        return sg.torch.arange(start, start + need, dtype=sg.torch.int64)

    @contextlib.contextmanager
    def one_rank(self):
        """The gloo all-reduce of polls as one rank sees it: its own polls."""
        dist = sg.torch.distributed
        with swapped(dist, all_reduce=lambda tensor, *a, **k: None, get_world_size=lambda *a, **k: 1):
            yield

    # --- the decode worker's steps -----------------------------------------------------------------
    def admit(self, name: str) -> None:
        """A request whose transfer starts: the next free metadata slot, as the prealloc queue takes it. With none
        free the request waits, as the queue leaves it (``available_size() <= 0``): never admitted, its transfer
        never started, which ``slots_free`` reads."""
        slot = self.meta_allocator.alloc()
        if slot is None:
            return
        number = len(self.requests) + 1
        req = _served(f"probe-{name}")
        req.bootstrap_room = ROOM + number
        entry = Request(name, number, req, slot)
        req.metadata_buffer_index = slot
        self.prealloc._pre_alloc(req)  # its row and KV slots, as pop_preallocated takes them
        receiver = STANDINS.make("receiver", f"receiver-{name}", poll=lambda: self._poll(entry),
                                 clear=Recorder("clear"), failure_exception=Recorder("failure_exception"))
        entry.decode_req = _build(sg.decode.DecodeRequest, req=req, kv_receiver=receiver, metadata_buffer_index=slot)
        self.transfer.add(entry.decode_req)
        self.requests[name] = entry

    def _poll(self, entry: Request) -> Any:
        return sg.KVPoll.Success if entry.landed else sg.KVPoll.WaitingForInput

    def land(self, name: str) -> None:
        """The request's transfer writes its slot: the prefill side's request as ``set_buf`` reads it (none for a
        request still waiting for a slot)."""
        entry = self.requests.get(name)
        if entry is None:
            return
        torch = sg.torch
        sent = _served(entry.req.rid)
        sent.output_ids = [entry.token]
        sent.metadata_buffer_index = entry.slot
        sent.bootstrap_room = entry.req.bootstrap_room
        sent.hidden_states_tensor = torch.full((HIDDEN,), entry.value, dtype=torch.float32)
        sent.output_topk_p = torch.full((TOPK,), entry.value, dtype=torch.float32)
        sent.output_topk_index = torch.full((TOPK,), entry.number, dtype=torch.int64)
        self.buffers.set_buf(sent)
        entry.landed = True

    def commit(self) -> None:
        """One poll of the transfer queue: the tree's ``pop_transferred`` commits what landed, frees its slot."""
        with self.one_rank():
            self.transfer.pop_transferred()

    def retract(self, name: str) -> None:
        """The request is retracted under memory pressure: ``release_req`` of a one-request decode batch."""
        req = self.requests[name].req
        release = getattr(sg.ScheduleBatch, "release_req", None)
        if release is None:
            sg.adapt("retract-inline")
            req.offload_kv_cache(self.req_to_token_pool, self.allocator)
            req.reset_for_retract()
        else:
            batch = object.__new__(sg.ScheduleBatch)
            lengths = sg.torch.tensor([len(req.origin_input_ids) + len(req.output_ids)], dtype=sg.torch.int64)
            for attr, value in {"reqs": [req], "req_to_token_pool": self.req_to_token_pool,
                                "token_to_kv_pool_allocator": self.allocator, "tree_cache": self.tree_cache,
                                "hisparse_coordinator": None, "model_config": None, "is_hybrid": False,
                                # 0.5.3 to 0.5.9 free the retracted range up to the batch's sequence length
                                "seq_lens": lengths, "seq_lens_cpu": lengths,
                                "spec_algorithm": self.scheduler.spec_algorithm}.items():
                setattr(batch, attr, value)
            release(batch, 0, 0, sg.server_args)
        req.is_retracted = True
        self.prealloc.retracted_queue.append(req)  # what the scheduler's extend(..., is_retracted=True) queues

    def resume(self, name: str) -> None:
        """Memory is back: the prealloc queue's own ``resume_retracted_reqs`` re-allocates and reloads it."""
        resumed = self.prealloc.resume_retracted_reqs()
        if self.requests[name].req not in resumed:
            raise CannotDrive(f"resume_retracted_reqs did not resume {name}")

    # --- what the worker and a request hold --------------------------------------------------------
    def slots_free(self) -> int:
        """The metadata slots the tree's allocator has free: each committed request gave its slot back."""
        return self.meta_allocator.available_size()

    def owner(self, name: str, held: Any) -> str:
        """Whose transfer ``held`` (a number read from the request) came from: own, other, none (nothing
        held), or neither (a value no transfer carried)."""
        if held is None:
            return "none"
        for other in self.requests.values():
            if held in (other.value, other.token, other.number):
                return "own" if other.name == name else "other"
        return "neither"

    def hidden_owner(self, name: str) -> str:
        held = getattr(self.requests[name].req, "hidden_states_tensor", None)
        return self.owner(name, None if held is None else float(held.reshape(-1)[0]))

    def topk_owner(self, name: str) -> str:
        held = getattr(self.requests[name].req, "output_topk_index", None)
        return self.owner(name, None if held is None else int(held.reshape(-1)[0]))

    def topk_p_owner(self, name: str) -> str:
        held = getattr(self.requests[name].req, "output_topk_p", None)
        return self.owner(name, None if held is None else float(held.reshape(-1)[0]))

    def output_id_owner(self, name: str) -> str:
        ids = self.requests[name].req.output_ids
        return self.owner(name, ids[-1] if ids else None)
