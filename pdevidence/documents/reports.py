"""The report document (report.json): what ``compare`` concluded, and its one loader.

The report is written by ``judge.compare.Summary.to_json`` (and enriched by the
report stage); this loader checks what publish and ``verify`` rely on: the
schema, every verdict and published status, and that each exit code follows.
Schema /2 added ``unconfirmed``: the references a publish took in with
``--allow-unconfirmed`` although the fresh comparison did not confirm them
(empty when it confirmed every one; null in an upgraded /1 report: unknown).
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import INTEGRITY, HarnessError, worst
from ..core.files import read_json
from .versions import Schema
from .vocabulary import PublishedStatus, Verdict

def _report_1_to_2(doc: dict) -> dict:
    """/1 did not record whether a publish took in references the fresh comparison did not confirm: unknown."""
    doc.setdefault("unconfirmed", None)
    return doc


SCHEMA = Schema("pdevidence-report/", 2, {1: _report_1_to_2})
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
    unconfirmed = doc.get("unconfirmed")
    if unconfirmed is not None:
        try:
            for entry in unconfirmed:
                Verdict(entry["verdict"])
                if not (isinstance(entry["experiment"], str) and isinstance(entry["kind"], str)
                        and isinstance(entry["reasons"], list)):
                    raise ValueError(entry)
        except (TypeError, KeyError, ValueError) as exc:
            raise bad(f"unconfirmed: {exc!r}") from None
    failures = doc.get("published_failures", {})
    if doc["exit_code"] != worst([*(p["exit_code"] for p in doc["pairs"]), *([INTEGRITY] if failures else [])]):
        raise bad(f"exit_code {doc['exit_code']} does not follow from its pairs")
    return doc

