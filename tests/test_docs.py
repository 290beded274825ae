"""The docs (README.md, docs/, mkdocs.yml): they build strictly, and every command they show parses.

A command is found in the shell blocks of every page (and in inline code that starts like one),
split as the shell splits it; each `pdevidence` / `python -m pdevidence` invocation is parsed by
the CLI's own argparse (every value checked by its type, except that the paths a page names need
not exist on this machine: `/opt/sglang-venv/bin/python` is the reader's to fill in), and each `nox` invocation by nox's parser, its sessions looked up in what
`nox --list --json` lists and its arguments after `--` handed by the noxfile's own session
function to the CLI's parser. Nothing is run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdevidence import cli
from pdevidence.core import arguments, errors
from pdevidence.core.paths import PROJECT

README = PROJECT / "README.md"
DOCS = PROJECT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[^`\s]*)[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)\s*$",
                   re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"<([A-Za-z][\w-]*)>")  # `--git <sha>`: a value to fill in, not a redirection
# The two commands a fresh machine needs (the developer guide); .ci/run runs the second.
MAIN_JOB = "python3 -m pip install -r requirements-dev.txt && nox -s matrix"
TESTS = "python3 -m pytest --sglang"


@dataclass(frozen=True)
class Command:
    page: str
    line: str
    argv: tuple[str, ...]


def rel(path: Path) -> str:
    return path.relative_to(PROJECT).as_posix()


def fences(text: str) -> list[tuple[str, str]]:
    return [(m["lang"], m["body"]) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    return FENCE.sub("", text)


def logical_lines(body: str) -> list[str]:
    """A block's lines with backslash continuations joined."""
    return [line for line in body.replace("\\\n", " ").splitlines() if line.strip()]


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split at ;, &&, || and pipes, redirections and leading
    variable assignments dropped; `sh -c SCRIPT` anywhere in one is a command line of its own."""
    lexer = shlex.shlex(PLACEHOLDER.sub(r"\1", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found: list[list[str]] = [[]]
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in SEPARATORS:
            found.append([])
        elif token in {">", ">>", "<", "2>"}:
            i += 1  # its file
        else:
            found[-1].append(token)
        i += 1
    commands = []
    for argv in found:
        while argv and ASSIGNMENT.match(argv[0]):
            argv = argv[1:]
        if not argv:
            continue
        commands.append(argv)
        for j, token in enumerate(argv[:-2]):
            if token in {"sh", "bash"} and argv[j + 1] == "-c":
                commands.extend(simple_commands(argv[j + 2]))
    return commands


def shown_commands() -> list[Command]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        lines = [line for lang, body in fences(text) if lang in SHELL for line in logical_lines(body)]
        # Inline code that reads as an invocation (not a bare name, as in "`pdevidence` answers ...").
        lines += [span for span in INLINE.findall(prose(text)) if harness_argv(span.split())
                  or span.split()[0] == "nox"]
        for line in lines:
            found.extend(Command(rel(page), line, tuple(argv)) for argv in simple_commands(line))
    return found


def harness_argv(argv: list[str]) -> list[str] | None:
    """The arguments to pdevidence, if this is a pdevidence invocation."""
    if argv[:1] == ["pdevidence"]:
        return argv[1:]
    if len(argv) >= 3 and re.fullmatch(r"python(3(\.\d+)?)?", argv[0]) and argv[1:3] == ["-m", "pdevidence"]:
        return argv[3:]
    return None


def nox_argv(argv: list[str]) -> list[str] | None:
    if argv[:1] == ["nox"]:
        return argv[1:]
    if len(argv) >= 3 and re.fullmatch(r"python(3(\.\d+)?)?", argv[0]) and argv[1:3] == ["-m", "nox"]:
        return argv[3:]
    return None


COMMANDS = shown_commands()
HARNESS = [c for c in COMMANDS if harness_argv(list(c.argv)) is not None]
NOX = [c for c in COMMANDS if nox_argv(list(c.argv)) is not None]


# The argparse types that look at the filesystem: a page's example path is any path.
PATH_TYPES = {arguments.directory, arguments.interpreter, arguments.wheel, arguments.output_file, arguments.project,
              arguments.image, arguments.server_args_file, arguments.server_env_file}


def docs_parser() -> argparse.ArgumentParser:
    """The CLI's parser, its path options taking any path (every other type and choice as it is)."""
    top = cli.parser()
    todo = [top]
    while todo:
        parser = todo.pop()
        for action in parser._actions:
            if action.type in PATH_TYPES:
                action.type = Path
            elif action.type is arguments.ref:  # a version, a commit, or (a page's path) any directory
                action.type = lambda value: value if "/" in value else arguments.ref(value)
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return top


def parse_harness(argv: list[str], parser: argparse.ArgumentParser | None = None) -> str | None:
    """None when the parser (the docs' by default) accepts argv; else what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            (parser or docs_parser()).parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip() or f"exit {exc.code}"
    return None


def test_the_pages_show_commands_of_each_kind():
    """The extraction finds what the pages show (a broken extraction would check nothing)."""
    assert len(HARNESS) >= 20 and len(NOX) >= 20, (len(HARNESS), len(NOX))
    assert any(c.argv[:4] == ("python", "-m", "pdevidence", "check") for c in HARNESS)
    pages = {c.page for c in COMMANDS}
    assert {"README.md", "docs/operators/check.md", "docs/maintainers/republishing.md"} <= pages


def test_the_extraction_splits_as_the_shell_does():
    assert simple_commands('SGLANG_REPO=~/src/sglang nox -s "probe(prefill, base)"   # a clone') == \
        [["nox", "-s", "probe(prefill, base)"]]
    assert simple_commands("python3 -m pip install -r x.txt && nox -s matrix") == \
        [["python3", "-m", "pip", "install", "-r", "x.txt"], ["nox", "-s", "matrix"]]
    assert simple_commands("docker run --rm img sh -c 'python -m pdevidence check --python \"$(command -v python)\"'")[1] \
        == ["python", "-m", "pdevidence", "check", "--python", "$(command -v python)"]
    assert simple_commands("echo /a > /b/image.pth") == [["echo", "/a"]]
    assert simple_commands("python -m pdevidence check --git <sha>") == [["python", "-m", "pdevidence", "check", "--git", "sha"]]


def test_the_parsers_refuse_what_does_not_work():
    """The checks below can fail: a misspelt option or command is refused."""
    assert parse_harness(["check", "--version", "0.5.20"]) is None
    assert "unrecognized arguments: --versions" in parse_harness(["check", "--versions", "0.5.20"])
    assert "invalid choice" in parse_harness(["chek"])
    assert "is not a release version" in parse_harness(["check", "--version", "0.5.20; rm -rf /"])
    # Only existence is waived for a page's paths: the CLI's own parser refuses one this machine lacks.
    assert parse_harness(["check", "--python", "/opt/sglang-venv/bin/python"]) is None
    assert "existing Python interpreter" in parse_harness(["check", "--python", "/opt/sglang-venv/bin/python"],
                                                          cli.parser())


@pytest.mark.parametrize("command", HARNESS, ids=[f"{c.page}: {c.line}" for c in HARNESS])
def test_every_pdevidence_command_shown_parses(command):
    said = parse_harness(harness_argv(list(command.argv)))
    assert said is None, f"{command.page} shows `{command.line}`, which pdevidence refuses: {said}"


@pytest.fixture(scope="module")
def nox_sessions() -> list[dict]:
    pytest.importorskip("nox", reason="nox is not installed: python -m pip install -r requirements-dev.txt")
    # Every session: a bare `--list --json` lists only the noxfile's default selection (matrix).
    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(PROJECT / "noxfile.py"), "--list", "--json",
                           "-k", "matrix or not matrix"], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert {"matrix", "check", "release(admission, base)"} <= {e["session"] for e in listed}
    return listed


class FakeSession:
    """What the noxfile's session functions use of nox's Session."""

    def __init__(self, name: str, posargs: list[str]):
        self.name = name
        self.posargs = posargs

    def error(self, message: str) -> None:
        raise AssertionError(message)


def nox_problems(argv: list[str], sessions: list[dict], noxfile, monkeypatch) -> list[str]:
    from nox._options import options  # nox's own parser: the version requirements-dev.txt pins
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = options.parser().parse_args(argv)
    except SystemExit:
        return [f"nox refuses it: {err.getvalue().strip().splitlines()[-1]}"]
    problems = []
    tags = {tag for entry in sessions for tag in entry["tags"]}
    given = vars(ns)  # nox leaves out the options not given
    problems += [f"no session is tagged {tag!r}" for tag in given.get("tags") or [] if tag not in tags]
    posargs = given.get("posargs") or []
    posargs = posargs[1:] if posargs[:1] == ["--"] else posargs
    handed = []

    def main(argv: list[str]) -> int:
        handed.append(argv)
        return errors.CONFIRMED

    monkeypatch.setattr(cli, "main", main)
    for name in given.get("sessions") or []:
        chosen = [e for e in sessions if name in (e["session"], e["name"])]
        if not chosen:
            problems.append(f"nox lists no session {name!r}")
        for entry in chosen:
            getattr(noxfile, entry["name"])(FakeSession(entry["session"], posargs), **entry["call_spec"])
    monkeypatch.undo()
    for args in handed:
        said = parse_harness(args)
        if said:
            problems.append(f"its session hands pdevidence {args[2:]}, which it refuses: {said}")
    if posargs and not handed:
        problems.append(f"arguments {posargs} after `--` but no session to take them")
    return problems


@pytest.mark.parametrize("command", NOX, ids=[f"{c.page}: {c.line}" for c in NOX])
def test_every_nox_command_shown_names_real_sessions_that_take_its_arguments(command, nox_sessions, noxfile,
                                                                            monkeypatch):
    problems = nox_problems(nox_argv(list(command.argv)), nox_sessions, noxfile, monkeypatch)
    assert not problems, f"{command.page} shows `{command.line}`: " + "; ".join(problems)


def test_the_nox_check_can_fail(nox_sessions, noxfile, monkeypatch):
    assert nox_problems(["-s", "check", "--", "--version", "0.5.20"], nox_sessions, noxfile, monkeypatch) == []
    assert nox_problems(["-s", "sweep_era(<era>)"], nox_sessions, noxfile, monkeypatch) == \
        ["nox lists no session 'sweep_era(<era>)'"]
    problem, = nox_problems(["-s", "check", "--", "--verison", "0.5.20"], nox_sessions, noxfile, monkeypatch)
    assert "unrecognized arguments: --verison" in problem


def test_every_script_shown_exists():
    for command in COMMANDS:
        argv = list(command.argv)
        if re.fullmatch(r"python(3(\.\d+)?)?", argv[0]) and len(argv) > 1 and argv[1].endswith(".py"):
            assert (PROJECT / argv[1]).is_file(), f"{command.page} shows `{command.line}`: no {argv[1]}"


def test_every_code_block_names_its_language():
    """So no command hides in a block the checks above do not read."""
    for page in PAGES:
        for lang, body in fences(page.read_text(encoding="utf-8")):
            assert lang, f"{rel(page)}: a code block without a language: {body[:60]!r}"


def test_the_readme_is_a_front_door_with_the_fresh_machine_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    shell = [line.strip() for lang, body in fences(text) if lang in SHELL for line in logical_lines(body)]
    assert MAIN_JOB in shell and TESTS in shell
    # CI runs the README's test command (in its venv: `python` there is python3).
    ci = (PROJECT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TESTS.replace("python3 ", "python ", 1) in ci


def test_every_local_link_resolves():
    """README links into docs/ (GitHub renders them); mkdocs checks the links between pages."""
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{rel(page)} links to {target}, which does not exist"


def test_mkdocs_builds_the_docs_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed: python -m pip install -r requirements-dev.txt")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(PROJECT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its successor
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every page is built (strict: a page left out of mkdocs.yml's nav fails the build).
    for page in DOCS.rglob("*.md"):
        built = page.relative_to(DOCS).with_suffix("")
        html = tmp_path / "site" / ("index.html" if built.name == "index" else built / "index.html")
        assert html.is_file(), page
