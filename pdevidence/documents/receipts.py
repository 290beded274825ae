"""The receipt of a cell run: everything environment-specific the result leaves out.

A receipt is evidence: ``Receipt.load`` checks every field the harness reads,
with its type, and that the result beside it is the one the receipt recorded.
Schema /2 added what the cell's interpreter is (implementation and the identity
the cache key uses) and the torch override; /3 the provenance block (what made
the run: probe, kit, registry, constraints, harness); /4 how the probe process
was contained (``core/sandbox.py``: by what, or not and why, and its limits).
Older receipts still load: their upgrade steps record what they lacked as
unknown (null), and a receipt with no provenance is stale evidence (``stale``).
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from ..core import sandbox
from ..core.errors import HarnessError, integrity
from ..core.files import read_json, relative, sha256_file
from ..environments import CellEnvironment, find_python
from ..registry import REGISTRY_FILE
from ..sources.trees import Tree
from .provenance import KIT, Provenance, Shaped, stale_why
from .results import result_beside
from .versions import Schema


def _receipt_1_to_2(doc: dict) -> dict:
    """/1 did not record the interpreter's implementation and identity, nor the torch override."""
    for table, keys in (("python", ("implementation", "identity")), ("torch", ("override",))):
        if isinstance(doc.get(table), dict):
            for key in keys:
                doc[table].setdefault(key, None)
    return doc


def _receipt_2_to_3(doc: dict) -> dict:
    """/2 did not record what made the run: unknown, so the receipt is stale evidence."""
    doc.setdefault("provenance", None)
    return doc


def _receipt_3_to_4(doc: dict) -> dict:
    """/3 did not record how the probe process was contained: unknown."""
    doc.setdefault("containment", None)
    return doc


SCHEMA = Schema("pdevidence-receipt/", 4, {1: _receipt_1_to_2, 2: _receipt_2_to_3, 3: _receipt_3_to_4})
RECEIPT_SCHEMA_VERSION = SCHEMA.current  # what ``build`` writes
RECEIPT_SCHEMA = SCHEMA.name
# Pins a /1 receipt did not record: compared only when both receipts have them.
_PINS_SINCE_2 = ("python-implementation",)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TODO = ("a published receipt: restore it from git (`git checkout -- results/`); "
         "a fresh one: rerun its cell with `-- --force`")


def build(*, cell: str, experiment: str, side: str, tree: Tree, env: CellEnvironment, project: Path,
          constraints: Path, probe: Path, result: Path, commands: list[list[str]], started: datetime,
          finished: datetime, exit_status: int, cache_key: str, provenance: Provenance, containment: dict) -> dict:
    interpreter = find_python(env.python)  # the one the environment and the cache key were made with
    packages = env.packages()
    doc = {
        "schema": RECEIPT_SCHEMA,
        "cell": cell,
        "experiment": experiment,
        "side": side,
        "tree": tree.receipt(),
        "python": {
            "requested": env.python,
            "version": _python_version(env),
            "implementation": interpreter.implementation,
            "identity": interpreter.identity(),  # as the cache key has it
            "platform": platform.platform(),
            "machine": platform.machine(),
        },
        "torch": {
            "build": env.torch_build(),
            "channel": env.torch.channel,
            "requested": env.torch.requested,
            "override": env.torch.override,
            "note": env.torch.note,
        },
        "packages": packages,
        "constraints": {"file": relative(constraints, project), "sha256": sha256_file(constraints)},
        "probe": {"file": relative(probe, project), "sha256": sha256_file(probe)},
        "result": {"file": result.name, "sha256": sha256_file(result)},
        "environment": {"path": str(env.path), "reused": env.reused},
        "commands": commands,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 3),
        "exit_status": exit_status,
        "cache_key": cache_key,
        "provenance": provenance.to_json(),
        "containment": containment,
    }
    Receipt.from_doc(doc, source=f"the receipt of {cell}")  # what we write, we can read back
    return doc


def _python_version(env: CellEnvironment) -> str:
    cfg = env.path / "pyvenv.cfg"
    for line in cfg.read_text().splitlines() if cfg.exists() else []:
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            return value.strip()
    return env.python


@dataclass(frozen=True)
class FileDigest:
    file: str
    sha256: str


@dataclass(frozen=True)
class Receipt:
    """A validated cell receipt; ``doc`` keeps the document as written."""

    schema_version: int
    cell: str
    experiment: str
    side: str
    tree: dict[str, Any]
    python_version: Version
    python_implementation: str | None  # e.g. cpython; None on a /1 receipt (not recorded)
    python_identity: str | None  # e.g. cpython-3.12.1, the cache key's; None on a /1 receipt
    torch_build: str | None  # None: the tree's environment has no torch
    torch_channel: str
    torch_override: str | None  # PDEVIDENCE_TORCH, or None (also on a /1 receipt, which did not record it)
    packages: dict[str, str]
    constraints: FileDigest
    probe: FileDigest
    result: FileDigest
    exit_status: int
    cache_key: str
    provenance: Provenance | None  # None on a receipt older than /3: what made it is unknown
    containment: dict | None  # how the probe ran (sandbox.Containment.record); None before /4: unknown
    doc: dict[str, Any]

    @classmethod
    def from_doc(cls, doc: Any, *, source: str) -> Receipt:
        """Every field the harness reads, with its type; a violation is an integrity failure naming ``source``."""
        def bad(why: str) -> HarnessError:
            return integrity(f"{source} is not a valid receipt: {why}",
                             expected=f"a {SCHEMA.name} document as `nox -s release(...)` writes it "
                             f"(or an earlier {SCHEMA.readable})", todo=_TODO)

        def field(table: dict, key: str, kind: type | tuple, where: str) -> Any:
            if key not in table:  # a nullable field too: null is a statement, a missing key is not
                raise bad(f"{where}{key} is missing")
            value = table[key]
            # JSON true/false are ints to Python; an integer field must not accept them.
            if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
                raise bad(f"{where}{key} must be {_kind(kind)}, got {type(value).__name__}")
            return value

        def digest(key: str) -> FileDigest:
            table = field(doc, key, dict, "")
            sha = field(table, "sha256", str, f"{key}.")
            if not _SHA256.match(sha):
                raise bad(f"{key}.sha256 {sha!r} is not a SHA-256")
            return FileDigest(field(table, "file", str, f"{key}."), sha)

        if not isinstance(doc, dict):
            raise bad("not a JSON object")
        written = doc
        schema_version, doc = SCHEMA.read(doc, bad)
        # Null where the upgrade from /1 could not know; a /2 receipt records them.
        unknown = (str, type(None)) if schema_version < 2 else str
        tree = field(doc, "tree", dict, "")
        for key in ("kind", "ref", "resolved"):
            field(tree, key, str, "tree.")
        python = field(doc, "python", dict, "")
        try:
            python_version = Version(field(python, "version", str, "python."))
        except InvalidVersion:
            raise bad(f"python.version {python['version']!r} is not a version") from None
        torch = field(doc, "torch", dict, "")
        implementation = field(python, "implementation", unknown, "python.")
        identity = field(python, "identity", unknown, "python.")
        if identity is not None and not _identity_of(identity, implementation):
            raise bad(f"python.identity {identity!r} is not {implementation}-<version>")
        override = field(torch, "override", (str, type(None)), "torch.")
        packages = field(doc, "packages", dict, "")
        for name, version in packages.items():
            if not isinstance(version, str):
                raise bad(f"packages.{name} must be a version string, got {type(version).__name__}")
        commands = field(doc, "commands", list, "")
        if not all(isinstance(c, list) and all(isinstance(a, str) for a in c) for c in commands):
            raise bad("commands must be a list of argument lists")
        for key in ("started", "finished"):
            field(doc, key, str, "")
        field(doc, "duration_s", (int, float), "")
        recorded = field(doc, "provenance", (dict, type(None)) if schema_version < 3 else dict, "")
        try:
            provenance = None if recorded is None else Provenance.from_doc(recorded)
        except ValueError as exc:
            raise bad(str(exc)) from None
        containment = field(doc, "containment", (dict, type(None)) if schema_version < 4 else dict, "")
        why = containment is not None and sandbox.record_problem(containment)
        if why:
            raise bad(f"containment {why}")
        return cls(
            schema_version=schema_version,
            cell=field(doc, "cell", str, ""),
            experiment=field(doc, "experiment", str, ""),
            side=field(doc, "side", str, ""),
            tree=tree,
            python_version=python_version,
            python_implementation=implementation,
            python_identity=identity,
            torch_build=field(torch, "build", (str, type(None)), "torch."),
            torch_channel=field(torch, "channel", str, "torch."),
            torch_override=override,
            packages=packages,
            constraints=digest("constraints"),
            probe=digest("probe"),
            result=digest("result"),
            exit_status=field(doc, "exit_status", int, ""),
            cache_key=field(doc, "cache_key", str, ""),
            provenance=provenance,
            containment=containment,
            doc=written,
        )

    @classmethod
    def load(cls, path: Path, *, experiment: str | None = None, side: str | None = None) -> Receipt:
        """The receipt at ``path``, checked against the result file beside it."""
        try:
            doc = read_json(path, "receipt", todo=_TODO)
        except HarnessError as exc:
            raise integrity(exc.what, todo=_TODO) from None
        receipt = cls.from_doc(doc, source=str(path))
        for key, want in (("experiment", experiment), ("side", side)):
            if want and getattr(receipt, key) != want:
                raise integrity(f"{path} is a receipt for {key} {getattr(receipt, key)!r}, expected {want!r}",
                                todo=_TODO)
        result = result_beside(path)
        if receipt.result.file != result.name:
            raise integrity(f"{path} is the receipt of {receipt.result.file}, not of {result.name}", todo=_TODO)
        if not result.exists():
            raise integrity(f"{path} has no result beside it ({result.name})", todo=_TODO)
        actual = sha256_file(result)
        if actual != receipt.result.sha256:
            raise integrity(f"{result} does not match its receipt {path.name}: SHA-256 {actual}, "
                            f"the receipt recorded {receipt.result.sha256}", todo=_TODO)
        return receipt

    def stale(self, root: Path) -> list[str]:
        """How this checkout differs from what made the run (empty: the receipt is current evidence)."""
        return stale_why(self.provenance, root, [self.probe.file, KIT, REGISTRY_FILE, self.constraints.file],
                         Shaped.RESULT)

    def pins(self) -> dict[str, Version | str]:
        """What must match for two runs to count as the same environment (versions compare as versions).

        The torch channel, not the override: PDEVIDENCE_TORCH naming the registry's own channel
        installs the same closure as no override, and one naming another channel changes the channel.
        """
        implementation = {"python-implementation": self.python_implementation} if self.python_implementation else {}
        return {
            "python": f"{self.python_version.major}.{self.python_version.minor}",
            **implementation,
            "torch": _version(self.torch_build) if self.torch_build else "none",
            "torch-channel": self.torch_channel,
            "constraints": self.constraints.sha256,
            "probe": self.probe.sha256,
            **{f"package:{name}": _version(version) for name, version in sorted(self.packages.items())},
        }

    def differing_pins(self, other: Receipt) -> list[str]:
        """The pins on which two receipts differ; a pin one of them predates is not compared."""
        mine, theirs = self.pins(), other.pins()
        unrecorded = {key for key in _PINS_SINCE_2 if key not in mine or key not in theirs}
        return sorted(key for key in (set(mine) | set(theirs)) - unrecorded if mine.get(key) != theirs.get(key))


def _identity_of(identity: str, implementation: str) -> bool:
    """``<implementation>-<version>``, as ``environments.Interpreter.identity`` writes it."""
    prefix = f"{implementation}-"
    if not identity.startswith(prefix):
        return False
    try:
        Version(identity.removeprefix(prefix))
    except InvalidVersion:
        return False
    return True


def _version(text: str) -> Version | str:
    """A PEP 440 version, so 2.14.1 and 2.14.1.0 are the same pin; anything else compares as written."""
    try:
        return Version(text)
    except InvalidVersion:
        return text


def _tuple(kind: type | tuple) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind(kind: type | tuple) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
             type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in _tuple(kind))
