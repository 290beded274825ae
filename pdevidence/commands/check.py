"""`check` (is my SGLang affected?) and `corpus` (the declared backports through check's judge)."""

from __future__ import annotations

import contextlib
import sys
import time

from .. import registry
from ..core import arguments, clock, phases
from ..core.errors import USAGE, HarnessError, usage, worst
from ..core.files import dumps, write_atomic
from ..core.locking import exclusive
from ..core.paths import runs_dir, work_dir
from ..documents import corpus_table
from ..lanes import check, corpus
from ..publish import openvex


def cmd_check(args) -> int:
    """Is my SGLang affected? Exit 0 all fixed, 1 any affected/partial/deviates/unknown, 3 any cannot run.
    Several targets share one warm engine; the exit code is the worst of theirs."""
    reg = registry.load(args.root)
    asked = [(kind, value) for kind in ("python", "release", "wheel", "path", "git", "image")
             for value in getattr(args, kind) or []]
    if not asked:
        raise usage("check needs a target",
                    expected="one or more of --python, --release, --wheel, --path, --git, --image")
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    started = time.monotonic()
    with phases.recording() as spent:
        with phases.measure(phases.TREES):
            targets = [target for kind, value in asked for target in _resolved(reg, kind, value, log)]
        with _taking_turns(reg, targets):
            found = check.run_all(reg, targets, fresh_references=args.references == "fresh", force=args.force,
                                  log=log, server_args=args.server_args, server_env=server_environment(args),
                                  server_platform=args.server_platform)
    for result in found:  # on stderr whatever the output: a typo in the environment must not pass silently
        for warning in result.environment.warnings() if result.environment else ():
            print(f"check: {check.describe(result)}: {warning}", file=sys.stderr)
    log(f"time: {phases.describe(spent, time.monotonic() - started)}")
    if args.openvex:
        stamp = clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        write_atomic(args.openvex, dumps(openvex.document(reg, found, stamp)))
        log(f"wrote {args.openvex}")
    if args.json:  # one target: its document, as before; several: a list of them
        print(dumps(found[0].to_json() if len(found) == 1 else [r.to_json() for r in found]), end="")
    else:
        print("\n".join(check.table(result, verbose=args.verbose) for result in found))
    return worst(result.exit_code for result in found)


def add_server_env_arguments(parser) -> None:
    """``check``'s server environment options (beside ``--server-args``)."""
    parser.add_argument("--server-env", type=arguments.server_env, action="append", metavar="NAME=VALUE",
                        help="a variable of the server's environment (repeatable; a bare NAME takes its value here, "
                        "as docker run -e does): a gated fix the environment leaves off is affected (read with each "
                        "tree's own Envs; none given: every variable at its default)")
    parser.add_argument("--server-env-file", type=arguments.server_env_file, action="append", metavar="FILE",
                        help="the server's environment in docker run --env-file format (NAME=VALUE lines, # comments)")
    parser.add_argument("--server-platform", type=arguments.server_platform, default=arguments.DEFAULT_PLATFORM,
                        metavar="PLATFORM", help="the platform the server runs on, as SGLang names it: "
                        f"{', '.join(arguments.SERVER_PLATFORMS)} (default: {arguments.DEFAULT_PLATFORM}): a fix that "
                        "runs by default only on some platforms is, elsewhere, affected unless the server's "
                        "environment turns it on")


def server_environment(args) -> arguments.ServerEnvironment | None:
    """Every variable given, the files first and then ``--server-env`` (a later one wins, as with docker)."""
    return arguments.ServerEnvironment.joined([*(args.server_env_file or []), *(args.server_env or [])])


@contextlib.contextmanager
def _taking_turns(reg: registry.Registry, targets: list[tuple]):
    """An interpreter's probe output is written in place (``runs/check/<its label>``), unlike a tree's: runs at
    once that check one interpreter take turns, so that each reads its own. Locked in label order: two runs
    naming two interpreters in either order never wait for each other."""
    with contextlib.ExitStack() as held:
        interpreters = {target.label(): target.ref for target, tree in targets if tree is None}
        for label in sorted(interpreters):
            held.enter_context(exclusive(work_dir(reg.root) / "locks" / f"check-{label}.lock",
                                         f"the output of checking {interpreters[label]}"))
        yield


def _resolved(reg: registry.Registry, kind: str, value, log) -> list[tuple]:
    """The check targets an option names (an image: each SGLang package in it); a usage error names the option and
    the value it is about (what the value names is only known once looked at: a wheel for another Python, a
    directory with no sglang/, a release PyPI does not have, an image with no SGLang)."""
    try:
        if kind == "image":
            return check.resolve_image(reg, value, log=log)
        return [check.resolve(reg, **{kind: value})]
    except HarnessError as exc:
        if exc.code == USAGE:
            exc.what = f"--{kind} {str(value)!r}: {exc.what}"
        raise


def cmd_corpus(args) -> int:
    """Each declared backport's pristine, backport and partial trees through check's judge; exit 0 only when
    every answer is the expected one."""
    reg = registry.load(args.root)
    found = corpus.run(reg, args.release, fresh_references=args.references == "fresh",
                       log=lambda msg: print(msg, flush=True))
    out = runs_dir(reg.root) / corpus_table.FILE
    write_atomic(out, dumps(found.table.to_json()))
    print(corpus.table(found))
    print(f"wrote {out}")
    return found.exit_code
