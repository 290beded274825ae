"""The SWA probes read a hybrid allocator's free lists and mapping; the scenarios read what they record.

No SGLang, no torch: ``probes/_swa.py`` is loaded as a cell loads it, with a list-backed tensor in torch's place
and small allocators written here in place of SGLang's: a paged SWA allocator whose ``free_swa`` frees whole SWA
pages but clears the mapping of the slots it was given only (as the trees before PR #27779), one that clears
every slot of each page it frees (as the fixed ones), and a plain paged allocator (a model without
sliding-window layers). What is tested is the probe's own recording: a page in the free list twice is
``double_freed``, a page handed out while another live request's mapping names it is ``live_page_reissued``, a
kernel without a CPU implementation in its module makes the scenario an error (never an all-clear), and what a
tree lacks is recorded.
"""

from __future__ import annotations

import abc
import sys
import types
from types import SimpleNamespace

import pytest

from conftest import PROJECT

SIZE = 32


# ---------------------------------------------------------------- a tensor where torch would be


class Tensor:
    """A 1-D list of ints with what the probe and the allocators here ask of a tensor (index by slice or tensor)."""

    device = "cpu"

    def __init__(self, data):
        self.data = [int(v) for v in data]

    def _at(self, key):
        if isinstance(key, slice):
            return list(range(len(self.data)))[key]
        return key.data

    def __getitem__(self, key):
        if isinstance(key, int):
            return self.data[key]
        return Tensor([self.data[i] for i in self._at(key)])

    def __setitem__(self, key, value):
        at = self._at(key)
        values = value.data if isinstance(value, Tensor) else [value] * len(at)
        for i, v in zip(at, values):
            self.data[i] = v

    def to(self, dtype):
        return self

    def clone(self):
        return Tensor(self.data)

    def tolist(self):
        return list(self.data)

    def numel(self):
        return len(self.data)

    def __len__(self):
        return len(self.data)


def fake_torch():
    return SimpleNamespace(int64="int64", float16="float16", zeros=lambda shape, dtype=None: Tensor([0] * shape[0]),
                           tensor=lambda data, dtype=None: Tensor(data),
                           cat=lambda tensors: Tensor([v for t in tensors for v in t.data]))


# ---------------------------------------------------------------- allocators written here


class Pages:
    """A paged allocator's free list: pages 1.. free at first; a free puts each page of the slots at the front."""

    def __init__(self, size, page_size, dtype=None, device="cpu", kvcache=None, need_sort=False):
        self.page_size = page_size
        self.size = size
        self.free_pages = Tensor(range(1, size // page_size + 1))
        self.release_pages = Tensor([])

    def alloc(self, need_size):
        count = need_size // self.page_size
        taken, self.free_pages = self.free_pages.data[:count], Tensor(self.free_pages.data[count:])
        return Tensor([p * self.page_size + i for p in taken for i in range(self.page_size)])

    def free(self, free_index):
        pages = sorted({v // self.page_size for v in free_index.data})
        self.free_pages = Tensor(pages + self.free_pages.data)

    def available_size(self):
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens):
        return self.alloc(-(-extend_num_tokens // self.page_size) * self.page_size)[:extend_num_tokens]

    def backup_state(self):
        return Tensor(self.free_pages.data)

    def restore_state(self, state):
        self.free_pages = state


class Pool:
    def __init__(self, size, size_swa, page_size, dtype, head_num, head_dim, swa_attention_layer_ids,
                 full_attention_layer_ids, enable_kvcache_transpose, device):
        self.page_size = page_size


class SWAAllocator:
    """SGLang's hybrid allocator in miniature; ``CLEARS_PAGE``: free_swa clears each freed page's every slot."""

    CLEARS_PAGE = False
    CLEARS_OUTSIDE_TAIL = False

    def __init__(self, size, size_swa, page_size, dtype, device, kvcache, need_sort):
        self.page_size = page_size
        self.full_attn_allocator = Pages(size, page_size)
        self.swa_attn_allocator = Pages(size_swa, page_size)
        self.full_to_swa_index_mapping = Tensor([0] * (size + page_size + 1))

    def alloc(self, need_size):
        full, swa = self.full_attn_allocator.alloc(need_size), self.swa_attn_allocator.alloc(need_size)
        self.full_to_swa_index_mapping[full] = swa
        return full

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens):
        need = -(-extend_num_tokens // self.page_size) * self.page_size
        return self.alloc(need)[:extend_num_tokens]

    def alloc_extend_swa_tail(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                              extend_num_tokens, swa_tail_len):
        full = self.full_attn_allocator.alloc(-(-extend_num_tokens // self.page_size) * self.page_size)
        swa = self.swa_attn_allocator.alloc(-(-swa_tail_len // self.page_size) * self.page_size)
        tail = Tensor(full.data[extend_num_tokens - swa_tail_len:extend_num_tokens])
        self.full_to_swa_index_mapping[tail] = Tensor(swa.data[:swa_tail_len])
        if self.CLEARS_OUTSIDE_TAIL:
            self.full_to_swa_index_mapping[Tensor(full.data[:extend_num_tokens - swa_tail_len])] = 0
        return Tensor(full.data[:extend_num_tokens])

    def backup_state(self):
        return [Tensor(self.full_attn_allocator.free_pages.data), Tensor(self.swa_attn_allocator.free_pages.data)]

    def restore_state(self, state):
        self.full_attn_allocator.free_pages, self.swa_attn_allocator.free_pages = state

    def free_swa(self, free_index):
        given = free_index.data
        if self.CLEARS_PAGE:
            given = [p * self.page_size + i for p in sorted({v // self.page_size for v in given})
                     for i in range(self.page_size)]
        swa = [v for v in self.full_to_swa_index_mapping[Tensor(given)].data if v > 0]
        self.swa_attn_allocator.free(Tensor(swa))
        self.full_to_swa_index_mapping[Tensor(given)] = 0

    def free(self, free_index):
        self.full_attn_allocator.free(free_index)
        self.free_swa(free_index)
        assert self.swa_attn_allocator.available_size() <= self.swa_attn_allocator.size

    def full_available_size(self):
        return self.full_attn_allocator.available_size()

    def swa_available_size(self):
        return self.swa_attn_allocator.available_size()


class FixedSWAAllocator(SWAAllocator):
    CLEARS_PAGE = True


class TailSWAAllocator(SWAAllocator):
    """swa_free's base, swa_tail's head: the tail allocation clears the mapping outside the tail."""

    CLEARS_OUTSIDE_TAIL = True


class TokenSWAAllocator(SWAAllocator):
    """A token-granular tree's allocator: no page size to give."""

    def __init__(self, size, size_swa, dtype, device, kvcache, need_sort):
        super().__init__(size, size_swa, 1, dtype, device, kvcache, need_sort)


class MHAPool:
    def __init__(self, size, page_size, dtype, head_num, head_dim, layer_num, device, enable_memory_saver):
        pass


class Paged(Pages):
    pass


KERNEL = object()  # the Triton kernel's place in the fake module


def naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, device):
    """Stands for the module's own CPU implementation: only that it was called is read here."""


class Req:
    def __init__(self, rid, text, input_ids, sampling_params):
        self.rid, self.origin_input_ids = rid, input_ids


class Queue:
    """A decode prealloc queue's ``_pre_alloc`` in miniature; ``TAIL``: the tree allocates SWA for the tail only."""

    TAIL = True

    def _pre_alloc(self, req):
        alloc, n = self.token_to_kv_pool_allocator, len(req.origin_input_ids)
        one, lens, last = Tensor([0]), Tensor([n]), Tensor([-1])
        if alloc.page_size == 1 or not hasattr(alloc, "alloc_extend_swa_tail"):
            return alloc.alloc(n)
        if self.TAIL:
            return alloc.alloc_extend_swa_tail(one, one, lens, lens, last, n, self.scheduler.sliding_window_size)
        return alloc.alloc_extend(one, one, lens, lens, last, n)


class WholeQueue(Queue):
    TAIL = False


class Rows:
    def __init__(self, size, max_context_len, device, enable_memory_saver):
        pass


@pytest.fixture
def swa(fresh_probe, monkeypatch):
    """The probe module with ``_swa.sg`` set as ``prepare()`` sets it, on the allocators written here."""
    def load(allocator=SWAAllocator, kernel_module=True, probe="free", queue=Queue):
        probe = fresh_probe(f"probe_swa_{probe}_differential.py")
        module = types.SimpleNamespace(alloc_extend_naive=naive, alloc_extend_kernel=KERNEL,
                                       __name__="fake.paged") if kernel_module else None
        monkeypatch.setattr(probe._swa, "sg", SimpleNamespace(
            ready=True, torch=fake_torch(), scenarios=probe.SCENARIOS, Allocator=allocator, Pool=Pool,
            Paged=Paged, MHAPool=MHAPool, kernel_module=module, naive=naive if kernel_module else None,
            Queue=queue, Req=Req, SamplingParams=lambda **kw: None, ReqToTokenPool=Rows))
        return probe
    return load


def played(probe, sid):
    observed = {}
    probe.play(next(s for s in probe.SCRIPTS if s.id == sid), observed)
    return observed


# ---------------------------------------------------------------- the scenarios on the allocators here


def test_f1_a_sibling_slot_frees_the_page_again_where_its_mapping_was_left(swa):
    base, head = played(swa(SWAAllocator), "F1"), played(swa(FixedSWAAllocator), "F1")
    assert base == {"swa_free_first": SIZE, "stale_mapping_first": 3, "swa_free": SIZE + 4, "double_freed": 1}
    assert head == {"swa_free_first": SIZE, "stale_mapping_first": 0, "swa_free": SIZE, "double_freed": 0}


def test_f2_the_finishing_free_is_refused_by_the_allocator_s_own_check_after_freeing_again(swa):
    base, head = played(swa(SWAAllocator), "F2"), played(swa(FixedSWAAllocator), "F2")
    assert (base["free_refused"], base["double_freed"], base["swa_free"]) == ("AssertionError", 1, SIZE + 4)
    assert (head["free_refused"], head["double_freed"], head["swa_free"], head["full_free"]) == (None, 0, SIZE, SIZE)


def test_f3_the_page_freed_twice_goes_to_two_live_requests(swa):
    base, head = played(swa(SWAAllocator), "F3"), played(swa(FixedSWAAllocator), "F3")
    # base: B gets the page A's stale mapping still names, then C gets it again while B holds it
    assert (base["live_page_reissued"], base["double_freed"]) == (2, 0)
    assert (head["live_page_reissued"], head["swa_free"]) == (0, SIZE - 8)


@pytest.mark.parametrize("sid", ["F4", "F5", "F6"])
def test_the_controls_read_alike_on_both_allocators(swa, sid):
    assert played(swa(SWAAllocator), sid) == played(swa(FixedSWAAllocator), sid)
    assert played(swa(SWAAllocator), sid)["double_freed"] == 0


def test_an_extend_allocation_records_the_module_s_cpu_implementation_as_an_adaptation(swa):
    probe = swa()
    seen = []
    extend = SWAAllocator.alloc_extend

    def watched(self, *args):
        seen.append(probe._swa.sg.kernel_module.alloc_extend_kernel)
        return extend(self, *args)

    SWAAllocator.alloc_extend = watched
    try:
        played(probe, "F1")
    finally:
        SWAAllocator.alloc_extend = extend
    assert probe.SCENARIOS.adaptations == {"alloc-extend-naive"}
    assert [type(k).__name__ for k in seen] == ["NaiveLaunch"]  # answered during the call that launches it
    assert probe._swa.sg.kernel_module.alloc_extend_kernel is KERNEL  # and the tree's own kernel back after


def test_a_kernel_without_a_cpu_implementation_is_the_scenario_s_error_never_an_observation(swa):
    probe = swa(kernel_module=False)
    with pytest.raises(probe._swa.CannotRunOnCpu, match="alloc_extend_kernel.*no alloc_extend_naive"):
        played(probe, "F1")
    assert played(probe, "F5")["double_freed"] == 0  # page size 1 needs no kernel


def test_the_naive_launch_passes_the_kernel_s_arguments_by_the_implementation_s_names():
    sys.path.insert(0, str(PROJECT / "probes"))
    import _swa

    seen = {}

    def cpu(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, device):
        seen.update(prefix_lens=prefix_lens, page_size=page_size, device=device, out=out_indices)

    out = Tensor([0, 0])
    _swa.NaiveLaunch(cpu)[(1,)]("p", "s", "l", "f", out, 2, 4, 16)
    assert seen == {"prefix_lens": "p", "page_size": 4, "device": "cpu", "out": out}


@pytest.mark.parametrize("lacks, fact", [(dict(Allocator=None), "swa_allocator"), (dict(Pool=None), "swa_allocator")])
def test_a_tree_without_the_hybrid_pool_records_it_and_the_scenario_stops(swa, lacks, fact):
    probe = swa()
    for name, value in lacks.items():
        setattr(probe._swa.sg, name, value)
    assert played(probe, "F1") == {fact: "absent"}


@pytest.mark.parametrize("lacks", [dict(Paged=None), dict(MHAPool=None)])
def test_a_tree_without_the_paged_allocator_records_it_in_the_plain_control_and_the_swa_scenarios_run(swa, lacks):
    probe = swa()
    for name, value in lacks.items():
        setattr(probe._swa.sg, name, value)
    assert played(probe, "F6") == {"paged_allocator": "absent"}
    assert played(probe, "F1")["double_freed"] == 1


def test_a_paged_allocator_without_a_page_aligned_alloc_is_recorded_in_the_plain_control(swa):
    probe = swa()
    probe._swa.sg.Paged = type("ExtendOnlyPagedAllocator", (), {"alloc_extend": lambda self, *args: None})
    assert played(probe, "F6") == {"paged_alloc": "absent"}


def test_a_token_granular_swa_allocator_records_no_paged_swa_and_still_runs_the_page_1_control(swa):
    probe = swa(TokenSWAAllocator)
    assert played(probe, "F1") == {"paged_swa": "absent"}
    assert played(probe, "F5")["double_freed"] == 0


def test_the_registry_expects_the_keys_the_probe_records_and_declares_the_kernel_it_answers(swa):
    from pdevidence import registry

    exp = registry.load(PROJECT).experiment("swa_free")
    probe = swa(FixedSWAAllocator)
    for sid, expect in exp.expect.items():
        assert set(expect.head) <= set(played(probe, sid)), sid
    assert {cpu for cpu, _ in exp.cpu_kernels.values()} == {probe._swa.NAIVE}
    assert {kernel.rpartition(":")[2] for kernel in exp.cpu_kernels} == {probe._swa.KERNEL}
    assert {kernel.partition(":")[0] for kernel in exp.cpu_kernels} == set(probe._swa.PAGED_AT)


def test_a_page_size_above_1_enters_the_path_and_page_size_1_or_no_hybrid_pool_does_not():
    from pdevidence import registry

    needs = registry.load(PROJECT).experiment("swa_free").needs
    assert needs.unmet({"page_size": 4, "disable_hybrid_swa_memory": False}) == []
    assert needs.unmet({"page_size": 1, "disable_hybrid_swa_memory": False}) == ["page_size"]
    assert needs.unmet({"page_size": 64, "disable_hybrid_swa_memory": True}) == ["disable_hybrid_swa_memory"]
    assert needs.undefined({"disable_hybrid_swa_memory": False}) == ["page_size"]
    assert needs.wanted()["page_size"] == ["> 1"] and "sliding-window" in needs.assumes


@pytest.mark.sglang
def test_real_base_frees_a_sibling_s_page_again_and_head_never(release_matrix):
    """Alone proves, on the real bracket (0.5.13, 0.5.14) with the module's own CPU allocation: the base frees an
    SWA page a second time through a sibling slot whose mapping it left, and hands that page to two live requests;
    the head clears the page's every slot and never does; the controls read alike."""
    observed = {}
    for side in ("base", "head"):
        doc = release_matrix.result("swa_free", side)
        assert all(sc["error"] is None for sc in doc["scenarios"].values()), doc["scenarios"]
        assert doc["adaptations"] == ["alloc-extend-naive"]
        observed[side] = {sid: sc["observed"] for sid, sc in doc["scenarios"].items()}
    base, head = observed["base"], observed["head"]
    assert (base["F1"]["double_freed"], base["F3"]["live_page_reissued"]) == (1, 2)
    assert (head["F1"]["double_freed"], head["F3"]["live_page_reissued"]) == (0, 0)
    assert base["F2"]["free_refused"] == "AssertionError" and head["F2"]["free_refused"] is None
    assert all(base[sid] == head[sid] for sid in ("F4", "F5", "F6"))


# ---------------------------------------------------------------- swa_tail: the decode preallocation


def test_t1_a_preallocation_over_a_draft_s_recycled_page_keeps_its_mapping_outside_the_tail(swa):
    base, head = (played(swa(SWAAllocator, probe="tail"), "T1"), played(swa(TailSWAAllocator, probe="tail"), "T1"))
    assert (base["swa_taken"], base["swa_mapped"]) == (4, 8)
    assert (head["swa_taken"], head["swa_mapped"]) == (4, 4)


def test_t3_the_slide_gives_the_tail_s_page_back_under_the_request_and_its_finish_frees_it_again(swa):
    base, head = (played(swa(SWAAllocator, probe="tail"), "T3"), played(swa(TailSWAAllocator, probe="tail"), "T3"))
    assert (base["live_in_free_after_slide"], base["live_page_reissued"], base["double_freed"]) == (1, 1, 1)
    assert (head["live_in_free_after_slide"], head["live_page_reissued"], head["double_freed"]) == (0, 0, 0)
    assert head["swa_free"] == SIZE - 4  # B still holds its page


@pytest.mark.parametrize("sid", ["T4", "T5", "T6"])
def test_the_tail_controls_read_alike_on_both_allocators(swa, sid):
    assert played(swa(SWAAllocator, probe="tail"), sid) == played(swa(TailSWAAllocator, probe="tail"), sid)


def test_a_preallocation_that_takes_swa_for_every_token_records_no_tail_and_stops(swa):
    probe = swa(SWAAllocator, probe="tail", queue=WholeQueue)
    assert played(probe, "T1") == {"swa_taken": 8, "tail_prealloc": "absent"}
    assert "live_page_reissued" in played(probe, "T6")  # the controls conclude nothing of it and run on


def test_the_registry_expects_the_keys_the_tail_probe_records(swa):
    from pdevidence import registry

    exp = registry.load(PROJECT).experiment("swa_tail")
    probe = swa(TailSWAAllocator, probe="tail")
    for sid, expect in exp.expect.items():
        assert set(expect.head) <= set(played(probe, sid)), sid
    assert exp.needs.unmet({"disaggregation_mode": "prefill", "page_size": 4,
                            "disable_hybrid_swa_memory": False}) == ["disaggregation_mode"]


@pytest.mark.sglang
def test_real_base_preallocation_hands_a_live_tail_page_on_and_head_never(release_matrix):
    """Alone proves, on the real bracket (0.5.12, 0.5.13) through the tree's own DecodePreallocQueue._pre_alloc:
    after an MTP draft's pages went back by restore_state, the base preallocation leaves the recycled full page
    naming the tail's SWA page, the window slide frees that page under the live request, the next request gets
    it and the finish frees it again; the head maps the tail only and never does; the controls read alike."""
    observed = {}
    for side in ("base", "head"):
        doc = release_matrix.result("swa_tail", side)
        assert all(sc["error"] is None for sc in doc["scenarios"].values()), doc["scenarios"]
        assert doc["adaptations"] == ["alloc-extend-naive"]
        observed[side] = {sid: sc["observed"] for sid, sc in doc["scenarios"].items()}
    base, head = observed["base"], observed["head"]
    assert (base["T1"]["swa_mapped"], base["T3"]["live_page_reissued"], base["T3"]["double_freed"]) == (8, 1, 1)
    assert (head["T1"]["swa_mapped"], head["T3"]["live_page_reissued"], head["T3"]["double_freed"]) == (4, 0, 0)
    assert all(base[sid] == head[sid] for sid in ("T4", "T5", "T6"))


class AbstractPool(Pool, abc.ABC):
    """0.4.9.post1-post2's SWA pool: a method of its base declared abstract and not written."""

    @abc.abstractmethod
    def backup_to_host_all_layer(self, host_pool, layer_id, event): ...


def test_a_pool_that_cannot_be_built_is_recorded_where_a_scenario_needs_it(swa, monkeypatch):
    """swa_free's F6 (no SWA layers) still runs; swa_tail's scenarios all record it (they control its path)."""
    free, tail = swa(TailSWAAllocator, probe="free"), swa(TailSWAAllocator, probe="tail")
    monkeypatch.setattr(free._swa.sg, "Pool", AbstractPool)
    assert played(free, "F1") == {"swa_pool": "abstract"}
    assert "swa_pool" not in played(free, "F6")
    assert all(played(tail, script.id) == {"swa_pool": "abstract"} for script in tail.SCRIPTS)


def test_a_token_granular_tree_records_no_paged_swa_in_every_tail_scenario_the_controls_too(swa):
    probe = swa(TokenSWAAllocator, probe="tail")
    assert all(played(probe, script.id) == {"paged_swa": "absent"} for script in probe.SCRIPTS)


class NoRestoreSWAAllocator(TailSWAAllocator):
    """From 0.5.17: the allocator keeps no state to restore (drafts are allocated otherwise)."""

    backup_state = restore_state = property(lambda self: (_ for _ in ()).throw(AttributeError("no such method")))


def test_an_allocator_without_restore_takes_the_draft_back_by_free_and_the_deciding_keys_are_observed(swa):
    probe = swa(NoRestoreSWAAllocator, probe="tail")
    assert played(probe, "T1") == {"draft_restore": "absent", "swa_taken": 4, "swa_mapped": 4, "live_in_free": 0}
    assert played(probe, "T3")["double_freed"] == 0


class NoRestoreNoClearSWAAllocator(SWAAllocator):
    """No state to restore, and free leaves the mapping of the slots it frees: a recycled page still names an
    SWA page, which the tail allocation (no clear) leaves to the preallocated request."""

    backup_state = restore_state = NoRestoreSWAAllocator.backup_state

    def free(self, free_index):
        self.full_attn_allocator.free(free_index)
        self.swa_attn_allocator.free(Tensor([v for v in self.full_to_swa_index_mapping[free_index].data if v > 0]))


def test_a_free_that_leaves_the_mapping_reads_as_the_base_where_no_restore_exists(swa):
    assert played(swa(NoRestoreNoClearSWAAllocator, probe="tail"), "T1")["swa_mapped"] == 8
