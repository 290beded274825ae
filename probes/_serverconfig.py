"""An operator's server arguments as one SGLang tree reads them (``check --server-args``): their effective values.

Everything here is the tree's own reading, run in its probe process:

1. its parser (``ServerArgs.add_cli_args``) reads the arguments: an option it does not define, or a value it
   refuses, is a refusal (kind ``arguments``: the check's usage error naming it);
2. its resolution (``ServerArgs.__post_init__``, or ``resolve_once`` where the tree defers it) derives the
   arguments that follow from others. It runs on the parsed record with one stand-in at the boundary, the device
   ``cpu`` where none is given (recorded); where it runs through, its values are the effective ones;
3. where it stops (here there is no model config and no accelerator), the tree's model-independent route (its
   own ``--model-path dummy`` short circuit) runs instead: a ``ValueError`` or ``AssertionError`` there is the
   tree refusing the configuration. An attribute its resolution code never writes keeps the parser's value; one
   it may write (read from the code: an assignment to it, a keyword or a string naming it in a function) has no
   established value, and the check does not let the configuration decide on it. A write that only rewrites one
   named value of the attribute to another (``if x.backend == "mooncake_tcp": backend = "mooncake"``) cannot
   touch a value none of its guards name: that value keeps the parser's.

A value is reported by value (an enum by its ``value``, a tuple as a list); one that is not plain data has no
established value. It runs inside the probe process, beside the tree (standard library and the kit only).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib.util
import inspect
from pathlib import Path
from typing import Any

from _probekit import describe_error

CONFIG_SCHEMA = "pd-probe-config/2"
# Where a tree that splits its resolution into steps keeps them (0.5.17 on), beside the ServerArgs module.
RESOLUTION_PACKAGES = ("sglang.srt.arg_groups",)
DUMMY_MODEL = "dummy"  # the model path every tree's resolution stops early for: its model-independent route
DEVICE_STAND_IN = "cpu"
REFUSALS = (ValueError, AssertionError)  # how a tree's resolution refuses a configuration


class Refused(Exception):
    """The tree's parser refused an argument; ``option`` names it."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class Unplain(TypeError):
    """A value that is not plain data: it cannot be compared with the registry's values."""


class _TreeParser(argparse.ArgumentParser):
    """argparse as the tree's server uses it, but an error is raised, never printed and exited on."""

    def error(self, message: str):
        raise Refused(message)

    def exit(self, status: int = 0, message: str | None = None):
        raise Refused(message or "the parser asked to exit (--help or --version is not a server option)")


def read_configuration(server_args: list[str], attrs: list[str]) -> dict:
    """``server_args`` as the tree reads them: the effective values of ``attrs`` it establishes, why the others
    are not established, how its resolution ran, or the refusal naming the argument."""
    doc: dict = {"schema": CONFIG_SCHEMA, "server_args": server_args, "values": None, "unestablished": {},
                 "resolution": None, "error": None}
    if not isinstance(server_args, list) or not all(isinstance(a, str) for a in server_args):
        doc["error"] = {"kind": "arguments", "option": None, "message": "--server-args is not a JSON array of strings"}
        return doc
    if "--config" in server_args or any(a.startswith("--config=") for a in server_args):
        doc["error"] = {"kind": "arguments", "option": "--config",
                        "message": "a config file is not read: give its options as arguments"}
        return doc
    try:
        from sglang.srt.server_args import ServerArgs
        parser = _TreeParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
    except Exception as exc:  # the tree's parser cannot be built here: nothing reads the arguments
        error = describe_error(exc)
        message = f"{error['type']}: {error['message']}"
        doc["error"] = {"kind": "parser", "option": None, "message": message}
        doc["unestablished"] = {attr: f"this tree's parser cannot be built here ({message})" for attr in attrs}
        return doc
    for action in parser._actions:
        action.required = False  # only the options given are read: a missing model path is the resolution's
    try:
        namespace, extra = parser.parse_known_args(server_args)
        if extra:
            raise Refused(f"unrecognized arguments: {' '.join(extra)}", extra[0])
    except Refused as exc:
        doc["error"] = {"kind": "arguments", "option": exc.option or _option_of(str(exc)), "message": str(exc)}
        return doc
    except Exception as exc:  # an option's own type or action refused its value
        error = describe_error(exc)
        doc["error"] = {"kind": "arguments", "option": None, "message": f"{error['type']}: {error['message']}"}
        return doc
    defined = [attr for attr in attrs if hasattr(namespace, attr)]  # an attribute the parser lacks is left out
    parsed = {attr: getattr(namespace, attr) for attr in defined}
    resolution, effective = _resolve(ServerArgs, namespace)
    if "refused" in resolution:
        refused = resolution["refused"]
        doc["error"] = {"kind": "arguments", "option": _named(refused["message"], server_args),
                        "message": f"this tree's ServerArgs refuses the configuration: {refused['type']}: "
                                   f"{refused['message']}"}
        doc["resolution"] = resolution
        return doc
    unestablished: dict[str, str] = {}
    if effective is None:  # stopped: what its code never derives keeps the parser's value
        derived = derived_attributes(ServerArgs, parsed)
        resolution["derived"] = sorted(derived)
        effective = {attr: value for attr, value in parsed.items() if attr not in derived}
        stopped = resolution["stopped"]
        unestablished = {attr: f"this tree's resolution derives it and stopped here ({stopped['type']} in "
                               f"{stopped['step']}: {stopped['message']})" for attr in sorted(derived)}
    values = {}
    for attr in defined:
        if attr not in effective:
            continue
        try:
            values[attr] = plain(effective[attr])
        except Unplain as exc:
            unestablished[attr] = str(exc)
    doc.update(values=values, unestablished=unestablished, resolution=resolution)
    return doc


def _resolve(ServerArgs: type, namespace: argparse.Namespace) -> tuple[dict, dict | None]:
    """How the tree's resolution ran on the parsed record, and the effective values where it ran through (None
    where it stopped). A refusal by its model-independent route is ``refused``."""
    given = vars(namespace)
    stand_ins = {"device": DEVICE_STAND_IN} if given.get("device", "") is None else {}
    record = {"stand_ins": stand_ins, "completed": False, "stopped": None}
    model = given.get("model_path")
    if model is None:
        record["stopped"] = {"step": "model_path", "type": "NotGiven",
                             "message": "no --model-path given: the server resolves its arguments against one"}
    else:
        try:
            return {**record, "completed": True}, _resolved(ServerArgs, {**given, **stand_ins})
        except Exception as exc:  # a boundary this machine lacks (the model's config, an accelerator), or a refusal
            record["stopped"] = {"step": _step(exc), **describe_error(exc)}
    try:  # the model-independent route: what refuses the configuration whatever the model
        _resolved(ServerArgs, {**given, **stand_ins, "model_path": DUMMY_MODEL})
    except REFUSALS as exc:
        record["refused"] = {"step": _step(exc), **describe_error(exc)}
    except Exception as exc:  # not a refusal: this machine lacks what even that route needs
        record["dummy_stopped"] = {"step": _step(exc), **describe_error(exc)}
    return record, None


def _resolved(ServerArgs: type, given: dict[str, Any]) -> dict[str, Any]:
    """The tree's resolution of ``given``: ``__post_init__`` runs in the constructor; a tree that defers it
    resolves on ``resolve_once`` and keeps what it decided apart from the input (``resolved_dict``)."""
    if hasattr(ServerArgs, "from_cli_args"):  # how the tree's launcher builds its record
        args = ServerArgs.from_cli_args(argparse.Namespace(**given))
    else:
        names = {f.name for f in dataclasses.fields(ServerArgs)}
        args = ServerArgs(**{name: value for name, value in given.items() if name in names})
    if hasattr(args, "resolve_once"):
        args.resolve_once()
    if hasattr(args, "resolved_dict"):
        return dict(args.resolved_dict())
    return {name: getattr(args, name) for name in given if hasattr(args, name)}


def _step(exc: BaseException) -> str:
    """The innermost function of the tree's ``sglang`` package the error passed through."""
    tb, found = exc.__traceback__, "?"
    while tb is not None:
        if "/sglang/" in Path(tb.tb_frame.f_code.co_filename).as_posix():
            found = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return found


def derived_attributes(ServerArgs: type, parsed: dict[str, Any]) -> set[str]:
    """The attributes of ``parsed`` (attribute -> the parser's value) the tree's resolution code may write: named
    as an assignment's attribute, a call's keyword or a string inside a function of the module defining
    ``ServerArgs`` or of its resolution package; except where every write is a guarded rewrite (``_Rewrite``)
    that no value the attribute can reach from the parser's enters. A source that cannot be read leaves every
    attribute derived."""
    try:
        files = [Path(inspect.getsourcefile(ServerArgs))]
        for name in RESOLUTION_PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                for location in spec.submodule_search_locations:
                    files += sorted(Path(location).rglob("*.py"))
        trees = [ast.parse(path.read_text(encoding="utf-8")) for path in files]
    except (OSError, TypeError, SyntaxError, ImportError, ValueError):
        return set(parsed)
    writes: dict[str, list[_Rewrite | None]] = {}
    for tree in trees:
        for attr, write in _writes(tree, set(parsed)):
            writes.setdefault(attr, []).append(write)
    return {attr for attr, found in writes.items() if _may_change(parsed[attr], found)}


@dataclasses.dataclass(frozen=True)
class _Rewrite:
    """A write of a constant, inside ``if <x>.<attr> == c`` (or ``in (c, ...)``): it runs only where the
    attribute holds one of ``guards``."""

    guards: tuple
    value: Any


def _may_change(value: Any, writes: list[_Rewrite | None]) -> bool:
    """Whether the writes (None: one that may run whatever the value) can change ``value``: the values it can
    reach through the rewrites' guards, from the parser's."""
    if any(w is None for w in writes):
        return True
    reached, todo = [value], [value]
    while todo:
        current = todo.pop()
        for write in writes:
            if current in write.guards and write.value not in reached:
                reached.append(write.value)
                todo.append(write.value)
    return len(reached) > 1


def _writes(tree: ast.AST, wanted: set[str]) -> list[tuple[str, _Rewrite | None]]:
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and node.attr in wanted:
            assigned = parents.get(node)
            value = assigned.value if isinstance(assigned, ast.Assign) and node in assigned.targets else None
            found.append((node.attr, _rewrite(node.attr, value, node, parents)))
        elif isinstance(node, ast.keyword) and node.arg in wanted:
            found.append((node.arg, _rewrite(node.arg, node.value, node, parents)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            found += [(n.value, None) for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in wanted]
    return found


def _rewrite(attr: str, value: ast.AST | None, node: ast.AST, parents: dict) -> _Rewrite | None:
    """The write at ``node`` as a guarded rewrite of a constant, or None: any other write."""
    if not isinstance(value, ast.Constant):
        return None
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and child in parent.body:
            guards = _guards(attr, parent.test)
            if guards is not None:
                return _Rewrite(guards, value.value)
        child, parent = parent, parents.get(parent)
    return None


def _guards(attr: str, test: ast.AST) -> tuple | None:
    """The constants ``test`` requires the attribute to hold (``<x>.attr == c``, ``<x>.attr in (c, ...)``,
    or one such among an ``and``); None: it does not require any."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        for part in test.values:
            found = _guards(attr, part)
            if found is not None:
                return found
        return None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Attribute)
            and test.left.attr == attr):
        return None
    [op], [right] = test.ops, test.comparators
    if isinstance(op, ast.Eq) and isinstance(right, ast.Constant):
        return (right.value,)
    if isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) and \
            all(isinstance(e, ast.Constant) for e in right.elts):
        return tuple(e.value for e in right.elts)
    return None


def plain(value: Any) -> Any:
    """``value`` as plain data, compared by value: an enum by its value, a tuple or set as a list."""
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    raise Unplain(f"its value is a {type(value).__name__} ({repr(value)[:200]}), not plain data this check can "
                  "compare")


def _option_of(message: str) -> str | None:
    """The argument a parser's message names: ``argument --x: ...``."""
    if message.startswith("argument "):
        return message.removeprefix("argument ").split(":", 1)[0].split("/", 1)[0].strip()
    return None


def _named(message: str, server_args: list[str]) -> str | None:
    """The first option given that a resolution's message names (``--x-y``, ``x-y`` or ``x_y``)."""
    for arg in server_args:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            if any(form in message for form in (name, name.replace("-", "_"))):
                return f"--{name}"
    return None
