"""Mutation operators: break one SGLang function in this process, then put it back.

USAGE (engine ready; for probe authors):

  Declare a mutant in experiments.toml, ``[experiments.<exp>.mutants.<id>]``:
      title = "one line"; kind = "removes-fix" | "over-broad" | "leaks"
      target = "sglang.srt.module:Qualname.attr"        # a Python function or method
      operator = "constant"  value = true|1|"x"          # the target returns value
               | "noop"                                  # the target returns None
               | "swap"      replacement = "mod:qualname" # the target calls replacement instead
               | "edit"      old = "tokens" new = "tokens" [count = 1]
  An edit replaces ``old`` by ``new`` in the target's source (docstring and comments
  blanked, so text there never matches); ``old`` must occur exactly ``count`` times.
  Drop a clause by editing it to its neutral value (``req.is_retracted`` -> ``False``
  inside an ``or``), a step by editing its call to ``None``.

  Run every mutant of an experiment on the registry's head release:
      python -m pdevidence mutate <exp>          # or: nox -s "mutate(<exp>)"
  which writes runs/mutate.<exp>.json and prints a mutant x scenario table.
  Try mutants by hand in a cell env (specs: a JSON list of registry ``Mutant.spec()``):
      .cells/envs/<exp>.head.release-X/bin/python probes/probe_mutants.py \
          --probe probes/probe_<exp>_differential.py --mutants specs.json [--only ID] --out /tmp/m.json

  In code: ``with applied(MutantSpec.from_json(spec)): ...`` raises NotApplicable when
  the target is missing on this tree, MutantError when the mutant cannot be built
  (e.g. the edit's text is not in the source); on exit the target is restored and the
  restore is checked (RestoreError).

Every operator swaps the target function's ``__code__`` (never a file, never a name
binding), so every reference to the function sees the mutant: the module attribute,
names imported elsewhere with ``from ... import``, methods already bound.
"""

from __future__ import annotations

import __future__
import ast
import contextlib
import importlib
import inspect
import io
import itertools
import textwrap
import tokenize
import types
from dataclasses import dataclass
from typing import Any, Iterator

OPERATORS = ("constant", "noop", "swap", "edit")
KINDS = ("removes-fix", "over-broad", "leaks")
# A swap's replacement is reached through one injected global of the target's module.
_SWAP_GLOBAL = "__pdevidence_swap_{}__"
_OUTER = "__pdevidence_outer__"
_serial = itertools.count()


class NotApplicable(Exception):
    """The target (or a swap's replacement) does not exist on this tree."""


class MutantError(Exception):
    """The mutant cannot be built on this tree: a probe-author problem, not a kill."""


class RestoreError(Exception):
    """The target is not the original object again after a mutant: later runs are void."""


@dataclass(frozen=True)
class MutantSpec:
    id: str
    title: str
    kind: str
    target: str
    operator: str
    value: Any = None
    replacement: str | None = None
    old: str | None = None
    new: str | None = None
    count: int = 1

    @classmethod
    def from_json(cls, data: dict) -> "MutantSpec":
        fields = set(cls.__dataclass_fields__)
        spec = cls(**{k: v for k, v in data.items() if k in fields})
        if spec.operator not in OPERATORS:
            raise MutantError(f"mutant {spec.id}: unknown operator {spec.operator!r}")
        if spec.kind not in KINDS:
            raise MutantError(f"mutant {spec.id}: unknown kind {spec.kind!r}")
        return spec


# ---------------------------------------------------------------- finding the target


def _lookup(path: str) -> Any:
    """The object at "module:Qual.name", unwrapped to what the owner stores."""
    if ":" not in path:
        raise MutantError(f"{path!r} is not \"module.path:Qualified.name\"")
    module_name, qualname = path.split(":", 1)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise NotApplicable(f"module {module_name} is not on this tree ({exc})") from None
    for part in qualname.split("."):
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            raise NotApplicable(f"{path}: {part!r} is not on this tree") from None
    return obj


def target_function(path: str) -> types.FunctionType:
    """The Python function whose code a mutant replaces (decorators and wrappers peeled)."""
    obj = _lookup(path)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    elif isinstance(obj, property):
        obj = obj.fget
    obj = inspect.unwrap(obj)
    if not isinstance(obj, types.FunctionType):
        raise MutantError(f"{path} is a {type(obj).__name__}, not a Python function: no code to replace")
    return obj


# ---------------------------------------------------------------- building the new code


def _blank_docs_and_comments(source: str) -> str:
    """The source with its docstring and comments blanked, line positions kept."""
    lines = source.splitlines(keepends=True)
    fdef = ast.parse(source).body[0]
    first = fdef.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str) and len(fdef.body) > 1):
        for row in range(first.lineno - 1, first.end_lineno):
            lines[row] = "\n"
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col].rstrip() + "\n"
    return "".join(lines)


def _stub_source(fn: types.FunctionType, body: str) -> str:
    return f"def {fn.__name__}(*args, **kwargs):\n    return {body}\n"


def _compile(fn: types.FunctionType, source: str, first_line: int = 1) -> types.CodeType:
    """Compile one ``def`` in ``fn``'s module, with ``fn``'s closure layout; return its code."""
    fdef = ast.parse(source).body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise MutantError(f"{fn.__qualname__}: the edited source is no longer one function definition")
    fdef.decorator_list = []  # the original function object keeps whatever wraps it
    ast.increment_lineno(fdef, first_line - 1)
    free = fn.__code__.co_freevars
    if free:
        # The code must use the same free variables as the original, so its closure cells fit.
        fdef.body.append(ast.parse(f"if False: ({', '.join(free)},)").body[0])
        outer = ast.parse(f"def {_OUTER}():\n    {' = '.join(free)} = None\n    return {fdef.name}\n").body[0]
        outer.body.insert(1, fdef)
        module = ast.Module(body=[outer], type_ignores=[])
    else:
        module = ast.Module(body=[fdef], type_ignores=[])
    ast.fix_missing_locations(module)
    filename = fn.__code__.co_filename
    # Annotations are never evaluated: names imported only for type checking stay unresolved.
    code = compile(module, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace = dict(fn.__globals__)
    exec(code, namespace)
    made = namespace[_OUTER]() if free else namespace[fdef.name]
    new = made.__code__
    if new.co_freevars != free:
        raise MutantError(f"{fn.__qualname__}: the edit changes the free variables "
                          f"{free} -> {new.co_freevars}; edit fewer tokens")
    return new.replace(co_name=fn.__code__.co_name, co_qualname=fn.__code__.co_qualname)


def edited_source(spec: MutantSpec, fn: types.FunctionType) -> tuple[str, int]:
    lines, first_line = inspect.getsourcelines(fn)
    source = _blank_docs_and_comments(textwrap.dedent("".join(lines)))
    found = source.count(spec.old)
    if found != spec.count:
        raise MutantError(f"edit of {spec.target}: {spec.old!r} occurs {found} time(s) in its code "
                          f"(docstring and comments excluded), expected {spec.count}; "
                          "the tree's source differs from what the mutant was written for")
    return source.replace(spec.old, spec.new), first_line


@dataclass
class Patch:
    """One applied mutant: what to put back, and how to check that it is back."""

    spec: MutantSpec
    function: types.FunctionType
    original: types.CodeType
    injected: dict[str, Any]

    def restore(self) -> None:
        self.function.__code__ = self.original
        for name in self.injected:
            self.function.__globals__.pop(name, None)

    def check(self) -> None:
        try:
            current = target_function(self.spec.target)
        except (NotApplicable, MutantError) as exc:
            raise RestoreError(f"{self.spec.id}: the target cannot be found after restoring: {exc}") from None
        if current is not self.function or current.__code__ is not self.original:
            raise RestoreError(f"{self.spec.id}: {self.spec.target} does not carry its original code after restoring")
        left = [name for name in self.injected if name in self.function.__globals__]
        if left:
            raise RestoreError(f"{self.spec.id}: injected globals left in {self.function.__module__}: {left}")


def apply(spec: MutantSpec) -> Patch:
    """Swap the mutant's code into its target; raises NotApplicable or MutantError."""
    fn = target_function(spec.target)
    injected: dict[str, Any] = {}
    if spec.operator == "constant":
        code = _compile(fn, _stub_source(fn, repr(spec.value)))
    elif spec.operator == "noop":
        code = _compile(fn, _stub_source(fn, "None"))
    elif spec.operator == "swap":
        if not spec.replacement:
            raise MutantError(f"mutant {spec.id}: a swap needs a replacement")
        replacement = _lookup(spec.replacement)
        if isinstance(replacement, (staticmethod, classmethod)):
            replacement = replacement.__func__
        if not callable(replacement):
            raise MutantError(f"mutant {spec.id}: replacement {spec.replacement} is not callable")
        name = _SWAP_GLOBAL.format(next(_serial))
        injected[name] = replacement
        code = _compile(fn, _stub_source(fn, f"{name}(*args, **kwargs)"))
    else:
        if not spec.old or spec.new is None:
            raise MutantError(f"mutant {spec.id}: an edit needs old and new")
        source, first_line = edited_source(spec, fn)
        try:
            code = _compile(fn, source, first_line)
        except SyntaxError as exc:
            raise MutantError(f"edit of {spec.target}: the edited source does not compile: {exc.msg}") from None
    patch = Patch(spec, fn, fn.__code__, injected)
    fn.__globals__.update(injected)
    fn.__code__ = code
    return patch


@contextlib.contextmanager
def applied(spec: MutantSpec) -> Iterator[Patch]:
    """The mutant in place for one block; restored and checked after it, whatever happens."""
    patch = apply(spec)
    try:
        yield patch
    finally:
        patch.restore()
        patch.check()
