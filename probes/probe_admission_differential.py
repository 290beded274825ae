"""Differential probe for the PD admission door (sgl-project/sglang PR #38935).

A request rejected at intake (`Req.set_finish_with_abort`) keeps its verdict in
`to_finish`, so `finished()` stays False. Before the fix the prefill and decode
admission doors let it through; after it, `is_unadmitted_reject` sends it to
`Scheduler.retire_unadmitted_request`. The scenarios call the real SGLang doors,
receiver/sender creation and retirement; only the KV sender/receiver classes,
the KV manager, the tree cache, the allocator, the output streamer and the
beam coordinator are recording stand-ins. Each is built from the tree's own
class (`STANDINS`): what the probe wrote behaves as written, and every other
method the class defines is a recorder, so a fix written in the tree's own
idiom never ends in an AttributeError inside a stand-in.

Older trees (back to 0.4.5) are driven through what they have, each detected
from the tree, never from its version, and named in the result's `adaptations`
(e.g. `session-id-only`: the request names its session by id;
`inline-intake-reject`: up to 0.4.6 the scheduler rejects through the real
`validate_input_length`). What a tree lacks that a scenario needs is recorded
as "absent" (`is_rebootstrap`, `is_retracted`, a mamba slot or host backup a
control would hold), not re-implemented.

The retirement's keys count what the fix decides the way any tree can do it,
so a backport into an older release reads `fixed`: `abort_streamed` counts
streams through the output streamer or, up to 0.5.12, the scheduler's own
`stream_output`; `released` counts `tree_cache.finish` of the request's handle or, up to
0.5.19, `tree_cache.release_aborted_request(rid)` (the doors run with HiCache storage
on, the only case in which those trees release anything). A call of an older
name is named in `adaptations` (`scheduler-stream-output`,
`release-aborted-request-by-rid`); today's trees never make one. Where a tree
has no such step at all, `prepare()` names it (`no-beam-groups` before 0.5.19,
`no-queued-abort-release` up to 0.5.1, `session-without-inflight` up to 0.5.10)
and the registry's `not_deciding` rules set the keys observing it aside.

Run it by hand against one tree, in a Python 3.12 venv holding the pinned
closure (`uv pip install -r constraints/cells-py312.txt`) plus SGLang without
its dependencies, either a release or a source tree:

    uv pip install --no-deps sglang==0.5.21
    SGLANG_BUILD_RUST_EXTS=none uv pip install --no-deps <tree>/python

then, from the repository root:

    python probes/probe_admission_differential.py --side head \
        --tree-kind release --tree-ref 0.5.21 --out /tmp/a.json
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import types
from array import array
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _probekit import (Collaborators, Observed, Recorder, ScenarioSet, Spy, accepts, class_fact, main,  # noqa: E402
                       publish_server_args, server_args, swapped)

PROBE = ScenarioSet("admission")

# Filled by prepare(): the real SGLang objects every scenario calls.
SG = SimpleNamespace()

REJECT_LIMIT = 1018
REJECT_MSG = f"Input length (1500 tokens) exceeds the maximum allowed length ({REJECT_LIMIT} tokens)."
# TEST-NET-1: never routed; the stand-in KV classes never dial it anyway.
BOOTSTRAP_HOST = "192.0.2.1"
BOOTSTRAP_PORT = 8998
CAPACITY = 4096  # well above every prompt here, so no capacity abort muddies a door

# The tree's classes each stand-in is built from, wherever a release keeps them: every method they
# define answers as a recorder, so a fix written in any tree's idiom reaches its collaborators.
# The doors run with HiCache storage on, so the tree cache is a HiRadixCache where the tree has one.
STANDINS = Collaborators(
    tree_cache=("sglang.srt.mem_cache.hiradix_cache:HiRadixCache", "sglang.srt.mem_cache.radix_cache:RadixCache",
                "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache"),
    output_streamer=("sglang.srt.managers.scheduler_components.output_streamer:SchedulerOutputStreamer",),
    beam_coordinator=("sglang.srt.beam_search.coordinator:BeamCoordinator",),
    kv_sender=("sglang.srt.disaggregation.fake.conn:FakeKVSender", "sglang.srt.disaggregation.base.conn:BaseKVSender"),
    kv_receiver=("sglang.srt.disaggregation.fake.conn:FakeKVReceiver",
                 "sglang.srt.disaggregation.base.conn:BaseKVReceiver"),
    kv_manager=("sglang.srt.disaggregation.fake.conn:FakeKVManager", "sglang.srt.disaggregation.base.conn:BaseKVManager"),
    kv_pool=("sglang.srt.mem_cache.memory_pool:KVCache",),
    allocator=("sglang.srt.mem_cache.allocator:TokenToKVPoolAllocator",
               "sglang.srt.mem_cache.allocator:BaseTokenToKVPoolAllocator"),
    session=("sglang.srt.session.session_controller:Session", "sglang.srt.managers.session_controller:Session"),
)


def presence(owner, name: str) -> str:
    return "present" if hasattr(owner, name) else "absent"


def prepare() -> str:
    import sglang
    # First, as a server imports it: 0.4.6's doors import its layers in a circle otherwise.
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.disaggregation import decode as decode_module
    from sglang.srt.disaggregation import prefill as prefill_module
    from sglang.srt.disaggregation import utils as disagg_utils
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers import utils as manager_utils
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    # The doors log every rejection; the result document is the record.
    logging.getLogger("sglang").setLevel(logging.CRITICAL)
    SG.server_args = server_args(ServerArgs, PROBE.adapted, model_path="dummy")
    # The doors run in the scheduler process, which may read every config bag.
    publish_server_args(SG.server_args, PROBE.adapted, role="scheduler", reset=True)
    # `set_finish_with_abort` logs on TP rank 0 only, and the live rank comes
    # from a process group no probe has; SGLang's own CPU tests patch this too.
    if hasattr(schedule_batch, "get_parallel"):
        schedule_batch.get_parallel = lambda: SimpleNamespace(tp_rank=0)
    elif hasattr(schedule_batch, "get_tensor_model_parallel_rank"):  # up to 0.5.15: the group's own rank
        PROBE.adapted("tp-rank-patch")
        schedule_batch.get_tensor_model_parallel_rank = lambda: 0

    SG.Req = schedule_batch.Req
    SG.validate_input_length = getattr(manager_utils, "validate_input_length", None)
    SG.FINISH_ABORT = schedule_batch.FINISH_ABORT
    SG.SamplingParams = SamplingParams
    SG.PrefillBootstrapQueue = PrefillBootstrapQueue
    SG.DecodePreallocQueue = DecodePreallocQueue
    SG.Scheduler = Scheduler
    SG.utils = disagg_utils
    SG.prefill_module, SG.decode_module = prefill_module, decode_module
    try:
        from sglang.srt.disaggregation import fake as fake_transport
    except ImportError:  # up to 0.4.6 no fake transport to route
        fake_transport = None
        # 0.4.6 looks the classes up (get_kv_class, no fake backend); 0.4.5 imports them by name.
        PROBE.adapted("kv-class-lookup" if hasattr(prefill_module, "get_kv_class") else "named-kv-classes")
    SG.fake_transport = fake_transport
    SG.transfer_backend = getattr(disagg_utils, "TransferBackend", None)
    if SG.transfer_backend is None:  # 0.4.5: one transport, no backend to name
        PROBE.adapted("no-transfer-backend")
    name_what_the_tree_lacks(Scheduler)
    STANDINS.find()
    return sglang.__version__


def name_what_the_tree_lacks(Scheduler) -> None:
    """Name the collaborators of the fix's retirement that this tree does not have.

    A backport into such a tree has no step to take there, so the keys that
    observe that step cannot tell a fixed tree from an affected one; the
    registry's rules (experiments.toml, `not_deciding`) set them aside where
    these names are in the result.
    """
    try:
        from sglang.srt.session.session_controller import Session
    except ImportError:  # up to 0.5.10 the session lives with the managers
        from sglang.srt.managers.session_controller import Session
    if not hasattr(Scheduler, "init_beam_coordinator"):  # beam search groups from 0.5.19
        PROBE.adapted("no-beam-groups")
    if not class_fact(Scheduler.abort_request, "release_aborted_request",
                      why="its abort of a queued request releases no cache-side state: an adaptation"):  # up to 0.5.1
        # Its abort of a queued request releases no cache-side state: there is none to release.
        PROBE.adapted("no-queued-abort-release")
    if not hasattr(Session, "abort_req"):  # up to 0.5.10
        # A streaming session marks no request in flight: nothing for a retirement to clear.
        PROBE.adapted("session-without-inflight")


# ---------------------------------------------------------------- stand-ins


SESSION_ID = "probe-session"


def make_req(prompt_len: int, session=None):
    link = {"session": session}
    if not accepts(SG.Req.__init__, "session"):
        # Up to 0.5.9 a request names its session by id; the link observed is that id.
        PROBE.adapted("session-id-only")
        link = {"session_id": SESSION_ID if session is not None else None}
    req = SG.Req(
        rid="probe-req",
        origin_input_text="",
        origin_input_ids=array("q", range(prompt_len)),
        sampling_params=SG.SamplingParams(max_new_tokens=8),
        **link,
    )
    req.bootstrap_host = BOOTSTRAP_HOST
    req.bootstrap_port = BOOTSTRAP_PORT
    req.bootstrap_room = 1
    return req


class IntakeRejectAbsent(Exception):
    """The tree has neither rejection the probe knows: nothing to call."""


def rejected_req(session=None):
    """A 1500-token request rejected at intake, as the tokenizer-side checks do."""
    req = make_req(1500, session=session)
    if hasattr(SG.Req, "set_finish_with_abort"):
        req.set_finish_with_abort(REJECT_MSG)
    elif SG.validate_input_length is not None:
        # Up to 0.4.6 `Scheduler.handle_generate_request` rejects inline: the real length check
        # sets the abort, then the scheduler stubs the prompt and queues the request as it is.
        PROBE.adapted("inline-intake-reject")
        if SG.validate_input_length(req, REJECT_LIMIT, False) is None:
            raise AssertionError(f"validate_input_length accepted {len(req.origin_input_ids)} tokens")
        req.origin_input_ids = [0]
        req.sampling_params.max_new_tokens = 0
    else:
        PROBE.adapted("no-set-finish-with-abort")
        raise IntakeRejectAbsent()
    return req


def pending_abort_req():
    """A 16-token request that a running-request abort ("Abort method 3") marked."""
    req = make_req(16)
    if hasattr(req, "to_finish"):
        req.to_finish = SG.FINISH_ABORT("Aborted by AbortReq.", HTTPStatus.SERVICE_UNAVAILABLE)
    else:  # up to 0.5.4 that abort is a flag and a message, read when the request next runs
        PROBE.adapted("to-abort-marker")
        req.to_abort = True
        req.to_abort_message = "Aborted by AbortReq."
    return req


def hold(req, names: tuple[str, ...], value, transient: str | None = None) -> str:
    """Mark a resource as held where this tree keeps it; returns where ("kv.<name>" or "<name>"),
    or "absent" where the tree has no such resource (nothing is marked).

    Since 0.5.19 a request's resources live on `req.kv` (a `ReqKvInfo`); older
    trees keep them on the request, some under another name (`names[1:]`), or
    as an attribute set only while the resource is held (``transient``).
    """
    kv = getattr(req, "kv", None)
    if kv is not None and hasattr(kv, names[0]):
        setattr(kv, names[0], value)
        return f"kv.{names[0]}"
    name = next((n for n in names if hasattr(req, n)), transient)
    if name is None:
        return "absent"
    setattr(req, name, value)
    return name


class OlderName(Recorder):
    """A recorder answering a name only older trees call; a call names its adaptation in the result.

    Today's trees never call it, so their results keep their bytes.
    """

    def __init__(self, name: str, adaptation: str):
        super().__init__(name)
        self.adaptation = adaptation

    def __call__(self, *args, **kwargs):
        PROBE.adapted(self.adaptation)
        return super().__call__(*args, **kwargs)


def make_scheduler(hicache_storage: bool = True):
    """A stand-in Scheduler carrying the real methods the exercised paths call.

    Collaborators (streamer, beam coordinator, tree cache) are recorders, under
    today's names and the names older trees call: up to 0.5.12 a scheduler
    streams through its own `stream_output`, and up to 0.5.19 it releases an
    aborted request's cache-side state with `tree_cache.release_aborted_request(rid)`,
    only where HiCache storage is on (the prefetch it drops exists only then).
    So the doors run on a server with HiCache storage (``hicache_storage``):
    every tree's own release path shows; today's `_release_aborted_request`
    releases whatever the flag. `retire_unadmitted_request` is a Spy, so a
    door's hand-off is recorded and the real retirement still runs.
    """
    sched = SimpleNamespace(
        output_streamer=STANDINS.make("output_streamer", "output_streamer", stream_output=Recorder("stream_output")),
        stream_output=OlderName("Scheduler.stream_output", "scheduler-stream-output"),
        beam_coordinator=STANDINS.make("beam_coordinator", "beam_coordinator", retire_group=Recorder("retire_group")),
        tree_cache=STANDINS.make(
            "tree_cache", "tree_cache",
            finish=Recorder("tree_cache.finish"),
            release_aborted_request=OlderName("tree_cache.release_aborted_request", "release-aborted-request-by-rid"),
        ),
        disaggregation_mode=SG.utils.DisaggregationMode.NULL,
        waiting_queue=[],
        processed_tokens_counter=0,
        enable_priority_scheduling=False,
        abort_on_priority_when_disabled=False,
        max_queued_requests=None,
        enable_hicache_storage=hicache_storage,
        enable_lmcache=False,
        enable_hisparse=False,
        # Up to 0.5.18 `_is_fake_transfer` takes the scheduler's server args.
        server_args=SG.server_args,
    )
    for name in (
        "_set_or_validate_priority",
        "_abort_on_queued_limit",
        "_prefetch_kvcache",
        "_release_aborted_request",
    ):
        if hasattr(SG.Scheduler, name):
            setattr(sched, name, types.MethodType(getattr(SG.Scheduler, name), sched))
    real_retire = getattr(SG.Scheduler, "retire_unadmitted_request", None)
    sched.retire_unadmitted_request = (
        Spy("retire_unadmitted_request", types.MethodType(real_retire, sched))
        if real_retire is not None
        else Recorder("retire_unadmitted_request")
    )
    return sched


def kv_endpoint_class(name: str) -> Recorder:
    """Stand-in for a KV sender/receiver class: each construction is a recorded call."""
    return Recorder(name, returns=STANDINS.make(name, name, init=Recorder(f"{name}.init")))


@contextlib.contextmanager
def stand_in_transport():
    """Route the real `get_kv_class` to recording sender/receiver classes.

    The queues ask for the FAKE backend (the only one importable without GPU
    transport libraries), and `get_kv_class` imports its classes from the fake
    package at call time, so swapping them there replaces only the classes.
    """
    sender, receiver = kv_endpoint_class("kv_sender"), kv_endpoint_class("kv_receiver")
    if SG.fake_transport is None and hasattr(SG.prefill_module, "get_kv_class"):  # kv-class-lookup
        def lookup(_backend, class_type):
            return {"SENDER": sender, "RECEIVER": receiver}.get(class_type.name)

        with swapped(SG.prefill_module, get_kv_class=lookup), swapped(SG.decode_module, get_kv_class=lookup):
            yield sender, receiver
        return
    if SG.fake_transport is None:  # the door modules' own names for the classes (named-kv-classes)
        with swapped(SG.prefill_module, KVSender=sender), swapped(SG.decode_module, KVReceiver=receiver):
            yield sender, receiver
        return
    with swapped(SG.fake_transport, FakeKVSender=sender, FakeKVReceiver=receiver):
        yield sender, receiver


def fake_backend():
    return SG.transfer_backend.FAKE if SG.transfer_backend is not None else None


def prefill_queue(sched):
    q = object.__new__(SG.PrefillBootstrapQueue)
    q.scheduler = sched
    q.queue = []
    q.kv_manager = STANDINS.make("kv_manager", "kv_manager")
    q.transfer_backend = fake_backend()
    q.tp_rank = 0
    q.pp_rank = 0
    q.bootstrap_port = BOOTSTRAP_PORT
    # The capacity check reads one or the other depending on the release.
    q.max_total_num_tokens = CAPACITY
    q.max_input_len = CAPACITY
    return q


def decode_queue(sched):
    q = object.__new__(SG.DecodePreallocQueue)
    q.scheduler = sched
    q.queue = []
    q.pending_reqs = []
    q.retracted_queue = []
    # No prefill peer resolved yet: a new receiver waits in `pending_reqs`.
    q.kv_manager = STANDINS.make("kv_manager", "kv_manager", prefill_info_table={})
    q.transfer_backend = fake_backend()
    if SG.fake_transport is None:  # that door builds the receiver's bootstrap address from the queue's port
        q.bootstrap_port = BOOTSTRAP_PORT
    # Not an SWA pool, so the capacity check takes its plain full-KV branch.
    q.token_to_kv_pool = STANDINS.make("kv_pool", "token_to_kv_pool")
    q.token_to_kv_pool_allocator = STANDINS.make(
        "allocator", "token_to_kv_pool_allocator",
        page_size=1,
        size_swa=CAPACITY,
        get_kvcache=lambda: q.token_to_kv_pool,
        # None: no unified byte budget, the plain token capacity decides.
        prealloc_ceiling_fits=lambda full, swa: None,
    )
    q.max_total_num_tokens = CAPACITY
    q.num_reserved_decode_tokens = 0
    return q


# ---------------------------------------------------------------- observations


def abort_streamed(sched, req) -> int:
    """Streams of ``req``, through the output streamer (0.5.13 on) or the scheduler's own method."""
    calls = sched.output_streamer.stream_output.calls + sched.stream_output.calls
    return sum(1 for args, _ in calls if req in args[0])


def released(sched, req) -> int:
    """Releases of ``req``'s cache-side state: `tree_cache.finish(handle, outcome)` (0.5.20 on), or
    `release_aborted_request(rid)`. Either names the request (a handle carries its rid), so another request's
    release in the same scheduler is not counted as this one's."""
    calls = sched.tree_cache.finish.calls + sched.tree_cache.release_aborted_request.calls
    return sum(1 for args, _ in calls if args and getattr(args[0], "rid", args[0]) == req.rid)


def finished_status(req):
    reason = req.finished_reason
    if isinstance(reason, SG.FINISH_ABORT) and reason.status_code is not None:
        return int(reason.status_code)
    return None


def observe_retirement(sched, req, observed: Observed) -> None:
    """What a retirement does, step by step, seen from its collaborators and the request.

    `retired` records only the door's hand-off; these keys move when a step of
    the retirement itself is skipped: group retired, cache-side state
    released, finish state set, the abort streamed.
    """
    observed["group_retired"] = sched.beam_coordinator.retire_group.count
    observed["released"] = released(sched, req)
    observed["finished_status"] = finished_status(req)
    observed["abort_streamed"] = abort_streamed(sched, req)


def decode_enqueued(q, req) -> bool:
    return req in q.retracted_queue or any(d.req is req for d in q.queue + q.pending_reqs)


def door_verdict(req):
    """The fix's own predicate on this request, evaluated before the door."""
    predicate = getattr(SG.utils, "is_unadmitted_reject", None)
    return "absent" if predicate is None else predicate(req)


def offer_prefill(req, observed: Observed) -> None:
    observed["door_verdict"] = door_verdict(req)
    sched = make_scheduler()
    q = prefill_queue(sched)
    with stand_in_transport() as (sender, _):
        try:
            if accepts(SG.PrefillBootstrapQueue.add, "num_kv_heads"):
                SG.PrefillBootstrapQueue.add(q, req, 8)
            else:  # up to 0.4.7
                PROBE.adapted("door-without-num-kv-heads")
                SG.PrefillBootstrapQueue.add(q, req)
        finally:  # a door that raises still leaves what it did observable
            observed["sender_created"] = sender.count > 0
            observed["enqueued"] = req in q.queue
            observed["retired"] = sched.retire_unadmitted_request.count > 0
            observe_retirement(sched, req, observed)


def offer_decode(req, observed: Observed, **flags):
    """Offer ``req`` to the decode door; None when the door has no such flag (recorded "absent")."""
    missing = sorted(flag for flag in flags if not accepts(SG.DecodePreallocQueue.add, flag))
    if missing:  # is_retracted from 0.4.8, is_rebootstrap from 0.5.16
        for flag in missing:
            PROBE.adapted(f"door-without-{flag.replace('_', '-')}")
            observed[flag] = "absent"
        return None
    observed["door_verdict"] = door_verdict(req)
    sched = make_scheduler()
    q = decode_queue(sched)
    with stand_in_transport() as (_, receiver):
        try:
            SG.DecodePreallocQueue.add(q, req, **flags)
        finally:
            observed["receiver_created"] = receiver.count > 0
            observed["enqueued"] = decode_enqueued(q, req)
            observed["retired"] = sched.retire_unadmitted_request.count > 0
            observe_retirement(sched, req, observed)
    return q


# ---------------------------------------------------------------- scenarios


def intake_reject(fn):
    """A scenario of a request rejected at intake: where the tree has no rejection method, that is
    recorded (``set_finish_with_abort: "absent"``) and nothing else runs."""

    @functools.wraps(fn)
    def run(observed: Observed) -> None:
        try:
            fn(observed)
        except IntakeRejectAbsent:
            observed["set_finish_with_abort"] = "absent"

    return run


@PROBE.scenario("A1", "1500-token request rejected at intake, offered to the prefill door")
@intake_reject
def a1(observed: Observed) -> None:
    # Scenario-independent facts about the tree, recorded once.
    observed["door_check"] = presence(SG.utils, "is_unadmitted_reject")
    observed["retire_method"] = presence(SG.Scheduler, "retire_unadmitted_request")
    req = rejected_req()
    observed["finished_before_door"] = req.finished()
    offer_prefill(req, observed)


@PROBE.scenario("A2", "same rejected request, decode door")
@intake_reject
def a2(observed: Observed) -> None:
    offer_decode(rejected_req(), observed)


@PROBE.scenario("A3p", "valid 16-token request, prefill door")
def a3p(observed: Observed) -> None:
    offer_prefill(make_req(16), observed)


@PROBE.scenario("A3d", "valid 16-token request, decode door")
def a3d(observed: Observed) -> None:
    offer_decode(make_req(16), observed)


@PROBE.scenario("A4", "re-entry with a pending 503 abort holding metadata buffer 7, prefill door")
def a4(observed: Observed) -> None:
    req = pending_abort_req()
    req.metadata_buffer_index = 7
    offer_prefill(req, observed)


@PROBE.scenario("A5", "re-entry with a pending abort holding a host retraction backup, prefill door")
def a5(observed: Observed) -> None:
    req = pending_abort_req()
    # The backup is `retraction_backup` since 0.5.18 (on `req.kv` from 0.5.19); before, a
    # `kv_cache_cpu` attribute that `offload_kv_cache` (from 0.4.7) sets only while it exists.
    transient = "kv_cache_cpu" if hasattr(SG.Req, "offload_kv_cache") else None
    observed["backup_marker"] = hold(req, ("retraction_backup",), object(), transient=transient)
    if observed["backup_marker"] != "absent":
        offer_prefill(req, observed)


def preempted_req():
    """What a short preemption leaves: pending abort, `is_retracted`, nothing held."""
    req = pending_abort_req()
    req.is_retracted = True
    return req


@PROBE.scenario("A6p", "preempted re-entry with a pending abort and is_retracted, prefill door")
def a6p(observed: Observed) -> None:
    offer_prefill(preempted_req(), observed)


@PROBE.scenario("A6d", "preempted re-entry with a pending abort and is_retracted, decode door")
def a6d(observed: Observed) -> None:
    offer_decode(preempted_req(), observed)


@PROBE.scenario("A7r", "decode door called with is_retracted=True on a pending-abort request")
def a7r(observed: Observed) -> None:
    req = pending_abort_req()
    q = offer_decode(req, observed, is_retracted=True)
    if q is not None:
        observed["retracted_queued"] = req in q.retracted_queue


@PROBE.scenario("A7b", "decode door called with is_rebootstrap=True on a pending-abort request")
def a7b(observed: Observed) -> None:
    offer_decode(pending_abort_req(), observed, is_rebootstrap=True)


@PROBE.scenario("A8", "NULL mode: rejected request through Scheduler._add_request_to_queue")
@intake_reject
def a8(observed: Observed) -> None:
    req = rejected_req()
    # Without HiCache storage: with it, NULL mode's real `_prefetch_kvcache` would ask a real tree cache.
    sched = make_scheduler(hicache_storage=False)
    SG.Scheduler._add_request_to_queue(sched, req)
    observed["enqueued"] = req in sched.waiting_queue
    observed["retired"] = sched.retire_unadmitted_request.count > 0
    # Where intake finishes the request at once (up to 0.5.4) nothing is left pending.
    observed["abort_pending"] = isinstance(getattr(req, "to_finish", None), SG.FINISH_ABORT)


def retire_session_request(streaming: bool, observed: Observed):
    """Retire a rejected request of a session with the real method, where the tree has one.

    The call is the probe's own, so nothing observed counts it: the keys are
    what SGLang did to the session and the request.
    """
    observed["retire_method"] = presence(SG.Scheduler, "retire_unadmitted_request")
    session = STANDINS.make("session", "session", streaming=streaming, abort_req=Recorder("session.abort_req"))
    req = rejected_req(session=session)
    sched = make_scheduler()
    real_retire = getattr(SG.Scheduler, "retire_unadmitted_request", None)
    if real_retire is not None:
        real_retire(sched, req)
    observed["session_aborted"] = session.abort_req.count
    link = req.session if accepts(SG.Req.__init__, "session") else req.session_id
    observed["session_detached"] = link is None
    return sched, req


@PROBE.scenario("A9", "retirement of a rejected request that belongs to a streaming session")
@intake_reject
def a9(observed: Observed) -> None:
    sched, req = retire_session_request(True, observed)
    observe_retirement(sched, req, observed)


@PROBE.scenario("A9n", "retirement of a rejected request of a non-streaming session keeps the session")
@intake_reject
def a9n(observed: Observed) -> None:
    retire_session_request(False, observed)


@PROBE.scenario("A10", "re-entry with a pending abort holding a KV row, prefill door")
def a10(observed: Observed) -> None:
    req = pending_abort_req()
    observed["held"] = hold(req, ("req_pool_idx",), 5)
    offer_prefill(req, observed)


@PROBE.scenario("A11", "re-entry with a pending abort holding a mamba slot, prefill door")
def a11(observed: Observed) -> None:
    req = pending_abort_req()
    observed["held"] = hold(req, ("mamba_pool_idx",), object())  # mamba slots from 0.5.4
    if observed["held"] != "absent":
        offer_prefill(req, observed)


@PROBE.scenario("A12", "request already finished with an abort (finished_reason set), prefill door")
def a12(observed: Observed) -> None:
    req = make_req(16)
    req.finished_reason = SG.FINISH_ABORT(REJECT_MSG, HTTPStatus.BAD_REQUEST)
    offer_prefill(req, observed)


if __name__ == "__main__":
    sys.exit(main(PROBE, prepare))
