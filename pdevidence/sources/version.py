"""Which SGLang version a source tree is, read from the commit without building it.

A fork's build may need setuptools-scm to parse its tags (``v0.5.10-npu.rc1`` it cannot),
cargo and crates.io; the probes need none of it, so the version is read, in this order, from
what the commit holds: a literal ``__version__`` in ``sglang/version.py`` (SGLang up to the
switch to setuptools-scm), or in ``sglang/_version.py`` (the file setuptools-scm writes when a wheel or
a source build is made: an unpacked wheel has it), a static ``[project] version`` in
``pyproject.toml``, else the nearest version-like tag (``git describe --tags``) where the tree is a
git checkout. Each file is read as text (``ast``), never imported. A tag is
read leniently: its leading release (``0.5.10``) is the version, what follows it
(``npu.rc1``) is kept as it is. The version chooses the era the tree runs in unless it is a tag far
behind the tree or one naming no known release (``era_choice.py``: the tree's pins choose then).
"""

from __future__ import annotations

import ast
import email.parser
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..core import children
from ..core.files import parse_python

GIT_DESCRIBE = "git describe --tags"
_DISTANCE = re.compile(r"^(?P<tag>.+)-(?P<commits>\d+)-g[0-9a-f]+$")  # what describe appends past the tag
_LEADING = re.compile(r"^[vV]?(?P<release>\d+(?:\.\d+)*)(?P<rest>.*)$")


@dataclass(frozen=True)
class TreeVersion:
    version: str  # what the era is chosen by: a PEP 440 version, e.g. "0.5.10"
    local: str | None  # what a lenient read set aside, as it was: "npu.rc1"
    source: str  # where it was read: "python/sglang/version.py", "sglang/_version.py", "git describe --tags", ...
    told: str  # as the tree says it: "0.5.10", "v0.5.10-npu.rc1-3-gabc1234"

    @property
    def tag(self) -> str | None:
        """The tag the version was read from (``v0.5.10-npu.rc1``); None when the tree states it in a file."""
        if self.source != GIT_DESCRIBE:
            return None
        past = _DISTANCE.match(self.told)
        return past["tag"] if past else self.told

    @property
    def commits_past_tag(self) -> int | None:
        """How many commits the tree is past its tag (0: at it); None when the version is not a tag's."""
        if self.source != GIT_DESCRIBE:
            return None
        past = _DISTANCE.match(self.told)
        return int(past["commits"]) if past else 0

    def to_json(self) -> dict:
        return {"version": self.version, "local": self.local, "source": self.source, "told": self.told}

    def describe(self) -> str:
        local = f" ({self.local})" if self.local else ""
        told = f": {self.told}" if self.told != self.version else ""
        return f"{self.version}{local}, from {self.source}{told}"


def lenient(told: str) -> tuple[str, str | None] | None:
    """``(version, local)`` of a version or tag as a fork writes it; None if it names no version."""
    text = told.strip()
    past = _DISTANCE.match(text)
    text = past["tag"] if past else text
    try:
        parsed = Version(text)
        return (parsed.public, parsed.local)
    except InvalidVersion:
        pass
    leading = _LEADING.match(text)
    if not leading:
        return None
    return str(Version(leading["release"])), leading["rest"].lstrip("-_.+") or None


def read(package_dir: Path, root: Path, *, repo: Path | None, rev: str) -> TreeVersion | None:
    """The version of the tree whose ``package_dir`` holds ``sglang/``; ``repo`` is a git checkout
    holding commit ``rev`` (None: no tags to read). None when nothing tells it."""
    version_py, pyproject = package_dir / "sglang" / "version.py", package_dir / "pyproject.toml"
    scm_version_py = package_dir / "sglang" / "_version.py"
    for where, tell in ((_relative(version_py, root), lambda: _literal(version_py)),
                        (_relative(scm_version_py, root), lambda: _literal(scm_version_py)),
                        (_relative(pyproject, root), lambda: _static(pyproject)),
                        (GIT_DESCRIBE, lambda: _describe(repo, rev) if repo is not None else None)):
        told = tell()
        found = lenient(told) if told else None
        if found:
            return TreeVersion(found[0], found[1], where, told)
    return None


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _literal(version_py: Path) -> str | None:
    """A module-level ``__version__ = "..."``; one assigned under try/except (a build's fallback) is not."""
    try:
        module = parse_python(version_py)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in module.body:
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__"
                                                     for t in node.targets)
        if named and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def metadata_version(metadata: Path) -> str | None:
    """The ``Version`` field of a dist-info's METADATA (its header, an email message's: core metadata)."""
    try:
        text = metadata.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return (email.parser.HeaderParser().parsestr(text)["Version"] or "").strip() or None


def _static(pyproject: Path) -> str | None:
    """``[project] version`` unless the version is dynamic (setuptools-scm's, from the tags)."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    version = project.get("version")
    return version if isinstance(version, str) and "version" not in project.get("dynamic", []) else None


def _describe(repo: Path, rev: str) -> str | None:
    """The nearest version-like tag of ``rev`` (``v0.5.10-npu.rc1``, plus ``-<n>-g<sha>`` past it)."""
    try:
        done = children.run(["git", "-C", str(repo), "describe", "--tags", "--match", "v[0-9]*", "--match", "[0-9]*",
                             rev], capture_output=True, text=True)
    except OSError:
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None
