"""Differential probe for experiment grammar_release: a grammar-rejected prefill's KV released twice (PR #30937).

On a PD prefill server, SGLang's real ``SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill``
shows a final result's first token to the request's grammar. Before the fix, a grammar that rejected it had the
request's KV released at once, while the request stayed in the inflight queue: with its last chunk already handed
to the KV sender, the transfer still read pages given back; with the bootstrap still pending (optimistic prefill),
the last chunk was sent later, from pages given back. The inflight queue's terminal poll
(``process_disagg_prefill_inflight_queue``) released the KV a second time, and a success poll overwrote the
abort with a normal finish (a failure poll with its own abort). The fix releases once, at that terminal poll,
and keeps the grammar's abort.

The world is experiment prefill's (``probe_prefill_differential.py``: a scheduler subclassing the real mixin,
the real ``Req``, recorders at the boundary, and its adaptations to older trees, which this result names). Beside
it: a grammar stand-in (the tree's grammar class, its ``accept_token`` raising ``ValueError`` as SGLang's grammar
objects do, or accepting) and a recording KV sender whose ``poll`` answers the state a step sets. The cross-rank
poll (``poll_and_all_reduce``, a torch.distributed all-reduce) is one rank's: each sender's own answer. Each
release, chunk handed over and terminal poll is an event in order; the transfer is in flight from the first chunk
handed to the sender until its poll answers Success or Failed.

Each scenario is a script (``SCRIPTS``): one final result, then the inflight queue's polls. Scenarios:

- G1 the grammar rejects the first token after the last chunk was handed over; a poll still transferring, then
  a success poll;
- G2 as G1, then a failure poll;
- G3 the grammar rejects it before the last chunk (bootstrap pending: the request is parked); the bootstrap
  completes (the last chunk is sent), then a success poll;
- G4 as G3, then a failure poll;
- G9 no grammar, the request already ended in an abort while its result was computed; transferring, then
  success: one release either way, and the abort kept or overwritten;
- G6 control: the grammar accepts, bootstrap done; transferring, then success;
- G7 control: no grammar; transferring, then success;
- G8 control: the grammar accepts; a failure poll.

Keys: ``release_count`` (the request's KV releases), ``double_released`` (more than one),
``released_in_flight`` (releases while a chunk handed to the sender had no terminal poll yet),
``sent_after_release`` (chunks handed to the sender after a release: the transfer reads pages given back),
``finish_reason`` (the class name of the request's final reason, or null), ``abort_kept`` (the final reason is
still the abort the request carried once its result was processed: the grammar's rejection's, or G9's). Tree
facts: ``grammar_in_result: "absent"`` (the result path never shows the token to the grammar, up to 0.4.6),
``grammar_error: "escapes"`` (it does not catch the rejection, 0.4.7 to 0.4.9: the scheduler stops on it),
``failed_poll: "raises"`` (a failure poll raises out of the inflight queue, up to 0.4.6: the scheduler stops on it),
``optimistic_prefill: "absent"`` (no pending bootstrap, before 0.5.13; 0.5.13 to 0.5.15 finish it at the result
instead: adaptation ``optimistic-prefill-retries``). G3/G4 on those trees run as G1/G2.

    python probes/probe_grammar_release_differential.py --side head --tree-kind release --tree-ref 0.5.16
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_prefill_differential as prefill  # noqa: E402
from _probekit import Observed, Recorder, ScenarioSet, Spy, main, swapped  # noqa: E402

SCENARIOS = ScenarioSet("grammar_release")
# The cross-rank polls the inflight queue (and 0.5.13-0.5.15's result path) call, by the tree's name.
POLL_NAMES = ("poll_and_all_reduce", "poll_and_all_reduce_attn_cp_tp_group")
TERMINAL = ("Success", "Failed")
ONE_RANK = SimpleNamespace(tp_rank=0, pp_rank=0, dp_rank=0, attn_tp_rank=0, attn_cp_rank=0)


def prepare() -> str:
    # The prefill world's adaptations to this tree are this experiment's: its result names them.
    prefill.SCENARIOS.adaptations = SCENARIOS.adaptations
    return prefill.prepare()


class TransferFailed(RuntimeError):
    """What the recording sender's ``failure_exception`` raises, as a failed transfer's does."""


class World(prefill.World):
    """Experiment prefill's world, with the KV sender's poll scripted and every release, chunk and terminal poll
    recorded in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self.state = "WaitingForInput"
        self.abort: Any = None  # the abort the request carries once its result is processed
        then = self.release.then
        self.release.then = lambda *args, **kwargs: (self.events.append("release"), then(*args, **kwargs))[1]
        self.scheduler.send_kv_chunk = Spy("send_kv_chunk", lambda *_a, **_k: self.events.append("send"))
        sched = self.scheduler
        sched.disagg_prefill_bootstrap_queue.finalize_bootstrap = Spy("finalize_bootstrap", bootstrap_done)
        sched.ps = SimpleNamespace(tp_rank=0, pp_rank=0)  # the ranks the failure paths name (0.5.14 on)
        sched.tp_rank = 0
        sched.tp_worker = SimpleNamespace(get_tp_cpu_group=lambda: None)  # up to 0.4.5: the poll's rank group
        sched.attn_cp_cpu_group = sched.attn_tp_cpu_group = None
        sched.enable_metrics = False  # up to 0.5.12 the failure path asks the scheduler itself
        sched.scheduler_stage_metrics = None  # 0.5.21 on: no stage recorder, as with metrics off
        # 0.5.10 and 0.5.11: the terminal poll measures each finished transfer by the pool's pages and the KV
        # manager's item sizes (one page of one byte: the measure is not observed)
        sched.token_to_kv_pool_allocator = SimpleNamespace(page_size=1)
        sched.disagg_prefill_bootstrap_queue.kv_manager = SimpleNamespace(kv_args=SimpleNamespace(kv_item_lens=[1]))

    def sender(self) -> Any:
        return prefill.STANDINS.make("kv_sender", "sender", abort=Recorder("sender.abort"), poll=self.poll_one,
                                     clear=Recorder("sender.clear"), get_transfer_metric=transfer_metric,
                                     failure_exception=Recorder("sender.failure_exception",
                                                                raises=TransferFailed("probe: transfer failed")))

    def poll_one(self) -> int:
        if self.state in TERMINAL:
            self.events.append("terminal")
        return getattr(prefill.sg.prefill.KVPoll, self.state)  # the states as the tree's result path names them

    def one_rank(self, senders: list, *_groups: Any, **_kwargs: Any) -> list:
        """The all-reduce on one rank: each sender's own poll."""
        return [sender.poll() for sender in senders]

    @contextlib.contextmanager
    def patched(self):
        polls = {name: self.one_rank for name in POLL_NAMES if hasattr(prefill.sg.prefill, name)}
        if hasattr(prefill.sg.prefill, "get_parallel"):
            # 0.5.17 on, the failure paths name the rank from the process's parallel context, which only a
            # server writes: this is rank 0 of one (SGLang's own CPU tests patch it too).
            polls["get_parallel"] = lambda: ONE_RANK
        with super().patched(), swapped(prefill.sg.prefill, **polls):
            yield

    def inflight(self) -> None:
        queue = getattr(self.scheduler, "process_disagg_prefill_inflight_queue", None)
        if queue is None:  # up to 0.4.5: the same queue, spelled infight
            SCENARIOS.adapted("infight-queue-name")
            queue = self.scheduler.process_disagg_prefill_infight_queue
        with self.patched():
            queue()


def bootstrap_done(req: Any) -> bool:
    """The bootstrap queue's answer once a parked request's bootstrap finished: its sender is ready."""
    req.pending_bootstrap = False
    return True


def transfer_metric() -> Any:
    """What the sender tells of its transfer: nothing measured (the tree's own record, where it has one)."""
    try:
        from sglang.srt.disaggregation.base import conn
    except ModuleNotFoundError:  # up to 0.4.5 there is no base package, and no transfer metric
        return None
    metric = getattr(conn, "KVTransferMetric", None)
    return metric() if metric is not None else None


def _released_in_flight(world: World, _req: Any) -> int:
    sent = ended = False
    count = 0
    for event in world.events:
        sent = sent or event == "send"
        ended = ended or event == "terminal"
        count += event == "release" and sent and not ended
    return count


def _sent_after_release(world: World, _req: Any) -> int:
    released = False
    count = 0
    for event in world.events:
        released = released or event == "release"
        count += event == "send" and released
    return count


def _abort_kept(world: World, req: Any) -> bool | None:
    return None if world.abort is None else req.finished_reason is world.abort


MEASURES: dict[str, Callable[[World, Any], Any]] = {
    "release_count": lambda w, r: w.events.count("release"),
    "double_released": lambda w, r: w.events.count("release") > 1,
    "released_in_flight": _released_in_flight,
    "sent_after_release": _sent_after_release,
    "finish_reason": lambda w, r: None if r.finished_reason is None else type(r.finished_reason).__name__,
    "abort_kept": _abort_kept,
}
ALL = tuple(MEASURES)


@dataclass(frozen=True)
class Deliver:
    """The request's final prefill result; ``grammar``: "rejects", "accepts" or None; ``pending``: its bootstrap
    has not finished (the last chunk is not handed over yet); ``aborted``: the request already ended in an abort
    (as a client's abort leaves it) while its result was computed."""
    grammar: str | None
    pending: bool = False
    aborted: bool = False

    def run(self, world: World, req: Any, observed: Observed) -> None:
        if self.aborted:
            req.finished_reason = prefill.sg.FINISH_ABORT()
        try:
            world.deliver(req)
        except prefill.GrammarRejects:  # 0.4.7-0.4.9: the scheduler would stop here; the queue's polls still show the rest
            observed["grammar_error"] = "escapes"
        if self.grammar is not None and not req.grammar.accept_token.count:
            SCENARIOS.adapted("no-grammar-in-result")
            observed["grammar_in_result"] = "absent"
        ended = (self.grammar == "rejects" or self.aborted) and req.finished_reason is not None
        world.abort = req.finished_reason if ended else None


@dataclass(frozen=True)
class Poll:
    """The sender answers ``state`` (a ``KVPoll`` name) and the inflight queue is processed."""
    state: str

    def run(self, world: World, req: Any, observed: Observed) -> None:
        world.state = self.state
        try:
            world.inflight()
        except Exception as exc:  # up to 0.4.6 a failed transfer raises a bare Exception: the scheduler stops there
            if self.state != "Failed" or type(exc) is not Exception:
                raise
            observed["failed_poll"] = "raises"


@dataclass(frozen=True)
class Observe:
    keys: tuple[str, ...]

    def run(self, world: World, req: Any, observed: Observed) -> None:
        observed.update({key: MEASURES[key](world, req) for key in self.keys})


def observe(*keys: str) -> Observe:
    unknown = [key for key in keys if key not in MEASURES]
    if unknown:  # a typo must fail at import, not read as a scenario's error on every tree
        raise KeyError(f"no measure {unknown}; measures: {sorted(MEASURES)}")
    return Observe(keys)


Step = Deliver | Poll | Observe
CONTROL = ("release_count", "released_in_flight", "sent_after_release", "finish_reason")


@dataclass(frozen=True)
class Script:
    id: str
    title: str
    steps: tuple[Step, ...]


SCRIPTS = (
    Script("G1", "grammar rejects the first token after the last chunk was handed over; transferring, then success",
           (Deliver("rejects"), Poll("Transferring"), Poll("Success"), observe(*ALL))),
    Script("G2", "as G1, then a failure poll",
           (Deliver("rejects"), Poll("Transferring"), Poll("Failed"), observe(*ALL))),
    Script("G3", "grammar rejects it before the last chunk (bootstrap pending); the bootstrap completes, then success",
           (Deliver("rejects", pending=True), Poll("WaitingForInput"), Poll("Success"), observe(*ALL))),
    Script("G4", "as G3, then a failure poll",
           (Deliver("rejects", pending=True), Poll("WaitingForInput"), Poll("Failed"), observe(*ALL))),
    Script("G9", "no grammar, the request already aborted while its result was computed; transferring, then success",
           (Deliver(None, aborted=True), Poll("Transferring"), Poll("Success"), observe(*ALL))),
    Script("G6", "control: the grammar accepts, bootstrap done; transferring, then success",
           (Deliver("accepts"), Poll("Transferring"), Poll("Success"), observe(*CONTROL))),
    Script("G7", "control: no grammar; transferring, then success",
           (Deliver(None), Poll("Transferring"), Poll("Success"), observe(*CONTROL))),
    Script("G8", "control: the grammar accepts; a failure poll",
           (Deliver("accepts"), Poll("Failed"), observe(*CONTROL))),
)


def play(script: Script, observed: Observed) -> None:
    """A fresh world and one owned request (KV, metadata buffer), driven through ``script``."""
    world = World()
    deliver = script.steps[0]
    req = prefill.owned_req(pending_bootstrap=deliver.pending)
    req.disagg_kv_sender = world.sender()
    if deliver.grammar is not None:
        prefill.with_grammar(req, rejects=deliver.grammar == "rejects")
    for step in script.steps:
        step.run(world, req, observed)
    prefill.note_optimistic_prefill(observed, deliver.pending)


for _script in SCRIPTS:
    SCENARIOS.scenario(_script.id, _script.title)(functools.partial(play, _script))


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, prepare))
