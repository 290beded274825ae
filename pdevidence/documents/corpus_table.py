"""The backport corpus table (``pdevidence-corpus/1``): what ``check`` answered for each ported fix.

One answer per release, fix and tree (``pristine``, ``backport``, ``partial``): check's status,
the status the corpus expects (on the partial tree ``fixed`` for a fix of which no partial port exists),
the scenarios that decided it and the result judged. The table
records what made it (the probes, kit, drivers, registry, closures, harness and every backport
file) and the base and head results it was judged against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import HarnessError
from ..core.files import read_json
from ..registry import REGISTRY_FILE
from ..sources.backports import Variant
from .provenance import KIT, SWEEP_DRIVERS, Provenance, Shaped, stale_why
from .versions import Schema
from .vocabulary import CheckStatus

CORPUS_SCHEMA = Schema("pdevidence-corpus/", 1)
CORPUS_TODO = "rerun `python -m pdevidence corpus` and publish it"
FILE = "corpus.json"


@dataclass(frozen=True)
class CorpusAnswer:
    release: str
    era: str | None
    variant: Variant
    experiment: str
    pr: int
    status: CheckStatus
    expected: CheckStatus
    deciding: list[str]
    result_sha256: str | None

    @property
    def as_expected(self) -> bool:
        return self.status is self.expected

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "era": self.era, "variant": self.variant.value,
                "experiment": self.experiment, "pr": self.pr, "status": self.status.value,
                "expected": self.expected.value, "deciding": self.deciding, "result_sha256": self.result_sha256}

    @classmethod
    def from_doc(cls, entry: Any) -> CorpusAnswer:
        """ValueError, TypeError or KeyError for an entry that is not an answer."""
        found = cls(entry["release"], entry["era"], Variant(entry["variant"]), entry["experiment"], entry["pr"],
                    CheckStatus(entry["status"]), CheckStatus(entry["expected"]), list(entry["deciding"]),
                    entry["result_sha256"])
        if not (isinstance(found.release, str) and isinstance(found.experiment, str) and isinstance(found.pr, int)
                and isinstance(found.era, (str, type(None))) and all(isinstance(s, str) for s in found.deciding)
                and isinstance(found.result_sha256, (str, type(None)))):
            raise TypeError(f"answer {entry!r}")
        return found


@dataclass(frozen=True)
class CorpusTable:
    answers: list[CorpusAnswer]
    provenance: Provenance
    references: dict[str, str]  # the base and head result files judged against -> SHA-256
    backports: list[str]  # the backport files checked, relative to the checkout

    @property
    def as_expected(self) -> bool:
        return all(a.as_expected for a in self.answers)

    def releases(self) -> list[str]:
        return list(dict.fromkeys(a.release for a in self.answers))

    def stale(self, root: Path, probes: list[str]) -> list[str]:
        return stale_why(self.provenance, root, [*probes, KIT, *SWEEP_DRIVERS, REGISTRY_FILE, *self.backports],
                         Shaped.CORPUS)

    def to_json(self) -> dict[str, Any]:
        return {"schema": CORPUS_SCHEMA.name, "answers": [a.to_json() for a in self.answers],
                "provenance": self.provenance.to_json(), "references": dict(sorted(self.references.items())),
                "backports": self.backports}

    @classmethod
    def from_doc(cls, doc: Any, *, source: str) -> CorpusTable:
        def bad(why: str) -> HarnessError:
            return HarnessError(f"{source} is not a corpus table: {why}",
                                expected=f"a {CORPUS_SCHEMA.readable} document", todo=CORPUS_TODO)

        _, doc = CORPUS_SCHEMA.read(doc, bad)
        for key, kind in (("answers", list), ("provenance", dict), ("references", dict), ("backports", list)):
            if not isinstance(doc.get(key), kind):
                raise bad(f"{key!r} must be a {kind.__name__}")
        answers = []
        for entry in doc["answers"]:
            try:
                answers.append(CorpusAnswer.from_doc(entry))
            except (TypeError, KeyError, ValueError):
                raise bad(f"answer {entry!r}") from None
        if not answers:
            raise bad("no answers")
        try:
            made = Provenance.from_doc(doc["provenance"])
        except ValueError as exc:
            raise bad(str(exc)) from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in doc["references"].items()) \
                or not all(isinstance(b, str) for b in doc["backports"]):
            raise bad("references must map file names to SHA-256s and backports list file paths")
        return cls(answers, made, dict(doc["references"]), list(doc["backports"]))

    @classmethod
    def load(cls, path: Path) -> CorpusTable:
        return cls.from_doc(read_json(path, "corpus table", todo=CORPUS_TODO), source=str(path))
