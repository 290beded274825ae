"""The decode-offload probes' stand-ins record what a manager gives back, and when; the scenarios read it.

No SGLang, no torch: ``probes/_offload.py`` is loaded as a cell loads it, with a list-backed tensor
in torch's place and small managers written here in place of SGLang's (one that gives slots back
early, as the trees before PR #24226 do, and one that waits, as the fixed ones do; one keyed by
rid, as before PR #37026, and one keyed by request). What is tested is the probe's own recording:
a slot given back while it is still in an unfinished request's row is ``live``, one a copy not yet
acknowledged still reads is ``in_flight``, a row released so is counted, and what a tree lacks is
recorded as absent.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest


# ---------------------------------------------------------------- a tensor where torch would be


class Tensor:
    """Just what the stand-ins and the managers here ask of a tensor of slot indices (1-D or 2-D)."""

    def __init__(self, data):
        self.data = data

    def _rows(self) -> bool:
        return bool(self.data) and isinstance(self.data[0], list)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            row, cols = key
            return Tensor(self.data[row][cols])
        item = self.data[key]
        return Tensor(list(item)) if isinstance(item, list) else item

    def __setitem__(self, row, value):
        self.data[row] = list(value.data)

    def __add__(self, other):
        return Tensor([x + other for x in self.data])

    def tolist(self):
        return [list(r) for r in self.data] if self._rows() else list(self.data)

    def clone(self):
        return Tensor(self.tolist())

    def long(self):
        return self

    def dim(self):
        return 2 if self._rows() else 1

    def numel(self):
        return sum(len(r) for r in self.data) if self._rows() else len(self.data)

    def __len__(self):
        return len(self.data)


def fake_torch():
    def zeros(shape, dtype=None):
        rows, cols = shape
        return Tensor([[0] * cols for _ in range(rows)])

    def arange(start, stop=None, dtype=None):
        start, stop = (0, start) if stop is None else (start, stop)
        return Tensor(list(range(start, stop)))

    return SimpleNamespace(zeros=zeros, arange=arange, int64="int64",
                           distributed=SimpleNamespace(get_world_size=lambda group=None: 1))


# ---------------------------------------------------------------- requests and managers written here


class Req:
    def __init__(self, rid, text, ids, sampling_params):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(ids), []
        self.finished_reason = None
        self.req_pool_idx = None

    def finished(self):
        return self.finished_reason is not None


PAGE = 4


class Manager:
    """A decode offload manager in miniature. ``early``: slots go back while the request decodes and
    on the first acknowledgement at finish (the trees before #24226); else only at the release, once
    no copy is in flight. ``by_rid``: progress and in-flight counts keyed by rid (before #37026)."""

    early = False
    by_rid = False

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, tp_group, tree_cache, server_args):
        self.pool, self.allocator = req_to_token_pool, token_to_kv_pool_allocator
        self.cache_controller = MODULE.HiCacheController()
        self.state, self.inflight, self.ongoing, self.counter = {}, {}, {}, 0

    def _key(self, req):
        return req.rid if self.by_rid else id(req)

    def offload_kv_cache(self, req) -> bool:
        if not req.output_ids:
            return False
        row = self.pool.req_to_token[req.req_pool_idx]
        prefill = len(req.origin_input_ids) // PAGE * PAGE
        done = self.state.setdefault(self._key(req), [0])
        new = (len(req.origin_input_ids) + len(req.output_ids) - 1 - prefill - done[0]) // PAGE * PAGE
        if new <= 0:
            return False
        if self.early and done[0] == 0 and prefill:
            self.allocator.free(row[:prefill])
        start = prefill + done[0]
        self.counter += 1
        self.cache_controller.write(device_indices=row[start:start + new].long(), node_id=self.counter)
        self.ongoing[self.counter] = (req, start, start + new)
        self.inflight[self._key(req)] = self.inflight.get(self._key(req), 0) + 1
        done[0] += new
        return True

    def check_offload_progress(self):
        queue = self.cache_controller.ack_write_queue
        while queue:
            _, event, ids = queue.pop(0)
            event.synchronize()
            for ack_id in ids:
                req, start, end = self.ongoing.pop(ack_id)
                self.inflight[self._key(req)] -= 1
                if not req.finished() and self.early:
                    self.allocator.free(self.pool.req_to_token[req.req_pool_idx, start:end])
                if req.finished() and (self.early or not self.inflight[self._key(req)]):
                    self._release(req)

    def finalize_release_on_finish(self, req):
        if not self.early and self.inflight.get(self._key(req)):
            return
        self._release(req)

    def _release(self, req):
        if req.req_pool_idx is None:
            return
        committed = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        self.allocator.free(self.pool.req_to_token[req.req_pool_idx, :committed])
        self.pool.free(req)
        self.state.pop(self._key(req), None)


class EarlyManager(Manager):
    early = True


class RidManager(Manager):
    by_rid = True


MODULE = SimpleNamespace(HiCacheController=None)


@pytest.fixture
def offload(fresh_probe, monkeypatch):
    """``_offload`` loaded as a cell loads it, its ``sg`` filled as ``prepare`` fills it on a tree that
    offloads while decoding; the probes loaded after it import this copy."""
    module = fresh_probe("_offload.py")
    monkeypatch.setitem(sys.modules, "_offload", module)
    module.sg.__dict__.update(
        torch=fake_torch(), module=MODULE, Manager=Manager, Req=Req, SamplingParams=lambda **kw: None,
        FINISH_ABORT=lambda: "abort", FINISH_LENGTH=lambda length: f"length {length}", ReqKvInfo=None,
        kv_on_record=False, KVPool=lambda: "mha", server_args=None, option=True, unobserved=None,
        decode_offload=module.DecodeOffload.PRESENT, ready=True)
    monkeypatch.setattr(MODULE, "HiCacheController", None)
    return module


# ---------------------------------------------------------------- the stand-ins' recording


def test_a_slot_given_back_from_a_decoding_request_s_row_is_live_and_after_finish_is_not(offload):
    world = offload.World()
    req = world.new_req("r", row=0, prompt=10)
    world.decode(req, 1, offload=False)
    world._free(world.req_to_token[0, 0:2])
    req.finished_reason = "done"
    world._free(world.req_to_token[0, 2:4])
    assert [f["live"] for f in world.frees] == [True, True, False, False]
    assert world.freed(live=True) == 2 and world.freed() == 4


def test_only_slots_of_the_committed_length_are_live(offload):
    world = offload.World()
    world.new_req("r", row=0, prompt=10)
    world._free([100 + 9, 100 + 10])  # position 9 is committed, 10 is not yet
    assert [f["live"] for f in world.frees] == [True, False]


def test_a_slot_a_copy_still_reads_is_in_flight_until_the_copy_lands(offload):
    world = offload.World()
    req = world.new_req("r", row=0, prompt=10)
    world.controller.write(device_indices=world.req_to_token[0, 8:12], node_id=1)
    req.finished_reason = "done"
    world._free(world.req_to_token[0, 8:10])
    world.writes[0]["landed"] = True
    world._free(world.req_to_token[0, 10:12])
    assert [f["in_flight"] for f in world.frees] == [True, True, False, False]
    assert world.freed(in_flight=True) == 2 and world.freed(live=True) == 0


def test_a_slot_given_back_twice_is_a_double_free(offload):
    world = offload.World()
    world.new_req("r", row=0, prompt=10)
    world._free([100, 101])
    world._free([101, 102, 101])
    assert world.double_freed() == 2


def test_releasing_a_row_clears_the_request_s_index_and_records_a_copy_reading_it(offload):
    world = offload.World()
    req = world.new_req("r", row=0, prompt=10)
    world.controller.write(device_indices=world.req_to_token[0, 8:12], node_id=1)
    world.phase = "finish"
    world._free_row(req)
    assert req.req_pool_idx is None
    assert world.rows_released == [{"row": 0, "phase": "finish", "in_flight": True}]


def test_free_kv_row_gives_each_range_back_through_the_allocator(offload):
    world = offload.World()
    world.new_req("r", row=1, prompt=10)
    world._free_kv_row(SimpleNamespace(req_pool_idx=1), [(0, 2), (8, 10)])
    assert [f["slot"] for f in world.frees] == [200, 201, 208, 209]


def test_a_landed_write_is_acknowledged_in_either_shape_the_manager_unpacks(offload):
    world = offload.World()
    world.controller.write(device_indices=world.req_to_token[0, 0:4], node_id=7)
    world.controller.write(device_indices=world.req_to_token[0, 4:8], node_id=8)
    world.manager.check_offload_progress = lambda: None
    world.land(1)
    (ack,) = world.controller.ack_write_queue
    _, event, ids = ack
    assert ids == [7] and ack.node_ids == [7] and ack.finish_event is event
    assert [w["landed"] for w in world.writes] == [True, False] and world.phase == "ack"


def test_an_exception_of_the_manager_is_recorded_by_type_not_raised(offload):
    world = offload.World()

    def broken(req):
        raise AssertionError("popped twice")

    assert world.call("progress", broken, None) is None
    assert world.error() == "progress:AssertionError"


def test_what_a_tree_lacks_is_recorded_as_absent(offload):
    observed = {}
    assert offload.tree_facts(observed)
    assert observed == {"decode_offload": "present"}
    offload.sg.decode_offload = offload.DecodeOffload.ABSENT  # observed: offloads at finish only
    observed = {}
    assert not offload.tree_facts(observed)
    assert observed == {"decode_offload": "absent"}
    offload.sg.option = False  # the tree's server cannot be asked to offload decode KV
    observed = {}
    assert not offload.tree_facts(observed)
    assert observed == {"offload_manager": "absent"}


def test_what_could_not_be_observed_is_the_scenario_s_error_never_an_absence(offload):
    offload.sg.unobserved = "whether the tree offloads while decoding cannot be observed: it raised"
    observed = {}
    with pytest.raises(offload.CannotObserve, match="cannot be observed: it raised"):
        offload.tree_facts(observed)
    assert observed == {}


# ---------------------------------------------------------------- whether a tree offloads while decoding


class StepReq:
    """Just what the decode steps written here ask of a request."""

    def __init__(self, rid, text, ids, sampling_params):
        self.limit, self.output_ids, self.finished_reason = sampling_params.max_new_tokens, [], None

    def finished(self):
        return self.finished_reason is not None

    def check_finished(self):
        if len(self.output_ids) >= self.limit:
            self.finished_reason = "length"


def is_finished(req):
    return req.finished()


class Step:
    """A decode step's output processing in miniature, as trees write it: append the token, check the finish,
    offload, stream; state it does not set (metrics here) is the stand-in's."""

    while_decoding = True

    def process_batch_result_decode(self, batch, result):
        manager = self.decode_offload_manager  # an alias of the manager
        for req, token in zip(batch.reqs, result.next_token_ids):
            req.output_ids.append(token)
            req.check_finished()
            if (self.server_args.disaggregation_decode_enable_offload_kvcache
                    # a comment between the guard and the call; a helper for finished()
                    and not is_finished(req) and self.while_decoding):
                manager.offload_kv_cache(req)
            if req.finished() and not manager.offload_kv_cache(req):
                manager.finalize_release_on_finish(req)
        self.metrics.num_generated_tokens += len(batch.reqs)
        self.stream_output(batch.reqs, batch.return_logprob)


class AtFinishOnly(Step):
    while_decoding = False


class Raises(Step):
    def process_batch_result_decode(self, batch, result):
        raise KeyError("a collaborator the step needs")


class NeverOffloads(Step):
    def process_batch_result_decode(self, batch, result):
        for req, token in zip(batch.reqs, result.next_token_ids):
            req.output_ids.append(token)
            req.check_finished()


@pytest.fixture
def decode_step(fresh_probe, monkeypatch):
    """``_decode_step`` loaded as a cell loads it; ``observe(processor)`` runs it on ``processor`` as the tree's."""
    module = fresh_probe("_decode_step.py")
    tree = SimpleNamespace()
    monkeypatch.setitem(sys.modules, "probe_tree_output", tree)
    monkeypatch.setattr(module, "OUTPUT_PROCESSORS", ("probe_tree_output:Processor",))
    sg = SimpleNamespace(Req=StepReq, SamplingParams=SimpleNamespace,
                         server_args=SimpleNamespace(disaggregation_decode_enable_offload_kvcache=True),
                         torch=SimpleNamespace(tensor=list), SPEC_NONE="none")

    def observe(processor):
        tree.Processor = processor
        return module.observe(sg, lambda **attrs: SimpleNamespace(finalize_release_on_finish=lambda req: None,
                                                                  **attrs))

    observe.module = module
    return observe


def test_a_tree_that_asks_the_manager_to_offload_a_decoding_request_offloads_while_decoding(decode_step):
    """However the call is written (an alias, a helper, a comment in the guard): what counts is the call made."""
    assert decode_step(Step) is decode_step.module.DecodeOffload.PRESENT


def test_a_tree_that_asks_only_at_finish_is_observed_to_offload_at_finish_only(decode_step):
    assert decode_step(AtFinishOnly) is decode_step.module.DecodeOffload.ABSENT


@pytest.mark.parametrize(("processor", "why"), [
    (Raises, "step raised KeyError"),
    (NeverOffloads, "never asked the offload manager to offload"),
])
def test_a_step_that_cannot_tell_is_no_answer_never_an_absence(decode_step, processor, why):
    with pytest.raises(decode_step.module.CannotObserve, match=why):
        decode_step(processor)


def test_a_tree_without_any_output_processor_is_no_answer(decode_step, monkeypatch):
    monkeypatch.setattr(decode_step.module, "OUTPUT_PROCESSORS", ("probe_no_such_module:Processor",))
    with pytest.raises(decode_step.module.CannotObserve, match="no process_batch_result_decode"):
        decode_step(Step)


def test_anything_reads_as_false_empty_and_zero_and_answers_every_call(decode_step):
    thing = decode_step.module.Anything("scheduler.metrics")
    thing.count += 3
    assert not thing.enabled and not thing() and list(thing.items()) == [] and thing.count == 3


# ---------------------------------------------------------------- the scenarios on managers written here


def scenario(fresh_probe, filename, sid, manager, offload):
    """One scenario of a probe, as the kit runs it, on ``manager``; what it observed."""
    probe = fresh_probe(filename)
    offload.sg.Manager = manager
    (found,) = [s for s in probe.SCENARIOS.scenarios if s.id == sid]
    observed = {}
    found.run(observed)
    return observed


@pytest.mark.parametrize("manager, expected", [
    (EarlyManager, {"freed_while_decoding": 8, "freed_on_ack_while_decoding": 4, "live_freed": 12}),
    (Manager, {"freed_while_decoding": 0, "freed_on_ack_while_decoding": 0, "live_freed": 0}),
])
def test_o1_counts_the_slots_given_back_under_a_decoding_request(fresh_probe, offload, manager, expected):
    observed = scenario(fresh_probe, "probe_offload_slots_differential.py", "O1", manager, offload)
    assert {k: observed[k] for k in expected} == expected
    assert observed["offload_written"] == 1 and observed["manager_error"] is None


@pytest.mark.parametrize("manager, in_flight", [(EarlyManager, 4), (Manager, 0)])
def test_o2_counts_the_slots_released_under_a_copy_still_in_flight(fresh_probe, offload, manager, in_flight):
    observed = scenario(fresh_probe, "probe_offload_slots_differential.py", "O2", manager, offload)
    assert observed["offload_written"] == 2
    assert observed["in_flight_freed"] == in_flight
    assert observed["row_released_in_flight"] == int(bool(in_flight))
    assert observed["rows_released"] == 1


@pytest.mark.parametrize("manager, expected", [
    (EarlyManager, {"freed_at_finish": 12, "row_released_in_flight": 1, "double_freed": 8}),
    (Manager, {"freed_at_finish": 0, "row_released_in_flight": 0, "double_freed": 0}),
])
def test_o4_sees_the_row_released_at_an_abort_under_a_copy_in_flight(fresh_probe, offload, manager, expected):
    observed = scenario(fresh_probe, "probe_offload_slots_differential.py", "O4", manager, offload)
    assert {k: observed[k] for k in expected} == expected and observed["rows_released"] == 1


@pytest.mark.parametrize("manager, radix_freed", [(EarlyManager, 4), (Manager, 0)])
def test_o5_counts_the_radix_owned_slots_given_back_while_decoding(fresh_probe, offload, manager, radix_freed):
    observed = scenario(fresh_probe, "probe_offload_slots_differential.py", "O5", manager, offload)
    assert observed["radix_freed_while_decoding"] == radix_freed


def test_a_script_observing_a_key_no_measure_reads_fails_where_it_is_written(fresh_probe, offload):
    probe = fresh_probe("probe_offload_slots_differential.py")
    assert probe.observe("live_freed", "manager_error").keys == ("live_freed", "manager_error")
    with pytest.raises(KeyError, match="no measure.*freed_whilst_decoding"):
        probe.observe("live_freed", "freed_whilst_decoding")


def test_o6_control_a_request_without_output_is_released_whole_once(fresh_probe, offload):
    for manager in (EarlyManager, Manager):
        observed = scenario(fresh_probe, "probe_offload_slots_differential.py", "O6", manager, offload)
        assert observed == {"decode_offload": "present", "offload_written": 0, "live_freed": 0,
                            "in_flight_freed": 0, "freed_total": 10, "double_freed": 0, "rows_released": 1,
                            "manager_error": None}


@pytest.mark.parametrize("manager, old_released_on_ack", [(RidManager, 0), (Manager, 1)])
def test_r1o_sees_the_old_request_held_back_by_a_new_one_with_its_rid(fresh_probe, offload, manager,
                                                                       old_released_on_ack):
    observed = scenario(fresh_probe, "probe_offload_rid_differential.py", "R1o", manager, offload)
    assert observed["old_released_on_ack"] == old_released_on_ack
    assert observed["double_freed"] == 0 and not any(key.startswith("new_") for key in observed)


def test_r1_sees_the_new_request_and_only_it(fresh_probe, offload):
    """R1 and R1o run one sequence; each keeps one request's keys, so a fix of one side only reads partial."""
    observed = scenario(fresh_probe, "probe_offload_rid_differential.py", "R1", Manager, offload)
    assert observed["new_freed"] == 17 and observed["double_freed"] == 0
    assert not any(key.startswith("old_") for key in observed)


def test_r2_control_a_new_rid_is_untouched_by_rid_keying(fresh_probe, offload):
    observed = {m: scenario(fresh_probe, "probe_offload_rid_differential.py", "R2", m, offload)
                for m in (RidManager, Manager)}
    assert observed[RidManager] == observed[Manager]
    assert observed[Manager]["old_released_on_ack"] == 1 and observed[Manager]["new_first_write_start"] == 8


def test_a_tree_without_the_offload_option_runs_no_scenario_past_the_fact(fresh_probe, offload):
    offload.sg.option = False
    for filename, sid in (("probe_offload_slots_differential.py", "O1"), ("probe_offload_rid_differential.py", "R1")):
        assert scenario(fresh_probe, filename, sid, Manager, offload) == {"offload_manager": "absent"}


def test_a_manager_counting_no_copies_in_flight_is_named_and_one_that_counts_is_not(fresh_probe, offload):
    class Counting(Manager):
        def _has_inflight_offload(self, req):
            return bool(self.inflight.get(self._key(req)))

    observed = {m: scenario(fresh_probe, "probe_offload_rid_differential.py", "R4o", m, offload)
                for m in (Manager, Counting)}
    assert observed[Manager]["inflight_wait"] == "absent"
    assert "inflight_wait" not in observed[Counting]
    assert observed[Counting]["old_released_on_ack"] == 1 and observed[Counting]["old_released"] == 1
