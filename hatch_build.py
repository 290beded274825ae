"""The wheel carries the project's files under ``pdevidence/project/`` (core/paths.py finds them there).

They are the registry, the in-cell probes, the closures and tree lock, and the published evidence
with its sums, as the checkout lays them out; never a hidden file (a write's temporary) or bytecode.
A build whose evidence does not match its SHA256SUMS.txt stops: an installed copy verifies it when
used, and would refuse it then.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

INTO = "pdevidence/project"
FILES = ("experiments.toml", "SHA256SUMS.txt")
TREES = ("probes", "constraints", "results")
OPTIONAL = ("backports",)  # the corpus lane's declared backports, where the checkout has them


def project_files(root: Path) -> list[str]:
    found = [name for name in FILES if (root / name).is_file()]
    for top in (*TREES, *OPTIONAL):
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                found.append(rel.as_posix())
    return found


def sums_problems(root: Path, files: list[str]) -> list[str]:
    listed = {}
    for line in (root / "SHA256SUMS.txt").read_text(encoding="utf-8").splitlines():
        digest, _, rel = line.partition("  ")
        listed[rel] = digest
    problems = [f"{rel}: not listed" for rel in files if rel.startswith("results/") and rel not in listed]
    for rel, digest in listed.items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: listed but missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{rel}: does not match its SHA-256 in SHA256SUMS.txt")
    return problems


class ProjectFiles(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        files = project_files(root)
        missing = [name for name in (*FILES, *TREES) if not (root / name).exists()]
        problems = [f"{name}: missing" for name in missing] or sums_problems(root, files)
        if problems:
            raise RuntimeError("not building a wheel of evidence that does not verify:\n  " + "\n  ".join(problems)
                               + "\n  restore the files from git, or republish (docs/maintainers/republishing.md)")
        for rel in files:
            build_data["force_include"][str(root / rel)] = f"{INTO}/{rel}"
