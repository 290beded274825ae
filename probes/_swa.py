"""What the two SWA probes share: the tree's real hybrid sliding-window pool and allocator, built on the CPU.

Both experiments (``swa_free``, PR #27779; ``swa_tail``, PR #25805) drive SGLang's real
``SWATokenToKVPoolAllocator`` over its real ``SWAKVPool`` (``device="cpu"``, small sizes: 32 full and 32 SWA
slots, one full and one SWA layer of one head). Nothing of the allocator or the pools is replaced; the probe
only reads their state after each step:

- the free counts (``full_available_size``, ``swa_available_size``: slots);
- ``double_freed``: SWA pages that sit in the SWA allocator's free lists (``free_pages`` and
  ``release_pages``) more than once: each was freed again while already free;
- ``stale_mapping``: a live request's full slots whose mapping still names an SWA slot of a free page;
- ``live_page_reissued``: SWA pages an allocation handed out while another live request's
  ``full_to_swa_index_mapping`` still named them (two requests then read and write one SWA page).

One kernel on the path cannot run on a CPU: the paged allocator's ``alloc_extend`` launches the Triton
kernel ``alloc_extend_kernel``. Where the same module defines ``alloc_extend_naive`` (its own CPU
implementation of the same computation, 0.5.9 on), the kernel's launch is answered by it for the probe's
run, for the calls that launch it only (declared in the registry's ``cpu_kernels``; the result names the
adaptation ``alloc-extend-naive``).
Where the module has none, every scenario that allocates a paged extend raises ``CannotRunOnCpu``: the
scenario cannot run, never an all-clear.

Tree facts: ``swa_allocator: "absent"`` (no ``SWATokenToKVPoolAllocator`` at any place it has lived: no
hybrid SWA pool); ``paged_swa: "absent"`` (the tree's SWA allocator, built as its constructor allows, is
token-granular: page size 1, so a free names exactly the slots it frees; up to 0.5.7); ``paged_allocator:
"absent"`` (the control without an SWA pool: no ``PagedTokenToKVPoolAllocator`` or ``MHATokenToKVPool`` at any
place they have lived); ``paged_alloc: "absent"`` (that control: the paged allocator has no page-aligned ``alloc``,
only the extend kernel's allocation; up to 0.4.4.post3); ``swa_pool: "abstract"`` (the tree's ``SWAKVPool`` leaves
methods of its base abstract, so neither the probe nor a server can build it: 0.4.9.post1-post2).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping

from _probekit import Observed, ScenarioSet, publish_server_args, server_args, swapped

PAGE = 4
SIZE = 32  # full and SWA slots: 8 pages each
# Where the allocator has lived: allocator/swa.py (0.5.13 on), swa_memory_pool.py (0.5.9 to 0.5.12), allocator.py.
ALLOCATOR_AT = ("sglang.srt.mem_cache.allocator.swa", "sglang.srt.mem_cache.swa_memory_pool",
                "sglang.srt.mem_cache.allocator")
POOL_AT = ("sglang.srt.mem_cache.swa_memory_pool", "sglang.srt.mem_cache.memory_pool")
# The paged allocator and its kernel: allocator/paged.py (0.5.13 on), allocator.py (0.4.8 to 0.5.12); before, the
# allocator in paged_allocator.py (only F6's control builds it there: no SWA pool to page).
PAGED_AT = ("sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.allocator")
PAGED_BEFORE = "sglang.srt.mem_cache.paged_allocator"
KERNEL = "alloc_extend_kernel"
NAIVE = "alloc_extend_naive"
ADAPT_NAIVE = "alloc-extend-naive"

sg = SimpleNamespace(ready=False)


class CannotRunOnCpu(RuntimeError):
    """A kernel on the probed path has no CPU implementation in its own module: the scenario cannot run."""


def _first(modules: tuple[str, ...], name: str) -> tuple[Any, Any]:
    """The first of ``modules`` defining ``name``, and the object; (None, None) where none does. A module the
    tree has that fails to import raises: that is no absence."""
    for module in modules:
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
                raise
            continue
        if hasattr(found, name):
            return found, getattr(found, name)
    return None, None


class NaiveLaunch:
    """``kernel[grid](...)`` answered by the module's own ``alloc_extend_naive`` (same inputs, same output)."""

    def __init__(self, naive: Callable[..., None]):
        self.naive = naive

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(prefix_lens, seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size, *rest):
            given = {"prefix_lens": prefix_lens, "seq_lens": seq_lens, "last_loc": last_loc,
                     "free_pages": free_pages, "out_indices": out_indices, "page_size": page_size,
                     "device": out_indices.device}
            params = inspect.signature(self.naive).parameters
            self.naive(**{name: given[name] for name in params if name in given})
        return launch


def prepare(scenarios: ScenarioSet, *, decode: bool = False) -> str:
    """Import the tree's SWA allocator and pools (``decode``: and its decode prealloc queue, with what a request
    is built from), and answer the paged kernel with the module's CPU one."""
    import sglang
    import torch

    sg.torch = torch
    sg.scenarios = scenarios
    # The scheduler first, as a server imports it: up to 0.4.7.post1 the memory pool alone meets a circular import
    # of sglang.srt.layers.linear.
    importlib.import_module("sglang.srt.managers.scheduler")
    _, sg.Allocator = _first(ALLOCATOR_AT, "SWATokenToKVPoolAllocator")
    _, sg.Pool = _first(POOL_AT, "SWAKVPool")
    _, sg.Paged = _first((*PAGED_AT, PAGED_BEFORE), "PagedTokenToKVPoolAllocator")
    _, sg.MHAPool = _first(("sglang.srt.mem_cache.memory_pool",), "MHATokenToKVPool")
    sg.kernel_module, _ = _first(PAGED_AT, KERNEL)
    sg.naive = getattr(sg.kernel_module, NAIVE, None) if sg.kernel_module is not None else None
    if decode:
        from sglang.srt.disaggregation.decode import DecodePreallocQueue
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.sampling.sampling_params import SamplingParams

        from sglang.srt.server_args import ServerArgs

        sg.Queue, sg.Req, sg.SamplingParams, sg.ReqToTokenPool = DecodePreallocQueue, Req, SamplingParams, ReqToTokenPool
        # From 0.5.20 the preallocation reads its server's configuration from the runtime context (get_disagg()):
        # there a decode server's, published as its scheduler process does (the defaults: no decode radix cache).
        if hasattr(importlib.import_module("sglang.srt.disaggregation.decode"), "get_disagg"):
            publish_server_args(server_args(ServerArgs, scenarios.adapted, model_path="dummy",
                                            disaggregation_mode="decode", page_size=1), scenarios.adapted, role="test")
    sg.ready = True
    return sglang.__version__


def tree_facts(observed: dict, *, swa: bool = True, paged: bool = True) -> bool:
    """Record what the tree lacks for a scenario (``swa``: the hybrid pool; ``paged``: at a page size above 1);
    True when the scenario can go on."""
    if not swa:
        if sg.Paged is None or sg.MHAPool is None:
            observed["paged_allocator"] = "absent"
            return False
        if not hasattr(sg.Paged, "alloc"):  # up to 0.4.4.post3 it allocates only through the Triton extend kernel
            observed["paged_alloc"] = "absent"
            return False
        return True
    if sg.Allocator is None or sg.Pool is None:
        observed["swa_allocator"] = "absent"
        return False
    if inspect.isabstract(sg.Pool):  # 0.4.9.post1-post2: the HiCache hooks declared, not written
        observed["swa_pool"] = "abstract"
        return False
    if paged and "page_size" not in inspect.signature(sg.Allocator).parameters:
        if World(page=1).allocator.page_size == 1:  # built as its constructor allows: its page size is the answer
            observed["paged_swa"] = "absent"
            return False
    return True


def _keywords(cls: type, **given: Any) -> dict[str, Any]:
    """``given`` as ``cls`` takes it: by its parameters' names and, where it passes ``**kwargs`` on to its layer
    pools (the SWA pool), by those of the tree's ``MHATokenToKVPool`` too (0.5.3 names none of them itself)."""
    params = inspect.signature(cls).parameters
    names = set(params)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and sg.MHAPool is not None:
        names |= set(inspect.signature(sg.MHAPool).parameters)
    return {name: value for name, value in given.items() if name in names}


class World:
    """One SWA allocator over one SWA pool (``page`` slots a page), and the live requests' full slots."""

    def __init__(self, page: int = PAGE, need_sort: bool = False, swa: bool = True):
        torch = sg.torch
        self.page = page
        self.swa = swa
        common = dict(size=SIZE, size_swa=SIZE, page_size=page, dtype=torch.float16, device="cpu")
        pool = dict(head_num=1, head_dim=8, enable_memory_saver=False, enable_kvcache_transpose=False)
        if swa:
            self.pool = sg.Pool(**_keywords(sg.Pool, **common, **pool, swa_attention_layer_ids=[1],
                                            full_attention_layer_ids=[0]))
            self.allocator = sg.Allocator(**_keywords(sg.Allocator, **common, kvcache=self.pool,
                                                      need_sort=need_sort))
            self.pages = self.allocator.swa_attn_allocator
        else:  # what a model without sliding-window layers gets: one paged allocator over one MHA pool
            self.pool = sg.MHAPool(**_keywords(sg.MHAPool, **common, **pool, layer_num=1))
            self.allocator = sg.Paged(**_keywords(sg.Paged, **common, kvcache=self.pool, need_sort=need_sort))
            self.pages = self.allocator
        self.live: dict[str, Any] = {}  # request -> its full slots
        self.reissued = 0

    # --- the allocator, called as the scheduler does ---------------------------------------------------
    def alloc(self, name: str, tokens: int) -> Any:
        """A new request's prefill of ``tokens`` (no prefix): ``alloc_extend`` (``alloc`` at page size 1)."""
        torch = sg.torch
        if self.page == 1 or not self.swa:  # page-aligned ``alloc``: no kernel
            slots = self.allocator.alloc(tokens)
        else:
            zero = torch.zeros((1,), dtype=torch.int64)
            lens = torch.tensor([tokens], dtype=torch.int64)
            last = torch.tensor([-1], dtype=torch.int64)
            with self.kernel():
                slots = self.allocator.alloc_extend(zero, zero.clone(), lens, lens.clone(), last, tokens)
        if slots is None:
            raise RuntimeError(f"the allocator refused {tokens} slots for {name}")
        self.handed_out(name, slots)
        return slots

    def kernel(self) -> Any:
        """For one call: the paged kernel's launch answered by its module's CPU implementation (named in the
        result); where the module has none, the scenario cannot run."""
        if sg.naive is None:
            raise CannotRunOnCpu(f"the paged allocator's {KERNEL} is a Triton kernel and its module "
                                 f"({getattr(sg.kernel_module, '__name__', 'not found')}) has no {NAIVE}: "
                                 "no CPU implementation of the same computation to run it with")
        sg.scenarios.adapted(ADAPT_NAIVE)
        return swapped(sg.kernel_module, **{KERNEL: NaiveLaunch(sg.naive)})

    def handed_out(self, name: str, slots: Any) -> None:
        """Count the SWA pages the new request got that another live request's mapping names."""
        others = set().union(set(), *(self.swa_pages(s) for n, s in self.live.items() if n != name))
        self.reissued += len(self.swa_pages(slots) & others)
        self.live[name] = slots if name not in self.live else sg.torch.cat((self.live[name], slots))

    def draft(self, name: str, tokens: int) -> bool:
        """A speculative (MTP) draft step for live request ``name``: its draft slots are allocated past its last
        slot, then given back. Where the allocator has ``backup_state``/``restore_state`` (up to 0.5.16), between
        them: the restore gives the pages back and leaves their mapping as the allocation wrote it (the recycled
        pages of PR #25805). Where it has not (0.5.17 on: the speculative workers allocate a request's draft slots
        with it), by ``free`` when they are done with. Answers whether the restore gave them back."""
        torch = sg.torch
        mine = self.live[name]
        restores = hasattr(self.allocator, "backup_state") and hasattr(self.allocator, "restore_state")
        state = self.allocator.backup_state() if restores else None
        if self.page == 1:  # the token allocator's slots: no kernel
            drafted = self.allocator.alloc(tokens)
        else:
            prefix = torch.tensor([len(mine)], dtype=torch.int64)
            lens = torch.tensor([len(mine) + tokens], dtype=torch.int64)
            last = mine[-1:].to(torch.int64)
            with self.kernel():
                drafted = self.allocator.alloc_extend(prefix, prefix.clone(), lens, lens.clone(), last, tokens)
        if drafted is None:
            raise RuntimeError(f"the allocator refused {tokens} draft slots for {name}")
        if restores:
            self.allocator.restore_state(state)
        else:
            self.allocator.free(drafted)
        return restores

    def pre_alloc(self, name: str, tokens: int, window: int) -> int:
        """The decode server's preallocation of a transferred request of ``tokens`` prompt tokens: the tree's own
        ``DecodePreallocQueue._pre_alloc`` (no prefix, no decode radix cache, no HiSparse; the model's sliding
        window ``window``). Answers the SWA slots it took."""
        torch = sg.torch
        queue = object.__new__(sg.Queue)
        queue.req_to_token_pool = self.rows()
        queue.token_to_kv_pool_allocator = self.allocator
        queue.token_to_kv_pool = self.pool
        queue.scheduler = SimpleNamespace(enable_hisparse=False, sliding_window_size=window,
                                          server_args=SimpleNamespace(disaggregation_decode_enable_radix_cache=False))
        # A cache with no streaming session (0.5.23's maybe_hand_to_session: the base cache's takes nothing).
        queue.tree_cache = SimpleNamespace(evictable_size=lambda: 0, protected_size=lambda: 0,
                                           maybe_hand_to_session=lambda req: None)
        req = sg.Req(name, "", list(range(1, tokens + 1)), sg.SamplingParams(max_new_tokens=8))
        req.output_ids = []
        before = self.swa_free()
        if self.page > 1:
            with self.kernel():
                slots = queue._pre_alloc(req)
        else:
            slots = queue._pre_alloc(req)
        self.handed_out(name, slots.to(torch.int64))
        return before - self.swa_free()

    def rows(self) -> Any:
        if getattr(self, "_rows", None) is None:
            self._rows = sg.ReqToTokenPool(**_keywords(sg.ReqToTokenPool, size=8, max_context_len=64, device="cpu",
                                                       enable_memory_saver=False))
        return self._rows

    def free_swa(self, name: str, start: int, stop: int) -> None:
        self.allocator.free_swa(self.live[name][start:stop])

    def free(self, name: str) -> None:
        """The request finishes: every full slot goes back (and, through it, its SWA slots)."""
        self.allocator.free(self.live.pop(name))

    # --- what is observed -------------------------------------------------------------------------------
    def swa_pages(self, slots: Any) -> set[int]:
        if not self.swa:
            return {int(s) // self.page for s in slots.tolist()}
        mapped = self.allocator.full_to_swa_index_mapping[slots.to(sg.torch.int64)]
        return {int(s) // self.page for s in mapped.tolist() if s > 0}

    def free_list(self, allocator: Any) -> list[int]:
        found = []
        for name in ("free_pages", "release_pages"):
            held = getattr(allocator, name, None)
            if held is not None:
                found += [int(v) for v in held.tolist()]
        return found

    def double_freed(self) -> int:
        """SWA pages (slots, at page size 1) in the SWA allocator's free lists more than once."""
        free = self.free_list(self.pages)
        return sum(free.count(p) - 1 for p in set(free))

    def swa_mapped(self, name: str) -> int:
        """Of the request's full slots, those whose mapping names an SWA slot."""
        mapped = self.allocator.full_to_swa_index_mapping[self.live[name].to(sg.torch.int64)]
        return sum(1 for s in mapped.tolist() if s > 0)

    def live_in_free(self) -> int:
        """SWA pages in the free lists that a live request's mapping still names (given back under it)."""
        free = set(self.free_list(self.pages))
        return len(free & set().union(set(), *(self.swa_pages(s) for s in self.live.values())))

    def stale_mapping(self, name: str) -> int:
        """Of the request's full slots, those whose mapping names an SWA slot of a page that is free."""
        free = set(self.free_list(self.pages))
        mapped = self.allocator.full_to_swa_index_mapping[self.live[name].to(sg.torch.int64)]
        return sum(1 for s in mapped.tolist() if s > 0 and int(s) // self.page in free)

    def swa_free(self) -> int:
        return int(self.allocator.swa_available_size() if self.swa else self.allocator.available_size())

    def full_free(self) -> int:
        return int(self.allocator.full_available_size() if self.swa else self.allocator.available_size())


# ---------------------------------------------------------------- the steps both probes' scripts share


@dataclass(frozen=True)
class Observe:
    """Record ``keys`` as the world stands now, each under ``<key><suffix>``, as the probe's ``measures`` say."""
    measures: Mapping[str, Callable[[World], Any]] = field(repr=False, compare=False)
    keys: tuple[str, ...]
    suffix: str = ""

    def run(self, world: World, observed: Observed) -> None:
        observed.update({key + self.suffix: self.measures[key](world) for key in self.keys})


def observer(measures: Mapping[str, Callable[[World], Any]]) -> Callable[..., Observe]:
    """A probe's ``observe(*keys, suffix=)``, for its ``measures``."""
    def observe(*keys: str, suffix: str = "") -> Observe:
        unknown = [key for key in keys if key not in measures]
        if unknown:  # a typo must fail at import, not read as a scenario's error on every tree
            raise KeyError(f"no measure {unknown}; measures: {sorted(measures)}")
        return Observe(measures, keys, suffix)
    return observe


@dataclass(frozen=True)
class Alloc:
    """Request ``name``'s prefill of ``tokens`` slots."""
    name: str
    tokens: int

    def run(self, world: World, observed: Observed) -> None:
        world.alloc(self.name, self.tokens)


@dataclass(frozen=True)
class Finish:
    """Request ``name`` finishes: ``free`` of all its full slots. ``free_refused`` is the type of the error the
    allocator's own accounting check raised after freeing (more free slots than it has), else null; a script
    that finishes two requests keeps the first refusal."""
    name: str

    def run(self, world: World, observed: Observed) -> None:
        try:
            world.free(self.name)
        except AssertionError as exc:
            observed["free_refused"] = type(exc).__name__
        else:
            observed.setdefault("free_refused", None)


@dataclass(frozen=True)
class Script:
    """A scenario: a fresh world (``page`` slots a page; ``swa``: a hybrid pool) driven through ``steps``."""
    id: str
    title: str
    steps: tuple[Any, ...]
    page: int = PAGE
    swa: bool = True
