"""The retract_resume probe's world reads whose transfer a request's metadata came from; the scenarios read it.

No SGLang, no torch: ``probes/_retract.py`` is loaded as a cell loads it, with a list-backed tensor in torch's
place and a decode side in miniature written here in place of SGLang's: metadata buffers whose ``get_buf`` hands
out views into the slot (as before PR #23346) or copies (as after), a slot allocator, a transfer queue that
commits what landed and gives the slot back, a retraction and a resumption. What is tested is the probe's own
recording: a request holding what another transfer wrote is ``other``, its own ``own``, nothing ``none``, a value
no transfer sent ``neither``; and what a tree lacks is recorded, never driven.
"""

from __future__ import annotations

import sys
from collections import deque
from types import SimpleNamespace

import pytest


class Tensor:
    """A 1-D tensor over a shared list: an index into a 2-D buffer is a view of its row, ``clone`` a copy."""

    def __init__(self, data: list):
        self.data = data

    def __getitem__(self, key):
        return self.data[key]

    def __setitem__(self, key, value):
        self.data[key] = value

    def reshape(self, *shape):
        return self

    def clone(self):
        return Tensor(list(self.data))

    def copy_(self, other):
        self.data[:len(other.data)] = other.data
        return self


def fake_torch():
    def full(shape, value, dtype=None):
        return Tensor([value] * shape[0])

    def arange(start, stop, dtype=None):
        return Tensor(list(range(start, stop)))

    def tensor(data, dtype=None):
        return Tensor(list(data))

    return SimpleNamespace(full=full, arange=arange, tensor=tensor, float32="float32", int64="int64",
                           distributed=SimpleNamespace(all_reduce=None, get_world_size=None))


# ---------------------------------------------------------------- a decode side in miniature


class Req:
    def __init__(self, rid, text, ids, sampling_params):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(ids), []
        self.hidden_states_tensor = self.output_topk_p = self.output_topk_index = None
        self.req_pool_idx = None
        self.kv_cache_cpu = None

    def offload_kv_cache(self, req_to_token_pool, allocator):
        self.kv_cache_cpu = allocator.get_cpu_copy(self.req_pool_idx)

    def load_kv_cache(self, req_to_token_pool, allocator):
        allocator.load_cpu_copy(self.kv_cache_cpu, self.req_pool_idx)
        self.kv_cache_cpu = None

    def reset_for_retract(self):
        self.req_pool_idx = None


class MetadataBuffers:
    """Slots of output id, top-k and hidden states; ``copies``: ``get_buf`` returns copies (the fix)."""

    copies = False

    def __init__(self, size, hidden_size, hidden_states_dtype, max_top_logprobs_num=128):
        self.output_ids = [Tensor([0] * 16) for _ in range(size)]
        self.output_topk_p = [Tensor([0.0] * 16) for _ in range(size)]
        self.output_topk_index = [Tensor([0] * 16) for _ in range(size)]
        self.output_hidden_states = [Tensor([0.0] * hidden_size) for _ in range(size)]

    def get_buf(self, idx):
        rows = (self.output_ids[idx], self.output_topk_p[idx], self.output_topk_index[idx],
                self.output_hidden_states[idx])
        return tuple(row.clone() for row in rows) if self.copies else rows

    def set_buf(self, req):
        idx = req.metadata_buffer_index
        self.output_ids[idx][0] = req.output_ids[0]
        if req.hidden_states_tensor is not None:
            self.output_topk_p[idx].copy_(req.output_topk_p)
            self.output_topk_index[idx].copy_(req.output_topk_index)
            self.output_hidden_states[idx].copy_(req.hidden_states_tensor)


class CopyingBuffers(MetadataBuffers):
    copies = True


class ReqToMetadataIdxAllocator:
    def __init__(self, size):
        self.free_slots = deque(range(size))

    def available_size(self):
        return len(self.free_slots)

    def alloc(self):
        return self.free_slots.popleft() if self.free_slots else None

    def free(self, idx):
        self.free_slots.append(idx)


class DecodeRequest:
    def __init__(self, req, kv_receiver, metadata_buffer_index):
        self.req, self.kv_receiver, self.metadata_buffer_index = req, kv_receiver, metadata_buffer_index


class DecodeTransferQueue:
    """Commits what landed; ``frees``: gives the slot back."""

    frees = True

    def __init__(self, gloo_group, req_to_metadata_buffer_idx_allocator, tp_rank, metadata_buffers, scheduler,
                 tree_cache):
        self.queue, self.allocator, self.buffers = [], req_to_metadata_buffer_idx_allocator, metadata_buffers
        self.spec_algorithm = scheduler.spec_algorithm

    def add(self, decode_req):
        self.queue.append(decode_req)

    def pop_transferred(self):
        done = [d for d in self.queue if d.kv_receiver.poll() == "Success"]
        for d in done:
            output_id, topk_p, topk_index, hidden = self.buffers.get_buf(d.metadata_buffer_index)
            d.req.output_ids.append(output_id[0])
            if not self.spec_algorithm.is_none():
                d.req.output_topk_p, d.req.output_topk_index, d.req.hidden_states_tensor = topk_p, topk_index, hidden
            if self.frees:
                self.allocator.free(d.metadata_buffer_index)
        self.queue = [d for d in self.queue if d not in done]
        return [d.req for d in done]


class LeakingTransferQueue(DecodeTransferQueue):
    """A transfer queue that never gives a committed request's slot back (the ``slot_never_freed`` mutant)."""

    frees = False


class DecodeReqToTokenPool:
    def __init__(self, size, max_context_len, device, enable_memory_saver, pre_alloc_size=0):
        self.free_rows = list(range(size))

    def alloc(self, reqs):
        for req in reqs:
            req.req_pool_idx = self.free_rows.pop(0)
        return [req.req_pool_idx for req in reqs]

    def available_size(self):
        return len(self.free_rows)

    def free(self, req):
        self.free_rows.append(req.req_pool_idx)


class DecodePreallocQueue:
    def _pre_alloc(self, req):
        self.req_to_token_pool.alloc([req])

    def resume_retracted_reqs(self):
        resumed = []
        for req in self.retracted_queue:
            self._pre_alloc(req)
            req.load_kv_cache(self.req_to_token_pool, self.token_to_kv_pool_allocator)
            resumed.append(req)
        self.retracted_queue = []
        return resumed


class ScheduleBatch:
    def release_req(self, idx, remaining, server_args):
        req = self.reqs[idx]
        req.offload_kv_cache(self.req_to_token_pool, self.token_to_kv_pool_allocator)
        self.req_to_token_pool.free(req)
        req.reset_for_retract()


class InlineRetractBatch:
    """A tree before 0.5.3: no ``release_req``."""


class Spec:
    def __init__(self, none: bool):
        self.none = none

    def is_none(self):
        return self.none


def tree(buffers: type = MetadataBuffers, batch: type = ScheduleBatch, transfer: type = DecodeTransferQueue) -> dict:
    decode = SimpleNamespace(DecodeTransferQueue=transfer, DecodeRequest=DecodeRequest,
                             DecodeReqToTokenPool=DecodeReqToTokenPool, DecodePreallocQueue=DecodePreallocQueue)
    utils = SimpleNamespace(MetadataBuffers=buffers, ReqToMetadataIdxAllocator=ReqToMetadataIdxAllocator)
    return dict(torch=fake_torch(), decode=decode, utils=utils, Req=Req, SamplingParams=lambda **kw: None,
                ScheduleBatch=batch, KVPoll=SimpleNamespace(Success="Success", WaitingForInput="Waiting"),
                SPEC={True: Spec(False), False: Spec(True)}, server_args=None, ready=True, missing=None)


@pytest.fixture
def retract(fresh_probe, monkeypatch):
    """``_retract`` loaded as a cell loads it, its ``sg`` filled as ``prepare`` fills it; the probe loaded after it
    imports this copy."""
    module = fresh_probe("_retract.py")
    monkeypatch.setitem(sys.modules, "_retract", module)
    module.sg.__dict__.update(tree(), adapt=lambda name: None)
    return module


def scenario(fresh_probe, retract, sid: str, **parts) -> tuple[dict, set[str]]:
    """One scenario of the probe, as the kit runs it, on the tree ``parts`` make; what it observed, and the
    adaptations it named."""
    probe = fresh_probe("probe_retract_resume_differential.py")
    retract.sg.__dict__.update(tree(**parts), adapt=probe.SCENARIOS.adapted)
    (found,) = [s for s in probe.SCENARIOS.scenarios if s.id == sid]
    observed = {}
    found.run(observed)
    return observed, probe.SCENARIOS.adaptations


OTHER = {"hidden_owner": "other", "output_id_owner": "own"}
OWN = {"hidden_owner": "own", "output_id_owner": "own"}
TOPK_OTHER = {"topk_owner": "other", "topk_p_owner": "other"}
TOPK_OWN = {"topk_owner": "own", "topk_p_owner": "own"}
# the slots free once each script ran: every committed request's given back; M1w's and M3's B holds its slot
SLOTS_FREE = {"M1": 1, "M1k": 1, "M1w": 0, "M2": 1, "M3": 0, "M4": 1, "M5": 2, "M6": 1}


# ---------------------------------------------------------------- the world's recording


def test_a_view_of_a_reused_slot_reads_the_next_request_s_transfer(retract):
    world = retract.World(slots=1)
    world.admit("A"), world.land("A"), world.commit()
    assert world.hidden_owner("A") == "own"
    world.admit("B"), world.land("B")
    assert world.requests["B"].slot == world.requests["A"].slot == 0
    assert (world.hidden_owner("A"), world.topk_owner("A"), world.output_id_owner("A")) == ("other", "other", "own")


def test_a_copy_keeps_the_request_s_own_transfer(retract):
    retract.sg.utils.MetadataBuffers = CopyingBuffers
    world = retract.World(slots=1)
    world.admit("A"), world.land("A"), world.commit()
    world.admit("B"), world.land("B")
    assert (world.hidden_owner("A"), world.topk_p_owner("A")) == ("own", "own")


def test_nothing_held_is_none_and_a_value_no_transfer_sent_is_neither(retract):
    world = retract.World(slots=1)
    world.admit("A")
    assert world.hidden_owner("A") == "none" and world.output_id_owner("A") == "none"
    world.requests["A"].req.hidden_states_tensor = Tensor([0.0])  # a slot zeroed, or never written
    assert world.hidden_owner("A") == "neither"


def test_a_transfer_not_landed_is_not_committed(retract):
    world = retract.World(slots=1)
    world.admit("A")
    world.commit()
    assert world.requests["A"].req.output_ids == [] and list(world.meta_allocator.free_slots) == []


def test_a_retraction_offloads_and_a_resumption_reloads_through_the_boundary(retract):
    world = retract.World(slots=1)
    world.admit("A"), world.land("A"), world.commit()
    world.retract("A")
    assert world.requests["A"].req.req_pool_idx is None and world.prealloc.retracted_queue == [world.requests["A"].req]
    world.resume("A")
    assert world.allocator.get_cpu_copy.count == 1 and world.allocator.load_cpu_copy.count == 1
    assert world.requests["A"].req.req_pool_idx is not None


def test_a_resumption_that_leaves_the_request_retracted_is_an_error_never_an_answer(retract, monkeypatch):
    world = retract.World(slots=1)
    world.admit("A"), world.land("A"), world.commit()
    world.retract("A")
    monkeypatch.setattr(DecodePreallocQueue, "resume_retracted_reqs", lambda self: [])
    with pytest.raises(retract.CannotDrive, match="did not resume A"):
        world.resume("A")


def test_a_request_finding_no_slot_free_waits_and_its_transfer_never_lands(retract):
    world = retract.World(slots=1)
    world.admit("A")
    assert world.slots_free() == 0
    world.admit("B"), world.land("B")
    assert list(world.requests) == ["A"] and world.slots_free() == 0
    world.land("A"), world.commit()
    assert world.slots_free() == 1 and world.hidden_owner("A") == "own"


def test_a_tree_without_metadata_buffers_cannot_build_a_world(retract):
    retract.sg.utils = SimpleNamespace(ReqToMetadataIdxAllocator=ReqToMetadataIdxAllocator)
    assert retract.metadata_buffers_absent()
    with pytest.raises(retract.CannotDrive, match="no MetadataBuffers"):
        retract.World(slots=1)


# ---------------------------------------------------------------- the scenarios


@pytest.mark.parametrize("sid", ["M1", "M1w", "M2", "M3"])
@pytest.mark.parametrize("buffers, expected", [(MetadataBuffers, OTHER), (CopyingBuffers, OWN)])
def test_the_changing_scenarios_read_views_as_other_and_copies_as_own(fresh_probe, retract, sid, buffers, expected):
    observed, _ = scenario(fresh_probe, retract, sid, buffers=buffers)
    assert observed == expected | {"slots_free": SLOTS_FREE[sid]}


class HiddenCopyingBuffers(MetadataBuffers):
    """A port copying the hidden states only: the top-k still handed out as views."""

    def get_buf(self, idx):
        output_id, topk_p, topk_index, hidden = super().get_buf(idx)
        return output_id, topk_p, topk_index, hidden.clone()


@pytest.mark.parametrize("buffers, expected", [(MetadataBuffers, TOPK_OTHER), (CopyingBuffers, TOPK_OWN),
                                               (HiddenCopyingBuffers, TOPK_OTHER)])
def test_m1k_reads_the_top_k_apart_from_the_hidden_states(fresh_probe, retract, buffers, expected):
    observed, _ = scenario(fresh_probe, retract, "M1k", buffers=buffers)
    assert observed == expected | {"slots_free": 1}
    assert scenario(fresh_probe, retract, "M1", buffers=buffers)[0]["hidden_owner"] == (
        "other" if buffers is MetadataBuffers else "own")


@pytest.mark.parametrize("sid", ["M4", "M5"])
@pytest.mark.parametrize("buffers", [MetadataBuffers, CopyingBuffers])
def test_the_controls_read_own_with_views_and_copies(fresh_probe, retract, sid, buffers):
    observed, _ = scenario(fresh_probe, retract, sid, buffers=buffers)
    assert observed == OWN | TOPK_OWN | {"slots_free": SLOTS_FREE[sid]}


def test_m6_without_speculative_decoding_holds_no_top_k_or_hidden_states(fresh_probe, retract):
    observed, _ = scenario(fresh_probe, retract, "M6")
    assert observed == {"hidden_owner": "none", "topk_owner": "none", "topk_p_owner": "none",
                        "output_id_owner": "own", "slots_free": 1}


@pytest.mark.parametrize("sid", sorted(SLOTS_FREE))
def test_a_slot_never_given_back_is_observed_not_raised(fresh_probe, retract, sid):
    """The next request finds no slot free and waits: every scenario records, none free. A (copies) still holds its
    own: ``slots_free`` alone tells, save in M1w and M3, whose B holds the one slot on base and head too."""
    observed, _ = scenario(fresh_probe, retract, sid, buffers=CopyingBuffers, transfer=LeakingTransferQueue)
    assert observed["slots_free"] == 0
    assert {k: v for k, v in observed.items() if k != "slots_free"} == (
        {"hidden_owner": "none", "topk_owner": "none", "topk_p_owner": "none", "output_id_owner": "own"}
        if sid == "M6" else {k: "own" for k in observed if k != "slots_free"})


def test_a_tree_without_release_req_retracts_inline_and_says_so(fresh_probe, retract):
    observed, adaptations = scenario(fresh_probe, retract, "M1", batch=InlineRetractBatch)
    assert observed == OTHER | {"slots_free": 1} and adaptations == {"retract-inline"}
    _, adaptations = scenario(fresh_probe, retract, "M1")
    assert adaptations == set()


def test_a_tree_without_metadata_buffers_records_the_fact_in_every_metadata_scenario(fresh_probe, retract):
    probe = fresh_probe("probe_retract_resume_differential.py")
    retract.sg.utils = SimpleNamespace()
    for found in [s for s in probe.SCENARIOS.scenarios if s.id.startswith("M")]:
        observed = {}
        found.run(observed)
        assert observed == {"metadata_buffers": "absent"}


# ---------------------------------------------------------------- the index-key half, in miniature


class T:
    """A list-backed tensor, enough for ``_index_keys``: a row of a 2-D table (``[row, :n]``), gathers and scatters
    by a tensor of indices (a copy, as torch's), ``[::step]``, ``// n``, a flat ``tolist``."""

    def __init__(self, data: list):
        self.data = data

    def _at(self, key):
        if isinstance(key, tuple):
            row, cols = key
            return self.data[row].data, cols
        return self.data, key

    def __getitem__(self, key):
        data, key = self._at(key)
        if isinstance(key, T):
            return T([data[i].clone() if isinstance(data[i], T) else data[i] for i in key.data])
        return T(data[key]) if isinstance(key, slice) else data[key]

    def __setitem__(self, key, value):
        data, key = self._at(key)
        if isinstance(key, slice):
            data[key] = list(value.data)
            return
        for n, i in enumerate(key.data if isinstance(key, T) else [key]):
            fill = value.data[n] if isinstance(value, T) else value
            if isinstance(data[i], T):
                data[i].data = list(fill.data) if isinstance(fill, T) else [fill] * len(data[i].data)
            else:
                data[i] = fill

    def __floordiv__(self, n):
        return T([x // n for x in self.data])

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)

    def clone(self):
        return T([x.clone() if isinstance(x, T) else x for x in self.data])

    def tolist(self):
        return [y for x in self.data for y in (x.tolist() if isinstance(x, T) else [x])]

    def reshape(self, *shape):
        return self

    def to(self, *args, **kwargs):
        return self

    float = to


PAGE = 64


class MLAPool:
    """A pool before PR #23346: ``get_cpu_copy`` offloads the latent KV only; the index buffer stays on device."""

    def __init__(self, size, page_size, kv_lora_rank, dtype, qk_rope_head_dim, layer_num, device, index_head_dim,
                 enable_memory_saver, kv_cache_dim):
        assert page_size == PAGE and index_head_dim == 128
        self.kv_buffer = [T([0] * (size + page_size))]
        self.index_buffer = [T([T([0] * 4) for _ in range(size // page_size + 1)])]

    def get_index_k_with_scale_buffer(self, layer_id):
        return self.index_buffer[layer_id]

    def get_cpu_copy(self, indices, mamba_indices=None):
        return self.kv_buffer[0][indices]

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None):
        self.kv_buffer[0][indices] = kv_cache_cpu


class NSAPool(MLAPool):
    """The fix: the index keys of the request's pages offloaded and restored with its KV."""

    def get_cpu_copy(self, indices, mamba_indices=None):
        return {"kv": super().get_cpu_copy(indices), "index_k": self.index_buffer[0][indices[::PAGE] // PAGE]}

    def load_cpu_copy(self, kv_cache_cpu_dict, indices, mamba_indices=None):
        super().load_cpu_copy(kv_cache_cpu_dict["kv"], indices)
        self.index_buffer[0][indices[::PAGE] // PAGE] = kv_cache_cpu_dict["index_k"]


class NSAPoolWithoutMamba(NSAPool):
    """0.5.12's pool: its ``get_cpu_copy`` takes no ``mamba_indices``, which the allocator hands it."""

    def get_cpu_copy(self, indices):
        return super().get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu_dict, indices):
        return super().load_cpu_copy(kv_cache_cpu_dict, indices)


class BrokenNSAPool(NSAPool):
    """A pool that takes ``mamba_indices`` and raises TypeError of its own: a failure, never an observation."""

    def get_cpu_copy(self, indices, mamba_indices=None):
        raise TypeError("a pool's own bug")


class PagedAllocator:
    """Pages handed out in order; with ``need_sort`` a freed page waits until the free list runs out."""

    def __init__(self, size, page_size, dtype, device, kvcache, need_sort):
        self.kvcache, self.page_size = kvcache, page_size
        self.free_pages, self.released = list(range(1, size // page_size + 1)), []

    def alloc(self, need_size):
        pages = need_size // self.page_size
        if pages > len(self.free_pages):
            self.free_pages, self.released = sorted(self.free_pages + self.released), []
        if pages > len(self.free_pages):
            return None
        taken, self.free_pages = self.free_pages[:pages], self.free_pages[pages:]
        return T([page * self.page_size + i for page in taken for i in range(self.page_size)])

    def free(self, locs):
        self.released += sorted({loc // self.page_size for loc in locs})

    def get_cpu_copy(self, indices, mamba_indices=None):
        return self.kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None):
        return self.kvcache.load_cpu_copy(kv_cache_cpu, indices, mamba_indices=mamba_indices)


class ReqToTokenPool:
    def __init__(self, size, max_context_len, device, enable_memory_saver, pre_alloc_size=0):
        self.req_to_token = T([T([0] * max_context_len) for _ in range(size)])


class IndexReq(Req):
    """A request whose retraction offloads ``seqlen - 1`` tokens through the allocator, as the tree's does."""

    mamba_pool_idx = None

    @property
    def seqlen(self):
        return len(self.origin_input_ids) + len(self.output_ids)

    def _indices(self, req_to_token_pool):
        return req_to_token_pool.req_to_token[self.req_pool_idx, : self.seqlen - 1]

    def offload_kv_cache(self, req_to_token_pool, allocator):
        self.kv_cache_cpu = allocator.get_cpu_copy(self._indices(req_to_token_pool), mamba_indices=None)

    def load_kv_cache(self, req_to_token_pool, allocator):
        allocator.load_cpu_copy(self.kv_cache_cpu, self._indices(req_to_token_pool), mamba_indices=None)


@pytest.fixture
def index_tree(retract, monkeypatch):
    """A tree of the given pool (None: none), the probe's ``_index_keys`` loaded as a cell loads it; returns a
    function making the tree and giving the probe module."""
    def make(fresh_probe, pool: type | None):
        memory_pool = SimpleNamespace(**({"NSATokenToKVPool": pool} if pool else {}))
        monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.memory_pool", memory_pool)
        monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.allocator",
                            SimpleNamespace(PagedTokenToKVPoolAllocator=PagedAllocator))
        threads = [2]
        torch = SimpleNamespace(bfloat16="bfloat16", int64="int64", cuda=SimpleNamespace(synchronize=None),
                                threads=threads, get_num_threads=lambda: threads[-1], set_num_threads=threads.append)
        retract.sg.__dict__.update(Req=IndexReq, torch=torch,
                                   decode=SimpleNamespace(DecodeReqToTokenPool=ReqToTokenPool))
        monkeypatch.setitem(sys.modules, "_index_keys", fresh_probe("_index_keys.py"))
        return fresh_probe("probe_retract_resume_differential.py")
    return make


def index_scenario(probe, sid: str) -> tuple[dict, set[str]]:
    (found,) = [s for s in probe.SCENARIOS.scenarios if s.id == sid]
    observed = {}
    found.run(observed)
    return observed, probe.SCENARIOS.adaptations


@pytest.mark.parametrize("pool, index_owner", [(MLAPool, "other"), (NSAPool, "own")])
def test_i1_reads_the_next_request_s_index_keys_unless_the_pool_offloads_them(fresh_probe, index_tree, pool,
                                                                             index_owner):
    probe = index_tree(fresh_probe, pool)
    assert index_scenario(probe, "I1") == (
        {"index_owner": index_owner, "kv_owner": "own", "allocator_path": "ok"}, set())


class KvIndexReq(IndexReq):
    """A request that keeps its row in ``req.kv`` (0.5.19 on), where its offload reads it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.kv = SimpleNamespace(req_pool_idx=None)

    def _indices(self, req_to_token_pool):
        return req_to_token_pool.req_to_token[self.kv.req_pool_idx, : self.seqlen - 1]


@pytest.mark.parametrize("pool, index_owner", [(MLAPool, "other"), (NSAPool, "own")])
def test_a_request_keeping_its_row_in_kv_is_driven_through_it(fresh_probe, index_tree, retract, pool, index_owner):
    probe = index_tree(fresh_probe, pool)
    retract.sg.Req = KvIndexReq
    assert index_scenario(probe, "I1")[0] == {"index_owner": index_owner, "kv_owner": "own", "allocator_path": "ok"}


class NoneKvIndexReq(IndexReq):
    """A request with a ``kv`` that is None (0.5.16 to 0.5.18): its row stays on the request."""

    def __init__(self, *args):
        super().__init__(*args)
        self.kv = None


def test_a_request_whose_kv_is_none_keeps_its_row_itself(fresh_probe, index_tree, retract):
    probe = index_tree(fresh_probe, NSAPool)
    retract.sg.Req = NoneKvIndexReq
    assert index_scenario(probe, "I1")[0] == {"index_owner": "own", "kv_owner": "own", "allocator_path": "ok"}


@pytest.mark.parametrize("pool", [MLAPool, NSAPool])
def test_i2_without_reuse_reads_own_either_way(fresh_probe, index_tree, pool):
    probe = index_tree(fresh_probe, pool)
    assert index_scenario(probe, "I2")[0] == {"index_owner": "own", "kv_owner": "own", "allocator_path": "ok"}


@pytest.mark.parametrize("sid", ["I1", "I2"])
def test_an_allocator_handing_the_pool_a_keyword_it_does_not_take_is_recorded_and_the_pool_offloads(
        fresh_probe, index_tree, sid):
    probe = index_tree(fresh_probe, NSAPoolWithoutMamba)
    assert index_scenario(probe, sid) == (
        {"index_owner": "own", "kv_owner": "own", "allocator_path": "raised TypeError"}, {"nsa-pool-direct"})


def test_a_type_error_of_a_pool_that_takes_the_keyword_is_an_error_never_an_observation(fresh_probe, index_tree):
    probe = index_tree(fresh_probe, BrokenNSAPool)
    with pytest.raises(TypeError, match="a pool's own bug"):
        index_scenario(probe, "I1")


def test_a_tree_without_an_nsa_pool_records_the_fact(fresh_probe, index_tree):
    probe = index_tree(fresh_probe, None)
    for sid in ("I1", "I2"):
        assert index_scenario(probe, sid)[0] == {"nsa_pool": "absent"}


def test_a_scenario_runs_torch_on_one_thread_and_gives_the_count_back(fresh_probe, index_tree, retract):
    """Its indexing kernels would otherwise start an OpenMP team a forked mutant child then waits on."""
    seen = []

    class CountingPool(NSAPool):
        def get_cpu_copy(self, indices, mamba_indices=None):
            seen.append(retract.sg.torch.get_num_threads())
            return super().get_cpu_copy(indices)

    probe = index_tree(fresh_probe, CountingPool)
    index_scenario(probe, "I2")
    assert seen == [1] and retract.sg.torch.threads == [2, 1, 2]


def test_pages_never_written_are_none_and_a_mix_is_neither(fresh_probe, index_tree):
    index_tree(fresh_probe, NSAPool)
    world = sys.modules["_index_keys"].World(lambda name: None)
    world.admit("A")
    assert world.owner("A", T([0, 0])) == "none" and world.owner("A", T([1, 2])) == "neither"
    assert world.owner("A", T([T([1]), T([1])])) == "own" and world.owner("A", T([7])) == "neither"
