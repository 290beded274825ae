"""Command-line values, each parsed and checked here, before anything runs.

Each function is an argparse ``type``: a malformed value becomes argparse's usage error, which
names the option and the value and exits 2, before the registry is read, a tree fetched or a
probe run. What only the registry can tell (an experiment, an era, a mutant) the CLI checks
right after reading it, also before anything runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import archives
from .paths import REGISTRY

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # an experiment (registry._NAME) or an era
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")  # a mutant
_FULL_SHA = re.compile(r"^[0-9a-fA-F]{40}$")
# What `git rev-parse` may resolve in a clone: a branch, a tag, HEAD~2, a short SHA. Never an option, never a
# range, nothing a shell would read (the harness passes it as one argument, but a script's typo should not pass).
_REV = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./@{}^~-]*$")
LATEST = "latest"


def _bad(value: str, expected: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{value!r} is not {expected}")


def version(value: str) -> str:
    """A release version as PyPI names it (PEP 440), e.g. 0.5.21; written without spaces."""
    try:
        Version(value)
    except InvalidVersion:
        raise _bad(value, "a release version (PEP 440), e.g. 0.5.21") from None
    if value != value.strip():
        raise _bad(value, "a release version (PEP 440) without spaces, e.g. 0.5.21")
    return value


def swept_version(value: str) -> str:
    """A release to sweep; a name there is usually an experiment meant for --experiment."""
    try:
        return version(value)
    except argparse.ArgumentTypeError as exc:
        hint = "; experiments are named with --experiment" if _NAME.match(value) else ""
        raise argparse.ArgumentTypeError(f"{exc}{hint}") from None


def version_or_latest(value: str) -> str:
    return value if value == LATEST else version(value)


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise _bad(value, "a whole number, e.g. 2") from None
    if number < 1:
        raise _bad(value, "a positive whole number, e.g. 2")
    return number


def name(value: str) -> str:
    """An experiment or era name as the registry spells them (the CLI then checks the registry has it)."""
    if not _NAME.match(value):
        raise _bad(value, "a name of lower-case letters, digits and _, as experiments.toml spells it")
    return value


def era(value: str) -> str:
    """An era name as the registry spells them: a name where - and . may also join words, e.g. torch2.9-tf5."""
    if not _NAME.match(value.replace("-", "_").replace(".", "_")):
        raise _bad(value, "an era name of lower-case letters, digits, _, - and ., e.g. torch2.9-tf5")
    return value


def mutant(value: str) -> str:
    if not _ID.match(value):
        raise _bad(value, "a mutant id, e.g. M1")
    return value


def commit(value: str) -> str:
    """A commit: its full SHA, or a ref a clone resolves (SGLANG_REPO; the CLI checks there is one)."""
    if _FULL_SHA.match(value) or (_REV.match(value) and ".." not in value and len(value) <= 255):
        return value
    raise _bad(value, "a commit: its 40-hex SHA, or a branch, tag or short SHA of the clone in SGLANG_REPO")


def full_sha(value: str) -> bool:
    return bool(_FULL_SHA.match(value))


def _is(value: str, test) -> bool:
    """``test(Path(value))``, False where the path cannot even be looked at (a NUL byte, a name too long, ...)."""
    try:
        return bool(value) and test(Path(value))
    except (OSError, ValueError):
        return False


def directory(value: str) -> Path:
    if not _is(value, Path.is_dir):
        raise _bad(value, "an existing directory")
    return Path(value)


def project(value: str) -> Path:
    """A project directory: a checkout (or an installed copy) holding the registry."""
    path = directory(value)
    if not _is(value, lambda p: (p / REGISTRY).is_file()):
        raise _bad(value, f"a pdevidence project directory (one holding {REGISTRY})")
    return path.resolve()  # cells run probes from other directories (a sandbox, a tree's own)


def interpreter(value: str) -> Path:
    if not _is(value, lambda p: p.is_file() and os.access(p, os.X_OK)):
        raise _bad(value, "an existing Python interpreter, e.g. /opt/venv/bin/python")
    return Path(value)


def wheel(value: str) -> Path:
    if not _is(value, Path.is_file):
        raise _bad(value, "an existing wheel file (.whl)")
    path = Path(value)
    try:
        parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise _bad(value, f"a wheel file name ({exc})") from None
    if not _is(value, zipfile.is_zipfile):
        raise _bad(value, "a wheel: the file is not a zip archive")
    return path


def image(value: str) -> Path:
    """A saved container image: an OCI layout (or unpacked `docker save`) directory, or a tar of one, compressed
    or not; what it holds is read later."""
    if _is(value, Path.is_dir):
        if not _is(value, lambda p: (p / "index.json").is_file() or (p / "manifest.json").is_file()):
            raise _bad(value, "a saved image: the directory holds neither index.json (an OCI image layout) nor "
                       "manifest.json (an unpacked `docker save`)")
        return Path(value)
    if not _is(value, Path.is_file):
        raise _bad(value, "a saved image: a `docker save` tarball, or an OCI image layout (a directory or a tar)")
    if not _is(value, _archive):
        raise _bad(value, "a saved image: the file is neither a tar archive nor a compressed one")
    return Path(value)


def _archive(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(archives.HEAD)
    return archives.is_tar(head) or archives.compression(head) is not None


def ref(value: str) -> str:
    """A cell's override of its tree: a version, a commit or a directory (the CLI checks it fits the kind)."""
    if _is(value, Path.is_dir) or _accepts(version, value) or _accepts(commit, value):
        return value
    raise _bad(value, "a version, a commit SHA or an existing directory")


def _accepts(check, value: str) -> bool:
    try:
        check(value)
    except argparse.ArgumentTypeError:
        return False
    return True


def output_file(value: str) -> Path:
    """A file to write: not a directory, in a directory that exists or can be made, that the harness may write in."""
    if not value or value.endswith(os.sep) or not _is(value, lambda p: not p.is_dir()):
        raise _bad(value, "a file to write: a path that names no directory")
    path = Path(value)
    try:
        for step in path.absolute().parents:
            if step.exists():
                if not (step.is_dir() and os.access(step, os.W_OK | os.X_OK)):
                    raise _bad(value, f"a file to write ({step} is not a directory you can write in)")
                return path
    except (OSError, ValueError):
        raise _bad(value, "a file to write: a path that can be made") from None
    return path


@dataclass(frozen=True)
class ServerArguments:
    """An operator's SGLang server arguments (``check --server-args``), split as a shell splits them, and where
    they were given: the option, or the file holding the launch command."""

    args: tuple[str, ...]
    source: str

    def to_json(self) -> dict:
        return {"args": list(self.args), "source": self.source}


# What starts an SGLang server in a launch command: what follows it are the server's arguments.
_LAUNCHERS = ("sglang.launch_server", "sglang/launch_server.py", "launch_server.py")


def _split(text: str, what: str) -> list[str]:
    # A backslash before a newline continues the line, as in a shell.
    joined = re.sub(r"\\\r?\n", " ", text)
    try:
        return shlex.split(joined, comments=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{what} does not split as a shell command line: {exc} "
                                         "(a quote left open, or a backslash at its end)") from None


def server_args(value: str) -> ServerArguments:
    """Server arguments as one string (``--disaggregation-mode decode ...``), split as a shell would."""
    found = _split(value, repr(value))
    if found and not found[0].startswith("-"):
        raise argparse.ArgumentTypeError(f"{value!r} does not start with an option: give the server's arguments "
                                         "(--disaggregation-mode decode ...), or its launch command with "
                                         "--server-args-file")
    return ServerArguments(tuple(found), "--server-args")


def server_args_file(value: str) -> ServerArguments:
    """A file holding the server's launch command (``python -m sglang.launch_server ...`` or ``sglang serve ...``,
    lines continued with a backslash, ``#`` comments): the arguments after what starts the server."""
    path = Path(value)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL in the name
        raise argparse.ArgumentTypeError(f"cannot read {value!r}: {exc}") from None
    words = _split(text, value)
    starts = [i for i, word in enumerate(words)
              if word.endswith(_LAUNCHERS) or (word.rsplit("/", 1)[-1] == "sglang" and words[i + 1:i + 2] == ["serve"])]
    if len(starts) > 1:
        raise argparse.ArgumentTypeError(f"{value!r} holds {len(starts)} SGLang launch commands: give one server's "
                                         "(each server of a deployment is checked on its own)")
    if starts:
        first = starts[0] + (2 if words[starts[0]].rsplit("/", 1)[-1] == "sglang" else 1)
        return ServerArguments(tuple(words[first:]), str(path.absolute()))
    if words and words[0].startswith("-"):  # the arguments alone
        return ServerArguments(tuple(words), str(path.absolute()))
    raise argparse.ArgumentTypeError(f"{value!r} holds no SGLang launch command (python -m sglang.launch_server ... "
                                     "or sglang serve ...) and does not start with an option")


@dataclass(frozen=True)
class ServerEnvironment:
    """An operator's SGLang server environment (``check --server-env``, ``--server-env-file``): the variables in
    the order given (a later one wins, as ``docker run -e`` after ``--env-file``), and where they were given."""

    variables: tuple[tuple[str, str], ...]
    source: str

    def values(self) -> dict[str, str]:
        return dict(self.variables)

    def to_json(self) -> dict:
        return {"variables": self.values(), "source": self.source}

    @classmethod
    def joined(cls, parts: list[ServerEnvironment]) -> ServerEnvironment | None:
        """The environment of every option given, in order (files first, as docker reads them); None: none."""
        if not parts:
            return None
        sources = " and ".join(dict.fromkeys(part.source for part in parts))
        return cls(tuple(pair for part in parts for pair in part.variables), sources)


# An environment variable's name as a shell accepts it (registry._VARIABLE).
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _variable(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` (the value taken literally, as docker does), or a bare ``NAME``: its value in the caller's
    environment, or nothing where the caller has none (docker leaves it unset in the container too)."""
    name, equals, value = text.partition("=")
    if not _VARIABLE.match(name):
        raise argparse.ArgumentTypeError(f"{where}: {name!r} is not an environment variable name (letters, digits "
                                         "and _, not starting with a digit): give NAME=VALUE")
    if equals:
        return ((name, value),)
    return ((name, os.environ[name]),) if name in os.environ else ()


def server_env(value: str) -> ServerEnvironment:
    """One variable of the server's environment: ``NAME=VALUE``, or ``NAME`` (its value here, as ``docker -e``)."""
    return ServerEnvironment(_variable(value, repr(value)), "--server-env")


def server_env_file(value: str) -> ServerEnvironment:
    """A ``docker run --env-file`` file: ``NAME=VALUE`` lines (the value literal, quotes kept), ``#`` comments,
    blank lines, a bare ``NAME`` taking its value from the caller's environment."""
    path = Path(value)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL in the name
        raise argparse.ArgumentTypeError(f"cannot read {value!r}: {exc}") from None
    found: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.lstrip()
        if line and not line.startswith("#"):
            found += _variable(line, f"{value!r}, line {number}")
    return ServerEnvironment(tuple(found), str(path.absolute()))


# A server's platform as SGLang's own flags name them (``is_cuda()``, ``is_hip()`` ...: rocm is HIP): where the
# server runs, which the probing machine does not share. CUDA is the deployments' at issue, and the default.
SERVER_PLATFORMS = ("cuda", "rocm", "npu", "cpu", "xpu", "hpu", "musa", "mps")
DEFAULT_PLATFORM = "cuda"


def server_platform(value: str) -> str:
    """``check --server-platform``: one of ``SERVER_PLATFORMS``, as written (lower case)."""
    if value not in SERVER_PLATFORMS:
        raise _bad(value, f"a server platform: one of {', '.join(SERVER_PLATFORMS)}")
    return value


_DURATION = re.compile(r"([0-9]+)([smhdw])")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"([0-9]+)([KMGT]?)(i?B)?", re.IGNORECASE)
_SIZE_BYTES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def duration(value: str) -> float:
    """A positive age in seconds, written with its unit: ``30d``, ``12h``, ``90m``, ``2w``, ``45s``."""
    found = _DURATION.fullmatch(value)
    if not found or int(found[1]) == 0:
        raise _bad(value, "a positive duration with its unit (s, m, h, d or w), e.g. 30d or 12h")
    return int(found[1]) * _DURATION_SECONDS[found[2]]


def size(value: str) -> int:
    """A size in bytes, binary units: ``20G``, ``500M``, ``1T``, ``20GiB``; ``0`` (nothing may stay) too."""
    found = _SIZE.fullmatch(value)
    if not found:
        raise _bad(value, "a size such as 20G, 500M or 1T (binary units), or a number of bytes")
    return int(found[1]) * _SIZE_BYTES[found[2].upper()]
