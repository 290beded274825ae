"""The war_barrier probe records where the schedule stream waits for the forward, on miniature overlap loops.

No SGLang, no torch: ``sglang.srt.managers.scheduler`` (with its ``dispatch_event_loop`` and the PD loops as
methods, as the mixins give them), the disaggregation mode, the speculative algorithm and ``Envs`` are written
here, shaped as the releases': a scheduler without a barrier (0.5.12), one whose barrier opens each iteration
behind ``is_cuda()`` (0.5.13), and one that waits right after each launch, forced on elsewhere by the variable
and on the read-done event where the forward publishes one (0.5.16 on).
"""

from __future__ import annotations

import enum
import json
import os
import sys
import types

import pytest

from conftest import PROJECT

ENABLE, COARSE = "SGLANG_ENABLE_WAR_BARRIER", "SGLANG_FORCE_COARSE_WAR_BARRIER"


class DisaggregationMode(enum.Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class SpeculativeAlgorithm(enum.Enum):
    NONE = 0
    DFLASH = 1


def is_cuda() -> bool:
    return True


class Base:
    """The loops' shape: receive, (decode: preallocate), schedule (the getter), launch, process the last."""

    barrier = None  # None: no barrier; "start": each iteration's start; "after": right after each launch
    old = False  # up to 0.5.3: a dummy first batch to the results, the PD queues measured, the running batch reset

    def run_event_loop(self):
        self.schedule_stream = self.device_module.Stream(priority=0)
        if self.barrier is not None:
            platform = sys.modules["sglang.srt.managers.scheduler"]  # the flags as the probe sets them
            self._war_barrier_enabled = platform.is_cuda() or (self.barrier == "after" and os.environ.get(ENABLE) == "true")
        with self.device_module.StreamContext(self.schedule_stream):
            dispatch_event_loop(self)

    def _apply(self):
        if not getattr(self, "_war_barrier_enabled", False):
            return
        runner = self.model_worker.last_shared_read_runner
        ev = runner.shared_read_done_event
        runner.shared_read_done_event = None
        if ev is not None and os.environ.get(COARSE) != "true":
            self.schedule_stream.wait_event(ev)
        else:
            self.schedule_stream.wait_stream(self.forward_stream)

    def _loop(self, getter, prealloc=False):
        self.result_queue = []
        while True:
            self.request_receiver.recv_requests()
            if prealloc:
                self.process_decode_queue()
            if self.barrier == "start":
                self._apply()
            batch = getattr(self, getter)(running_batch=self.running_batch).batch_to_run
            if batch:
                result = self.run_batch(batch)
                if self.barrier == "after":
                    self._apply()
                self.result_queue.append((batch.copy(), result))
                if self.old and self.last_batch is None:
                    self.process_batch_result(types.SimpleNamespace(reqs=None), None)
            if self.last_batch:
                self.process_batch_result(*self.result_queue.pop(0))
            if self.old and (len(self.disagg_decode_transfer_queue.queue) + len(self.disagg_decode_prealloc_queue.queue)
                             + len(self.disagg_prefill_inflight_queue)):
                raise AssertionError("the probe's PD queues hold no request")
            if self.old and getter == "get_next_disagg_prefill_batch_to_run":
                self.running_batch.batch_is_full = False
            self.last_batch = batch

    def event_loop_overlap(self):
        self._loop("get_next_batch_to_run")

    def event_loop_overlap_disagg_decode(self):
        self._loop("get_next_disagg_decode_batch_to_run", prealloc=True)

    def event_loop_overlap_disagg_prefill(self):
        self._loop("get_next_disagg_prefill_batch_to_run")


def dispatch_event_loop(scheduler):
    mode = scheduler.disaggregation_mode
    if mode == DisaggregationMode.NULL:
        scheduler.event_loop_overlap()
    elif mode == DisaggregationMode.PREFILL:
        scheduler.event_loop_overlap_disagg_prefill()
    else:
        scheduler.event_loop_overlap_disagg_decode()


TREES = {"0.5.3": None, "0.5.12": None, "0.5.13": "start", "0.5.16": "after"}


def load_tree(load, monkeypatch, version: str):
    """The probe (loaded by ``load``, as a cell loads it), on the miniature tree of ``version``."""
    scheduler = types.ModuleType("sglang.srt.managers.scheduler")
    scheduler.Scheduler = type("Scheduler", (Base,), {"barrier": TREES[version], "old": version == "0.5.3"})
    scheduler.dispatch_event_loop = dispatch_event_loop
    scheduler.is_cuda = is_cuda
    modules = {"sglang": types.ModuleType("sglang"), "sglang.srt": types.ModuleType("sglang.srt"),
               "sglang.srt.managers.scheduler": scheduler,
               "sglang.srt.disaggregation.decode": types.ModuleType("decode"),
               "sglang.srt.disaggregation.prefill": types.ModuleType("prefill"),
               "sglang.srt.disaggregation.utils": types.SimpleNamespace(DisaggregationMode=DisaggregationMode),
               "sglang.srt.speculative.spec_info": types.SimpleNamespace(SpeculativeAlgorithm=SpeculativeAlgorithm),
               "sglang.srt.server_args": types.SimpleNamespace(ServerArgs=lambda **kw: types.SimpleNamespace(**kw))}
    modules["sglang"].__version__ = version
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    found = load("probe_war_barrier_differential.py")
    monkeypatch.setattr(found, "publish_server_args", lambda *a, **k: None)  # the miniature has no runtime context
    assert found.prepare() == version
    return found


def test_a_tree_without_pd_has_its_plain_loop_driven_and_no_pd_loop(fresh_probe, monkeypatch):
    """0.4.4.post1 and before: no PD package (no disaggregation mode, no PD loops), the plain overlap loop called
    directly: it runs, unfenced where it has no barrier; the PD loops' scenarios record ``loop: "absent"``."""
    scheduler = types.ModuleType("sglang.srt.managers.scheduler")
    scheduler.Scheduler = type("Scheduler", (), {"barrier": None, "old": True, "_loop": Base._loop,
                                                 "event_loop_overlap": Base.event_loop_overlap})
    scheduler.is_cuda = is_cuda
    modules = {"sglang": types.ModuleType("sglang"), "sglang.srt": types.ModuleType("sglang.srt"),
               "sglang.srt.managers.scheduler": scheduler, "sglang.srt.disaggregation.utils": None,
               "sglang.srt.disaggregation.decode": None, "sglang.srt.disaggregation.prefill": None,
               "sglang.srt.speculative.spec_info": types.SimpleNamespace(SpeculativeAlgorithm=SpeculativeAlgorithm),
               "sglang.srt.server_args": types.SimpleNamespace(ServerArgs=lambda **kw: types.SimpleNamespace(**kw))}
    modules["sglang"].__version__ = "0.4.4.post1"
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    found = fresh_probe("probe_war_barrier_differential.py")
    monkeypatch.setattr(found, "publish_server_args", lambda *a, **k: None)
    monkeypatch.setattr(found, "lacks_pd", lambda: True)
    assert found.prepare() == "0.4.4.post1"
    seen = observed(found)
    assert {sid: o["loop"] for sid, o in seen.items()} == \
        {run.id: "plain" if run.loop == "plain" else "absent" for run in found.RUNS}
    assert (seen["W1"]["forwards"], seen["W1"]["waits"], seen["W1"]["war_wait_before_write"]) == (3, 0, False)
    assert "overlap_loop_called_directly" in found.SCENARIOS.adaptations


@pytest.fixture
def probe(fresh_probe, monkeypatch, request):
    """The probe, on a miniature tree (``request.param``: its version)."""
    return load_tree(fresh_probe, monkeypatch, request.param)


def observed(probe) -> dict[str, dict]:
    kit = sys.modules["_probekit"]
    found = {sc.id: kit.run_scenario(sc) for sc in probe.SCENARIOS.scenarios}
    assert all(r["error"] is None for r in found.values()), found
    return {sid: r["observed"] for sid, r in found.items()}


@pytest.mark.parametrize("probe", ["0.5.3", "0.5.12"], indirect=True)
def test_without_a_barrier_no_loop_waits_and_every_write_after_a_launch_is_unfenced(probe):
    found = observed(probe)
    assert {sid: o["loop"] for sid, o in found.items() if sid in ("W1", "W2", "W3")} == \
        {"W1": "plain", "W2": "decode", "W3": "prefill"}
    for o in found.values():
        assert (o["forwards"], o["waits"], o["war_wait_before_write"], o["wait_placement"]) == (3, 0, False, "none")
        assert o["results"] == 2  # the earlier launches' results; 0.5.3's dummy first batch is none
    assert found["W2"]["prealloc_fenced"] is False and found["W12"]["waits_on_read_done"] is False


@pytest.mark.parametrize("probe", ["0.5.13"], indirect=True)
def test_a_barrier_behind_is_cuda_waits_on_cuda_only_before_each_iterations_writes(probe):
    found = observed(probe)
    for sid in ("W1", "W2", "W3", "W12", "W13", "W14"):
        assert (found[sid]["waits"], found[sid]["war_wait_before_write"], found[sid]["wait_placement"]) == \
            (3, True, "before_schedule"), sid
    for sid in ("W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11"):  # the tree's flags as a non-CUDA server's
        assert (found[sid]["waits"], found[sid]["war_wait_before_write"]) == (0, False), sid
    # The decode queue preallocates before the iteration's wait: not fenced behind the last launch.
    assert found["W2"]["prealloc_fenced"] is False


@pytest.mark.parametrize("probe", ["0.5.16"], indirect=True)
def test_a_barrier_after_each_launch_fences_the_prealloc_and_reads_both_variables(probe):
    found = observed(probe)
    assert (found["W1"]["wait_placement"], found["W2"]["prealloc_fenced"]) == ("after_launch", True)
    assert (found["W4"]["waits"], found["W7"]["waits"], found["W9"]["war_wait_before_write"]) == (0, 3, True)
    assert (found["W12"]["waits_on_read_done"], found["W13"]["waits_on_read_done"]) == (True, False)


@pytest.mark.parametrize("probe", ["0.5.13"], indirect=True)
def test_the_platform_and_environment_are_put_back_after_each_scenario(probe, monkeypatch):
    monkeypatch.setenv(ENABLE, "operator's")
    observed(probe)
    assert sys.modules["sglang.srt.managers.scheduler"].is_cuda is is_cuda
    assert os.environ[ENABLE] == "operator's"


@pytest.mark.parametrize("probe", ["0.5.13"], indirect=True)
def test_a_tree_without_dflash_records_so(probe, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_info",
                        types.SimpleNamespace(SpeculativeAlgorithm=enum.Enum("SpeculativeAlgorithm", "NONE EAGLE")))
    (w14,) = [sc for sc in probe.SCENARIOS.scenarios if sc.id == "W14"]
    assert sys.modules["_probekit"].run_scenario(w14)["observed"] == {"dflash": "absent"}


def recorded(fresh_probe, version: str) -> dict:
    """The result document the probe writes on the miniature of ``version``."""
    with pytest.MonkeyPatch.context() as mp:
        found = load_tree(fresh_probe, mp, version)
        kit = sys.modules["_probekit"]
        tree = {"kind": "release", "ref": version, "resolved": version}
        return json.loads(kit.dumps(kit.build_document(found.SCENARIOS, version, tree)))


def test_the_registry_judges_the_recorded_trees_by_side(fresh_probe):
    """The miniatures' observations through the registry's expectations: 0.5.3 and 0.5.12 pre-fix, 0.5.13 and
    0.5.16 fixed (the placement set aside, the later variables' scenarios too)."""
    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("war_barrier")
    docs = {version: recorded(fresh_probe, version) for version in TREES}
    base, head = docs["0.5.12"], docs["0.5.13"]
    assert {v: judge(doc, base, head, exp).classification.value for v, doc in docs.items()} == \
        {"0.5.3": "pre-fix", "0.5.12": "pre-fix", "0.5.13": "fixed", "0.5.16": "fixed"}


def test_pd_loops_are_set_aside_only_where_observed_absent(fresh_probe):
    """A tree without the PD overlap loops (up to 0.4.5.post2: their scenarios record ``loop: "absent"``) is judged
    on its plain loop: pre-fix there stays pre-fix. A PD loop that is there but waits for nothing is never set
    aside: the plain loop's barrier alone is no all-clear."""
    from pdevidence import registry
    from pdevidence.judge.classify import judge

    exp = registry.load(PROJECT).experiment("war_barrier")
    docs = {version: recorded(fresh_probe, version) for version in ("0.5.12", "0.5.13")}
    base, head = docs["0.5.12"], docs["0.5.13"]
    absent = {"loop": "absent", "forwards": 0, "results": 0, "waits": 0, "war_wait_before_write": None,
              "wait_placement": "none"}

    def tree(plain: dict, pd: dict | None) -> dict:
        doc = json.loads(json.dumps(plain))
        for sid in ("W2", "W3", "W5", "W6", "W8", "W9", "W14"):
            doc["scenarios"][sid]["observed"] = dict(absent) if pd is None else pd["scenarios"][sid]["observed"]
        return doc

    assert judge(tree(base, None), base, head, exp).classification.value == "pre-fix"
    assert judge(tree(head, None), base, head, exp).classification.value == "fixed"
    assert judge(tree(head, base), base, head, exp).classification.value != "fixed"


@pytest.mark.parametrize("probe", ["0.5.16"], indirect=True)
def test_a_stream_the_world_lacks_is_an_error_never_a_pass_through(probe, monkeypatch):
    """A loop waiting on a stream this world does not make (here ``copy_stream``) raises: were it a pass-through,
    its waits would go unrecorded and the tree read pre-fix."""
    scheduler = sys.modules["sglang.srt.managers.scheduler"].Scheduler
    monkeypatch.setattr(scheduler, "_apply", lambda self: self.copy_stream.wait_stream(self.forward_stream))
    (w1,) = [sc for sc in probe.SCENARIOS.scenarios if sc.id == "W1"]
    assert sys.modules["_probekit"].run_scenario(w1)["error"]["type"] == "AttributeError"
