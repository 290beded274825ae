"""Whether a tree offloads a request's KV while the request decodes: observed, never read from its text.

The tree's own decode-step output processing (``process_batch_result_decode``, wherever the tree keeps
it: ``OUTPUT_PROCESSORS``) runs on one decode step of one real ``Req``, twice: a step after which the
request still decodes, and a step whose token finishes it (by length). The decode offload manager it is
given is a stand-in built from the tree's manager class (every method a recorder), and its
``offload_kv_cache`` notes, each time it is called, whether the request had finished. Everything else
the step reaches (the scheduler's other state, the batch, the forward result) is ``Anything``: what the
tree does there is not observed, only whether it asks the manager to offload.

- ``PRESENT``: the still-decoding step asked the manager to offload the unfinished request;
- ``ABSENT`` (offloads at finish only): it did not, and the finishing step did, so the path and the
  manager were reached and the tree offloads only finished requests;
- anything else (a step raised, reached an import stand-in, or neither step asked the manager) is no
  answer: ``CannotObserve`` says why, and the scenarios that need the answer record it as their error.

Comments, parentheses, aliases and helpers in the tree's code change nothing here: only the calls made count.
"""

from __future__ import annotations

import enum
import importlib
import operator
from types import SimpleNamespace
from typing import Any, Callable

import _standins
from _probekit import served_req

# Where a tree processes a decode step's results, newest first: the scheduler's batch-result component
# from 0.5.13, the scheduler's output-processor mixin up to 0.5.12.
OUTPUT_PROCESSORS = (
    "sglang.srt.managers.scheduler_components.batch_result_processor:SchedulerBatchResultProcessor",
    "sglang.srt.managers.scheduler_output_processor_mixin:SchedulerOutputProcessorMixin",
)
ENTRY = "process_batch_result_decode"
DECODING_TOKENS = 64  # the still-decoding step's request is far from its length limit
TOKEN = 7


class DecodeOffload(enum.Enum):
    PRESENT = "present"
    ABSENT = "absent"  # offloads at finish only


class CannotObserve(RuntimeError):
    """The tree's decode step could not be run far enough to tell whether it offloads while decoding."""


class Anything:
    """A collaborator the probe does not observe: any attribute, item or call answers another, and each
    reads as false, empty and zero (in arithmetic and comparisons: ``x += n`` leaves ``n``), so the tree's
    step takes its plain path through it."""

    def __init__(self, name: str, **attrs: Any):
        object.__setattr__(self, "_name", name)
        for key, value in attrs.items():
            object.__setattr__(self, key, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Anything(f"{self._name}.{name}")
        object.__setattr__(self, name, value)
        return value

    def __call__(self, *args, **kwargs) -> Any:
        return Anything(f"{self._name}()")

    def __getitem__(self, key) -> Any:
        return Anything(f"{self._name}[]")

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def __index__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<anything {self._name}>"


def _as_zero(op: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[[Anything, Any], Any]:
    return (lambda self, other: op(other, 0)) if reflected else (lambda self, other: op(0, other))


for _name in ("add", "sub", "mul", "floordiv", "truediv", "mod", "lt", "le", "gt", "ge"):
    setattr(Anything, f"__{_name}__", _as_zero(getattr(operator, _name)))
    if _name in ("add", "sub", "mul", "floordiv", "truediv", "mod"):
        setattr(Anything, f"__r{_name}__", _as_zero(getattr(operator, _name), reflected=True))


def output_processor() -> type:
    """The tree's class holding its decode-step output processing; none found is no answer."""
    for path in OUTPUT_PROCESSORS:
        module, _, name = path.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            if not (module == exc.name or module.startswith(f"{exc.name}.")):
                raise CannotObserve(f"{module} does not import: {exc}") from exc  # no answer, not an absence
            continue
        if callable(getattr(cls, ENTRY, None)):
            return cls
    raise CannotObserve(f"no {ENTRY} in the tree's output processors ({', '.join(OUTPUT_PROCESSORS)})")


def processor_class(owner: type) -> type:
    """A stand-in for the scheduler (or its component) running ``owner``'s own methods: every state the
    step reads that is not set answers as ``Anything``; streaming the outputs is the boundary (it does nothing)."""

    def __init__(self, **attrs: Any) -> None:
        for key, value in attrs.items():
            object.__setattr__(self, key, value)  # a frozen dataclass (0.5.13 on) refuses setattr

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Anything(f"scheduler.{name}")
        object.__setattr__(self, name, value)
        return value

    return type("ProbeOutputProcessor", (owner,), {
        "__init__": __init__, "__getattr__": __getattr__, "__setattr__": object.__setattr__,
        "stream_output": lambda self, *args, **kwargs: None})


def offload_manager(make: Callable[..., Any], calls: list[bool]) -> Any:
    """The manager stand-in: ``offload_kv_cache`` records whether the request had finished, and says it
    wrote a copy (so a finished request's release waits for it, as the tree's own path expects)."""

    def offload_kv_cache(req, *args, **kwargs) -> bool:
        calls.append(bool(req.finished()))
        return True

    return make(offload_kv_cache=offload_kv_cache)


def step(owner: type, sg: SimpleNamespace, make_manager: Callable[..., Any], *, finishes: bool) -> list[bool]:
    """One decode step of one request through the tree's output processing; the manager's offload calls."""
    calls: list[bool] = []
    req = served_req(sg.Req, sg.SamplingParams, "probe-decode-step", [1, 2, 3, 4, 5],
                     max_new_tokens=1 if finishes else DECODING_TOKENS)
    req.output_ids = []
    processor = processor_class(owner)(
        server_args=sg.server_args, decode_offload_manager=offload_manager(make_manager, calls), enable_overlap=False)
    batch = Anything("batch", reqs=[req], spec_algorithm=sg.SPEC_NONE, is_spec_v2=False, return_logprob=False,
                     batch_size=lambda: 1)
    result = Anything("result", next_token_ids=sg.torch.tensor([TOKEN]), copy_done=None)
    getattr(processor, ENTRY)(batch, result)
    if bool(req.finished()) is not finishes:
        raise CannotObserve(f"the tree's decode step left the request {'un' if finishes else ''}finished")
    return calls


def observe(sg: SimpleNamespace, make_manager: Callable[..., Any]) -> DecodeOffload:
    """Whether the tree offloads a request while it decodes (see the module's docstring)."""
    reached = len(_standins.CALLED)
    try:
        owner = output_processor()
        decoding = step(owner, sg, make_manager, finishes=False)
        finishing = step(owner, sg, make_manager, finishes=True)
    except CannotObserve:
        raise
    except Exception as exc:
        raise CannotObserve(f"running the tree's decode step raised {type(exc).__name__}: {exc}") from exc
    if len(_standins.CALLED) > reached:
        raise CannotObserve(f"the tree's decode step called the import stand-in(s) "
                            f"{', '.join(sorted(set(_standins.CALLED[reached:])))}")
    if False in decoding:
        return DecodeOffload.PRESENT
    if True in finishing:
        return DecodeOffload.ABSENT
    raise CannotObserve("the tree's decode step never asked the offload manager to offload, "
                        "neither while the request decoded nor at its finish")
