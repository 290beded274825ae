"""The admission probe sees a fix at every age: its stand-ins answer what older trees call, it names
what a tree lacks, and the registry's rules set the keys observing a missing step aside.

Without SGLang: the probe module is loaded as a cell loads it, driven with stand-in schedulers and
synthetic ``sglang`` trees; the rules are judged against the published bracket results.
"""

from __future__ import annotations

import copy
import json
import sys
from types import SimpleNamespace

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT as ROOT
from pdevidence.documents.vocabulary import Classification
from pdevidence.judge import classify

RETIRING = ("A1", "A2", "A9", "A12")
LACKS = ["no-beam-groups", "no-queued-abort-release", "session-without-inflight"]


@pytest.fixture
def probe(fresh_probe):
    """A fresh copy of the probe module (its adaptations start empty), with SG filled by the test."""
    module = fresh_probe("probe_admission_differential.py")
    module.SG.utils = SimpleNamespace(DisaggregationMode=SimpleNamespace(NULL="null"))
    module.SG.Scheduler = type("Scheduler", (), {})
    module.SG.server_args = None
    return module


def retire_as_0_5_12(self, req):
    """How a backport into 0.5.12 retires: the tree's own release and stream paths."""
    if self.enable_hicache_storage:
        self.tree_cache.release_aborted_request(req.rid)
    self.stream_output([req], req.return_logprob)


def retire_as_today(self, req):
    self.tree_cache.finish(req.cache_request_handle, "abort")
    self.output_streamer.stream_output([req], req.return_logprob)


def request(rid: str, **fields) -> SimpleNamespace:
    """A request as 0.5.20 on carries it: its cache-side handle names its rid (``CacheRequestHandle``)."""
    return SimpleNamespace(rid=rid, cache_request_handle=SimpleNamespace(rid=rid, attempt_id=0), **fields)


def observed_after(probe, retire, **scheduler):
    sched = probe.make_scheduler(**scheduler)
    req = request("probe-req", return_logprob=False, finished_reason=None)
    retire(sched, req)
    return {"released": probe.released(sched, req), "abort_streamed": probe.abort_streamed(sched, req)}


def test_an_older_trees_release_and_stream_are_counted_and_named(probe):
    assert observed_after(probe, retire_as_0_5_12) == {"released": 1, "abort_streamed": 1}
    assert probe.PROBE.adaptations == {"release-aborted-request-by-rid", "scheduler-stream-output"}


def test_todays_release_and_stream_name_nothing(probe):
    assert observed_after(probe, retire_as_today) == {"released": 1, "abort_streamed": 1}
    assert probe.PROBE.adaptations == set()


def test_a_release_by_rid_counts_only_for_the_request_retired(probe):
    sched = probe.make_scheduler()
    req = request("probe-req")
    sched.tree_cache.release_aborted_request("another-req")
    assert probe.released(sched, req) == 0


def test_a_finish_counts_only_for_the_request_retired(probe):
    """Two requests in one scheduler: the other one's finish is not a release of ours."""
    sched = probe.make_scheduler()
    ours, other = request("probe-req"), request("another-req")
    sched.tree_cache.finish(other.cache_request_handle, "abort")
    assert probe.released(sched, ours) == 0
    sched.tree_cache.finish(ours.cache_request_handle, "abort")
    assert probe.released(sched, ours) == 1 and probe.released(sched, other) == 1


def test_null_mode_runs_without_hicache_storage_so_an_older_tree_releases_nothing_there(probe):
    assert observed_after(probe, retire_as_0_5_12, hicache_storage=False) == {"released": 0, "abort_streamed": 1}


def synthetic_tree(tmp_path, *, beam: bool, abort_release: bool, session_module: str, inflight: bool):
    """An ``sglang`` whose Scheduler and streaming Session have (or lack) what the retirement acts on."""
    root = tmp_path / "tree"
    release = "        self.tree_cache.release_aborted_request(req.rid)\n" if abort_release else "        pass\n"
    files = {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/managers/__init__.py": "",
        "sglang/srt/managers/scheduler.py": (
            "class Scheduler:\n"
            + ("    def init_beam_coordinator(self):\n        pass\n" if beam else "")
            + "    def abort_request(self, req):\n" + release),
        f"{session_module.replace('.', '/')}.py": (
            "class Session:\n" + ("    def abort_req(self):\n        pass\n" if inflight else "    pass\n")),
    }
    if session_module.startswith("sglang.srt.session"):
        files["sglang/srt/session/__init__.py"] = ""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def tree_on_path(monkeypatch):
    def put(root):
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(root))
        from sglang.srt.managers.scheduler import Scheduler
        return Scheduler

    yield put
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


@pytest.mark.parametrize("shape, names", [
    (dict(beam=True, abort_release=True, session_module="sglang.srt.session.session_controller", inflight=True), set()),
    (dict(beam=False, abort_release=True, session_module="sglang.srt.session.session_controller", inflight=True),
     {"no-beam-groups"}),
    (dict(beam=False, abort_release=True, session_module="sglang.srt.managers.session_controller", inflight=False),
     {"no-beam-groups", "session-without-inflight"}),
    (dict(beam=False, abort_release=False, session_module="sglang.srt.managers.session_controller", inflight=False),
     set(LACKS)),
], ids=["today", "0.5.11-0.5.18", "0.5.2-0.5.10", "up-to-0.5.1"])
def test_what_the_tree_lacks_is_read_from_the_tree(probe, tmp_path, tree_on_path, shape, names):
    Scheduler = tree_on_path(synthetic_tree(tmp_path, **shape))
    probe.name_what_the_tree_lacks(Scheduler)
    assert probe.PROBE.adaptations == names


@pytest.fixture(scope="module")
def brackets():
    reg = registry.load(ROOT)
    exp = reg.experiment("admission")
    docs = {side: json.loads((ROOT / "results" / f"admission.{side}.release-{exp.releases[side]}.json").read_text())
            for side in ("base", "head")}
    return exp, docs["base"], docs["head"]


def older_tree(doc, version, adaptations, **steps):
    """``doc`` as an older tree would show it: the retiring scenarios' keys for the steps it has not."""
    out = copy.deepcopy(doc)
    out["tree"] = {**out["tree"], "resolved": version}
    out["adaptations"] = sorted(adaptations)
    for sid in RETIRING:
        observed = out["scenarios"][sid]["observed"]
        for key, value in steps.items():
            if key in observed:
                observed[key] = value
    return out


def test_a_backport_without_the_steps_its_tree_lacks_reads_fixed_only_through_the_rules(brackets):
    exp, base, head = brackets
    backport = older_tree(head, "0.4.10", LACKS, group_retired=0, released=0, session_aborted=0,
                          session_detached=False)
    found = classify.classify(backport, base, head, exp)
    assert found.classification is Classification.FIXED
    assert sorted(rule.split(":")[0] for rule in found.not_deciding) == sorted(r.replace("-", "_") for r in LACKS)
    unexplained = older_tree(backport, "0.4.10", [])
    assert classify.classify(unexplained, base, head, exp).classification is Classification.NEITHER


@pytest.mark.parametrize("lacks", LACKS)
def test_each_rule_sets_aside_only_its_own_step(brackets, lacks):
    exp, base, head = brackets
    missing = {"no-beam-groups": {"group_retired": 0}, "no-queued-abort-release": {"released": 0},
               "session-without-inflight": {"session_aborted": 0, "session_detached": False}}
    others = {key: value for name, keys in missing.items() if name != lacks for key, value in keys.items()}
    # The tree lacks one step, yet skips another it has: that is not the fixed code.
    doc = older_tree(head, "0.5.0", [lacks], **missing[lacks], **others)
    assert classify.classify(doc, base, head, exp).classification is Classification.NEITHER
    assert classify.classify(older_tree(head, "0.5.0", [lacks], **missing[lacks]), base, head,
                             exp).classification is Classification.FIXED


def test_a_pristine_older_tree_stays_pre_fix_with_every_rule_holding(brackets):
    exp, base, head = brackets
    assert classify.classify(older_tree(base, "0.4.10", LACKS), base, head, exp).classification \
        is Classification.PRE_FIX


class HiRadixCache04:
    """0.4.10's HiCache tree cache as a retirement reaches it: no `finish`, no `release_aborted_request`
    (0.5.2); the scheduler ends a request's storage prefetch with `check_prefetch_progress(rid)`."""

    def check_prefetch_progress(self, req_id: str):
        raise AssertionError("the real method must never run")


def retire_as_0_4_10_ending_the_prefetch(self, req):
    """A port into 0.4.10 that ends the request's prefetch as that tree's own scheduler does."""
    if self.enable_hicache_storage:
        self.tree_cache.check_prefetch_progress(req.rid)
    self.stream_output([req], req.return_logprob)


def test_a_port_calling_a_method_only_its_tree_s_cache_has_is_recorded_not_an_error(probe):
    probe.STANDINS.found = {"tree_cache": (HiRadixCache04,)}
    sched = probe.make_scheduler()
    req = SimpleNamespace(rid="probe-req", return_logprob=False, finished_reason=None)
    retire_as_0_4_10_ending_the_prefetch(sched, req)  # was an AttributeError inside the stand-in: `unknown`
    assert sched.tree_cache.check_prefetch_progress.calls == [(("probe-req",), {})]
    assert {"released": probe.released(sched, req), "abort_streamed": probe.abort_streamed(sched, req)} == {
        "released": 0, "abort_streamed": 1}
