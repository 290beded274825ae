"""Settings read from the environment, each parsed and checked here, in one place.

A bad value is a usage error naming the variable and what it accepts, before
anything runs; an empty value means unset.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import faults
from .errors import usage

TORCH_CHANNELS = ("pypi", "cpu")  # registry.TorchChannel's values (the registry sits above core)
TREE_KINDS = ("git", "release", "path")
SANDBOX_TOOLS = ("auto", "bubblewrap", "unshare", "none")  # sandbox.Tool's values, and auto
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"([0-9]+)([KMGTkmgt]?)")
_DIGITS = re.compile(r"[0-9]+")
_NAMES = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Setting:
    name: str
    accepted: str  # what a value may be, in words, for the error message
    parse: Callable[[str], Any]  # raises ValueError (or OSError, for a path) on a bad value
    default: Any = None


def _seconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(text)
    return value


def _choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(text)
        return text
    return parse


def _bytes(text: str) -> int:
    """``8G``, ``512M``, ``1048576``: a positive size in bytes, in ASCII digits with an optional binary unit."""
    found = _SIZE.fullmatch(text)
    if not found or int(found[1]) == 0:
        raise ValueError(text)
    return int(found[1]) * _SIZE_UNITS[found[2].upper()]


def _budget(text: str) -> int | None:
    """A size as ``_bytes`` reads it, or ``off``: no budget."""
    return None if text == "off" else _bytes(text)


def _count(text: str) -> int:
    """A positive whole number, in ASCII digits."""
    if not _DIGITS.fullmatch(text) or int(text) == 0:
        raise ValueError(text)
    return int(text)


def _names(text: str) -> tuple[str, ...]:
    """``NAME,NAME``: environment variable names, comma-separated, nothing else."""
    if not _NAMES.fullmatch(text):
        raise ValueError(text)
    return tuple(text.split(","))


def _url(text: str) -> str:
    if urlsplit(text).scheme not in ("http", "https", "file"):
        raise ValueError(text)
    return text


def _archive_url(text: str) -> str:
    try:
        filled = text.format(sha="0" * 40)
    except (KeyError, IndexError, ValueError):
        raise ValueError(text) from None
    if "0" * 40 not in filled:
        raise ValueError(text)
    return _url(text)


def _directory(text: str) -> Path:
    """A directory the harness may write in: an existing one, or one it can make (every existing step of the
    way a directory it can write in)."""
    path = Path(text).expanduser()
    for step in (path, *path.parents):
        if step.exists():
            if not (step.is_dir() and os.access(step, os.W_OK | os.X_OK)):
                raise ValueError(text)
            return path
    return path


def _existing_directory(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ValueError(text)
    return path


def _executable(text: str) -> str:
    """A program: a path to an executable file, or a name found on PATH."""
    found = shutil.which(text) if os.sep not in text else (text if os.path.isfile(text) and os.access(text, os.X_OK)
                                                           else None)
    if not found:
        raise ValueError(text)
    return text


SETTINGS = {s.name: s for s in (
    Setting("PDEVIDENCE_PROBE_TIMEOUT", "a positive number of seconds, e.g. 900 (the default)", _seconds, 900.0),
    Setting("PDEVIDENCE_LOCK_TIMEOUT", "a positive number of seconds a run waits for another one's lock before it "
            "gives up, e.g. 7200 (the default)", _seconds, 7200.0),
    Setting("PDEVIDENCE_DOWNLOAD_TRIES", "a positive number of tries of a download that fails on the way (no "
            "connection, a server error, a cut transfer), e.g. 4 (the default)", _count, 4),
    Setting("PDEVIDENCE_DOWNLOAD_BACKOFF", "a positive number of seconds before a download's second try, doubled "
            "before each next one, e.g. 2 (the default)", _seconds, 2.0),
    Setting(faults.VARIABLE, "a fault point's name (tests only: the run kills itself there)", _choice(*faults.POINTS)),
    Setting("PDEVIDENCE_SANDBOX", f"one of: {', '.join(SANDBOX_TOOLS)} (default auto: bubblewrap, else unshare)",
            _choice(*SANDBOX_TOOLS), "auto"),
    Setting("PDEVIDENCE_PROBE_MEMORY", "a size in bytes with an optional K, M, G or T, e.g. 8G (the default)",
            _bytes, 8 << 30),
    Setting("PDEVIDENCE_PROBE_PROCESSES", "a positive number of processes and threads, e.g. 1024 (the default)",
            _count, 1024),
    Setting("PDEVIDENCE_PROBE_PASS_ENV", "names of environment variables a probe process also gets, comma-separated "
            "without spaces, e.g. MY_VAR,OTHER_VAR", _names, ()),
    Setting("PDEVIDENCE_ARCHIVE_FILE_BYTES", "a size in bytes with an optional K, M, G or T, e.g. 256M (the default): "
            "the largest file extracted from a wheel, a source archive or an image", _bytes, 256 << 20),
    Setting("PDEVIDENCE_ARCHIVE_BYTES", "a size in bytes with an optional K, M, G or T, e.g. 4G (the default): all "
            "that is extracted from one wheel, source archive or image", _bytes, 4 << 30),
    Setting("PDEVIDENCE_IMAGE_TAR_BYTES", "a size in bytes with an optional K, M, G or T, e.g. 64G (the default): "
            "the most an image archive compressed whole (`docker save | gzip`) may decompress to", _bytes, 64 << 30),
    Setting("PDEVIDENCE_ARCHIVE_MEMBERS", "a positive number of members, e.g. 1000000 (the default): the most one "
            "wheel, source archive or image layer may hold", _count, 1_000_000),
    Setting("PDEVIDENCE_TORCH", f"one of: {', '.join(TORCH_CHANNELS)}; unset for the registry's torch_channel",
            _choice(*TORCH_CHANNELS)),
    Setting("PDEVIDENCE_UPSTREAM_KIND", f"one of: {', '.join(TREE_KINDS)} (default git)", _choice(*TREE_KINDS), "git"),
    Setting("PDEVIDENCE_INDEX_URL", "the http(s) or file URL of a PEP 691 simple index, e.g. https://pypi.org/simple",
            _url, "https://pypi.org/simple"),
    Setting("PDEVIDENCE_GIT_ARCHIVE_URL", "an http(s) or file URL with {sha} where the commit goes, e.g. "
            "https://codeload.github.com/sgl-project/sglang/tar.gz/{sha}", _archive_url,
            "https://codeload.github.com/sgl-project/sglang/tar.gz/{sha}"),
    Setting("PDEVIDENCE_CACHE", "a directory the harness may write in (made if missing); default the user's cache "
            "directory", _directory),
    Setting("PDEVIDENCE_CACHE_BUDGET", "a size in bytes with an optional K, M, G or T, e.g. 50G (the default), or "
            "off: what the cache and the work directory may hold (as `cache info` counts it) at the end of a run "
            "that fills them", _budget, 50 << 30),
    Setting("PDEVIDENCE_WORK", "a directory the harness may write in (made if missing); default .cells/ in a "
            "checkout, the cache's work/ when installed", _directory),
    Setting("PDEVIDENCE_RUNS", "a directory the harness may write in (made if missing); default runs/ in a "
            "checkout, the user's state directory when installed", _directory),
    Setting("PDEVIDENCE_PYTHON", "the cells' Python interpreter: an executable file, or a command on PATH",
            _executable),
    Setting("PDEVIDENCE_UPSTREAM_TESTS", "an existing directory: an SGLang checkout, or one holding the PR's test "
            "files", _existing_directory),
    Setting("SGLANG_REPO", "an existing directory: a clone of SGLang's repository", _existing_directory),
    Setting("SGLANG_TREE", "an existing directory: an SGLang source tree", _existing_directory),
    Setting("UV", "the uv program: an executable file, or a command on PATH (set by `uv run`)", _executable),
)}


def get(name: str) -> Any:
    """The setting's parsed value, or its default when unset or empty."""
    setting = SETTINGS[name]
    raw = os.environ.get(name, "")
    if raw == "":
        return setting.default
    try:
        return setting.parse(raw)
    except (ValueError, OSError):  # OSError: a path that cannot even be looked at (a name too long)
        raise usage(f"{name}={raw!r} is not a valid setting", expected=setting.accepted,
                    todo=f"fix {name} or unset it") from None


def check_all() -> None:
    """Every setting at once: a typo stops the run before it starts, not in the middle."""
    for name in SETTINGS:
        get(name)
