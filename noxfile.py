"""Sessions over experiment x side; the logic lives in the `pdevidence` package.

    nox -l                               list every cell
    nox -s "probe(admission, head)"      one pinned-commit cell
    nox -s "release(prefill, base)"      one release-backed cell
    nox -s matrix                        release-backed matrix, then compare
    nox -s compare                       aggregate existing results
    nox -s "mutate(admission)"           the head release under each declared mutant of the fix
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))

from pdevidence import cli, errors, registry  # noqa: E402

nox.options.default_venv_backend = "none"
# Bare `nox` runs the main job; `nox -l` still lists every cell.
nox.options.sessions = ["matrix"]

ROOT = Path(__file__).parent
try:
    REGISTRY = registry.load(ROOT)
except errors.HarnessError as exc:  # a broken registry: say so, not a traceback
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(exc.code)
CELLS = [(name, side) for name in REGISTRY.experiments for side in registry.SIDES]
CELL_IDS = [f"{name}, {side}" for name, side in CELLS]


def _run(*argv: str) -> None:
    code = cli.main(["--root", str(ROOT), *argv])
    # SystemExit carries the documented exit code through nox.
    if code:
        raise SystemExit(code)


@nox.session(tags=["cell", "git"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def probe(session: nox.Session, experiment: str, side: str) -> None:
    """A pinned-commit cell (GitHub archive, or SGLANG_REPO=<clone>)."""
    _run("cell", "git", experiment, side, *session.posargs)


@nox.session(tags=["cell", "release"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def release(session: nox.Session, experiment: str, side: str) -> None:
    """A release-backed cell: the registry's bracketing SGLang release from PyPI."""
    _run("cell", "release", experiment, side, *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """The main job: every release-backed cell (2 at a time), then compare."""
    _run("matrix", *session.posargs)


@nox.session
def compare(session: nox.Session) -> None:
    """Aggregate existing results; runs no probe. `-- --kind git|all` for other cells."""
    _run("compare", *session.posargs)


@nox.session
def verify(session: nox.Session) -> None:
    """Check SHA256SUMS.txt against the probes and published results."""
    _run("verify")


@nox.session
def checksums(session: nox.Session) -> None:
    """Regenerate SHA256SUMS.txt."""
    _run("checksums")


@nox.session
def publish(session: nox.Session) -> None:
    """Copy fresh release results into results/ and regenerate SHA256SUMS.txt."""
    _run("publish", *session.posargs)


@nox.session
@nox.parametrize("experiment", list(REGISTRY.experiments), ids=list(REGISTRY.experiments))
def sweep(session: nox.Session, experiment: str) -> None:
    """Probe every SGLang release from the registry floor up; name the first fixed one."""
    _run("sweep", experiment, *session.posargs)


@nox.session(tags=["drift"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def drift(session: nox.Session, experiment: str, side: str) -> None:
    """A release cell on the newest torch (`-- --transformers latest` moves it too); advisory."""
    _run("drift", experiment, side, *session.posargs)


@nox.session(tags=["upstream"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def upstream(session: nox.Session, experiment: str, side: str) -> None:
    """The PR's own test files on one side's tree (PDEVIDENCE_UPSTREAM_TESTS=<checkout>, `-- --kind release`)."""
    _run("upstream", experiment, side, *session.posargs)


@nox.session(tags=["mutate"])
@nox.parametrize("experiment", list(REGISTRY.experiments), ids=list(REGISTRY.experiments))
def mutate(session: nox.Session, experiment: str) -> None:
    """The head release under each declared mutant of the fix: every one must be killed."""
    _run("mutate", experiment, *session.posargs)
