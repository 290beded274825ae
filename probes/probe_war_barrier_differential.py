"""Differential probe for experiment war_barrier: the overlap scheduler's write-after-read barrier (PR #26380).

The overlap scheduler prepares the next batch while the current forward runs: the scheduling writes
(``req_to_token`` rows, the decode prealloc, the SWA mapping) go on the schedule stream, the forward's reads
on the forward stream. Without a barrier the next batch's writes rewrite rows the forward still reads, and a
request attends to KV that is no longer its own. The fix makes the schedule stream wait for the forward
(``schedule_stream.wait_stream(forward_stream)``) before the next batch's writes, in the plain
(``Scheduler.event_loop_overlap``), PD-decode and PD-prefill overlap loops. Later releases reshaped it: CUDA
only (#26646, 0.5.13), ``SGLANG_ENABLE_WAR_BARRIER`` forces it elsewhere (#27967, 0.5.14), a wait on the
forward's read-done event where the runner publishes one (#28363, 0.5.14), DFLASH opted out (0.5.14 only,
back in 0.5.15 by #29556), the wait moved right after each launch (#31687, 0.5.16),
``SGLANG_FORCE_COARSE_WAR_BARRIER`` forces the whole-forward wait (#29353, 0.5.16).

Each scenario drives the tree's real ``Scheduler.run_event_loop`` (where the tree has it: it sets the gate and
dispatches by disaggregation mode; before it, the overlap loop itself) for ``ITERATIONS`` iterations. The
boundary: the scheduler's ``device_module`` (streams, events, stream contexts) and its ``forward_stream`` are
recorders; the batch, forward and scheduling collaborators (request receiver, batch getters, ``run_batch``,
result processing, the decode queue, the prefill bootstrap queue, the model worker's runner) are stubs that
log what they were asked to do (the batch a decode batch of no request, no grammar; a launch's result with no
delayed sampling); the platform is the tree's own flags (``is_cuda()``, ``_is_hip`` ...) set as a
server on that platform has them (``PLATFORMS``). Each iteration the batch getter stands for the schedule's
writes of the next batch and ``run_batch`` for a forward launch (reading them). Scenarios (``RUNS``):

- W1 plain loop on CUDA; W2 PD-decode loop on CUDA; W3 PD-prefill loop on CUDA;
- W4, W5, W6 the three loops on ROCm (HIP), the environment unset;
- W7, W8, W9 the three loops on ROCm with ``SGLANG_ENABLE_WAR_BARRIER=true``;
- W10 plain loop on an NPU; W11 plain loop on the CPU (both unset);
- W12 plain loop on CUDA, the forward publishing its read-done event (the fast path);
- W13 W12 with ``SGLANG_FORCE_COARSE_WAR_BARRIER=true``;
- W14 PD-decode loop on CUDA with speculative decoding DFLASH.

Keys: ``loop`` (which overlap loop ran, by the batch getter it called: ``plain``, ``decode``, ``prefill``; null:
none), ``forwards`` (launches), ``results`` (results of earlier launches processed; a dummy first batch, up to
0.5.3, is none), ``waits`` (times the schedule stream waited for the forward stream or for an event the forward
published), ``war_wait_before_write`` (every schedule write that followed a launch had such a wait between them;
null where no write followed a launch), ``wait_placement`` (``before_schedule``: each iteration's wait precedes
its writes; ``after_launch``: right after each launch; ``mixed``; ``none``);
W12/W13: ``waits_on_read_done`` (a wait was on the forward's read-done event rather than the whole stream);
decode loops: ``prealloc_fenced`` (the decode queue's preallocation, a schedule write, ran after a wait since
the last launch; null: it never ran after one). Tree facts: ``dflash: "absent"`` (W14: the tree's
``SpeculativeAlgorithm`` has no DFLASH, or the tree has no ``spec_info`` to define one, before 0.4.2: adaptation
``no_speculative_module``, its loops then given no speculative algorithm). A tree without the loop a scenario
drives records ``loop: "absent"`` (the PD overlap loops up to 0.4.5.post2; every PD loop on a tree without PD,
0.4.4.post1 and before, whose plain loop is driven all the same; every loop on a scheduler without an overlap
loop, 0.3.3.post1 and before).
What a CPU probe sees is the barrier's placement and gating, never the race itself (docs/operators/limits.md).

    python probes/probe_war_barrier_differential.py --side head --tree-kind release --tree-ref 0.5.13
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _probekit import Observed, ScenarioSet, lacks_pd, main, publish_server_args, server_args, swapped  # noqa: E402
from _serverenv import environment  # noqa: E402

SCENARIOS = ScenarioSet("war_barrier", needs_pd=False)  # the plain overlap loop is older than PD
ITERATIONS = 3
ENABLE = "SGLANG_ENABLE_WAR_BARRIER"
COARSE = "SGLANG_FORCE_COARSE_WAR_BARRIER"
SCHEDULER = "sglang.srt.managers.scheduler"
SPEC_INFO = "sglang.srt.speculative.spec_info"
PD_MODULES = ("sglang.srt.disaggregation.decode", "sglang.srt.disaggregation.prefill")

# A server's platform as the tree's own flags say it: its device string and which ``is_<x>`` is true.
PLATFORMS: dict[str, tuple[str, str]] = {"cuda": ("cuda", "cuda"), "rocm": ("cuda", "hip"), "npu": ("npu", "npu"),
                                         "cpu": ("cpu", "cpu")}
FLAGS = ("cuda", "hip", "npu", "cpu", "xpu", "musa", "hpu")
# The loop each disaggregation mode runs, by the batch getter it calls (and its name where no dispatch exists).
LOOPS = {"plain": ("NULL", "get_next_batch_to_run", "event_loop_overlap"),
         "decode": ("DECODE", "get_next_disagg_decode_batch_to_run", "event_loop_overlap_disagg_decode"),
         "prefill": ("PREFILL", "get_next_disagg_prefill_batch_to_run", "event_loop_overlap_disagg_prefill")}
FORWARD, READ_DONE = "forward", "read_done"
ARGS: dict[str, Any] = {}  # the tree's ServerArgs (its defaults: one pipeline stage), built once by prepare()


class LoopBound(Exception):
    """Raised by the request receiver after ``ITERATIONS`` iterations: the loop never returns on its own."""


class Stream:
    """A recording stream: its waits go to the log, by name."""

    def __init__(self, world: World, name: str):
        self.world, self.name, self.cuda_stream = world, name, len(world.streams)
        world.streams.append(self)

    def wait_stream(self, other: Any) -> None:
        self.world.log.append(("wait", self.name, getattr(other, "name", "?")))

    def wait_event(self, event: Any) -> None:
        self.world.log.append(("wait", self.name, getattr(event, "name", "?")))

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Event:
    """A recording event; waiting on it (``event.wait(stream)``) is the stream's wait."""

    def __init__(self, world: World, name: str = "event"):
        self.world, self.name = world, name

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        self.world.log.append(("wait", getattr(stream, "name", "current"), self.name))

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class DeviceModule:
    """The scheduler's ``device_module`` (``torch.cuda`` on a CUDA server): streams and events that record."""

    def __init__(self, world: World):
        self.world = world

    def Stream(self, *args: Any, **kwargs: Any) -> Stream:  # noqa: N802 - torch's name
        return Stream(self.world, "schedule" if not any(s.name == "schedule" for s in self.world.streams)
                      else f"stream{len(self.world.streams)}")

    def Event(self, *args: Any, **kwargs: Any) -> Event:  # noqa: N802 - torch's name
        return Event(self.world)

    def StreamContext(self, stream: Any) -> contextlib.AbstractContextManager:  # noqa: N802 - torch's name
        return contextlib.nullcontext(stream)

    stream = StreamContext

    def current_stream(self, *args: Any) -> Stream:
        return self.world.default

    def synchronize(self, *args: Any) -> None:
        pass


class Runner:
    """The model worker's runner: the read-done event the forward published (None: none), as the tree names it
    (``war_fastpath_read_done_event``, ``shared_read_done_event``); the tree clears it by assigning None."""

    def __init__(self):
        object.__setattr__(self, "published", None)

    def __getattr__(self, name: str) -> Any:
        if name.endswith("read_done_event"):
            return self.published
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, "published" if name.endswith("read_done_event") else name, value)


class Worker:
    """The model worker: every ``*runner`` it is asked for is the one runner."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def __getattr__(self, name: str) -> Any:
        if name.endswith("runner"):
            return self.runner
        raise AttributeError(name)


class Mode:
    """A batch's forward mode: a decode batch (every ``is_<mode>()`` false but decode's)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: name == "is_decode"


class Batch:
    """A scheduled batch, and the plan that carries it where the getter returns one (``batch_to_run``): no request
    constrained by a grammar (0.5.6's plain loop syncs grammar batches)."""

    running_batch = None
    inner_idle_batch = None
    reqs: tuple = ()
    has_grammar = False

    def __init__(self, n: int):
        self.n = n
        self.forward_mode = Mode()

    @property
    def batch_to_run(self) -> Batch:
        return self

    def copy(self) -> Batch:
        return self

    def batch_size(self) -> int:  # the PD-prefill loop traces it (0.5.4.post2 to 0.5.5)
        return len(self.reqs)


class Result:
    """What a forward launch returns: its sampling launched with it (0.5.3.post1's loops launch a delayed one)."""

    delay_sample_launch = False


class RunningBatch:
    """The running batch: the PD-prefill loop (up to 0.5.3) marks it not full each iteration; later loops hand it
    to the batch getter and keep the plan's."""

    batch_is_full = False


class Boundary:
    """A scheduling collaborator the loop reaches that no step here names: each call logs its name and hands its
    first argument back (a pass-through, as ``prepare_for_forward(batch)`` is)."""

    def __init__(self, world: World, name: str):
        self.world, self.name = world, name

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.world.log.append(("call", f"{self.name}.{name}"))
            return args[0] if args else None
        return call


class Queue(Boundary):
    """A PD queue the loops measure (``len(queue.queue)``, up to 0.5.3 on every iteration): empty, no request
    waits in it; its other calls pass through."""

    def __init__(self, world: World, name: str):
        super().__init__(world, name)
        self.queue, self.retracted_queue = [], []


@dataclass
class World:
    """One run's log: ("recv"), ("prealloc"), ("write", loop), ("forward",), ("wait", waiter, target), ...."""

    log: list[tuple] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    fastpath: bool = False
    runner: Runner = field(default_factory=Runner)

    def __post_init__(self):
        self.default = Stream(self, "default")
        self.forward = Stream(self, FORWARD)


def scheduler_for(world: World, loop: str, mode: Any, spec: Any) -> Any:
    """The tree's real ``Scheduler`` (its loops, its ``run_event_loop``) with the boundary stubbed."""
    sched_mod = importlib.import_module(SCHEDULER)
    getter = LOOPS[loop][1]
    iterations = iter(range(ITERATIONS))

    def recv_requests(*args: Any) -> list:
        if next(iterations, None) is None:
            raise LoopBound
        world.log.append(("recv",))
        return []

    def get_batch(self: Any, *args: Any, **kwargs: Any) -> Batch:
        world.log.append(("write", loop))
        return Batch(sum(1 for e in world.log if e[0] == "write"))

    def run_batch(self: Any, batch: Any, *args: Any) -> Any:
        world.log.append(("forward",))
        if world.fastpath:
            world.runner.published = Event(world, READ_DONE)
        return Result()

    def other_getter(name: str):
        def wrong(self: Any, *args: Any, **kwargs: Any) -> Batch:
            world.log.append(("write", next(k for k, v in LOOPS.items() if v[1] == name)))
            return Batch(0)
        return wrong

    def result(self: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        # Up to 0.5.3 the plain loop also hands its first iteration's dummy batch here (to signal the sampling
        # info, as the PD loops' set_next_batch_sampling_info_done does): no launch's result.
        world.log.append(("result",) if isinstance(batch, Batch) else ("sampling_info",))

    def logged(name: str, returns: Any = None):
        def stub(self: Any, *args: Any, **kwargs: Any) -> Any:
            world.log.append((name,))
            return returns
        return stub

    def fallback(self: Any, name: str) -> Any:
        if name.startswith("_") or "stream" in name:  # a stream or a flag the loop reads must be this world's
            raise AttributeError(name)
        return Boundary(world, name)

    stubs = {name: other_getter(name) for _, name, _ in LOOPS.values()}
    if loop == "prefill":  # the PD-prefill loop's getter before 0.5.4
        stubs["get_new_batch_prefill"] = get_batch
    stubs.update({getter: get_batch, "run_batch": run_batch, "recv_requests": staticmethod(recv_requests),
                  "ingest_requests": lambda self, *args, **kwargs: recv_requests(),
                  "process_input_requests": logged("input"), "process_decode_queue": logged("prealloc"),
                  "process_batch_result": result, "launch_batch_sample_if_needed": logged("sample"),
                  "is_disable_overlap_for_batch": logged("overlap_check", False), "on_idle": logged("idle"),
                  "self_check_during_idle": logged("idle"), "self_check_during_busy": logged("busy"),
                  "process_disagg_prefill_inflight_queue": logged("inflight"),
                  "process_batch_result_disagg_prefill": result,
                  "set_next_batch_sampling_info_done": logged("sampling_info"),
                  "maybe_prefetch_staging_for_batch": logged("staging"), "__getattr__": fallback})
    cls = type("ProbeScheduler", (sched_mod.Scheduler,), stubs)
    sched = object.__new__(cls)
    # The schedule stream as the scheduler's init makes it (0.5.19 on; before, run_event_loop makes its own).
    sched.schedule_stream = DeviceModule(world).Stream(priority=0)
    # The prefill bootstrap queue, empty (named disagg_prefill_pending_queue up to 0.4.5.post3).
    bootstrap = type("Bootstrap", (), {"pop_bootstrapped": lambda self, *a, **k: [], "queue": []})()
    sched.__dict__.update(
        server_args=ARGS["server"], disaggregation_mode=mode, spec_algorithm=spec, device_module=DeviceModule(world),
        forward_stream=world.forward, enable_overlap=True, _deferred_input_requests=[], enable_pdmux=False,
        enable_overlap_mlx=False,
        is_generation=True, enable_unified_memory=False, gracefully_exit=False, _engine_paused=False,
        last_batch=None, running_batch=RunningBatch(), chunked_req=None, cur_batch=None, require_mlp_sync=False,
        model_worker=Worker(world.runner), waiting_queue=[],
        request_receiver=type("Receiver", (), {"recv_requests": staticmethod(recv_requests)})(),
        disagg_prefill_bootstrap_queue=bootstrap, disagg_prefill_pending_queue=bootstrap,
        disagg_prefill_inflight_queue=[], disagg_decode_transfer_queue=Queue(world, "disagg_decode_transfer_queue"),
        disagg_decode_prealloc_queue=Queue(world, "disagg_decode_prealloc_queue"))
    return sched


@dataclass(frozen=True)
class Run:
    """A scenario: one overlap loop on one platform, under an environment, the forward publishing its read-done
    event or not, with a speculative algorithm (None: none)."""
    id: str
    title: str
    loop: str
    platform: str = "cuda"
    env: tuple[tuple[str, str], ...] = ()
    fastpath: bool = False
    spec: str | None = None


RUNS = (
    Run("W1", "plain overlap loop on CUDA", "plain"),
    Run("W2", "PD-decode overlap loop on CUDA", "decode"),
    Run("W3", "PD-prefill overlap loop on CUDA", "prefill"),
    Run("W4", "plain overlap loop on ROCm, the environment unset", "plain", "rocm"),
    Run("W5", "PD-decode overlap loop on ROCm, the environment unset", "decode", "rocm"),
    Run("W6", "PD-prefill overlap loop on ROCm, the environment unset", "prefill", "rocm"),
    Run("W7", f"plain overlap loop on ROCm with {ENABLE}=true", "plain", "rocm", ((ENABLE, "true"),)),
    Run("W8", f"PD-decode overlap loop on ROCm with {ENABLE}=true", "decode", "rocm", ((ENABLE, "true"),)),
    Run("W9", f"PD-prefill overlap loop on ROCm with {ENABLE}=true", "prefill", "rocm", ((ENABLE, "true"),)),
    Run("W10", "plain overlap loop on an NPU, the environment unset", "plain", "npu"),
    Run("W11", "plain overlap loop on the CPU, the environment unset", "plain", "cpu"),
    Run("W12", "plain overlap loop on CUDA, the forward publishing its read-done event", "plain", fastpath=True),
    Run("W13", f"W12 with {COARSE}=true", "plain", env=((COARSE, "true"),), fastpath=True),
    Run("W14", "PD-decode overlap loop on CUDA with speculative decoding DFLASH", "decode", spec="DFLASH"),
)


def loop_modules() -> list[str]:
    """The modules whose overlap loops the tree has: the scheduler's, and the PD loops' where it has PD."""
    return [SCHEDULER] if lacks_pd() else [SCHEDULER, *PD_MODULES]


def prepare() -> str:
    import sglang
    from sglang.srt.server_args import ServerArgs

    for name in loop_modules():
        importlib.import_module(name)
    ARGS["server"] = server_args(ServerArgs, SCENARIOS.adapted, model_path="dummy")
    # Built from its defaults (up to 0.4.10: no accelerator here), the args lack what __post_init__ derives; the PD
    # loops of 0.4.6 to 0.4.7.post1 read enable_sp_layernorm, which it sets on the defaults (no DeepEP MoE): False.
    # From 0.5.20 the args are a sealed msgspec record no loop reads that from: only the dataclass ones get it.
    if is_dataclass(ServerArgs) and not hasattr(ARGS["server"], "enable_sp_layernorm"):
        object.__setattr__(ARGS["server"], "enable_sp_layernorm", False)
    return sglang.__version__


@contextlib.contextmanager
def platform(name: str):
    """The tree's platform flags, in every module whose loop reads them, as a server on ``name`` has them."""
    device, true = PLATFORMS[name]
    with contextlib.ExitStack() as stack:
        for module in (importlib.import_module(m) for m in loop_modules()):
            flags = {f"is_{flag}": functools.partial(bool, flag == true) for flag in FLAGS
                     if callable(getattr(module, f"is_{flag}", None))}
            flags.update({f"_is_{flag}": flag == true for flag in FLAGS if hasattr(module, f"_is_{flag}")})
            if hasattr(module, "triton_load_watch"):  # GPU kernel-load diagnostics: nothing to watch here
                flags["triton_load_watch"] = Boundary(World(), "triton_load_watch")
            stack.enter_context(swapped(module, **flags))
        yield device


def speculative_algorithms() -> Any:
    """The tree's ``SpeculativeAlgorithm`` enum; None where the tree has no ``spec_info`` module to hold one (before
    0.4.2: its loops know no speculative algorithm). A module that is there but fails to import raises."""
    try:
        module = importlib.import_module(SPEC_INFO)
    except ModuleNotFoundError as exc:  # only the module's own absence: a dependency it lacks raises on
        if exc.name not in (SPEC_INFO.rpartition(".")[0], SPEC_INFO):
            raise
        SCENARIOS.adapted("no_speculative_module")
        return None
    return module.SpeculativeAlgorithm


def speculative(name: str | None) -> Any:
    """The scheduler's ``spec_algorithm`` for ``name`` (None: no speculative decoding): a member of the tree's
    ``SpeculativeAlgorithm``; None where the tree has no such enum, or one without ``NONE`` (0.4.1.post2 and post3:
    EAGLE alone, no algorithm being None; their loops never read it), adaptation ``no_speculative_none``."""
    spec_enum = speculative_algorithms()
    if spec_enum is None:
        return None
    if name is None and not hasattr(spec_enum, "NONE"):
        SCENARIOS.adapted("no_speculative_none")
        return None
    return getattr(spec_enum, name or "NONE")


def drive(run: Run, world: World) -> str | None:
    """Run the tree's loop for ``run``; the loop that ran (None: the tree has none to run)."""
    sched_mod = importlib.import_module(SCHEDULER)
    spec = speculative(run.spec)
    mode, _, loop_name = LOOPS[run.loop]
    # Before PD (0.4.4.post1 and older) the plain loop is the only one, and reads no mode.
    if lacks_pd() and run.loop != "plain":
        return None
    mode_value = None if lacks_pd() else \
        getattr(importlib.import_module("sglang.srt.disaggregation.utils").DisaggregationMode, mode)
    sched = scheduler_for(world, run.loop, mode_value, spec)
    # The dispatch reads the pipeline size from the published config (0.5.17 on), as a scheduler process has it;
    # published per run, as the probes sharing this process publish their own.
    publish_server_args(ARGS["server"], SCENARIOS.adapted, role="scheduler")
    with environment(dict(run.env), unset=(ENABLE, COARSE)), platform(run.platform) as device:
        sched.device = device
        if hasattr(sched_mod.Scheduler, "run_event_loop"):
            start = sched.run_event_loop
        else:  # before the schedule stream: the loop itself, as its dispatch called it
            if not hasattr(sched_mod.Scheduler, loop_name):
                return None
            SCENARIOS.adapted("overlap_loop_called_directly")
            start = getattr(sched, loop_name)
        try:
            start()
        except LoopBound:
            pass
    return run.loop


def forward_waits(world: World) -> list[int]:
    """Indices of the log's waits for the forward: a stream other than the forward's waiting on it, or on an
    event it published."""
    return [i for i, e in enumerate(world.log) if e[0] == "wait" and e[1] != FORWARD and e[2] in (FORWARD, READ_DONE)]


def fenced(world: World, kind: str) -> bool | None:
    """Whether every ``kind`` entry after a launch has a wait for the forward since that launch (None: none
    followed a launch)."""
    waits, last_forward, found = set(forward_waits(world)), None, []
    for i, entry in enumerate(world.log):
        if entry[0] == "forward":
            last_forward = i
        elif entry[0] == kind and last_forward is not None:
            found.append(any(last_forward < w < i for w in waits))
    return all(found) if found else None


def placement(world: World) -> str:
    """Where each wait sits: in the iteration of the launch it follows (``after_launch``), or in the next one,
    after its intake (``before_schedule``)."""
    kinds = set()
    for i in forward_waits(world):
        since = [e[0] for e in reversed(world.log[:i])]
        launch = since.index("forward") if "forward" in since else len(since)
        kinds.add("before_schedule" if "recv" in since[:launch] else "after_launch")
    return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "none"


def play(run: Run, observed: Observed) -> None:
    spec_enum = speculative_algorithms()
    if run.spec and (spec_enum is None or not hasattr(spec_enum, run.spec)):
        observed[run.spec.lower()] = "absent"
        return
    world = World(fastpath=run.fastpath)
    ran = drive(run, world)
    writes = {e[1] for e in world.log if e[0] == "write"}
    observed.update(loop=(writes.pop() if len(writes) == 1 else "mixed" if writes else None) if ran else "absent",
                    forwards=sum(1 for e in world.log if e[0] == "forward"),
                    results=sum(1 for e in world.log if e[0] == "result"), waits=len(forward_waits(world)),
                    war_wait_before_write=fenced(world, "write"), wait_placement=placement(world))
    if run.fastpath:
        observed["waits_on_read_done"] = any(world.log[i][2] == READ_DONE for i in forward_waits(world))
    if run.loop == "decode":
        observed["prealloc_fenced"] = fenced(world, "prealloc")


for _run in RUNS:
    SCENARIOS.scenario(_run.id, _run.title)(functools.partial(play, _run))


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
