"""What a source tree pins, and what a closure installs, of the packages that decide an era.

An era is the closure a range of releases was built for: above all its torch and its
transformers; SGLang's kernel package (``sgl-kernel``, renamed ``sglang-kernel`` at 0.5.10)
tells releases of one closure apart. A source tree states its pins in its ``pyproject.toml``
(``[project] dependencies``; up to 0.5.2 in optional groups such as ``srt``), read here
without building it. Only exact pins (``==``) count: a range says what a tree tolerates, not
what it was made for.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

TORCH, TRANSFORMERS = "torch", "transformers"
KERNELS = ("sgl-kernel", "sglang-kernel")
_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)")


@dataclass(frozen=True)
class TreePins:
    torch: str | None
    transformers: str | None
    kernel: str | None  # the kernel package's version
    kernel_package: str | None  # which one: sgl-kernel or sglang-kernel
    source: str  # where they were read: "python/pyproject.toml"

    def to_json(self) -> dict:
        return {"torch": self.torch, "transformers": self.transformers, "kernel": self.kernel,
                "kernel_package": self.kernel_package, "source": self.source}

    def describe(self) -> str:
        found = [f"{name} {version}" for name, version in ((TORCH, self.torch), (TRANSFORMERS, self.transformers),
                                                          (self.kernel_package, self.kernel)) if version]
        return ", ".join(found)


def read(package_dir: Path, root: Path) -> TreePins | None:
    """The exact pins of ``package_dir/pyproject.toml``: its dependencies first, then its optional groups in
    the file's order (the first pin of a package wins). None when it has no such file or pins none of them."""
    pyproject = package_dir / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    groups = project.get("optional-dependencies", {})
    listed = [project.get("dependencies", []), *(groups.values() if isinstance(groups, dict) else [])]
    found: dict[str, str] = {}
    for group in listed:
        for line in group if isinstance(group, list) else []:
            pinned = _exact_pin(line)
            if pinned:
                found.setdefault(*pinned)
    kernel = next((name for name in KERNELS if name in found), None)
    if not (found.get(TORCH) or found.get(TRANSFORMERS) or kernel):
        return None
    source = str(pyproject.relative_to(root)) if pyproject.is_relative_to(root) else str(pyproject)
    return TreePins(found.get(TORCH), found.get(TRANSFORMERS), found.get(kernel) if kernel else None, kernel, source)


def _exact_pin(line) -> tuple[str, str] | None:
    """``(name, version)`` of a requirement pinned with ``==`` to one version, else None."""
    if not isinstance(line, str):
        return None
    try:
        requirement = Requirement(line)
    except InvalidRequirement:
        return None
    specs = list(requirement.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        return None
    return canonicalize_name(requirement.name), specs[0].version


@functools.lru_cache(maxsize=64)
def _closure_pins(path: Path, mtime_ns: int) -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        pinned = _PINNED.match(line)
        if pinned:
            found[canonicalize_name(pinned["name"])] = pinned["version"]
    return found


def closure_pins(path: Path) -> dict[str, str]:
    """Every exact version a compiled closure installs (``name==version``); empty when the file is missing."""
    try:
        return _closure_pins(path, path.stat().st_mtime_ns)
    except OSError:
        return {}


def release(version: str | None) -> Version | None:
    """A pin's version without its local build tag (``2.9.1+cu128`` is 2.9.1); None if it is not a version."""
    try:
        return Version(Version(version).public) if version else None
    except InvalidVersion:
        return None
