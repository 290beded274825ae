"""A decode worker's NSA/DSA index keys across a retraction, on the tree's own pool (experiment retract_resume).

A sparse-attention model (DeepSeek V3.2-style) keeps, beside each page of its MLA KV, the page's index keys in
the pool's page-indexed index buffer. A retraction offloads the request's KV to the host and gives its pages
back; the next request takes them and writes its own index keys there. What a ``World`` holds is the tree's own:

- its ``NSATokenToKVPool`` (0.5.3 to 0.5.12.post1) or ``DSATokenToKVPool`` (0.5.13 on), built on CPU with page
  size 64 and index head dim 128 (the only sizes it takes), one layer;
- its ``PagedTokenToKVPoolAllocator`` over that pool, sorted on free as a PD server builds it (``need_sort``), with
  exactly one request's pages: the next request takes the pages just given back;
- the retraction's KV half, the request's own ``offload_kv_cache`` (which ``release_req``, or from 0.5.18 the
  ``cpu_tensor`` retraction backup, calls) through the allocator's ``get_cpu_copy``, and the resumption's
  ``load_kv_cache``, over the tree's request-to-token pool.

Stand-ins, at the boundary only: ``torch.cuda.synchronize`` (no device here), and the attention kernels'
writes (request n's forward fills its pages' index keys and latent KV with ``n`` through the pool's own buffer
accessor, where a Triton kernel would). The scheduler's bookkeeping around the KV half is the probe's: a
request's row in the request-to-token pool, its pages given back to the allocator at the retraction (what the
tree cache's release does) and taken again at the resumption (what ``_pre_alloc`` does).

0.5.12 to 0.5.13.post1: the allocator hands the pool ``mamba_indices``, which the PR's ``get_cpu_copy`` does not
take, so the retraction raises TypeError on an NSA decode server (fixed by #25828/#25833). The world records
that (``allocator_path``) and retracts through the pool's own ``get_cpu_copy``/``load_cpu_copy``, the code the
fix changed (adaptation ``nsa-pool-direct``).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable

from _probekit import accepts, swapped
from _retract import _build, _req_to_token_pool_class, _served, sg

PAGE = 64  # the NSA/DSA pool's page size on CUDA
PAGES = 2  # pages a request holds, and the pool's: the next request takes exactly the pages given back
INDEX_HEAD_DIM = 128
KV_LORA_RANK = 128  # the pools of 0.5.4.post3-0.5.8.post1 take multiples of their quant block (128) only
ROPE_DIM = 8
ROWS = 4
POOL_CLASSES = ("DSATokenToKVPool", "NSATokenToKVPool")


def pool_class() -> type | None:
    """The tree's sparse-attention KV pool (renamed DSA in 0.5.13), or None before 0.5.3."""
    module = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    return next((getattr(module, name) for name in POOL_CLASSES if hasattr(module, name)), None)


@contextlib.contextmanager
def single_threaded():
    """Torch's CPU ops on one thread while a scenario runs: its indexing kernels otherwise start an OpenMP team,
    and a child forked after that (the mutation lane forks one per mutant) waits on the team's barrier for ever."""
    threads = sg.torch.get_num_threads()
    sg.torch.set_num_threads(1)
    try:
        yield
    finally:
        sg.torch.set_num_threads(threads)


class World:
    """The tree's pool, allocator and request-to-token pool of one scenario, and its requests."""

    def __init__(self, adapt: Callable[[str], None]):
        torch = sg.torch
        self.adapt = adapt
        self.pool = _build(pool_class(), size=PAGE * PAGES, page_size=PAGE, kv_lora_rank=KV_LORA_RANK,
                           dtype=torch.bfloat16, qk_rope_head_dim=ROPE_DIM, layer_num=1, device="cpu",
                           index_head_dim=INDEX_HEAD_DIM, enable_memory_saver=False,
                           kv_cache_dim=KV_LORA_RANK + ROPE_DIM)
        allocator = importlib.import_module("sglang.srt.mem_cache.allocator").PagedTokenToKVPoolAllocator
        self.allocator = _build(allocator, size=PAGE * PAGES, page_size=PAGE, dtype=torch.bfloat16, device="cpu",
                                kvcache=self.pool, need_sort=True)
        self.req_to_token_pool = _build(_req_to_token_pool_class(), size=ROWS, max_context_len=PAGE * PAGES + 1,
                                        device="cpu", enable_memory_saver=False, pre_alloc_size=0)
        self.requests: dict[str, Any] = {}
        self.numbers: dict[str, int] = {}
        self.host_copies: dict[str, Any] = {}  # what the pool's own offload returned, where the allocator's raised
        self.allocator_path = "ok"

    def admit(self, name: str) -> None:
        """A request of one output token after a prompt filling its pages (a retraction offloads ``seqlen - 1``
        tokens: the prompt): its row and pages, then its forward's index keys and KV written in them."""
        number = len(self.requests) + 1
        req = _served(f"probe-nsa-{name}")
        req.origin_input_ids = req.origin_input_ids[:1] * (PAGE * PAGES)
        req.output_ids.append(11 * number)
        self._holder(req).req_pool_idx = number - 1
        self.requests[name], self.numbers[name] = req, number
        self._take_pages(req)
        locs = self._locs(req)
        for page in self._pages(locs):
            self.pool.get_index_k_with_scale_buffer(0)[page] = number
        self.pool.kv_buffer[0][locs] = number

    @staticmethod
    def _holder(req: Any) -> Any:
        """Where the request keeps its row: ``req.kv`` from 0.5.19, the request itself before (0.5.16 to 0.5.18
        have a ``kv`` too, None here: what a retraction's release expects)."""
        kv = getattr(req, "kv", None)
        return req if kv is None else kv

    def _take_pages(self, req: Any) -> None:
        locs = self.allocator.alloc(PAGE * PAGES)
        if locs is None:
            raise RuntimeError("the allocator has no pages free for the request")
        self.req_to_token_pool.req_to_token[self._holder(req).req_pool_idx, : PAGE * PAGES] = locs

    def _locs(self, req: Any) -> Any:
        row = self._holder(req).req_pool_idx
        return self.req_to_token_pool.req_to_token[row, : req.seqlen - 1].to(sg.torch.int64)

    @staticmethod
    def _pages(locs: Any) -> Any:
        return locs[::PAGE] // PAGE

    def release(self, name: str) -> None:
        """The request's pages go back to the allocator (finished, or retracted after its offload)."""
        self.allocator.free(self._locs(self.requests[name]))

    def retract(self, name: str) -> None:
        """The retraction's KV half: the request's own offload through the allocator, then its pages given back."""
        req = self.requests[name]
        with self._no_device():
            try:
                req.offload_kv_cache(self.req_to_token_pool, self.allocator)
            except TypeError:
                if accepts(self.pool.get_cpu_copy, "mamba_indices"):
                    raise
                self._pool_direct(name)
        self.release(name)

    def _pool_direct(self, name: str) -> None:
        """The allocator handed the pool ``mamba_indices``, which its ``get_cpu_copy`` does not take (0.5.12 to
        0.5.13.post1): recorded, and the pool's own offload run in its place."""
        self.allocator_path = "raised TypeError"
        self.adapt("nsa-pool-direct")
        self.host_copies[name] = self.pool.get_cpu_copy(self._locs(self.requests[name]))

    def resume(self, name: str) -> None:
        """Memory is back: the request takes pages again and its own ``load_kv_cache`` restores them (the pool's
        own ``load_cpu_copy`` where the allocator's offload raised)."""
        req = self.requests[name]
        self._take_pages(req)
        with self._no_device():
            if name in self.host_copies:
                self.pool.load_cpu_copy(self.host_copies.pop(name), self._locs(req))
            else:
                req.load_kv_cache(self.req_to_token_pool, self.allocator)

    def _no_device(self):
        return swapped(sg.torch.cuda, synchronize=lambda *a, **k: None)

    # --- what a request holds ----------------------------------------------------------------------
    def owner(self, name: str, held: Any) -> str:
        """Whose forward wrote ``held`` (what the request's pages hold): own, other, none (never written), or
        neither (a mix, or a value no request wrote)."""
        values = {int(v) for v in held.reshape(-1).tolist()}
        if values == {0}:
            return "none"
        if len(values) != 1:
            return "neither"
        (value,) = values
        for other, number in self.numbers.items():
            if value == number:
                return "own" if other == name else "other"
        return "neither"

    def index_owner(self, name: str) -> str:
        pages = self._pages(self._locs(self.requests[name]))
        return self.owner(name, self.pool.get_index_k_with_scale_buffer(0)[pages])

    def kv_owner(self, name: str) -> str:
        return self.owner(name, self.pool.kv_buffer[0][self._locs(self.requests[name])].float())
