"""Schema versions, the way asv migrates its result files.

A document names its schema as ``<prefix><version>``. A loader reads the current
version and, for every older version it still reads, one upgrade step to the
next version; an old document is upgraded step by step and then checked as a
current one, so what an old file means is written down once, and tested.
Upgrades never touch the document as written (loaders keep that for byte-level
comparisons and for the report).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Upgrade = Callable[[dict], dict]


@dataclass(frozen=True)
class Schema:
    prefix: str  # e.g. "pdevidence-receipt/"
    current: int
    upgrades: dict[int, Upgrade] = field(default_factory=dict)  # version n -> its step to n + 1

    def __post_init__(self) -> None:
        assert sorted(self.upgrades) == list(range(self.oldest, self.current)), "one upgrade step per old version"

    @property
    def name(self) -> str:
        """What a document of the current version says it is."""
        return f"{self.prefix}{self.current}"

    @property
    def oldest(self) -> int:
        return min(self.upgrades, default=self.current)

    @property
    def readable(self) -> str:
        """The versions a loader reads, for messages: ``prefix<1|2>``."""
        return f"{self.prefix}<{'|'.join(map(str, range(self.oldest, self.current + 1)))}>"

    def version_of(self, doc: Any) -> int | None:
        """The version ``doc`` is written in, when it is one this schema reads."""
        schema = doc.get("schema") if isinstance(doc, dict) else None
        version = schema.removeprefix(self.prefix) if isinstance(schema, str) and schema.startswith(self.prefix) \
            else ""
        if not (version.isdigit() and self.oldest <= int(version) <= self.current):
            return None
        return int(version)

    def read(self, doc: Any, bad: Callable[[str], Exception]) -> tuple[int, dict]:
        """The version ``doc`` is written in and ``doc`` in the current form; ``bad(why)`` for any other schema."""
        version = self.version_of(doc)
        if version is None:
            raise bad(f"schema {doc.get('schema') if isinstance(doc, dict) else None!r}, expected {self.readable}")
        return version, self.upgrade(doc, version)

    def upgrade(self, doc: dict, version: int) -> dict:
        """``doc`` (written in ``version``) in the current form; a copy, when any step runs."""
        if version == self.current:
            return doc
        doc = copy.deepcopy(doc)
        for step in range(version, self.current):
            doc = self.upgrades[step](doc)
            doc["schema"] = f"{self.prefix}{step + 1}"
        return doc
