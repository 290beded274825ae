"""The report document (report.json): what ``compare`` concluded, and its one loader.

The report is written by ``judge.compare.Summary.to_json`` (and enriched by the
report stage); this loader checks what publish and ``verify`` rely on: the
schema, every verdict and published status, and that each exit code follows.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import INTEGRITY, HarnessError, worst
from ..core.files import read_json
from .versions import Schema
from .vocabulary import PublishedStatus, Verdict

SCHEMA = Schema("pdevidence-report/", 1)
REPORT_SCHEMA = SCHEMA.name


def load_report(path: Path) -> dict:
    """A report.json as ``Summary.to_json`` wrote it, with its schema, verdicts and statuses checked."""
    todo = "regenerate it: `nox -s compare` writes runs/report.json, `nox -s publish` results/report.json"
    try:
        doc = read_json(path, "report", todo=todo)
    except HarnessError as exc:
        raise HarnessError(exc.what, code=INTEGRITY, todo=todo) from None

    def bad(why: str) -> HarnessError:
        return HarnessError(f"{path} is not a valid report: {why}", code=INTEGRITY, todo=todo)

    _, doc = SCHEMA.read(doc, bad)
    if not isinstance(doc.get("pairs"), list) or not isinstance(doc.get("exit_code"), int):
        raise bad("pairs must be a list and exit_code an integer")
    for n, pair in enumerate(doc["pairs"]):
        try:
            verdict = Verdict(pair["verdict"])
            for entry in pair["published"].values():
                PublishedStatus(entry["status"])
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise bad(f"pairs[{n}]: {exc!r}") from None
        if pair.get("exit_code") != verdict.exit_code or not isinstance(pair.get("experiment"), str):
            raise bad(f"pairs[{n}]: exit code {pair.get('exit_code')!r} for verdict {verdict.value!r}")
    failures = doc.get("published_failures", {})
    if doc["exit_code"] != worst([*(p["exit_code"] for p in doc["pairs"]), *([INTEGRITY] if failures else [])]):
        raise bad(f"exit_code {doc['exit_code']} does not follow from its pairs")
    return doc

