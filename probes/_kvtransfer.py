"""Stand-ins at the KV transfer's boundary: the ZeroMQ transport, the transfer engine, the queues and
threads the tree starts, and the allocators a decode request's pages go back to.

The transfer probes (``abort_notify``, ``deferred_release``, ``deferred_release_nixl``) drive the tree's
real receivers, managers and ``DecodeTransferQueue``; what those talk to is built here, and every
stand-in writes what it saw into one ``Timeline`` (a counter shared by all of them), so a probe can
ask what happened *after* what: a page written after it was freed, a chunk written after the abort.

- ``Bus``: ZeroMQ. ``bus.zmq`` is a drop-in for the ``zmq`` module (its constants are the real
  module's; ``Context()`` gives sockets of this bus); ``bus.context()`` one context, for a class that
  keeps one (``CommonKVReceiver._ctx``). A socket's ``send_multipart`` records a ``Message``
  (destination endpoint, frames, time) and queues it for that endpoint; ``bus.inbox(endpoint)`` is the
  socket a manager receives on (``server_socket``): its ``recv_multipart`` hands over that endpoint's
  queued frames in order, then raises ``ScriptEnded``, which ends the tree's ``while True`` loop. A
  socket's monitor (``get_monitor_socket``, 0.5.18 on) never reports a disconnection.
- ``TransferEngine``: the Mooncake (or NIXL) engine. Each ``transfer_sync`` / ``batch_transfer_sync``
  block is a ``Write`` (session, source and destination address, length, time); ``pages(base,
  item_len)`` turns the destination addresses back into the decode pages written. ``status`` is what
  every transfer returns (0 success; set it non-zero for a transfer that fails).
- ``ScriptedQueue``: a transfer worker's queue; ``get`` raises ``ScriptEnded`` once it is empty.
- ``InlineExecutor``: a thread pool that runs each task at once, on the caller's thread.
- ``threads(module, run=...)``: swaps a module's ``threading`` for one whose ``Thread.start()`` runs
  the target at once, on the probe's thread, when its function's name is in ``run`` (a ``ScriptEnded``
  ends it quietly; any other exception is recorded in ``Threads.errors`` as ``name:Type`` and kept in
  ``Threads.raised``, for the probe to tell the tree's own failure from a stand-in it under-built), and
  records every other thread as never started (a heartbeat loop must not run).
- ``BootstrapServer``: the HTTP bootstrap server a decode receiver asks which prefill ranks serve a
  room (``requests`` as its module imports it): each ``get``/``post`` is recorded as its path and query,
  and answered with what ``answer(path, query)`` returns (a status 200 JSON body; None: a 404).
- ``FreeRecorder``: an allocator's (or metadata-slot allocator's) ``free``: each call's indices, at
  what time; ``freed()`` lists them.

Nothing here imports SGLang or ZeroMQ at import time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import importlib.util
import itertools
import urllib.parse
import threading as _threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterator


class ScriptEnded(BaseException):
    """The scripted input is used up: ends a ``while True`` loop of the tree. A BaseException, so the tree's
    own ``except Exception`` (a transfer worker wraps every error into RuntimeError) lets it through."""


class Timeline:
    """One clock for every stand-in of a scenario: each event takes the next tick."""

    def __init__(self):
        self._ticks = itertools.count(1)
        self.marks: dict[str, int] = {}
        self.taken = 0  # items taken from transfer queues so far: the chunk a worker's writes belong to

    def tick(self) -> int:
        return next(self._ticks)

    def mark(self, name: str) -> int:
        """Name this moment (``"abort"``): events after it have larger ticks."""
        self.marks[name] = self.tick()
        return self.marks[name]

    def after(self, name: str, tick: int) -> bool:
        return name in self.marks and tick > self.marks[name]


# ---------------------------------------------------------------- ZeroMQ


@dataclass
class Message:
    to: str  # the endpoint as the tree connected it: "tcp://ip:port"
    frames: list[bytes]
    at: int

    @property
    def head(self) -> bytes:
        return self.frames[0] if self.frames else b""


class Socket:
    """A ZeroMQ socket of the bus: connect / bind / setsockopt are noted; sends go to the bus. As in ZeroMQ, a
    socket bound again listens on every endpoint it was bound to (up to 0.4.10 a manager's thread binds its inbox
    to a fresh port, while decode and prefill still address the port the probe's bootstrap server named)."""

    def __init__(self, bus: "Bus", kind: Any):
        self.bus, self.kind = bus, kind
        self.endpoint: str | None = None
        self.bound: list[str] = []
        self.options: dict[Any, Any] = {}

    def setsockopt(self, option, value) -> None:
        self.options[option] = value

    def connect(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def bind(self, endpoint: str) -> None:
        self.endpoint = self.endpoint or endpoint
        self.bound.append(endpoint)

    def send_multipart(self, frames, *args, **kwargs) -> None:
        if self.endpoint is None:
            raise RuntimeError("send_multipart on a socket that was never connected")
        self.bus.deliver(self.endpoint, frames)

    def recv_multipart(self, *args, **kwargs) -> list[bytes]:
        return self.bus.receive(*(self.bound or [self.endpoint]))

    def close(self, *args, **kwargs) -> None:
        pass

    def get_monitor_socket(self, *args, **kwargs) -> "Monitor":
        return Monitor()


class Monitor:
    """A socket's connection monitor: the bus never disconnects, so it has no event (ZeroMQ's ``Again``)."""

    def recv_multipart(self, *args, **kwargs) -> list[bytes]:
        raise importlib.import_module("zmq").Again()

    def close(self, *args, **kwargs) -> None:
        pass


class Context:
    def __init__(self, bus: "Bus"):
        self.bus = bus

    def socket(self, kind) -> Socket:
        return Socket(self.bus, kind)

    def term(self) -> None:
        pass


class _Zmq:
    """The ``zmq`` module as the bus answers it: constants from the real module, contexts of the bus."""

    def __init__(self, bus: "Bus"):
        self._bus = bus

    def Context(self, *args, **kwargs) -> Context:  # noqa: N802 - the module's own name
        return Context(self._bus)

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("zmq"), name)


class Bus:
    """Every message of one scenario, in order, and each endpoint's queue of frames not yet received."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.sent: list[Message] = []
        self.queues: dict[str, list[list[bytes]]] = {}
        self.zmq = _Zmq(self)

    def context(self) -> Context:
        return Context(self)

    def deliver(self, endpoint: str, frames) -> None:
        frames = [bytes(f) if not isinstance(f, bytes) else f for f in frames]
        self.sent.append(Message(endpoint, frames, self.timeline.tick()))
        self.queues.setdefault(endpoint, []).append((self.sent[-1].at, frames))

    def receive(self, *endpoints: str | None) -> list[bytes]:
        """The oldest frames queued for any of ``endpoints`` (one socket's bound endpoints)."""
        waiting = [(self.queues[e][0][0], e) for e in endpoints if self.queues.get(e or "")]
        if not waiting:
            raise ScriptEnded(endpoints)
        return self.queues[min(waiting)[1]].pop(0)[1]

    def inbox(self, endpoint: str) -> Socket:
        socket = Socket(self, None)
        socket.bind(endpoint)
        return socket

    def messages(self, head: bytes | None = None, to: str | None = None) -> list[Message]:
        return [m for m in self.sent if (head is None or m.head == head) and (to is None or m.to == to)]


def endpoint(ip: str, port: int) -> str:
    return f"tcp://{ip}:{port}"


# ---------------------------------------------------------------- the transfer engine


@dataclass
class Write:
    session: str
    src: int
    dst: int
    length: int
    at: int
    chunk: int = 0  # the queue item (Timeline.taken) being worked on when it was written


@dataclass
class TransferEngine:
    """What a manager's ``engine`` does: records each block written; ``status`` is every transfer's return."""

    timeline: Timeline
    session_id: str = "probe-session"
    status: int = 0
    writes: list[Write] = field(default_factory=list)

    def transfer_sync(self, session_id, src, dst, length, *args, **kwargs) -> int:
        self.writes.append(Write(str(session_id), int(src), int(dst), int(length), self.timeline.tick(),
                                 self.timeline.taken))
        return self.status

    def batch_transfer_sync(self, session_id, srcs, dsts, lengths, *args, **kwargs) -> int:
        at = self.timeline.tick()  # one batch, one moment
        for src, dst, length in zip(srcs, dsts, lengths):
            self.writes.append(Write(str(session_id), int(src), int(dst), int(length), at, self.timeline.taken))
        return self.status

    def get_session_id(self) -> str:
        return self.session_id

    def get_localhost(self) -> str:
        return self.session_id.rsplit(":", 1)[0]

    def register(self, *args, **kwargs) -> int:
        return 0

    def deregister(self, *args, **kwargs) -> int:
        return 0

    def batch_register(self, *args, **kwargs) -> int:
        return 0

    def batch_deregister(self, *args, **kwargs) -> int:
        return 0

    def pages(self, base: int, item_len: int, *, region: int, since: str | None = None) -> list[int]:
        """The pages written in ``[base, base + region)`` (one layer's buffer), each block split per page;
        with ``since``, only the writes after that mark."""
        pages = []
        for w in self.writes:
            if base <= w.dst < base + region and (since is None or self.timeline.after(since, w.at)):
                first = (w.dst - base) // item_len
                pages.extend(range(first, first + max(w.length // item_len, 1)))
        return pages


# ---------------------------------------------------------------- queues, executors, threads


class ScriptedQueue:
    """A transfer queue: ``put`` keeps order; ``get`` hands items over, then raises ``ScriptEnded``. Given the
    timeline, each item handed over counts as taken (``Timeline.taken``): the engine's writes name their chunk
    however many engine calls a tree makes for one (up to 0.4.10 one per layer and contiguous block)."""

    def __init__(self, timeline: Timeline | None = None):
        self.items: list[Any] = []
        self.timeline = timeline

    def put(self, item, *args, **kwargs) -> None:
        self.items.append(item)

    def put_nowait(self, item) -> None:
        self.items.append(item)

    def get(self, *args, **kwargs) -> Any:
        if not self.items:
            raise ScriptEnded("queue")
        if self.timeline is not None:
            self.timeline.taken += 1
        return self.items.pop(0)

    get_nowait = get

    def qsize(self) -> int:
        return len(self.items)

    def empty(self) -> bool:
        return not self.items


class InlineExecutor:
    """A thread pool that runs each task at once on the caller's thread (deterministic order)."""

    def submit(self, fn: Callable[..., Any], *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, *args, **kwargs) -> None:
        pass


@dataclass
class Threads:
    """What the tree asked to start, and how the loops the probe ran ended."""

    run: frozenset[str]
    started: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    raised: list[BaseException] = field(default_factory=list)  # the exceptions themselves, in order

    def thread_class(self) -> type:
        threads = self

        class Thread:
            def __init__(self, group=None, target=None, name=None, args=(), kwargs=None, daemon=None):
                self.target, self.args, self.kwargs = target, tuple(args), dict(kwargs or {})
                self.name = getattr(target, "__name__", name or "thread")
                self.daemon = daemon

            def start(self) -> None:
                if self.name not in threads.run:
                    threads.skipped.append(self.name)
                    return
                threads.started.append(self.name)
                try:
                    self.target(*self.args, **self.kwargs)
                except ScriptEnded:
                    pass
                except Exception as exc:
                    threads.errors.append(f"{self.name}:{type(exc).__name__}")
                    threads.raised.append(exc)

            def join(self, timeout=None) -> None:
                pass

            def is_alive(self) -> bool:
                return False

        return Thread


@contextlib.contextmanager
def threads(module: Any, *, run: tuple[str, ...]) -> Iterator[Threads]:
    """Within the block, ``module.threading.Thread`` runs the loops named in ``run`` at once on this thread and
    starts no other; everything else of ``threading`` (locks, events) is the real one."""
    seen = Threads(frozenset(run))
    fake = SimpleNamespace(**{name: getattr(_threading, name) for name in dir(_threading) if not name.startswith("__")})
    fake.Thread = seen.thread_class()
    saved = module.threading
    module.threading = fake
    try:
        yield seen
    finally:
        module.threading = saved


# ---------------------------------------------------------------- the bootstrap server


class Response:
    def __init__(self, body: Any):
        self.body = body
        self.status_code = 200 if body is not None else 404
        self.text = "" if body is not None else "not found"

    def json(self) -> Any:
        return self.body


class BootstrapServer:
    """``requests`` as a receiver's module uses it, answered by ``answer(path, query)``; every call recorded."""

    def __init__(self, answer: Callable[[str, dict[str, str]], Any]):
        self.answer = answer
        self.asked: list[tuple[str, dict[str, str]]] = []
        self.requests = SimpleNamespace(get=self.get, post=self.post, put=self.post, Session=lambda: self,
                                        exceptions=importlib.import_module("requests").exceptions
                                        if importlib.util.find_spec("requests") else None)

    def get(self, url: str, *args, **kwargs) -> Response:
        parsed = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        if isinstance(kwargs.get("json"), dict):
            query.update({k: str(v) for k, v in kwargs["json"].items()})
        self.asked.append((parsed.path, query))
        return Response(self.answer(parsed.path, query))

    post = get


# ---------------------------------------------------------------- allocators


@dataclass
class Freed:
    indices: list[int]
    at: int
    label: str


class FreeRecorder:
    """An allocator's ``free``: each call's indices (a tensor, array or list), at what time, with a label."""

    def __init__(self, timeline: Timeline, label: str = "free"):
        self.timeline, self.label = timeline, label
        self.calls: list[Freed] = []

    def __call__(self, indices, *args, **kwargs) -> None:
        if hasattr(indices, "tolist"):
            indices = indices.tolist()
        flat = [int(i) for i in (indices if isinstance(indices, (list, tuple)) else [indices])]
        self.calls.append(Freed(flat, self.timeline.tick(), self.label))

    def freed(self, *, before: int | None = None) -> list[int]:
        return [i for call in self.calls if before is None or call.at < before for i in call.indices]
