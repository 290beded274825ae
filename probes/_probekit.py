"""Shared machinery of the differential probes: scenarios, recorders, output.

Nothing here imports SGLang at import time, so it can be tested on its own (the
server-args helpers import it when a probe's ``prepare()`` calls them). A probe script
defines its scenarios with ``@scenario`` and calls ``main``; ``main`` isolates
every scenario, blocks the network and writes a deterministic result document.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import os
import re
import socket
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import _standins

SCHEMA = "pd-differential-probe/1"
# PD disaggregation's package: a tree without it has no PD handoff, so neither fix (nor what it fixes) is in it.
PD_PACKAGE = "sglang.srt.disaggregation"
RUNTIME_PACKAGE = "sglang.srt.managers"
PD_ABSENT = {"pd_disaggregation": "absent"}
EXIT_OK = 0
EXIT_CANNOT_RUN = 3
EXIT_USAGE = 2
TREE_KINDS = ["git", "release", "path"]  # what a cell names; the check driver takes any
FILE_MODE = 0o644  # results are read by everyone; mkstemp alone gives 0600

Observed = dict[str, Any]


@dataclass
class Scenario:
    id: str
    title: str
    run: Callable[[Observed], None]


@dataclass
class ScenarioSet:
    """Scenarios of one experiment, in declaration order."""

    experiment: str
    scenarios: list[Scenario] = field(default_factory=list)
    # Whether what the scenarios drive needs PD disaggregation: a tree without it then records so in each scenario
    # instead of preparing anything. False for a fix outside PD (the plain overlap loop is older than PD).
    needs_pd: bool = True
    # How the probe drove this tree where it differs from today's SGLang (short stable names).
    adaptations: set[str] = field(default_factory=set)

    def scenario(self, scenario_id: str, title: str):
        def register(fn: Callable[[Observed], None]):
            if any(s.id == scenario_id for s in self.scenarios):
                raise ValueError(f"duplicate scenario id {scenario_id!r}")
            self.scenarios.append(Scenario(scenario_id, title, fn))
            return fn

        return register

    def guarded(self, lacks: Callable[..., Observed]):
        """A ``scenario`` decorator whose scenarios, on a tree lacking what they drive, record what it lacks and end.

        ``lacks(**options)`` (the options a scenario is declared with) answers, when the scenario runs, the tree
        facts it records instead of running: empty where the tree has what the scenario needs.
        """
        def scenario(scenario_id: str, title: str, **options: Any):
            def register(body: Callable[[Observed], None]) -> Callable[[Observed], None]:
                @functools.wraps(body)
                def run(observed: Observed) -> None:
                    facts = lacks(**options)
                    if facts:
                        observed.update(facts)
                        return
                    body(observed)
                return self.scenario(scenario_id, title)(run)
            return register

        return scenario

    def adapted(self, name: str) -> None:
        """Name an adaptation that ran: the result lists it, so a reader sees how the tree was driven."""
        self.adaptations.add(name)


class Recorder:
    """A stand-in callable that records each call's arguments.

    ``returns`` is returned from every call; ``raises`` is raised after the
    call is recorded, so a failing collaborator still leaves a trace.
    """

    def __init__(self, name: str, returns: Any = None, raises: BaseException | None = None):
        self.name = name
        self.returns = returns
        self.raises = raises
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.raises is not None:
            raise self.raises
        return self.returns

    @property
    def count(self) -> int:
        return len(self.calls)

    def arg(self, name: str, position: int | None = None, call: int = -1, default: Any = None):
        """One argument of one recorded call, by keyword or position."""
        args, kwargs = self.calls[call]
        if name in kwargs:
            return kwargs[name]
        if position is not None and position < len(args):
            return args[position]
        return default


class Spy(Recorder):
    """A Recorder that also runs ``then`` (usually the real callable it watches)."""

    def __init__(self, name: str, then: Callable[..., Any]):
        super().__init__(name)
        self.then = then

    def __call__(self, *args, **kwargs):
        super().__call__(*args, **kwargs)
        return self.then(*args, **kwargs)


def tree_classes(*paths: str) -> tuple[type, ...]:
    """The tree's own classes among ``"module:Class"`` paths, in order; a path the tree lacks is skipped.

    Collaborators move and get renamed between releases, so a stand-in names every place its class
    has lived. A module that does not import on this machine only leaves its names unrecorded: the
    stand-in still carries what it was written with.
    """
    found = []
    for path in paths:
        module, _, name = path.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception:  # absent, or not importable here: nothing to take names from
            continue
        if isinstance(cls, type) and cls not in found:  # an old module may re-export the new one's class
            found.append(cls)
    return tuple(found)


def _methods(classes: tuple[type, ...]) -> dict[str, Any]:
    """Each method name the classes and their bases define (dunders aside), with its return annotation."""
    methods: dict[str, Any] = {}
    for cls in classes:
        for klass in cls.__mro__:
            if klass is object:
                continue
            for name, value in vars(klass).items():
                if (name.startswith("__") and name.endswith("__")) or name in methods:
                    continue
                fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                if inspect.isfunction(fn):
                    methods[name] = fn.__annotations__.get("return")
    return methods


_NEUTRAL: dict[str, Callable[[], Any]] = {"bool": bool, "int": int, "float": float, "str": str, "list": list,
                                         "dict": dict, "tuple": tuple, "set": set}


def _neutral(annotation: Any) -> Any:
    """What a recorded method returns: the empty value of a builtin return type it declares, else None."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    head = text.removeprefix("typing.").split("[", 1)[0].strip().lower()
    make = _NEUTRAL.get(head)
    return make() if make is not None else None


def summary(value: Any) -> str:
    """A deterministic word for an argument: scalars as they are, anything else by its type (no ids)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(scrub(value))
    if isinstance(value, (list, tuple, set, dict)):
        return f"{type(value).__name__}[{len(value)}]"
    return type(value).__name__


class _Recording:
    """What a collaborator stand-in adds to its hand-written attributes: every other method of the
    tree's collaborator classes answers as a recorder, so the tree's own idiom (a name only an older
    or a newer tree calls) never ends a scenario with an AttributeError.

    A name neither written nor defined by those classes stays an AttributeError, as the real
    collaborator would raise: the tree's own ``hasattr`` tests read it as absent. Its message says
    which stand-in lacked what and why, so a scenario's error (or a tree's log of an error its loop
    caught) names the probe's gap, not a bare ``SimpleNamespace``."""

    __methods: dict[str, Any] = {}
    __label = ""
    __classes: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        methods = type(self).__methods
        if name not in methods:
            owner = type(self)
            classes = owner.__classes
            where = (f"the tree's {', '.join(classes)} {'defines' if len(classes) == 1 else 'define'} no such method"
                     if classes else "the tree has no class for its role here to take methods from")
            raise AttributeError(f"the probe's {owner.__label} stand-in has no attribute {name!r}: the probe did "
                                 f"not write it, and {where}", name=name, obj=self)
        recorder = _MethodRecorder(f"{type(self).__label}.{name}", methods[name], self)
        object.__setattr__(self, name, recorder)  # one recorder per name, so its calls add up
        return recorder


class _MethodRecorder(Recorder):
    """A recorder for a method no one wrote: each call also goes to its stand-in's log."""

    def __init__(self, name: str, annotation: Any, owner: Any):
        super().__init__(name)
        self.annotation = annotation
        self.owner = owner

    def __call__(self, *args, **kwargs):
        words = [summary(a) for a in args] + [f"{k}={summary(v)}" for k, v in sorted(kwargs.items())]
        recorded(self.owner).append(f"{self.name}({', '.join(words)})")
        self.returns = _neutral(self.annotation)  # a fresh one each call: the tree may fill it
        return super().__call__(*args, **kwargs)


def recorded(stand_in: Any) -> list[str]:
    """The calls of ``stand_in``'s recorded methods, in order: ``name(argument summaries)``."""
    return stand_in.__dict__.setdefault("_Recording__log", [])


@functools.cache  # a scenario makes many stand-ins of a few kinds
def stand_in_class(written: type, classes: tuple[type, ...], label: str | None = None) -> type:
    """``written`` (a hand-written stand-in class) answering every method of ``classes`` as a recorder.

    The result is not a subclass of the tree's classes: an ``isinstance`` test in the tree still
    sees a stranger, and no real method runs.
    """
    methods = {name: ret for name, ret in _methods(classes).items() if not hasattr(written, name)}
    return type(written.__name__, (written, _Recording), {
        "_Recording__methods": methods, "_Recording__label": label or written.__name__,
        "_Recording__classes": tuple(cls.__qualname__ for cls in classes),
        "__module__": written.__module__, "__qualname__": written.__qualname__})


def stand_in(classes: tuple[type, ...], label: str, **attrs: Any) -> Any:
    """A collaborator stand-in: ``attrs`` as written (what the probes observe, and every attribute the
    tree reads), and every other method the tree's ``classes`` define a recorder returning a neutral value."""
    return stand_in_class(SimpleNamespace, classes, label)(**attrs)


class Collaborators:
    """A probe's collaborator roles, each with the ``"module:Class"`` paths its classes have lived at.

    ``find()`` imports them once, from ``prepare()``, so no scenario imports anything; until then (and
    for a role the tree has no class for) a stand-in carries only what it was written with.
    """

    def __init__(self, **roles: tuple[str, ...]):
        self.roles = roles
        self.found: dict[str, tuple[type, ...]] = {}

    def find(self) -> None:
        self.found = {role: tree_classes(*paths) for role, paths in self.roles.items()}

    def classes(self, role: str) -> tuple[type, ...]:
        if role not in self.roles:
            raise KeyError(f"no collaborator role {role!r}")  # a typo must not pass as a tree lacking the class
        return self.found.get(role, ())

    def make(self, role: str, label: str, **attrs: Any) -> Any:
        """The stand-in for ``role``: see ``stand_in``."""
        return stand_in(self.classes(role), label, **attrs)

    def make_class(self, role: str, written: type, label: str) -> type:
        """A hand-written stand-in class for ``role`` (one the tree constructs): see ``stand_in_class``."""
        return stand_in_class(written, self.classes(role), label)


@contextlib.contextmanager
def swapped(owner: Any, **attrs: Any):
    """Set attributes on a module or object for one block, restoring them after."""
    saved = {name: getattr(owner, name) for name in attrs}
    for name, value in attrs.items():
        setattr(owner, name, value)
    try:
        yield owner
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


def server_args(ServerArgs: type, adapt: Callable[[str], None], **kwargs: Any) -> Any:
    """``ServerArgs(**kwargs)``, or where the tree cannot build one on this machine its dataclass defaults.

    Up to 0.4.10 ``__post_init__`` asks for an accelerator (RuntimeError without one) and loads the
    model's config (OSError offline); the probed doors and result paths read only plain fields.
    """
    try:
        return ServerArgs(**kwargs)
    except (RuntimeError, OSError):
        adapt("server-args-defaults")
    args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    for name, value in dict(kwargs, device="cpu").items():
        object.__setattr__(args, name, value)
    return args


VOCAB = 1000  # above every token a probe's requests carry
EOS = VOCAB - 1  # the model's end-of-sequence token: no probe's request carries it


def served_req(req_cls: type, params_cls: type, rid: str, prompt: list[int], **sampling: Any) -> Any:
    """The tree's ``Req`` as a server hands it to a scheduler: its sampling parameters normalized as the tokenizer
    manager leaves them (no stop strings), its vocabulary size and end-of-sequence tokens set (a server sets them
    from the model), all of which a finish check reads (0.5.4.post2 and 0.5.4.post3 look a committed first token
    up in the EOS set)."""
    params = params_cls(**sampling)
    if hasattr(params, "normalize"):
        params.normalize(None)
    req = req_cls(rid, "", list(prompt), params)
    req.vocab_size = VOCAB
    req.eos_token_ids = {EOS}
    return req


def publish_server_args(args: Any, adapt: Callable[[str], None], *, role: str, reset: bool = False) -> None:
    """Publish server args as a scheduler process would, by the first route the tree has.

    ``runtime_context.publish`` (0.5.17 on); ``get_context().set_server_args`` (0.5.15, 0.5.16);
    ``set_global_server_args_for_scheduler`` (0.5.4 to 0.5.14); older trees read a module-level dict
    of defaults and publish nothing.
    """
    try:
        from sglang.srt import runtime_context
    except ImportError:
        runtime_context = None
    if runtime_context is not None and hasattr(runtime_context, "publish"):
        if reset and hasattr(runtime_context, "reset_context"):
            runtime_context.reset_context()
        runtime_context.publish(args, role=role)
        return
    get_context = getattr(runtime_context, "get_context", None)
    if get_context is not None and hasattr(get_context(), "set_server_args"):
        adapt("publish-set-server-args")
        get_context().set_server_args(args)
        return
    from sglang.srt import server_args as module
    if hasattr(module, "set_global_server_args_for_scheduler"):
        adapt("publish-global-server-args")
        module.set_global_server_args_for_scheduler(args)
        return
    adapt("server-args-unpublished")


class SourceUnreadable(RuntimeError):
    """What a tree's code reads was asked of a source that cannot be read: no answer, never a no."""


def class_fact(fn: Callable[..., Any], token: str, *, why: str) -> bool:
    """Whether ``fn``'s source names ``token``: a fact of the tree's classes that shapes what the probe's
    stand-ins carry or which adaptation it records (``why`` says which), never an observation: an answer rests
    on what the tree's code does when driven (tests/test_source_reads.py holds every probe to that).
    A source that cannot be read raises ``SourceUnreadable``: an error of the scenario (or of the probe's
    setup), never a False."""
    return token in _source(fn)


_SOURCES: dict[Any, str] = {}


def _source(obj: Any) -> str:
    """``inspect.getsource``, read once per code object (a class: once per class). Each call re-tokenizes the
    file, most of a scenario's time; a mutant's swapped ``__code__`` is a new key, read as it always was."""
    key = getattr(obj, "__code__", obj)
    if key not in _SOURCES:
        try:
            _SOURCES[key] = inspect.getsource(obj)
        except (OSError, TypeError) as exc:
            name = getattr(obj, "__qualname__", type(obj).__name__)
            raise SourceUnreadable(f"the source of {name} cannot be read ({type(exc).__name__}: {exc}), "
                                   "so what it reads is unknown") from exc
    return _SOURCES[key]


def accepts(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(fn).parameters


_HEX_ID = re.compile(r"0x[0-9a-fA-F]+")
_ABS_PATH = re.compile(r"(/[^\s'\"():]+)+/(?=[^/\s'\"():]+)")


def scrub(text: str) -> str:
    """Remove what differs between runs or machines: object ids and directories."""
    return _ABS_PATH.sub("", _HEX_ID.sub("0x?", text))


def describe_error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": scrub(str(exc))[:500]}


def run_scenario(sc: Scenario) -> dict[str, Any]:
    observed: Observed = {}
    error = None
    calls = len(_standins.CALLED)
    try:
        sc.run(observed)
    except Exception as exc:  # one scenario's failure must not stop the others
        error = describe_error(exc)
    reached = _standins.CALLED[calls:]
    if reached:  # even if SGLang caught it: what a stand-in did is never an observation
        error = {"type": _standins.StandInCalled.__name__,
                 "message": f"the scenario called the import stand-in(s) {', '.join(sorted(set(reached)))}"}
    try:
        plain = _plain(observed)
    except TypeError as exc:
        plain, error = {}, describe_error(exc)
    return {"title": sc.title, "observed": plain, "error": error}


def _plain(value: Any) -> Any:
    """Reduce observations to JSON scalars; anything else is a probe bug."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(f"observation of type {type(value).__name__} is not a JSON scalar")


def build_document(scenario_set: ScenarioSet, side: str, tree: dict[str, str], extra: dict | None = None, *,
                   pd_absent: bool = False) -> dict:
    """Every scenario's observations; on a tree without PD disaggregation, each records only that."""
    doc = {
        "schema": SCHEMA,
        "experiment": scenario_set.experiment,
        "side": side,
        "tree": tree,
        "scenarios": {sc.id: {"title": sc.title, "observed": dict(PD_ABSENT), "error": None} if pd_absent
                      else run_scenario(sc) for sc in scenario_set.scenarios},
    }
    stand_ins = _standins.record()
    if stand_ins is not None:  # absent, not empty, where none ran: today's documents keep their bytes
        doc["stand_ins"] = stand_ins
    if scenario_set.adaptations:  # absent where none ran: today's trees keep their results' bytes
        doc["adaptations"] = sorted(scenario_set.adaptations)
    doc.update(extra or {})
    return doc


def dumps(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """As the harness writes files (pdevidence.core.files, which a cell cannot import): whole, 0644."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class NetworkBlocked(RuntimeError):
    pass


def block_network() -> None:
    """Make any accidental outbound connection fail loudly."""

    def refuse(self, address, *args, **kwargs):
        raise NetworkBlocked(f"probe attempted a network connection to {address!r}")

    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = lambda address, *a, **k: refuse(None, address)


def quiet_environment() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_probe(path: Path) -> tuple[ScenarioSet, Callable[[], str]]:
    """A probe module's one scenario set and its ``prepare()``, loaded by path (for the drivers)."""
    spec = importlib.util.spec_from_file_location(f"pdprobe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    sets = [value for value in vars(module).values() if isinstance(value, ScenarioSet)]
    if len(sets) != 1 or not callable(getattr(module, "prepare", None)):
        raise TypeError(f"{path.name} must define one ScenarioSet and a prepare() function")
    return sets[0], module.prepare


def add_tree_arguments(parser: argparse.ArgumentParser, kinds: list[str] | None = TREE_KINDS) -> None:
    """What the tree under test is; ``kinds=None`` takes any kind (a check also names wheels, interpreters)."""
    parser.add_argument("--tree-kind", default="path", choices=kinds)
    parser.add_argument("--tree-ref", default="", help="the ref as asked for (commit, version, directory label)")
    parser.add_argument("--tree-resolved", default="", help="full SHA or version; default: sglang.__version__")


def tree_of(args: argparse.Namespace, version: str) -> dict[str, str]:
    """The result's tree: as the harness named it, else the SGLang version ``prepare()`` found."""
    return {"kind": args.tree_kind, "ref": args.tree_ref or version, "resolved": args.tree_resolved or version}


def lacks_pd() -> bool:
    """Whether the tree has SGLang's server runtime (``sglang.srt.managers``: the scheduler and its request
    queues) but no PD disaggregation package beside it: read from what the tree holds, not its version. A tree whose ``sglang`` does not import raises that error here (the
    reason it cannot run); without ``sglang`` at all, prepare() says so."""
    try:
        import sglang  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name == "sglang":
            return False
        raise
    try:
        return importlib.util.find_spec(RUNTIME_PACKAGE) is not None and importlib.util.find_spec(PD_PACKAGE) is None
    except ModuleNotFoundError:  # no sglang.srt: not a server tree
        return False


def prepare_tree(scenario_set: ScenarioSet, prepare: Callable[[], str]) -> tuple[str, bool]:
    """The SGLang version and whether the tree lacks the PD disaggregation the scenarios need; ``prepare()`` runs
    only where they have what they need (everything it sets up lives there)."""
    if scenario_set.needs_pd and lacks_pd():
        import sglang
        return sglang.__version__, True
    return prepare(), False


def prepared(scenario_set: ScenarioSet, prepare: Callable[[], str]) -> tuple[str, bool] | None:
    """``prepare_tree``'s answer, or None after saying why the probe cannot run."""
    try:
        return prepare_tree(scenario_set, prepare)
    except Exception as exc:
        err = describe_error(exc)
        print(f"probe cannot run: SGLang setup failed: {err['type']}: {err['message']}", file=sys.stderr)
        return None


def emit(text: str, out: Path | None) -> None:
    """The document to ``out`` (atomically), or to stdout."""
    if out:
        write_atomic(out, text)
    else:
        sys.stdout.write(text)


def parse_args(argv: list[str] | None, experiment: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=f"Run the {experiment} differential probe against the installed SGLang."
    )
    parser.add_argument("--side", default="local", help="label of the tree under test (base, head, a release)")
    add_tree_arguments(parser)
    parser.add_argument("--out", type=Path, help="write the result here (atomically); default: stdout")
    return parser.parse_args(argv)


def run_driver(main: Callable[[], int]) -> int:
    """Every probe entry point's boundary: an exception outside any scenario (a scenario's own is
    recorded in the result) is a bug of the probe kit, and means the probe could not run."""
    try:
        return main()
    except Exception:
        traceback.print_exc()
        print("probe cannot run: the probe driver failed outside any scenario; this is a bug in "
              "pdevidence's probes, please report it with the traceback above", file=sys.stderr)
        return EXIT_CANNOT_RUN


def main(scenario_set: ScenarioSet, prepare: Callable[[], str], argv: list[str] | None = None) -> int:
    """Run every scenario and write the result document.

    ``prepare`` imports SGLang and sets up what all scenarios share; it
    returns the installed SGLang version. If it fails the probe cannot run.
    """
    return run_driver(lambda: _main(scenario_set, prepare, argv))


def _main(scenario_set: ScenarioSet, prepare: Callable[[], str], argv: list[str] | None) -> int:
    try:
        args = parse_args(argv, scenario_set.experiment)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    quiet_environment()
    block_network()
    _standins.install()
    found = prepared(scenario_set, prepare)
    if found is None:
        return EXIT_CANNOT_RUN
    version, absent = found
    emit(dumps(build_document(scenario_set, args.side, tree_of(args, version), {"sglang_version": version},
                              pd_absent=absent)), args.out)
    return EXIT_OK
