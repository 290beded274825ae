"""The base and head results a build is judged against, read and verified (the judge itself reads no file).

The sweep, ``check`` and the corpus judge against the registry's release-backed
results: published (``results/``, each file verified against SHA256SUMS.txt) or,
while republishing, fresh (``runs/``). Either way each must load with its receipt,
and the receipt must record this checkout's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import INCOMPLETE, HarnessError
from ..core.errors import integrity as integrity_error
from ..core.files import relative, sha256_file
from ..registry import SIDES, Experiment, Registry
from ..sources.trees import tree_label
from . import integrity, results
from .provenance import stale_error
from .receipts import Receipt


def expected_file(exp: Experiment, side: str, kind: str) -> str:
    """The result file name a registry cell produces, known without fetching anything."""
    pin = exp.release(side) if kind == "release" else exp.commit(side)
    return results.result_name(exp.name, side, tree_label(kind, pin))


@dataclass(frozen=True)
class References:
    """The base and head result documents a build is judged against, and each file's SHA-256 (by name)."""

    docs: dict[str, dict]  # side -> result document
    digests: dict[str, str]

    @property
    def base(self) -> dict:
        return self.docs["base"]

    @property
    def head(self) -> dict:
        return self.docs["head"]


def references(reg: Registry, exp: Experiment, directory: Path, *, fresh: bool = False,
               sides: tuple[str, ...] = SIDES) -> References:
    """The registry's release-backed base and head results (or only ``sides``), verified before anything is
    judged by them.

    Published (``results/``): each file and its receipt must match SHA256SUMS.txt and load (else exit 5,
    naming it). Fresh (``runs/``, while republishing): each must load with its receipt. Either way the
    receipt must record this checkout's probe, kit, registry, constraints and harness (else exit 8).
    """
    docs, digests, stale = {}, {}, {}
    for side in sides:
        path = directory / expected_file(exp, side, "release")
        if not path.exists():
            todo = ("run `nox -s matrix` first" if fresh else
                    f"run `nox -s \"release({exp.name}, {side})\"` and `nox -s publish` first")
            raise HarnessError(f"the {'fresh' if fresh else 'published'} {side} result {path.name} is missing",
                               code=INCOMPLETE, todo=todo)
        receipt = results.receipt_path(path)
        if not fresh:
            for file in (path, receipt):
                why = integrity.problem(reg.root, relative(file, reg.root))
                if why:
                    raise integrity_error(f"the published reference {relative(file, reg.root)} fails verification: "
                                          f"{why}", todo="restore it from git (`git checkout -- results/`) "
                                          "or republish; nothing was judged")
        try:
            docs[side] = results.load(path, experiment=exp.name, side=side)
            made = Receipt.load(receipt, experiment=exp.name, side=side)
        except HarnessError as exc:
            raise integrity_error(f"the {'fresh' if fresh else 'published'} reference {relative(path, reg.root)} "
                                  f"is not valid: {exc.what}", todo=exc.todo) from None
        digests[path.name] = sha256_file(path)
        why = made.stale(reg.root)
        if why:
            stale[relative(receipt, reg.root)] = why
    if stale:
        raise stale_error(stale, reg, what="reference results")
    return References(docs, digests)
