"""The declarative registry: experiments, pins, brackets, expected differentials.

Everything the harness knows about an experiment comes from ``experiments.toml``;
this module only reads and validates it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import usage

SIDES = ("base", "head")
REGISTRY_FILE = "experiments.toml"
_SHA = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Expectation:
    """What one scenario must show: a change from base to head, or a control."""

    scenario: str
    changes: bool
    base: dict[str, Any]
    head: dict[str, Any]


@dataclass(frozen=True)
class Experiment:
    name: str
    pr: int
    title: str
    probe: Path
    upstream_tests: tuple[str, ...]
    git: dict[str, str]
    releases: dict[str, str | None]
    expect: dict[str, Expectation] = field(default_factory=dict)

    def release(self, side: str) -> str:
        version = self.releases.get(side)
        if not version:
            raise usage(
                f"experiment {self.name!r} has no release-backed {side} yet",
                expected=f"[experiments.{self.name}.releases] {side} = \"<version>\" in {REGISTRY_FILE}",
                todo=f"run `nox -s \"sweep({self.name})\"` to find the bracketing releases, then record them",
            )
        return version


@dataclass(frozen=True)
class Registry:
    root: Path
    python: str
    constraints: Path
    constraints_input: Path | None
    release_floor: str
    experiments: dict[str, Experiment]

    def experiment(self, name: str) -> Experiment:
        try:
            return self.experiments[name]
        except KeyError:
            raise usage(
                f"unknown experiment {name!r}",
                expected=f"one of: {', '.join(sorted(self.experiments))}",
                todo="check the spelling, or add the experiment to experiments.toml",
            ) from None


def check_side(side: str) -> str:
    if side not in SIDES:
        raise usage(f"unknown side {side!r}", expected=f"one of: {', '.join(SIDES)}")
    return side


def load(root: Path, filename: str = REGISTRY_FILE) -> Registry:
    path = root / filename
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise usage(f"no registry at {path}", todo="run from the project's top directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise usage(f"{path} is not valid TOML: {exc}", todo="fix the file; `git diff` shows what changed") from None
    try:
        return _parse(root, data)
    except (KeyError, TypeError, ValueError) as exc:
        raise usage(f"{path}: {exc}", todo="fix the registry entry named above") from None


def _require(table: dict, key: str, kind: type, where: str):
    if key not in table:
        raise KeyError(f"{where}: missing key {key!r}")
    value = table[key]
    if not isinstance(value, kind):
        raise TypeError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _parse(root: Path, data: dict) -> Registry:
    experiments = {}
    for name, table in _require(data, "experiments", dict, "registry").items():
        if not _NAME.match(name):
            raise ValueError(f"experiment name {name!r} must be lowercase letters, digits and _")
        experiments[name] = _parse_experiment(root, name, table)
    if not experiments:
        raise ValueError("registry declares no experiments")
    return Registry(
        root=root,
        python=_require(data, "python", str, "registry"),
        constraints=root / _require(data, "constraints", str, "registry"),
        constraints_input=root / data["constraints_input"] if "constraints_input" in data else None,
        release_floor=_require(data, "release_floor", str, "registry"),
        experiments=experiments,
    )


def _parse_experiment(root: Path, name: str, table: dict) -> Experiment:
    where = f"experiments.{name}"
    git = _require(table, "git", dict, where)
    for side in SIDES:
        sha = _require(git, side, str, f"{where}.git")
        if not _SHA.match(sha):
            raise ValueError(f"{where}.git.{side}: {sha!r} is not a full 40-hex commit SHA")
    releases = table.get("releases", {})
    expect = {
        sid: _parse_expectation(f"{where}.expect.{sid}", sid, spec)
        for sid, spec in table.get("expect", {}).items()
    }
    return Experiment(
        name=name,
        pr=_require(table, "pr", int, where),
        title=_require(table, "title", str, where),
        probe=root / _require(table, "probe", str, where),
        upstream_tests=tuple(table.get("upstream_tests", ())),
        git={side: git[side] for side in SIDES},
        releases={side: releases.get(side) or None for side in SIDES},
        expect=expect,
    )


def _with_nulls(values: dict, spec: dict, key: str, where: str) -> dict:
    """TOML has no null: keys expected to be null are listed in ``<side>_null_keys``."""
    nulls = spec.get(key, [])
    if not isinstance(nulls, list) or not all(isinstance(n, str) for n in nulls):
        raise TypeError(f"{where}.{key}: expected a list of key names")
    return {**values, **{name: None for name in nulls}}


def _parse_expectation(where: str, sid: str, spec: dict) -> Expectation:
    changes = _require(spec, "changes", bool, where)
    if changes:
        base = _with_nulls(_require(spec, "base", dict, where), spec, "base_null_keys", where)
        head = _with_nulls(_require(spec, "head", dict, where), spec, "head_null_keys", where)
        if base == head:
            raise ValueError(f"{where}: changes = true but base and head expect the same values")
    else:
        base = head = _with_nulls(_require(spec, "keys", dict, where), spec, "null_keys", where)
    return Expectation(sid, changes, base, head)
