"""Why a tree is not simply fixed: its observations beside the base's and the head's, key by key.

The judge explains an answer with these (``check``'s ``explain``, a sweep entry's
``deviations``): per scenario, per key, what the judged tree observed, what the
published base observed and what the published head observed. A side that did not
observe the key is left out of the JSON (in memory: ``NOT_OBSERVED``), so a missing
key is never mistaken for an observed null, nor for any value a side observed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SIDES = ("tree", "base", "head")


class _NotObserved:
    def __repr__(self) -> str:
        return "NOT_OBSERVED"


NOT_OBSERVED: Any = _NotObserved()


@dataclass(frozen=True)
class Values:
    """One key: the judged tree's value, base's and head's (``NOT_OBSERVED`` where a side has no such key)."""

    tree: Any
    base: Any
    head: Any

    def to_json(self) -> dict[str, Any]:
        return {side: value for side, value in zip(SIDES, (self.tree, self.base, self.head))
                if value is not NOT_OBSERVED}

    @classmethod
    def from_doc(cls, doc: Any) -> Values:
        if not isinstance(doc, dict) or set(doc) - set(SIDES):
            raise ValueError(f"expected an object with some of {', '.join(SIDES)}, got {doc!r}")
        return cls(*(doc.get(side, NOT_OBSERVED) for side in SIDES))

    def neither(self) -> bool:
        """The tree observes what neither side does, compared as the judge compares: a key not observed is no
        value (never null), agreeing only with a side that did not observe it either."""
        tree, base, head = (NOT_OBSERVED if v is NOT_OBSERVED else json.dumps(v, sort_keys=True)
                            for v in (self.tree, self.base, self.head))
        return tree not in (base, head)

    def text(self) -> str:
        """``true (base false, head false)``: the tree's value first, the sides it is judged against after."""
        return f"{shown(self.tree)} (base {shown(self.base)}, head {shown(self.head)})"


# Per scenario, per key.
Explained = dict[str, dict[str, Values]]


def shown(value: Any) -> str:
    """An observation as a reader sees it: JSON, ``not observed`` for a key the side does not have."""
    return "not observed" if value is NOT_OBSERVED else json.dumps(value, sort_keys=True)


def explained_json(found: Explained) -> dict[str, dict[str, dict[str, Any]]]:
    return {sid: {key: values.to_json() for key, values in keys.items()} for sid, keys in found.items()}


def explained_from_doc(doc: Any) -> Explained:
    if not isinstance(doc, dict) or not all(isinstance(keys, dict) for keys in doc.values()):
        raise ValueError(f"expected scenario -> key -> values, got {doc!r}")
    return {sid: {key: Values.from_doc(values) for key, values in keys.items()} for sid, keys in doc.items()}


def explained_text(found: Explained) -> list[str]:
    """One line per scenario: ``A3p: retired true (base false, head false); enqueued ...``."""
    return [f"{sid}: " + "; ".join(f"{key} {values.text()}" for key, values in keys.items())
            for sid, keys in found.items()]


def explained_brief(found: Explained) -> list[str]:
    """One line per scenario, one key: ``A3p: retired true (base false, head false); 2 more keys``. The key
    shown is one the tree departs from both sides on where there is one: why the scenario matches neither."""
    lines = []
    for sid, keys in found.items():
        key = next((k for k, values in keys.items() if values.neither()), next(iter(keys)))
        others = len(keys) - 1
        more = f"; {others} more key{'s' if others > 1 else ''}" if others else ""
        lines.append(f"{sid}: {key} {keys[key].text()}{more}")
    return lines
