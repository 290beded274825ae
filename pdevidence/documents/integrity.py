"""SHA256SUMS.txt and the published documents it vouches for.

The sums cover every file under results/, the probes, the registry and the
constraints the published run used, in ``sha256sum -c`` format. Beyond the
sums, every published receipt must be a valid receipt of the result beside it,
and every published receipt and table must have been made by this checkout's
probes, kit, drivers, registry, constraints and harness (else it is stale: the
sums are never regenerated over stale evidence, which only a republish replaces).
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import HarnessError, integrity
from ..core.files import read_json, relative, sha256_file, write_atomic
from ..core.paths import results_dir
from ..registry import REGISTRY_FILE, TorchChannel
from ..registry import load as load_registry
from .provenance import republish_steps, stale_error
from .receipts import Receipt
from .results import RECEIPT_SUFFIX, RESULT_SCHEMA_PREFIX, Result, receipt_path, result_beside
from .corpus_table import FILE as CORPUS_FILE
from .corpus_table import CorpusTable
from .bisects import BisectDocument
from .tables import MutationTable, SweepTable

SUMS_FILE = "SHA256SUMS.txt"
# Published tables and bisect documents, by loader: each names its experiment and is stale against its probe.
TABLES = (("sweep-*.json", SweepTable.load), ("mutate.*.json", MutationTable.load),
          ("bisect-*.json", BisectDocument.load))
_TODO = ("if you changed a probe, the registry or the constraints on purpose (`nox -s checksums` refuses while "
         "published evidence was made by other inputs), " + republish_steps() + "; otherwise restore the file from git")


def published_inputs(root: Path) -> list[Path]:
    """The registry and the constraints closures the published runs were built from (every era's too)."""
    reg = load_registry(root)
    inputs = [root / REGISTRY_FILE, reg.constraints]
    if reg.torch_channel is TorchChannel.CPU and reg.constraints_cpu:
        inputs.append(reg.constraints_cpu)
    return inputs + [era.constraints for era in reg.eras.values()] + backport_files(root)


def backport_files(root: Path) -> list[Path]:
    """The backport corpus's declarations (``backports/sglang-*.toml``): inputs of the published corpus table."""
    return sorted((root / "backports").glob("sglang-*.toml"))


def _published(top: Path) -> list[Path]:
    # Hidden files are write_atomic's temporaries, never published.
    return sorted(p for p in top.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(top).parts))


def _covered(root: Path, top: Path | None = None) -> dict[str, Path]:
    """Each covered file's name in the sums -> where it is now; ``top`` stands in for results/ (a staged publish)."""
    probes = sorted((root / "probes").glob("*.py"))
    files = {p.relative_to(root).as_posix(): p for p in [*probes, *(p for p in published_inputs(root) if p.exists())]}
    results = results_dir(root)
    top = top or results
    files.update({(results / p.relative_to(top)).relative_to(root).as_posix(): p for p in _published(top)})
    return files


def covered_files(root: Path) -> list[str]:
    return list(_covered(root))


def render(root: Path, top: Path | None = None) -> str:
    return "".join(f"{sha256_file(path)}  {rel}\n" for rel, path in _covered(root, top).items())


def regenerate(root: Path) -> Path:
    """Write the sums; refuse to vouch for a published document that is not valid (5) or is stale (8)."""
    bad = document_problems(root)
    if bad:
        raise integrity(f"not regenerating {SUMS_FILE}: {len(bad)} published file(s) are not valid:\n"
                        + _listing(bad), todo="restore them from git (`git checkout -- results/`) or republish")
    check_current(root, f"published evidence (not regenerating {SUMS_FILE})")
    path = root / SUMS_FILE
    write_atomic(path, render(root))
    return path


def listed(root: Path) -> dict[str, str]:
    path = root / SUMS_FILE
    if not path.exists():
        return {}
    entries = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64:
            raise integrity(f"{SUMS_FILE} line {number} is not `<sha256>  <path>`: {line!r}",
                            todo="regenerate it with `nox -s checksums` after checking the files")
        entries[rel] = digest
    return entries


def problems(root: Path) -> dict[str, str]:
    """Each covered or listed file that does not check out against SHA256SUMS.txt, with why."""
    entries = listed(root)
    found = {rel: _problem(root, rel, entries) for rel in sorted(set(entries) | set(covered_files(root)))}
    return {rel: why for rel, why in found.items() if why}


def problem(root: Path, rel: str) -> str | None:
    """Why one file (a path relative to ``root``) does not check out against SHA256SUMS.txt, if it does not."""
    return _problem(root, rel, listed(root))


def _problem(root: Path, rel: str, entries: dict[str, str]) -> str | None:
    if rel not in entries:
        return f"not listed in {SUMS_FILE}"
    if not (root / rel).exists():
        return f"listed in {SUMS_FILE} but missing"
    actual = sha256_file(root / rel)
    return None if actual == entries[rel] else f"SHA-256 {actual}, {SUMS_FILE} says {entries[rel]}"


def document_problems(root: Path, top: Path | None = None) -> dict[str, str]:
    """Each published receipt, result or table (under ``top``, default results/) that is not valid evidence,
    with why (sums aside)."""
    top = top or results_dir(root)
    found = {}
    for receipt in sorted(top.glob(f"*{RECEIPT_SUFFIX}")):
        try:
            Receipt.load(receipt)
        except HarnessError as exc:
            found[relative(receipt, root)] = exc.what
            continue
        try:
            Result.load(result_beside(receipt))
        except HarnessError as exc:
            found[relative(result_beside(receipt), root)] = exc.what
    for pattern, load in (*TABLES, (CORPUS_FILE, CorpusTable.load)):
        for path in sorted(top.glob(pattern)):
            try:
                load(path)
            except HarnessError as exc:
                found[relative(path, root)] = exc.what
    for path in sorted(top.glob("*.json")):
        if not path.name.endswith(RECEIPT_SUFFIX) and not receipt_path(path).exists() and _looks_like_result(path):
            found[relative(path, root)] = f"a published result without its receipt {receipt_path(path).name}"
    return found


def _looks_like_result(path: Path) -> bool:
    try:
        doc = read_json(path, "document", todo="")
    except HarnessError:
        return False
    schema = doc.get("schema") if isinstance(doc, dict) else None
    return isinstance(schema, str) and schema.startswith(RESULT_SCHEMA_PREFIX)


def failures(root: Path) -> dict[str, str]:
    """Everything ``verify`` refuses: sums that do not match, published documents that are not valid."""
    found: dict[str, str] = {}
    for source in (problems(root), document_problems(root)):
        for rel, why in source.items():
            found[rel] = f"{found[rel]}; {why}" if rel in found else why
    return found


def stale_documents(root: Path, top: Path | None = None) -> dict[str, list[str]]:
    """Each published receipt and table (under ``top``, default results/) that other inputs made, with how
    this checkout differs. Assumes they load (``document_problems`` first)."""
    reg = load_registry(root)
    top = top or results_dir(root)
    found = {}
    for receipt in sorted(top.glob(f"*{RECEIPT_SUFFIX}")):
        found[relative(receipt, root)] = Receipt.load(receipt).stale(root)
    for pattern, load in TABLES:
        for path in sorted(top.glob(pattern)):
            table = load(path)
            probe = reg.experiments[table.experiment].probe if table.experiment in reg.experiments else None
            found[relative(path, root)] = (table.stale(root, relative(probe, root)) if probe else
                                           [f"experiment {table.experiment!r} is not in the registry"])
    corpus = top / CORPUS_FILE
    if corpus.is_file():
        found[relative(corpus, root)] = CorpusTable.load(corpus).stale(
            root, [relative(exp.probe, root) for exp in reg.experiments.values()])
    return {rel: why for rel, why in found.items() if why}


def check_current(root: Path, what: str = "published evidence", top: Path | None = None) -> None:
    """Exit 8 naming each published document other inputs made."""
    stale = stale_documents(root, top)
    if stale:
        raise stale_error(stale, load_registry(root), what=what)


def verify(root: Path) -> None:
    """Tampering first (exit 5: sums, loaders), then staleness (exit 8: provenance)."""
    bad = failures(root)
    if bad:
        raise integrity(f"{len(bad)} file(s) fail verification:\n" + _listing(bad), todo=_TODO)
    check_current(root)


def _listing(bad: dict[str, str]) -> str:
    return "\n".join(f"  {rel}: {why}" for rel, why in sorted(bad.items()))
