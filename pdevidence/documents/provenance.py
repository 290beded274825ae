"""What made a document, recorded in it and cross-checked against this checkout.

A receipt, a sweep table and a mutation table each carry a provenance block:
the SHA-256 of every file that ran or decided its content (the probe, the
probe kit, the in-cell drivers, the registry, the constraints closure), keyed
by their path in the checkout, and one digest of the harness modules that
shape that kind of document (``SHAPING``, declared here and nowhere else; by
path in the package and bytes, so a checkout and an installed copy agree).
Evidence whose block differs from the checkout was made by other inputs than
the ones a reader would rerun: it is stale (exit 8), and the only way forward
is a republish. A module outside the declared set (the command line, fetching,
locking, messages, publishing, the report) changes without staling anything.
The warm engine's outcome cache keys on the same digests, through the same
functions.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import STALE, HarnessError
from ..core.files import parse_python, relative, sha256_file
from ..registry import REGISTRY_FILE, Registry

HARNESS = Path(__file__).resolve().parents[1]  # the pdevidence package that is running


class Shaped(str, enum.Enum):
    """A kind of document, for which harness modules shape it."""

    RESULT = "result"  # a cell's result and its receipt; an outcome the warm engine keeps
    TABLE = "table"  # a sweep or mutation table
    CORPUS = "corpus table"  # the backport corpus's table
    BISECT = "bisect document"  # the commits a bisection found


# The harness modules that decide what each kind of document records, by path in the package. A result is made by
# the in-cell files, the closure, the tree and the interpreter (recorded besides); of the harness, by what sets up
# and runs its probe process and writes its receipt. A table is made by those, the registry and the judge.
# Each kind's modules are named once, below; a module that comes to decide what a document records belongs here.
RESULT_MODULES = (
    "cells/cells.py",  # a cell's probe arguments, and what its receipt records of the run
    "cells/probe_run.py",  # a probe process's command and environment
    "cells/allprobes.py",  # the all-probes driver's command and environment
    "cells/engine.py",  # the warm engine's tasks: the driver, the tree on the path, the arguments
    "sources/importable.py",  # a tree as the warm engine puts it on a probe's path
    "environments.py",  # the environment a probe runs in: the closure installed, the tree, the stand-ins
    "documents/receipts.py",  # what a receipt records
)
TABLE_MODULES = (
    *RESULT_MODULES,
    "registry.py",  # how experiments.toml is read: expectations, mutants, not-affected and not-deciding rules
    "judge/classify.py",  # the judge: a release's classification
    "judge/compare.py",  # the judge: which observations agree (a mutant's verdict)
    "documents/vocabulary.py",  # the words a table records
    "documents/tables.py",  # what a table records
    "lanes/sweep.py",  # the sweep: its releases, their arguments, its document
    "lanes/sweep_parts.py",  # the CI fan-out's parts, joined into the sweep's document
    "lanes/mutate.py",  # the mutation lane: its mutants, their verdicts, its document
)
# The corpus table: a table's modules, and check's judge run on the trees the backports make.
CORPUS_MODULES = (
    *TABLE_MODULES,
    "sources/backports.py",  # the backport, pristine and partial trees, made from the declared edits
    "lanes/check.py",  # check's judge: each tree's status per fix
    "lanes/corpus.py",  # the corpus: its trees, the answer expected of each
    "documents/corpus_table.py",  # what a corpus table records
)
# A bisect document: a result's modules, check's judge run on each commit's tree, and the search.
BISECT_MODULES = (
    *RESULT_MODULES,
    "registry.py",  # how experiments.toml is read: expectations, not-affected and not-deciding rules, loads
    "judge/classify.py",  # the judge: each scenario's behaviour
    "documents/vocabulary.py",  # the words the document records
    "documents/bisects.py",  # what the document records
    "sources/history.py",  # the main line, its first-parent commits, their subjects and PR numbers
    "sources/era_choice.py",  # the era a commit's tree runs in
    "lanes/check.py",  # check's judge: each commit's status
    "lanes/bisect.py",  # the search: which commits it probes, what it concludes
    "lanes/bisect_run.py",  # the brackets, the lines, a commit's side
    "lanes/bisect_ahead.py",  # the trees made ahead: an error met making one is raised in the round asking for it
    "lanes/bisect_report.py",  # the notes
)
SHAPING = {Shaped.RESULT: RESULT_MODULES, Shaped.TABLE: TABLE_MODULES, Shaped.CORPUS: CORPUS_MODULES,
           Shaped.BISECT: BISECT_MODULES}
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


def harness_digest(shaped: Shaped, package: Path | None = None) -> str:
    """One digest of the modules that shape ``shaped`` documents, by their path in ``package`` (default: the
    running one) and their bytes."""
    package = package or HARNESS
    return tree_digest([package / rel for rel in SHAPING[shaped]], package)


def harness_name(shaped: Shaped) -> str:
    return f"the harness modules that shape a {shaped.value} (provenance.{shaped.name}_MODULES)"


def republish_steps(reg: Registry | None = None) -> str:
    """What to run after any change to the harness, a probe, the registry or the constraints."""
    names = [n for n, e in reg.experiments.items() if e.mutants] if reg else ["<experiment>"]
    example = reg.openvex_example if reg else "<version>"
    steps = ["`nox -s matrix`", "`nox -s sweep -- --references fresh`"]
    if names:
        steps.append("`nox -s " + " ".join(f'"mutate({name})"' for name in names) + "`")
    if example:
        steps.append(f"`python -m pdevidence check --references fresh --release {example} "
                     f"--openvex runs/openvex-sglang-{example}.json`")
    if reg is None or (reg.root / "backports").is_dir():
        steps.append("`nox -s corpus -- --references fresh`")
    if reg is None or any((reg.root / "results").glob("bisect-*.json")):  # a bisection, once published
        steps.append("`SGLANG_REPO=<clone> nox -s bisect -- --references fresh`")
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

    def differences(self, root: Path, required: list[str], shaped: Shaped) -> list[str]:
        """How this checkout differs from what made the document, one line per file; empty: it is current."""
        found = [f"{rel}: not recorded" for rel in sorted(set(required) - set(self.files))]
        for rel, sha in sorted(self.files.items()):
            path = root / rel
            if not path.is_file():
                found.append(f"{rel}: made by {_role(rel)} ({rel} is not in this checkout)")
            elif (now := file_digest(path)) != sha:
                found.append(f"{rel}: made by {_role(rel)} (recorded {sha[:12]}, this checkout {now[:12]})")
        if (now := harness_digest(shaped)) != self.harness:
            found.append(f"made by another harness: {harness_name(shaped)} recorded {self.harness[:12]}, "
                         f"this checkout {now[:12]}")
        return found


def record(root: Path, files: list[Path], shaped: Shaped) -> Provenance:
    """The provenance block of a ``shaped`` document made now from ``files`` (paths in the checkout at ``root``)."""
    return Provenance({relative(path, root): file_digest(path) for path in files}, harness_digest(shaped))


def probe_files(probe: Path) -> list[Path]:
    """A probe and the modules of its own directory it imports (``_offload.py``, shared by two probes), but the
    kit and the stand-ins, which every document records anyway."""
    found, todo = [probe], [probe]
    while todo:
        tree = parse_python(todo.pop())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        for name in sorted(names):
            path = probe.parent / f"{name}.py"
            if path.is_file() and path not in found and relative(path, probe.parent.parent) not in (KIT, STAND_INS):
                found.append(path)
                todo.append(path)
    return found


def inputs(reg: Registry, experiments: list[str], drivers: tuple[str, ...], closures: list[Path]) -> list[Path]:
    """The files that run in the cell or decide a document's content."""
    probes = list(dict.fromkeys(f for name in experiments for f in probe_files(reg.experiment(name).probe)))
    stand_ins = [reg.root / STAND_INS] if (reg.root / STAND_INS).is_file() else []
    return [*probes, reg.root / KIT, *stand_ins, *(reg.root / d for d in drivers), reg.root / REGISTRY_FILE,
            *dict.fromkeys(closures)]


def required(reg: Registry, experiment: str, drivers: tuple[str, ...]) -> list[str]:
    """What a current document of ``experiment`` must have recorded (besides the closure and the harness)."""
    return [*(relative(f, reg.root) for f in probe_files(reg.experiment(experiment).probe)), KIT, *drivers,
            REGISTRY_FILE]


def stale_why(block: Provenance | None, root: Path, required_files: list[str], shaped: Shaped) -> list[str]:
    if block is None:
        return ["it records no provenance (written before documents recorded what made them)"]
    return block.differences(root, required_files, shaped)


def stale_error(found: dict[str, list[str]], reg: Registry | None, *, what: str = "evidence") -> HarnessError:
    """Exit 8, naming each stale document and what differs."""
    lines = "\n".join(f"  {name}: {'; '.join(why)}" for name, why in sorted(found.items()))
    return HarnessError(f"stale {what}: made by other inputs than this checkout's:\n{lines}",
                        expected="evidence made by this checkout's probes, kit, drivers, registry, constraints "
                        "and harness",
                        todo=f"any change to them requires a republish; {republish_steps(reg)}", code=STALE)
