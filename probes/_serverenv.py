"""An operator's server environment as one SGLang tree reads it (``check --server-env``): the values it takes.

Everything here is the tree's own reading, run in its probe process after the probes:

1. a variable its ``sglang.srt.environ.Envs`` defines is read by that field: the given environment is set in
   ``os.environ`` only for the read (then restored), and the field's ``get()`` gives the value the server takes.
   A value the field's ``parse`` refuses (the server would warn and fall back to the default, or raise) is a
   refusal (kind ``environment``: the check's usage error naming the variable);
2. a variable its ``Envs`` does not define, but that a source file of the tree names, is read elsewhere in the
   tree, its own way (``named``); one that no source file names is ``undefined``: the check warns (a typo must
   not pass silently);
3. each registry gate's variable (``--server-gates``: variable -> the value that turns the fix on): its field's
   value under the given environment (its default where not given) beside the field's reading of the ``on``
   value: ``on`` where they are equal, ``off`` where not; ``undefined`` where the tree names it nowhere, and
   ``unread`` where it names it outside ``Envs`` or its ``Envs`` cannot be imported (the reading is not
   established here: never an all-clear). A tree with no ``sglang.srt.environ`` at all (0.4.x to 0.5.2) reads
   its variables with its own helpers: a boolean gate it names is read as its ``get_bool_env_var`` reads it
   (``bool_reader``), the same comparison, and the record's ``why`` says so (a backport of a gated fix into
   such a tree, written in its idiom; no release of those names a gate).

Standard library and the kit only; ``plain`` is the server arguments' (one way to write a value as data).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from _probekit import describe_error
from _serverconfig import Unplain, plain

ENV_SCHEMA = "pd-probe-environment/1"
ENVIRON_MODULE = "sglang.srt.environ"
# A gate's state, as the check's GateState enum reads it back (documents/vocabulary.py).
ON, OFF, UNDEFINED, UNREAD = "on", "off", "undefined", "unread"
# The values a tree's get_bool_env_var understands (0.4.x's sglang.srt.utils): anything else it reads as false.
TRUTHY, FALSY = ("true", "1"), ("false", "0")


@contextlib.contextmanager
def environment(given: dict[str, str], unset: tuple[str, ...] = ()) -> Iterator[None]:
    """``given`` in ``os.environ`` for the block and ``unset`` out of it, the previous values (or their absence)
    restored after."""
    saved = {name: os.environ.get(name) for name in (*given, *unset)}
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(given)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def read_environment(given: dict[str, str], gates: dict[str, str]) -> dict:
    """``given`` (name -> value) as the tree reads it, and each gate's state under it."""
    doc: dict = {"schema": ENV_SCHEMA, "given": given, "envs": False, "values": {}, "named": [], "undefined": [],
                 "gates": {}, "envs_error": None, "error": None}
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        doc["error"] = {"kind": "environment", "variable": None,
                        "message": "--server-env is not a JSON object of strings"}
        return doc
    envs, failed = _envs()
    doc["envs"], doc["envs_error"] = envs is not None, failed
    bare = envs is None and failed is None and not has_environ()  # reads its variables its own way
    fields = {name: _field(envs, name) for name in {*given, *gates}}
    outside = [name for name in {*given, *gates} if fields[name] is None]
    named = _named_in_source(outside) if outside else set()
    for name in sorted(given):
        if fields[name] is not None:
            read = _read(fields[name], name, given)
            if "error" in read:
                doc["error"] = read["error"]
                return doc
            doc["values"][name] = read["value"]
        elif failed is not None:  # an Envs that does not import here reads nothing: ``envs_error`` says why
            continue
        elif name in named:
            doc["named"].append(name)
        else:
            doc["undefined"].append(name)
    for variable, on in sorted(gates.items()):
        if fields[variable] is None and variable in named and bare and on.lower() in TRUTHY + FALSY:
            doc["gates"][variable] = _bool_gate(variable, on, given)
        else:
            doc["gates"][variable] = _gate(fields[variable], variable, on, given, variable in named, failed)
    return doc


def has_environ() -> bool:
    """Whether the tree has a ``sglang.srt.environ`` module at all (0.5.3 on), importable here or not."""
    try:
        return importlib.util.find_spec(ENVIRON_MODULE) is not None
    except (ImportError, ValueError):  # no sglang.srt to look in
        return False


def bool_reader() -> tuple[Callable[[str], bool], str]:
    """How a tree with no ``sglang.srt.environ`` reads a boolean variable, and that reader's name: its own
    ``sglang.srt.utils.get_bool_env_var`` (false unless set), or where it has none, ``os.environ`` as that helper
    reads it ("true" or "1", case aside)."""
    try:
        from sglang.srt.utils import get_bool_env_var
    except ImportError:
        return (lambda name: os.environ.get(name, "false").lower() in TRUTHY), "os.environ"
    return (lambda name: bool(get_bool_env_var(name))), "get_bool_env_var"


def _bool_gate(variable: str, on: str, given: dict[str, str]) -> dict:
    """A gate a tree with no ``sglang.srt.environ`` names: read, as given and as ``on``, by its ``bool_reader``."""
    found: dict = {"given": variable in given, "on": on, "value": None, "on_value": None}
    try:
        read, how = bool_reader()
        with environment(given, () if variable in given else (variable,)), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = read(variable)
        with environment({variable: on}), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            turned = read(variable)
    except Exception as exc:  # the tree's helper does not run here: its reading is not established
        error = describe_error(exc)
        return {**found, "state": UNREAD, "why": f"this tree's boolean reader failed: {error['type']}: "
                                                 f"{error['message']}"}
    where = "as given" if variable in given else "its default: not given"
    why = (f"read with this tree's sglang.srt.utils.get_bool_env_var (it has no {ENVIRON_MODULE}), {where}"
           if how == "get_bool_env_var" else
           f"read from os.environ as a get_bool_env_var reads it (true or 1): this tree has neither "
           f"{ENVIRON_MODULE} nor that helper, {where}")
    return {**found, "value": value, "on_value": turned, "state": ON if value == turned else OFF, "why": why}


def _envs() -> tuple[Any, dict | None]:
    """The tree's ``Envs`` record, or None with why (None, None: the tree has no such module)."""
    try:
        module = importlib.import_module(ENVIRON_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and ENVIRON_MODULE.startswith(exc.name):
            return None, None
        return None, describe_error(exc)
    except Exception as exc:  # the module is there but does not import here: its fields cannot be read
        return None, describe_error(exc)
    envs = getattr(module, "envs", None)
    return (envs, None) if envs is not None else (None, None)


def _field(envs: Any, name: str) -> Any:
    """The tree's field for ``name``: an attribute of its ``Envs`` with a ``get()``; None: it defines none."""
    if envs is None:
        return None
    found = getattr(type(envs), name, None)
    return found if callable(getattr(found, "get", None)) else None


def _read(field: Any, name: str, given: dict[str, str]) -> dict:
    """The value ``field`` takes under ``given``; a value its own ``parse`` refuses is an error naming ``name``."""
    try:
        # Not given, it is at the tree's default on the server, whatever this process inherited.
        with environment(given, () if name in given else (name,)), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a refused value warns and falls back: ``parse`` below says why
            value = field.get()
            if name in given and callable(getattr(field, "parse", None)):
                field.parse(given[name])
    except Exception as exc:  # the tree refuses the value (its server would ignore it, or fail to start)
        error = describe_error(exc)
        shown = f"{name}={given[name]!r}" if name in given else f"{name} (not given: its default)"
        return {"error": {"kind": "environment", "variable": name,
                          "message": f"this tree's Envs refuses {shown}: {error['type']}: {error['message']}"}}
    try:
        return {"value": plain(value)}
    except Unplain as exc:
        return {"value": str(exc)}


def _gate(field: Any, variable: str, on: str, given: dict[str, str], named: bool, failed: dict | None) -> dict:
    found: dict = {"given": variable in given, "on": on, "value": None, "on_value": None}
    if field is None:
        why = "named outside its Envs" if named else "its Envs does not import here" if failed else None
        return {**found, "state": UNREAD if why else UNDEFINED, "why": why or "not defined by this tree"}
    value, turned = _read(field, variable, given), _read(field, variable, {variable: on})
    if "error" in value or "error" in turned:  # the given value was refused above; the registry's ``on`` here
        return {**found, "state": UNREAD, "why": (value.get("error") or turned["error"])["message"]}
    state = ON if value["value"] == turned["value"] else OFF
    why = "as given" if variable in given else "its default: not given"
    return {**found, "value": value["value"], "on_value": turned["value"], "state": state, "why": why}


def _named_in_source(names: list[str]) -> set[str]:
    """The ``names`` some Python file of the tree's ``sglang`` package spells out."""
    try:
        import sglang
        roots = [Path(p) for p in sglang.__path__]
    except Exception:  # no package to read: nothing is named
        return set()
    found: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            found |= {name for name in names if name in text}
            if found == set(names):
                return found
    return found
