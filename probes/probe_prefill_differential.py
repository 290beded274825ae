"""Differential probe for experiment B: aborted prefill results (PR #36988).

Runs SGLang's real ``SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill``
on a stand-in scheduler that subclasses the real mixin, with real ``Req``,
``ReqKvInfo``, ``FINISH_ABORT`` and ``GenerationBatchResult``. Only the
transport / cache / scheduler boundary is replaced by recorders: the KV sender,
``send_kv_chunk``, ``release_kv_cache``, the unfinished-request cache call,
the tree cache, the allocators, the output streamer, the metrics and the
scheduler's queues and cache-side abort hook. Each collaborator is built from the
tree's own class (``STANDINS``): every method it defines that the probe did not write
is a recorder, so no name the tree's own idiom calls is missing. The stand-ins carry everything
the pre-fix paths read too, so a head tree with its fix removed (the mutation
lane, ``python -m pdevidence mutate prefill``) shows the base behaviour.

Older trees (back to the first PD release) are driven through what they have, each
detected from the tree (an attribute, a signature, what the result path's source
reads), never from its version, and named in the result's ``adaptations``. The
stand-ins also answer the names older trees call where today's call others, so a
fix ported into an older tree (the backport corpus, ``backports/``) is measured by
that tree's own paths: the scheduler's ``stream_output`` before the output streamer,
the tree cache's ``release_aborted_request(rid)`` before ``finish``, ``cache_finished_req``
before ``release_kv_cache``, the mamba pool before its allocator, the metadata allocator
through the bootstrap queue up to 0.4.6. Each such name, once called, is named in the
adaptations; trees that never call it keep their results' bytes. A tree that cannot
express a key (no insert flag on its release, no abortable sender, no cache-side abort,
no KV-less mamba slot, no grammar in the result path) records a tree fact the registry's
``not_deciding`` rules name. A tree without the optimistic (pending-bootstrap) requeue
path records ``optimistic_prefill: "absent"`` in the scenarios that exercise it.

Run it by hand against one tree, in a Python 3.12 venv holding the pinned
closure (`uv pip install -r constraints/cells-py312.txt`) plus SGLang without
its dependencies, either a release or a source tree:

    uv pip install --no-deps sglang==0.5.20
    SGLANG_BUILD_RUST_EXTS=none uv pip install --no-deps <tree>/python

then, from the repository root:

    python probes/probe_prefill_differential.py --side head \
        --tree-kind release --tree-ref 0.5.20 --out /tmp/b.json
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _probekit import (Collaborators, Observed, Recorder, ScenarioSet, SourceUnreadable, Spy,  # noqa: E402
                       class_fact, main, publish_server_args, server_args, swapped)

SCENARIOS = ScenarioSet("prefill")

# SGLang names, bound by prepare() so that importing this file stays cheap.
sg = SimpleNamespace()

RID = "probe-prefill-req"
PROMPT_LEN = 16
METADATA_BUFFER = 7  # "owned" in the spec: KV, a mamba slot and metadata buffer 7
MAMBA_SLOT = 3
NEXT_TOKEN = 11
OPTIMISTIC_ATTEMPTS = 2
# Module-level functions the mixin looks up in its own globals; each scenario
# replaces those present on the tree (names differ between releases).
CACHE_UNFINISHED_NAMES = ("maybe_cache_unfinished_req", "checkpoint_kv_cache")

# The tree's classes each stand-in is built from, wherever a release keeps them: every method they
# define answers as a recorder, so a fix written in any tree's idiom reaches its collaborators.
STANDINS = Collaborators(
    tree_cache=("sglang.srt.mem_cache.hiradix_cache:HiRadixCache",
                "sglang.srt.mem_cache.mamba_radix_cache:MambaRadixCache",
                "sglang.srt.mem_cache.radix_cache:RadixCache", "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache"),
    req_to_token_pool=("sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool",
                       "sglang.srt.mem_cache.memory_pool:ReqToTokenPool"),
    mamba_allocator=("sglang.srt.mem_cache.allocator.mamba:MambaSlotAllocator",),
    mamba_pool=("sglang.srt.mem_cache.memory_pool:MambaPool",),
    metadata_allocator=("sglang.srt.disaggregation.utils:ReqToMetadataIdxAllocator",),
    output_streamer=("sglang.srt.managers.scheduler_components.output_streamer:SchedulerOutputStreamer",),
    metrics_reporter=("sglang.srt.managers.scheduler_components.metrics_reporter:SchedulerMetricsReporter",),
    batch_result_processor=(
        "sglang.srt.managers.scheduler_components.batch_result_processor:SchedulerBatchResultProcessor",),
    bootstrap_queue=("sglang.srt.disaggregation.prefill:PrefillBootstrapQueue",),
    kv_sender=("sglang.srt.disaggregation.base.conn:BaseKVSender",),
    grammar=("sglang.srt.constrained.base_grammar_backend:BaseGrammarObject",),
)


def prepare() -> str:
    import sglang
    import torch
    from sglang.srt.disaggregation import prefill
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    # The requeue path and later releases' final-chunk path read the published
    # disaggregation config (get_disagg()); outside a server nothing is published.
    # "dummy" is the model path SGLang's own tests use: it skips loading a config.
    # A pending bootstrap only exists with optimistic prefill on (attempts > 0).
    sg.server_args = server_args(ServerArgs, SCENARIOS.adapted, model_path="dummy", disaggregation_mode="prefill",
                                 **_optimistic_prefill(ServerArgs))
    publish_server_args(sg.server_args, SCENARIOS.adapted, role="test")
    ReqKvInfo = getattr(schedule_batch, "ReqKvInfo", None)
    if ReqKvInfo is None:  # up to 0.5.15 the KV lengths live on the request itself
        SCENARIOS.adapted("no-req-kv-info")
    sg.GenerationBatchResult = _generation_batch_result()
    sg.torch = torch
    sg.prefill = prefill
    sg.Req = Req
    sg.ReqKvInfo = ReqKvInfo
    sg.FINISH_ABORT = FINISH_ABORT
    sg.SamplingParams = SamplingParams
    sg.SPEC_NONE = SpeculativeAlgorithm.NONE
    # 0.5.17/0.5.18 keep the KV row and mamba slot on the Req; later releases on req.kv.
    sg.kv_on_record = ReqKvInfo is not None and hasattr(ReqKvInfo, "holds_kv")
    sg.real_release_kv_cache = getattr(prefill, "release_kv_cache", None)
    sg.release_flag_of = None
    if sg.real_release_kv_cache is None:  # up to 0.5.5 the tree cache's cache_finished_req releases
        SCENARIOS.adapted("tree-cache-release")
        sg.release_flag_of = _tree_cache_release_flag()
    if not (_tree_defines("sglang.srt.mem_cache.hiradix_cache", "release_aborted_request")
            or _tree_defines("sglang.srt.mem_cache.base_prefix_cache", "finish")):
        # Up to 0.5.1 no prefix cache can be told that a request ended in an abort.
        SCENARIOS.adapted("no-cache-abort-release")
    sg.cache_frees_kvless_mamba = False
    if not (sg.kv_on_record or class_fact(Req.__init__, "self.mamba_pool_idx",
                                          why="whether a request can hold a mamba slot: an adaptation")):
        # Up to 0.5.3 a mamba slot is the request-pool row's: no request holds one without KV.
        SCENARIOS.adapted("no-req-mamba-slot")
    elif sg.real_release_kv_cache is not None and not class_fact(
            sg.real_release_kv_cache, "mamba", why="who frees a KV-less mamba slot: what the tree cache stand-in does"):
        # 0.5.6 to 0.5.8's release_kv_cache leaves a request's mamba slot to the tree cache; 0.5.7
        # and 0.5.8's mamba cache hands back the slot of a request that holds no KV row.
        from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache
        sg.cache_frees_kvless_mamba = class_fact(MambaRadixCache.cache_finished_req, "req.req_pool_idx is None",
                                                 why="what the tree cache stand-in frees")
    if not any(_defines(conn, "abort") for conn in Path(prefill.__file__).parent.glob("**/conn.py")):
        # Up to 0.4.9 no KV sender of the tree can be aborted.
        SCENARIOS.adapted("no-sender-abort")
    sg.Scheduler = _scheduler_class(prefill.SchedulerDisaggregationPrefillMixin)
    STANDINS.find()
    return sglang.__version__


def _tree_defines(module: str, name: str) -> bool:
    """Whether the tree's ``module`` defines a function or method ``name``, read without importing it; a
    module the tree lacks defines nothing, one whose file cannot be read or parsed raises (never a no)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    if not spec.origin:
        raise SourceUnreadable(f"{module} has no source file: whether it defines {name} is unknown")
    return _defines(Path(spec.origin), name)


def _defines(path: Path, name: str) -> bool:
    """Whether the module file defines a function or method ``name`` (parsed: comments and layout do not count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               for node in ast.walk(tree))


def _tree_cache_release_flag() -> str | None:
    """The insert flag of the tree cache's ``cache_finished_req`` (0.5.4, 0.5.5), or None where it has none."""
    from sglang.srt.mem_cache.radix_cache import RadixCache
    params = inspect.signature(RadixCache.cache_finished_req).parameters
    flag = next((name for name in ("is_insert", "insert") if name in params), None)
    if flag is None:  # up to 0.5.3 a finished request's KV always goes into the prefix cache
        SCENARIOS.adapted("release-without-insert-flag")
    return flag


def _optimistic_prefill(ServerArgs: type) -> dict[str, int]:
    """The optimistic-prefill knob under the tree's name, or none where the tree has no such path."""
    fields = inspect.signature(ServerArgs).parameters  # a dataclass up to 0.5.19, generated later
    if "optimistic_prefill_attempts" in fields:
        return {"optimistic_prefill_attempts": OPTIMISTIC_ATTEMPTS}
    if "optimistic_prefill_retries" in fields:  # 0.5.13 to 0.5.15
        SCENARIOS.adapted("optimistic-prefill-retries")
        return {"optimistic_prefill_retries": OPTIMISTIC_ATTEMPTS}
    SCENARIOS.adapted("no-optimistic-prefill")
    return {}


def optimistic_prefill_absent() -> bool:
    return "no-optimistic-prefill" in SCENARIOS.adaptations


def _generation_batch_result() -> type:
    try:
        from sglang.srt.managers.utils import GenerationBatchResult
    except ImportError:  # up to 0.5.3 it lives beside the scheduler, with required fields
        from sglang.srt.managers.scheduler import GenerationBatchResult
    return GenerationBatchResult


class Older(Recorder):
    """A stand-in for a name older trees call where today's call another (or ``then``'s, under that name).

    Called, it names its adaptation in the result; never called (today's trees, and older ones
    whose probed paths do not reach it), it leaves the result as it was.
    """

    def __init__(self, name: str, adaptation: str, then: Recorder | None = None):
        super().__init__(name)
        self.adaptation = adaptation
        self.then = then

    def __call__(self, *args, **kwargs):
        SCENARIOS.adapted(self.adaptation)
        super().__call__(*args, **kwargs)
        return self.then(*args, **kwargs) if self.then is not None else self.returns


def _scheduler_class(mixin: type) -> type:
    class ProbeScheduler(mixin):
        """Only the scheduler state the result path reads; the methods are the mixin's."""

        def __init__(self, *, mamba_cache: bool):
            self.tree_cache = STANDINS.make(
                "tree_cache", "tree_cache",
                supports_mamba=Recorder("tree_cache.supports_mamba", returns=mamba_cache),
                finish=Recorder("tree_cache.finish"),
                # Up to 0.5.19 a hicache storage learns of an abort by the request's id.
                release_aborted_request=Older("tree_cache.release_aborted_request",
                                              "tree-cache-release-aborted-request"),
                req_to_token_pool=STANDINS.make(
                    "req_to_token_pool", "req_to_token_pool",
                    mamba_allocator=STANDINS.make("mamba_allocator", "mamba_allocator",
                                                  free=Recorder("mamba_allocator.free")),
                    # Up to 0.5.12 mamba slots go back to the pool itself.
                    mamba_pool=STANDINS.make("mamba_pool", "mamba_pool",
                                             free=Older("mamba_pool.free", "mamba-pool-free")),
                ),
            )
            metadata_free = Recorder("metadata_allocator.free")
            self.req_to_metadata_buffer_idx_allocator = STANDINS.make("metadata_allocator", "metadata_allocator",
                                                                      free=metadata_free)
            self.output_streamer = STANDINS.make("output_streamer", "output_streamer",
                                                 stream_output=Recorder("stream_output"))
            # Up to 0.5.12 the scheduler streams outputs itself.
            self.stream_output = Older("scheduler.stream_output", "scheduler-stream-output")
            self.send_kv_chunk = Recorder("send_kv_chunk")
            self.metrics_reporter = STANDINS.make(
                "metrics_reporter", "metrics_reporter",
                enable_metrics=False, report_prefill_stats=Recorder("report_prefill_stats")
            )
            self.maybe_send_health_check_signal = Recorder("maybe_send_health_check_signal")
            self.batch_result_processor = STANDINS.make(
                "batch_result_processor", "batch_result_processor",
                snapshot_auxiliary_output_starts=Recorder("snapshot_auxiliary_output_starts"),
                move_logprobs_to_cpu=Recorder("move_logprobs_to_cpu"),
            )
            self.spec_algorithm = sg.SPEC_NONE
            self.enable_hicache_storage = False
            self.enable_overlap = False
            self.chunked_req = None
            self.disagg_prefill_inflight_queue = []
            self.disagg_prefill_pending_chunk_rids = set()
            self.waiting_queue = []
            # What the optimistic requeue path reads (0.5.20 added the last two; the
            # abort hook is Scheduler's, not the mixin's); a head tree with its fix
            # removed runs that path too and must reach its end.
            # Up to 0.4.6 the metadata allocator is reached through the bootstrap queue,
            # named disagg_prefill_pending_queue in 0.4.5.
            self.disagg_prefill_bootstrap_queue = STANDINS.make(
                "bootstrap_queue", "bootstrap_queue",
                queue=[], req_to_metadata_buffer_idx_allocator=STANDINS.make(
                    "metadata_allocator", "bootstrap_queue.metadata_allocator",
                    free=Older("bootstrap_queue.metadata_allocator.free", "bootstrap-queue-metadata-allocator",
                               then=metadata_free)))
            self.disagg_prefill_pending_queue = STANDINS.make(
                "bootstrap_queue", "pending_queue",
                req_to_metadata_buffer_idx_allocator=STANDINS.make(
                    "metadata_allocator", "pending_queue.metadata_allocator",
                    free=Older("pending_queue.metadata_allocator.free", "pending-queue-metadata-allocator",
                               then=metadata_free)))
            self.processed_tokens_counter = 0
            self._release_aborted_request = Recorder("release_aborted_request")
            _older_scheduler_state(self)

    return ProbeScheduler


# Scheduler methods older result paths call, by the adaptation that names each.
OLDER_SCHEDULER_HOOKS = {
    "report_prefill_stats": "scheduler-report-prefill-stats",
    "log_prefill_stats_late": "scheduler-log-prefill-stats-late",
    "set_next_batch_sampling_info_done": "scheduler-sampling-info-done",
}


def _older_scheduler_state(sched: Any) -> None:
    """What older trees' result paths read from the scheduler, each where the tree reads it."""
    mixin = sg.prefill.SchedulerDisaggregationPrefillMixin
    result_path = mixin.process_batch_result_disagg_prefill
    if class_fact(mixin, "self.server_args", why="what the scheduler stand-in carries"):  # 0.5.13 to 0.5.16
        SCENARIOS.adapted("scheduler-server-args")
        sched.server_args = sg.server_args
    for hook, name in OLDER_SCHEDULER_HOOKS.items():  # metrics and sampling hooks: recorders
        if class_fact(result_path, f"self.{hook}(", why="a hook the scheduler stand-in records"):
            SCENARIOS.adapted(name)
            setattr(sched, hook, Recorder(hook))
    if class_fact(result_path, "disagg_prefill_infight_queue", why="the queue's name on the stand-in"):  # 0.4.5
        SCENARIOS.adapted("infight-queue-name")
        sched.disagg_prefill_infight_queue = sched.disagg_prefill_inflight_queue
    if class_fact(result_path, "self.tree_cache.cache_unfinished_req", why="an adaptation"):  # up to 0.5.10
        SCENARIOS.adapted("tree-cache-unfinished")
    if class_fact(result_path, "poll_and_all_reduce", why="the stand-in's poll groups"):  # 0.5.13 to 0.5.15
        SCENARIOS.adapted("single-rank-poll")
        sched.attn_cp_cpu_group = sched.attn_tp_cpu_group = None


# --- the request -------------------------------------------------------------


def make_req(*, kv: bool, mamba: bool, metadata: bool, pending_bootstrap: bool) -> Any:
    req = sg.Req(RID, "", array("q", range(PROMPT_LEN)), sg.SamplingParams(max_new_tokens=4))
    req.disagg_kv_sender = STANDINS.make("kv_sender", "sender", abort=Recorder("sender.abort"))
    req.pending_bootstrap = pending_bootstrap
    if pending_bootstrap:
        # In its first optimistic attempt, as pop_bootstrapped leaves it.
        req.prefill_attempt_count = 1
    if metadata:
        req.metadata_buffer_index = METADATA_BUFFER
    slot = sg.torch.tensor([MAMBA_SLOT]) if mamba else None
    if sg.kv_on_record:
        if kv:
            req.kv.req_pool_idx = 0
            req.kv.kv_allocated_len = PROMPT_LEN
            req.kv.kv_committed_len = PROMPT_LEN
        req.kv.mamba_pool_idx = slot
    else:
        if kv:
            req.req_pool_idx = 0
            if sg.ReqKvInfo is not None:
                req.kv = sg.ReqKvInfo(kv_allocated_len=PROMPT_LEN, swa_evicted_seqlen=0)
            else:  # no-req-kv-info
                for name in ("kv_allocated_len", "kv_committed_len"):
                    if hasattr(req, name):
                        setattr(req, name, PROMPT_LEN)
        req.mamba_pool_idx = slot
    return req


def owned_req(*, pending_bootstrap: bool) -> Any:
    return make_req(kv=True, mamba=True, metadata=True, pending_bootstrap=pending_bootstrap)


def drop_ownership(req: Any, *_args, **_kwargs) -> None:
    """What a KV release leaves behind: the request holds no KV row and no mamba slot."""
    if sg.kv_on_record:
        req.kv.req_pool_idx = None
        req.kv.mamba_pool_idx = None
        req.kv.mark_kv_released()
    else:
        req.req_pool_idx = None
        req.kv = None
        req.mamba_pool_idx = None


def mark_middle_chunk(req: Any) -> None:
    """One middle chunk of ``req`` in flight."""
    if hasattr(req, "inflight_middle_chunks"):
        req.inflight_middle_chunks = 1
    else:  # up to 0.5.12 the counter is is_chunked
        SCENARIOS.adapted("is-chunked-counter")
        req.is_chunked = 1


def mark_pending_abort(req: Any) -> None:
    """A running-request abort, not yet final."""
    if hasattr(req, "to_finish"):
        req.to_finish = sg.FINISH_ABORT()
    else:  # up to 0.5.4 that abort is a flag, read when the request next runs
        SCENARIOS.adapted("to-abort-marker")
        req.to_abort = True


def schedule_chunk(req: Any, end: int) -> None:
    """Record that the chunk ending at ``end`` was scheduled for this request, as the tree's scheduler does."""
    if hasattr(req, "set_extend_range"):  # 0.5.15 to 0.5.21
        req.set_extend_range(0, end)
    elif hasattr(req, "extend_end"):  # 0.5.22 on
        req.extend_end = end
    elif hasattr(req, "fill_len"):  # 0.5.13, 0.5.14
        SCENARIOS.adapted("chunk-fill-len")
        req.fill_len = end
    else:  # up to 0.5.12 the scheduled chunk is the request's fill_ids, truncated at its end
        SCENARIOS.adapted("chunk-fill-ids")
        req.fill_ids = (list(req.origin_input_ids) + list(req.output_ids))[:end]


# --- one scenario's world ----------------------------------------------------


class World:
    """A stand-in scheduler plus the recorders patched into the prefill module."""

    def __init__(self, *, mamba_cache: bool = False, real_release: bool = False, hicache: bool = False):
        self.scheduler = sg.Scheduler(mamba_cache=mamba_cache)
        self.scheduler.enable_hicache_storage = hicache
        self.cache_unfinished = Recorder("cache_unfinished")
        # B7 keeps the real release: from 0.5.9 its mamba-only branch touches nothing but the
        # tree cache's mamba allocator (or pool) stand-in, before it the tree cache stand-in;
        # what reaches them is what B7 observes.
        real = sg.real_release_kv_cache if real_release else None
        self.release = Spy("release_kv_cache", real or drop_ownership)
        tree_cache = self.scheduler.tree_cache
        if "tree-cache-unfinished" in SCENARIOS.adaptations:
            tree_cache.cache_unfinished_req = self.cache_unfinished
        if sg.real_release_kv_cache is None:  # tree-cache-release
            tree_cache.cache_finished_req = self.release
        elif real_release:  # the real release of 0.5.6 to 0.5.8 hands every request to the tree cache
            tree_cache.cache_finished_req = Older("tree_cache.cache_finished_req", "tree-cache-finished-req",
                                                  then=self._kvless_mamba_released)
        self.kvless_mamba_released = 0

    def _kvless_mamba_released(self, req: Any, *_args, **_kwargs) -> None:
        """A request holding a mamba slot and no KV row, handed to a tree cache that frees such a slot."""
        if sg.cache_frees_kvless_mamba and req.req_pool_idx is None and req.mamba_pool_idx is not None:
            self.kvless_mamba_released += 1

    def patched(self):
        replacements = {"release_kv_cache": self.release} if sg.real_release_kv_cache is not None else {}
        if "single-rank-poll" in SCENARIOS.adaptations:
            replacements["poll_and_all_reduce_attn_cp_tp_group"] = still_bootstrapping
        for name in CACHE_UNFINISHED_NAMES:
            if hasattr(sg.prefill, name):
                replacements[name] = self.cache_unfinished
        return swapped(sg.prefill, **replacements)

    def deliver(self, req: Any) -> None:
        """Hand one prefill forward result for ``req`` to the real result processor."""
        batch = SimpleNamespace(
            reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None
        )
        result_path = sg.prefill.SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill
        if class_fact(result_path, "batch.return_logprob", why="what the batch stand-in carries"):  # up to 0.5.10
            SCENARIOS.adapted("batch-return-logprob")
            batch.return_logprob = False
        if class_fact(result_path, "batch.next_batch_sampling_info", why="what the batch stand-in carries"):  # 0.4.5
            SCENARIOS.adapted("batch-sampling-info")
            batch.next_batch_sampling_info = None
        result = sg.GenerationBatchResult(next_token_ids=sg.torch.tensor([NEXT_TOKEN]), **required_result_fields())
        with self.patched():
            self.scheduler.process_batch_result_disagg_prefill(batch, result)

    def observe(self, req: Any, observed: Observed, keys: tuple[str, ...]):
        for key in keys:
            observed[key] = OBSERVATIONS[key](self, req)

    def release_inserts_prefix(self) -> bool | str | None:
        if not self.release.count:
            return None
        args, kwargs = self.release.calls[-1]
        if sg.real_release_kv_cache is None:  # tree-cache-release: cache_finished_req(req, <its flag>)
            if sg.release_flag_of is None:  # release-without-insert-flag
                return "absent"
            from sglang.srt.mem_cache.radix_cache import RadixCache
            bound = inspect.signature(RadixCache.cache_finished_req).bind(None, *args, **kwargs)
            bound.apply_defaults()
            return bool(bound.arguments[sg.release_flag_of])
        bound = inspect.signature(sg.real_release_kv_cache).bind(*args, **kwargs)
        bound.apply_defaults()
        # The flag was renamed from is_insert to checkpoint in 0.5.22.
        for name in ("is_insert", "checkpoint"):
            if name in bound.arguments:
                return bool(bound.arguments[name])
        raise TypeError("release_kv_cache has neither is_insert nor checkpoint")


def still_bootstrapping(senders: list, *_groups: Any) -> list:
    """The transport's answer for pending-bootstrap senders on one rank: the bootstrap has not finished."""
    from sglang.srt.disaggregation.base import KVPoll
    return [KVPoll.Bootstrapping for _ in senders]


def required_result_fields() -> dict[str, Any]:
    """Up to 0.5.3 a batch result has required fields; the final-chunk path reads only logits_output's."""
    params = inspect.signature(sg.GenerationBatchResult).parameters
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n != "next_token_ids"]
    if not required:
        return {}
    SCENARIOS.adapted("batch-result-required-fields")
    fields: dict[str, Any] = dict.fromkeys(required)
    if "logits_output" in fields:
        fields["logits_output"] = SimpleNamespace(hidden_states=None, next_token_logprobs=None,
                                                  input_token_logprobs=None)
    return fields


def _streamed(world: World, req: Any) -> int:
    """Outputs streamed for ``req``: through the output streamer, or (scheduler-stream-output) the scheduler."""
    scheduler = world.scheduler
    calls = scheduler.output_streamer.stream_output.calls + scheduler.stream_output.calls
    return sum(1 for args, _ in calls if req in args[0])


def _metadata_freed(world: World, _req: Any) -> int:
    free = world.scheduler.req_to_metadata_buffer_idx_allocator.free
    freed = [free.arg("free_index", 0, call) for call in range(free.count)]
    return freed.count(METADATA_BUFFER)


def _cache_aborted(world: World, _req: Any) -> int:
    """Calls telling the tree cache the request ended in an abort (hicache storage): ``finish(handle, ABORT)``,
    or up to 0.5.19 ``release_aborted_request(rid)``."""
    finish = world.scheduler.tree_cache.finish
    outcomes = [finish.arg("outcome", 1, call) for call in range(finish.count)]
    by_rid = world.scheduler.tree_cache.release_aborted_request
    rids = [by_rid.arg("rid", 0, call) for call in range(by_rid.count)]
    return sum(1 for outcome in outcomes if getattr(outcome, "name", None) == "ABORT") + rids.count(RID)


def _mamba_freed(world: World, _req: Any) -> int:
    """Mamba slots handed back: to the allocator, (mamba-pool-free) up to 0.5.12 to the pool itself, or in
    0.5.7 and 0.5.8 to the mamba cache, which frees the slot of a request without KV."""
    pool = world.scheduler.tree_cache.req_to_token_pool
    return pool.mamba_allocator.free.count + pool.mamba_pool.free.count + world.kvless_mamba_released


OBSERVATIONS: dict[str, Callable[[World, Any], Any]] = {
    "cached_unfinished": lambda w, r: w.cache_unfinished.count,
    "enqueued_inflight": lambda w, r: w.scheduler.disagg_prefill_inflight_queue.count(r),
    "kv_chunk_sent": lambda w, r: w.scheduler.send_kv_chunk.count,
    "kv_released": lambda w, r: w.release.count,
    "release_inserts_prefix": lambda w, r: w.release_inserts_prefix(),
    "sender_aborted": lambda w, r: r.disagg_kv_sender.abort.count,
    "metadata_freed": _metadata_freed,
    "abort_streamed": _streamed,
    "finished": lambda w, r: bool(r.finished()),
    # With attempts left (OPTIMISTIC_ATTEMPTS) the requeue path goes to the waiting queue.
    "requeued": lambda w, r: w.scheduler.waiting_queue.count(r),
    "mamba_freed": _mamba_freed,
    "cache_aborted": _cache_aborted,
}

B1_KEYS = (
    "cached_unfinished",
    "enqueued_inflight",
    "kv_chunk_sent",
    "kv_released",
    "release_inserts_prefix",
    "sender_aborted",
    "metadata_freed",
    "abort_streamed",
    "finished",
)


class TransportDown(RuntimeError):
    """B5's failing sender: the only exception the probe lets a scenario survive."""


def aborted_owned(*, pending_bootstrap: bool) -> Any:
    req = owned_req(pending_bootstrap=pending_bootstrap)
    mark_pending_abort(req)
    return req


def aborted_middle_chunk(*, final_in_flight: bool, pending_bootstrap: bool = True) -> Any:
    """An owned request whose middle-chunk result arrives after its abort."""
    req = aborted_owned(pending_bootstrap=pending_bootstrap)
    mark_middle_chunk(req)
    # Either the final chunk is already running, or no later chunk was launched
    # (the request yielded, or its chunking stopped at the abort).
    schedule_chunk(req, PROMPT_LEN if final_in_flight else PROMPT_LEN // 2)
    return req


def retired_req() -> Any:
    """What a retirement leaves: abort final, bootstrap no longer pending, nothing held."""
    req = make_req(kv=False, mamba=False, metadata=False, pending_bootstrap=False)
    req.finished_reason = sg.FINISH_ABORT()
    return req


def run(observed: Observed, req: Any, keys: tuple[str, ...], *, deliveries: int = 1, **world: bool) -> None:
    """A fresh world, ``deliveries`` results for ``req``, then the observations."""
    pending = req.pending_bootstrap
    w = World(**world)
    for _ in range(deliveries):
        w.deliver(req)
    w.observe(req, observed, keys)
    note_optimistic_prefill(observed, pending or "requeued" in keys)


def note_optimistic_prefill(observed: Observed, exercised: bool) -> None:
    """Where the tree has no optimistic prefill, a scenario with a pending bootstrap or a requeue
    says so: its request reached the result path as any bootstrapped one, and `requeued: 0` is moot."""
    if exercised and optimistic_prefill_absent():
        observed["optimistic_prefill"] = "absent"


# --- scenarios -----------------------------------------------------------------


@SCENARIOS.scenario("B1", "final-chunk result, owned request, pending abort, bootstrap pending")
def b1(observed: Observed) -> None:
    run(observed, aborted_owned(pending_bootstrap=True), B1_KEYS)


@SCENARIOS.scenario("B1b", "as B1 but bootstrap already done")
def b1b(observed: Observed) -> None:
    run(observed, aborted_owned(pending_bootstrap=False), B1_KEYS)


@SCENARIOS.scenario("B1h", "as B1 with hicache storage on: the cache learns of the abort")
def b1h(observed: Observed) -> None:
    keys = ("cache_aborted", "cached_unfinished", "kv_released")
    run(observed, aborted_owned(pending_bootstrap=True), keys, hicache=True)


@SCENARIOS.scenario(
    "B2", "aborted middle-chunk result, no later chunk in flight, bootstrap pending"
)
def b2(observed: Observed) -> None:
    keys = ("requeued", "kv_released", "release_inserts_prefix", "abort_streamed")
    run(observed, aborted_middle_chunk(final_in_flight=False), keys)


@SCENARIOS.scenario(
    "B2d", "aborted middle-chunk result, no later chunk in flight, bootstrap done (abandoned)"
)
def b2d(observed: Observed) -> None:
    keys = ("requeued", "kv_released", "metadata_freed", "sender_aborted", "abort_streamed")
    run(observed, aborted_middle_chunk(final_in_flight=False, pending_bootstrap=False), keys)


@SCENARIOS.scenario(
    "B3", "aborted middle-chunk result while the final chunk is in flight, then the final result"
)
def b3(observed: Observed) -> None:
    keys = ("cached_unfinished", "enqueued_inflight", "kv_released", "abort_streamed")
    run(observed, aborted_middle_chunk(final_in_flight=True), keys, deliveries=2)


@SCENARIOS.scenario(
    "B3m", "control: aborted middle-chunk result while the final chunk is in flight, alone"
)
def b3m(observed: Observed) -> None:
    # The running final chunk still writes this KV: nothing may be released yet.
    keys = ("requeued", "kv_released", "sender_aborted", "abort_streamed")
    run(observed, aborted_middle_chunk(final_in_flight=True), keys)


@SCENARIOS.scenario("B4", "delayed final result for a request already retired (owns nothing)")
def b4(observed: Observed) -> None:
    keys = ("cached_unfinished", "enqueued_inflight", "kv_chunk_sent", "abort_streamed")
    run(observed, retired_req(), keys)


@SCENARIOS.scenario("B5", "as B1, but the sender's abort raises")
def b5(observed: Observed) -> None:
    world = World()
    req = aborted_owned(pending_bootstrap=True)
    req.disagg_kv_sender.abort.raises = TransportDown("probe: transport is down")
    # A fix that lets the sender's error escape skips the local cleanup: observe that,
    # rather than end the scenario on the error.
    try:
        world.deliver(req)
        observed["sender_error_escaped"] = False
    except TransportDown:
        observed["sender_error_escaped"] = True
    world.observe(req, observed, ("kv_released", "metadata_freed", "abort_streamed", "finished"))
    note_optimistic_prefill(observed, True)


class GrammarRejects(ValueError):
    """B6's grammar: rejects the sampled token the way SGLang's grammar objects do (ValueError)."""


def with_grammar(req: Any, *, rejects: bool) -> Any:
    error = GrammarRejects("probe: token rejected") if rejects else None
    req.grammar = STANDINS.make("grammar", "grammar", accept_token=Recorder("grammar.accept_token", raises=error),
                                finished=False)
    return req


@SCENARIOS.scenario("B6", "grammar rejects the sampled token of a final result, bootstrap done")
def b6(observed: Observed) -> None:
    keys = ("cached_unfinished", "kv_chunk_sent", "kv_released", "abort_streamed")
    world = World()
    req = with_grammar(owned_req(pending_bootstrap=False), rejects=True)
    try:
        world.deliver(req)
    except GrammarRejects:  # up to 0.4.9 the result path does not catch it: what it did before stays observable
        observed["grammar_error_escaped"] = True
    if not req.grammar.accept_token.count:
        # The result path ran to its end and never showed the sampled token to the grammar (0.4.5, 0.4.6).
        SCENARIOS.adapted("no-grammar-in-result")
    world.observe(req, observed, keys)


@SCENARIOS.scenario("B7", "aborted request holding only a mamba slot")
def b7(observed: Observed) -> None:
    req = make_req(kv=False, mamba=True, metadata=False, pending_bootstrap=True)
    mark_pending_abort(req)
    run(observed, req, ("mamba_freed", "abort_streamed"), mamba_cache=True, real_release=True)


@SCENARIOS.scenario("B8", "B1's result delivered twice")
def b8(observed: Observed) -> None:
    keys = ("enqueued_inflight", "kv_released", "abort_streamed")
    run(observed, aborted_owned(pending_bootstrap=True), keys, deliveries=2)


NORMAL_FINAL_KEYS = ("cached_unfinished", "enqueued_inflight", "kv_chunk_sent", "kv_released")


@SCENARIOS.scenario("B9", "control: normal (not aborted) final result, bootstrap done")
def b9(observed: Observed) -> None:
    run(observed, owned_req(pending_bootstrap=False), NORMAL_FINAL_KEYS)


@SCENARIOS.scenario("B9g", "control: as B9, and the grammar accepts the sampled token")
def b9g(observed: Observed) -> None:
    run(observed, with_grammar(owned_req(pending_bootstrap=False), rejects=False), NORMAL_FINAL_KEYS)


@SCENARIOS.scenario(
    "B10", "control: late middle-chunk result for a request already retired (owns nothing)"
)
def b10(observed: Observed) -> None:
    req = retired_req()
    mark_middle_chunk(req)
    schedule_chunk(req, PROMPT_LEN // 2)
    run(observed, req, ("requeued", "kv_released", "sender_aborted", "abort_streamed"))


@SCENARIOS.scenario(
    "B11", "control: normal middle-chunk result after a yield, bootstrap pending: requeued"
)
def b11(observed: Observed) -> None:
    req = owned_req(pending_bootstrap=True)
    mark_middle_chunk(req)
    schedule_chunk(req, PROMPT_LEN // 2)
    # Not release_inserts_prefix: from 0.5.22 this path keeps the prefix by a checkpoint
    # call (cached_unfinished) and releases without one.
    keys = ("requeued", "cached_unfinished", "kv_released", "abort_streamed")
    run(observed, req, keys)


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
