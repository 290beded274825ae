"""What made a document, recorded in it and cross-checked against this checkout.

A receipt, a sweep table and a mutation table each carry a provenance block:
the SHA-256 of every file that ran or decided its content (the probe, the
probe kit, the in-cell drivers, the registry, the constraints closure), keyed
by their path in the checkout, and one digest of the harness (every
``pdevidence/**/*.py``, sorted by path). Evidence whose block differs from the
checkout was made by other inputs than the ones a reader would rerun: it is
stale (exit 8), and the only way forward is a republish. The warm engine's
outcome cache keys on the same digests, through the same functions.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import STALE, HarnessError
from ..core.files import relative, sha256_file
from ..registry import REGISTRY_FILE, Registry

HARNESS = Path(__file__).resolve().parents[1]  # the pdevidence package that is running
HARNESS_NAME = "the harness (pdevidence/**/*.py)"
KIT = "probes/_probekit.py"
STAND_INS = "probes/_standins.py"  # the era stand-ins the kit loads in every cell, where the checkout has them
# The in-cell drivers of each kind of document, beside the experiment's own probe.
CELL_DRIVERS: tuple[str, ...] = ()  # a cell runs its probe file directly
SWEEP_DRIVERS = ("probes/probe_all.py", "probes/engine.py")
MUTATION_DRIVERS = ("probes/probe_mutants.py", "probes/_mutants.py", "probes/engine.py")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Digests are remembered per process: a sweep or a check records and verifies the same harness, kit and
# closures once per era group and per document. A file's entry is keyed by what changes when its content does
# (inode, size, mtime, ctime); one changed in the last seconds is never remembered, since a file system's clock
# is coarse and a second write within one tick can leave that stat as it was.
RECENT_NS = 2_000_000_000
_digests: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    """``path``'s SHA-256, read once per process while the file stays as it was."""
    now = time.time_ns()
    st = path.stat()
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    found = _digests.get(key)
    if found is None:
        found = sha256_file(path)
        if max(st.st_mtime_ns, st.st_ctime_ns) < now - RECENT_NS:
            _digests[key] = found
    return found


def tree_digest(files: list[Path], root: Path) -> str:
    """One digest over files: each one's path relative to ``root`` and its SHA-256, in path order."""
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(f"{path.relative_to(root).as_posix()}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def harness_digest() -> str:
    return tree_digest(list(HARNESS.rglob("*.py")), HARNESS)


def republish_steps(reg: Registry | None = None) -> str:
    """What to run after any change to the harness, a probe, the registry or the constraints."""
    names = [n for n, e in reg.experiments.items() if e.mutants] if reg else ["<experiment>"]
    example = reg.openvex_example if reg else "<version>"
    steps = ["`nox -s matrix`", "`nox -s sweep -- --references fresh`"]
    if names:
        steps.append("`nox -s " + " ".join(f'"mutate({name})"' for name in names) + "`")
    if example:
        steps.append(f"`python -m pdevidence check --references fresh --version {example} "
                     f"--openvex runs/openvex-sglang-{example}.json`")
    if reg is None or (reg.root / "backports").is_dir():
        steps.append("`nox -s corpus -- --references fresh`")
    return f"republish: {', '.join(steps)}, then `nox -s publish`"


def _role(rel: str) -> str:
    """What a changed file means for the evidence, in the words an error uses."""
    if rel == REGISTRY_FILE:
        return "another registry"
    if rel == KIT:
        return "another probe kit"
    if rel.startswith("constraints/"):
        return "other constraints"
    if rel in (*SWEEP_DRIVERS, *MUTATION_DRIVERS):
        return "another driver"
    return "another probe"


@dataclass(frozen=True)
class Provenance:
    files: dict[str, str]  # path in the checkout -> SHA-256
    harness: str

    def to_json(self) -> dict[str, Any]:
        return {"files": dict(sorted(self.files.items())), "harness": self.harness}

    @classmethod
    def from_doc(cls, doc: Any) -> Provenance:
        """A recorded block; ValueError says what is wrong with it (the document's loader names the file)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict) or not doc["files"]:
            raise ValueError("provenance must be an object with a non-empty files table")
        for rel, sha in doc["files"].items():
            if not isinstance(sha, str) or not _SHA256.match(sha):
                raise ValueError(f"provenance.files.{rel} is not a SHA-256")
        if not isinstance(doc.get("harness"), str) or not _SHA256.match(doc["harness"]):
            raise ValueError("provenance.harness is not a SHA-256")
        return cls(dict(doc["files"]), doc["harness"])

    def differences(self, root: Path, required: list[str]) -> list[str]:
        """How this checkout differs from what made the document, one line per file; empty: it is current."""
        found = [f"{rel}: not recorded" for rel in sorted(set(required) - set(self.files))]
        for rel, sha in sorted(self.files.items()):
            path = root / rel
            if not path.is_file():
                found.append(f"{rel}: made by {_role(rel)} ({rel} is not in this checkout)")
            elif (now := file_digest(path)) != sha:
                found.append(f"{rel}: made by {_role(rel)} (recorded {sha[:12]}, this checkout {now[:12]})")
        if (now := harness_digest()) != self.harness:
            found.append(f"made by another harness: {HARNESS_NAME} recorded {self.harness[:12]}, "
                         f"this checkout {now[:12]}")
        return found


def record(root: Path, files: list[Path]) -> Provenance:
    """The provenance block of a document made now from ``files`` (paths in the checkout at ``root``)."""
    return Provenance({relative(path, root): file_digest(path) for path in files}, harness_digest())


def inputs(reg: Registry, experiments: list[str], drivers: tuple[str, ...], closures: list[Path]) -> list[Path]:
    """The files that run in the cell or decide a document's content."""
    probes = [reg.experiment(name).probe for name in experiments]
    stand_ins = [reg.root / STAND_INS] if (reg.root / STAND_INS).is_file() else []
    return [*probes, reg.root / KIT, *stand_ins, *(reg.root / d for d in drivers), reg.root / REGISTRY_FILE,
            *dict.fromkeys(closures)]


def required(reg: Registry, experiment: str, drivers: tuple[str, ...]) -> list[str]:
    """What a current document of ``experiment`` must have recorded (besides the closure and the harness)."""
    return [relative(reg.experiment(experiment).probe, reg.root), KIT, *drivers, REGISTRY_FILE]


def stale_why(block: Provenance | None, root: Path, required_files: list[str]) -> list[str]:
    if block is None:
        return ["it records no provenance (written before documents recorded what made them)"]
    return block.differences(root, required_files)


def stale_error(found: dict[str, list[str]], reg: Registry | None, *, what: str = "evidence") -> HarnessError:
    """Exit 8, naming each stale document and what differs."""
    lines = "\n".join(f"  {name}: {'; '.join(why)}" for name, why in sorted(found.items()))
    return HarnessError(f"stale {what}: made by other inputs than this checkout's:\n{lines}",
                        expected="evidence made by this checkout's probes, kit, drivers, registry, constraints "
                        "and harness",
                        todo=f"any change to them requires a republish; {republish_steps(reg)}", code=STALE)
