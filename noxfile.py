"""Sessions over experiment x side; the logic lives in the `pdevidence` package.

    nox -l                               list every cell
    nox -s "probe(admission, head)"      one pinned-commit cell
    nox -s "release(prefill, base)"      one release-backed cell
    nox -s matrix                        release-backed matrix, then compare
    nox -s compare                       aggregate existing results
    nox -s "mutate(admission)"           the head release under each declared mutant of the fix
    nox -s corpus                        the backport corpus through check's judge
    nox -s lock_cpu                      compile the hashed CPU-torch closure (needs the PyTorch CPU index)

One selected session exits with the harness's own code (docs/operators/exit-codes.md). With
several, each failure fails only its session: nox runs the rest, prints its summary
and exits 1. Ctrl-C or SIGTERM stops the run at once (130 or 143).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))

from pdevidence import cli, registry  # noqa: E402
from pdevidence.core import errors  # noqa: E402

nox.options.default_venv_backend = "none"
# Bare `nox` runs the main job; `nox -l` still lists every cell.
nox.options.sessions = ["matrix"]

ROOT = Path(__file__).parent


def _load_registry() -> registry.Registry:
    """The sessions are made from the registry: a broken one is its exit code, not a traceback."""
    loaded = []
    code = errors.boundary(lambda: loaded.append(registry.load(ROOT)) or errors.CONFIRMED,
                           where="the noxfile, reading experiments.toml")
    if code != errors.CONFIRMED:
        sys.exit(code)
    return loaded[0]


REGISTRY = _load_registry()
CELLS = [(name, side) for name in REGISTRY.experiments for side in registry.SIDES]
CELL_IDS = [f"{name}, {side}" for name, side in CELLS]
# Pinned-commit cells only where the registry pins the side's commit ([experiments.<name>.git] is optional).
GIT_CELLS = [(name, side) for name, side in CELLS if side in REGISTRY.experiments[name].git]
GIT_CELL_IDS = [f"{name}, {side}" for name, side in GIT_CELLS]
ERAS = ["current", *REGISTRY.eras]  # lanes.sweep_parts.CURRENT: the releases of no declared era


# The ids of each parametrized session: `-s release` selects them all, `-s "release(prefill, base)"` one.
MUTATED = list(REGISTRY.experiments)
PARAMETRIZED = {"probe": GIT_CELL_IDS, "release": CELL_IDS, "sweep_era": ERAS, "drift": CELL_IDS,
                "upstream": CELL_IDS, "mutate": MUTATED}


def _names_one_session(argv: list[str], environ: dict[str, str]) -> bool:
    """Whether this nox run selects exactly one session, read from nox's documented selection (-s/-e/--session,
    NOXSESSION, else nox.options.sessions; -k and -t select by rule, never "one"): nox tells a session no more.
    Unsure means several: a failure then fails its session and nox runs the rest."""
    selection = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # nox's parser takes no abbreviation
    selection.add_argument("-s", "-e", "--sessions", "--session", nargs="*", action="extend", dest="sessions")
    selection.add_argument("-k", "--keywords")
    selection.add_argument("-t", "--tags", nargs="*")
    given, _ = selection.parse_known_args(argv[:argv.index("--")] if "--" in argv else argv)
    if given.keywords or given.tags:
        return False
    names = given.sessions or (environ["NOXSESSION"].split(",") if environ.get("NOXSESSION") else nox.options.sessions)
    if len(names) != 1:
        return False
    base, parametrized, rest = names[0].partition("(")
    return rest.removesuffix(")") in PARAMETRIZED.get(base, ()) if parametrized else base not in PARAMETRIZED


def _finish(session: nox.Session, code: int) -> None:
    """Pass the harness's exit code on: alone, as nox's exit code; among others, as a failed session."""
    if code == errors.CONFIRMED:
        return
    if code > 128 or _names_one_session(sys.argv[1:], dict(os.environ)):
        # Interrupted (130/143) stops the whole run; a lone session keeps its documented code.
        raise SystemExit(code)
    session.error(f"exit {code}: {errors.EXIT_CODES.get(code, 'see the output above')}")


def _run(session: nox.Session, *argv: str) -> None:
    # cli.main returns argparse's usage errors (2) too: this session's failure, not nox's end.
    _finish(session, errors.boundary(lambda: cli.main(["--root", str(ROOT), *argv]),
                                     where=f"nox session {session.name}"))


@nox.session(tags=["cell", "git"])
@nox.parametrize(("experiment", "side"), GIT_CELLS, ids=GIT_CELL_IDS)
def probe(session: nox.Session, experiment: str, side: str) -> None:
    """A pinned-commit cell (GitHub archive, or SGLANG_REPO=<clone>)."""
    _run(session, "cell", "git", experiment, side, *session.posargs)


@nox.session(tags=["cell", "release"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def release(session: nox.Session, experiment: str, side: str) -> None:
    """A release-backed cell: the registry's bracketing SGLang release from PyPI."""
    _run(session, "cell", "release", experiment, side, *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """The main job: every release-backed cell (2 at a time), then compare."""
    _run(session, "matrix", *session.posargs)


@nox.session
def compare(session: nox.Session) -> None:
    """Aggregate existing results; runs no probe. `-- --kind git|all` for other cells."""
    _run(session, "compare", *session.posargs)


@nox.session
def verify(session: nox.Session) -> None:
    """Check SHA256SUMS.txt against the probes and published results."""
    _run(session, "verify")


@nox.session
def checksums(session: nox.Session) -> None:
    """Regenerate SHA256SUMS.txt (refused while published evidence is stale: republish instead)."""
    _run(session, "checksums")


@nox.session
def publish(session: nox.Session) -> None:
    """Publish the declared set (fresh cells, sweep and mutation tables, the OpenVEX example) into results/, whole."""
    _run(session, "publish", *session.posargs)


@nox.session
def sweep(session: nox.Session) -> None:
    """Every SGLang release from the registry floor up, all experiments in one import each; flags regressions.
    `-- --experiment admission` for one, `-- --pre` for pre- and dev releases."""
    _run(session, "sweep", *session.posargs)


@nox.session
def corpus(session: nox.Session) -> None:
    """Every declared backport (backports/): each release as published, with each fix ported, with each port
    partial; `check` must answer affected, fixed and partial (fixed, for a fix of which no partial port exists)."""
    _run(session, "corpus", *session.posargs)


@nox.session(tags=["era"])
@nox.parametrize("era", ERAS, ids=ERAS)
def sweep_era(session: nox.Session, era: str) -> None:
    """One era's releases (its own closure, one warm engine), written as a part: the CI fan-out's job."""
    _run(session, "sweep", "--era", era, *session.posargs)


@nox.session
def sweep_merge(session: nox.Session) -> None:
    """Join every era's part into the sweep tables; fails on a missing part (`-- --partial` joins what there is,
    unpublishable) and on a release that lost a fix (the watch)."""
    _run(session, "sweep-merge", *session.posargs)


@nox.session
def check(session: nox.Session) -> None:
    """Is my SGLang affected? `-- --python /venv/bin/python`, `-- --release 0.5.20`, --wheel, --path, --git."""
    _run(session, "check", *session.posargs)


@nox.session(tags=["drift"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def drift(session: nox.Session, experiment: str, side: str) -> None:
    """A release cell on the newest torch (`-- --transformers latest` moves it too); advisory."""
    _run(session, "drift", experiment, side, *session.posargs)


@nox.session(tags=["upstream"])
@nox.parametrize(("experiment", "side"), CELLS, ids=CELL_IDS)
def upstream(session: nox.Session, experiment: str, side: str) -> None:
    """The PR's own test files on one side's tree (PDEVIDENCE_UPSTREAM_TESTS=<checkout>, `-- --kind release`)."""
    _run(session, "upstream", experiment, side, *session.posargs)


@nox.session
def lock_cpu(session: nox.Session) -> None:
    """Compile the CPU channel's hashed closure (`uv pip compile --generate-hashes`, PyTorch CPU index)."""
    _run(session, "lock-cpu")


@nox.session(tags=["mutate"])
@nox.parametrize("experiment", MUTATED, ids=MUTATED)
def mutate(session: nox.Session, experiment: str) -> None:
    """The head release under each declared mutant of the fix: every one must be killed."""
    _run(session, "mutate", experiment, *session.posargs)


@nox.session
def cache(session: nox.Session) -> None:
    """What pdevidence's caches hold and how to shrink them: `-- info` (the default), `-- prune --older-than 30d`,
    `-- prune --max-size 20G`, `-- clean`."""
    _run(session, "cache", *(session.posargs or ["info"]))


@nox.session
def bisect(session: nox.Session) -> None:
    """The commit that fixed each bug and the one that brought it in, by behaviour, on the clone in SGLANG_REPO
    (`-- offload_slots`, `-- --every`, `-- --good <ref> --bad <ref>`; default: every experiment)."""
    _run(session, "bisect", *session.posargs)
