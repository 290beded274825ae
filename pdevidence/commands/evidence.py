"""The project's own evidence: `verify`, `checksums`, `publish`, `lock-cpu`, `lock-trees`; and the evidence
`--version` names."""

from __future__ import annotations

from pathlib import Path

from .. import __version__, environments, registry
from ..core import paths
from ..core.errors import CONFIRMED, usage
from ..core.files import sha256_file
from ..core.paths import results_dir, runs_dir, tree_lock_file
from ..documents import integrity, reports
from ..publish import publish
from ..sources import trees


def cmd_verify(args) -> int:
    integrity.verify(args.root)
    published_report = results_dir(args.root) / "report.json"
    if published_report.exists():
        reports.load_report(published_report)
    print("SHA256SUMS.txt: every listed file matches, every covered file is listed, "
          "every published receipt is valid for the result beside it, and the published report is valid")
    return CONFIRMED


def cmd_checksums(args) -> int:
    path = integrity.regenerate(args.root)
    print(f"wrote {path}")
    return CONFIRMED


def cmd_lock_cpu(args) -> int:
    """The CPU channel's hashed closure, compiled where the PyTorch CPU index is reachable."""
    reg = registry.load(args.root)
    if reg.constraints_input is None:
        raise usage("the registry names no constraints_input to compile")
    dest = reg.constraints_cpu or reg.root / "constraints" / f"cells-py{reg.python.replace('.', '')}-cpu.txt"
    environments.compile_cpu_closure(reg.constraints_input, dest, reg.python)
    print(f"wrote {dest}; commit it and set constraints_cpu = \"{dest.relative_to(reg.root)}\" in experiments.toml")
    return CONFIRMED


def cmd_lock_trees(args) -> int:
    """Pin every wheel file of releases in the tracked tree lock, with the index's SHA-256s.

    Default: the releases pinned already and the registry's release brackets (a new published
    release, e.g. from the sweep, is named explicitly). The only writer of that file.
    """
    reg = registry.load(args.root)
    lock = trees.LockFile(tree_lock_file(reg.root))
    versions = args.versions or sorted(
        {key.split("==", 1)[1] for key in lock.pinned_keys("sglang")}
        | {v for exp in reg.experiments.values() for v in exp.releases.values() if v}, key=trees.parse_version)
    for version in versions:
        trees.parse_version(version)
    files = trees.index_files("sglang")
    lock.pin_releases({f"sglang=={v}": trees.pinned_release_files(files, "sglang", v) for v in versions})
    print(f"pinned every wheel of sglang {', '.join(versions)} in {lock.path}; commit it")
    return CONFIRMED


def cmd_publish(args) -> int:
    reg = registry.load(args.root)
    done = publish.publish(reg, runs_dir(reg.root), args.kind, allow_unconfirmed=args.allow_unconfirmed)
    for path in done.files:
        print(f"published {path.relative_to(reg.root)}")
    print(f"wrote {done.sums}")
    return CONFIRMED


def evidence_digest(root: Path) -> str | None:
    """The digest of the published set a project carries: the SHA-256 of its SHA256SUMS.txt, which lists every
    published file, probe, registry and closure by its own SHA-256."""
    sums = root / integrity.SUMS_FILE
    return sha256_file(sums) if sums.is_file() else None


def version_text(root: Path) -> str:
    digest = evidence_digest(root)
    where = "installed copy" if paths.bundled(root) else "checkout"
    if digest is None:
        return f"pdevidence {__version__}\nevidence: none ({integrity.SUMS_FILE} is missing from {root})"
    return (f"pdevidence {__version__}\nevidence: sha256:{digest} (the {integrity.SUMS_FILE} of the {where} at "
            f"{root}; `pdevidence verify` checks every file it lists)")
