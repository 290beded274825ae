"""No answer rests on a search of the tree's source text (issue 44 item 3).

A probe decides by driving the tree's code. What it may read off the source is a class fact: how the probe
builds its stand-ins or which adaptation it records, through ``_probekit.class_fact(..., why=...)``, or in one
of the few functions declared below with what they read and why. A new ``inspect.getsource`` (or a file of the
tree read as text) anywhere else in probes/ fails here, as does a ``class_fact`` that does not say why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pdevidence.core.paths import PROJECT

PROBES = PROJECT / "probes"
# Reading the tree's source as text: inspect's source look-ups, a file read or parsed.
SOURCE_CALLS = {"getsource", "getsourcelines", "getsourcefile", "findsource", "getfile", "getcomments"}
TEXT_CALLS = {"read_text", "read_bytes"}
# (file, function) -> what it reads off the source, and why that is no answer of a probe.
DECLARED = {
    ("_probekit.py", "_source"): "class_fact's read: every call says why (checked below)",
    ("_mutants.py", "edited_source"): "a mutant's edit of a function's source: what runs, not what is decided",
    ("_mutants.py", "_blank_docs_and_comments"): "the same edit's text, compared without its comments",
    ("_mutants.py", "_compile"): "the edited source compiled in its function's place",
    ("_serverconfig.py", "derived_attributes"): "which server-args attributes the tree's resolution code may "
                                                "write: an unreadable source leaves every one derived (the "
                                                "operator's arguments then decide nothing), never an all-clear",
    ("_serverenv.py", "_named_in_source"): "whether a gate's variable is named anywhere in the tree: only to say "
                                           "its reading is not established (unread), never an all-clear",
    ("probe_prefill_differential.py", "_defines"): "which functions a module defines, parsed without importing "
                                                   "it: adaptations (no-sender-abort, no-cache-abort-release)",
}


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node -> the name of the innermost function holding it ("" at module level)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            owner[child] = inner
            visit(child, inner)

    visit(tree, "")
    return owner


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def undeclared_source_reads(path: Path) -> list[str]:
    """Each place ``path`` reads the tree's source outside the declared functions, or calls ``class_fact``
    without a literal ``why``, or the removed ``reads``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = _functions(tree)
    found = []
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        name, where = _callee(node), f"{path.name}:{node.lineno}"
        if name in SOURCE_CALLS | TEXT_CALLS or _is_ast_parse(node):
            if (path.name, owner.get(node, "")) not in DECLARED:
                found.append(f"{where}: {name}() in {owner.get(node) or 'the module'}")
        elif name == "reads":
            found.append(f"{where}: reads() searches source text: drive the code, or declare a class_fact")
        elif name == "class_fact":
            why = next((k.value for k in node.keywords if k.arg == "why"), None)
            if not (isinstance(why, ast.Constant) and isinstance(why.value, str) and why.value.strip()):
                found.append(f"{where}: class_fact() without a literal why=")
    return found


def _is_ast_parse(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "parse" and isinstance(func.value, ast.Name) \
        and func.value.id == "ast"


# What the engine and the mutation driver read of their own files and task lists is no tree source.
HARNESS_FILES = {"engine.py", "probe_mutants.py", "_upstream_plugin.py"}


@pytest.mark.parametrize("path", sorted(p for p in PROBES.glob("*.py") if p.name not in HARNESS_FILES),
                         ids=lambda p: p.name)
def test_no_probe_decides_on_source_text_it_does_not_declare(path):
    assert undeclared_source_reads(path) == []


def test_every_declared_source_read_still_exists():
    """A declaration outliving its function would let a new one of that name through unseen."""
    for file, function in DECLARED:
        tree = ast.parse((PROBES / file).read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in ast.walk(tree)), (file, function)


def test_the_check_notices_each_way_of_reading_source_text(tmp_path):
    probe = tmp_path / "probe_x_differential.py"
    probe.write_text(
        "import ast, inspect\n"
        "from _probekit import class_fact, reads\n"
        "def prepare(loop, path):\n"
        "    a = '\"ABORT\"' in inspect.getsource(loop)\n"
        "    b = reads(loop, 'ABORT')\n"
        "    c = class_fact(loop, 'ABORT', why='')\n"
        "    d = class_fact(loop, 'ABORT')\n"
        "    e = ast.parse(path.read_text())\n"
        "    f = class_fact(loop, 'x', why='what the stand-in carries')\n"
        "    g = {}.get('parse')\n")
    found = undeclared_source_reads(probe)
    assert [f.split(": ", 1)[1] for f in found] == [
        "getsource() in prepare",
        "reads() searches source text: drive the code, or declare a class_fact",
        "class_fact() without a literal why=",
        "class_fact() without a literal why=",
        "parse() in prepare",
        "read_text() in prepare",
    ]
