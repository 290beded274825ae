"""Command line: ``python -m pdevidence <command>``; the noxfile calls the same functions.

Every failure becomes one line of what happened, what was expected, what to
do, and the exit code documented in docs/operators/exit-codes.md.
"""

from __future__ import annotations

import argparse
import sys

from . import commands, registry
from .cells import cells
from .core import arguments, children, debris, paths, sandbox, settings
from .core.errors import EXIT_CODES, USAGE, boundary
from .core.paths import PROJECT
from .judge import classify
from .lanes import cache as caches
from .lanes import check, drift, upstream


def _allow_uncontained(command: argparse.ArgumentParser) -> None:
    command.add_argument("--allow-uncontained", action="store_true",
                         help="where nothing can contain a probe process (no bubblewrap, no user namespaces), run "
                         "trees that are not pinned releases anyway: their code runs with your privileges")


class _Parser(argparse.ArgumentParser):
    """argparse, except that ``--opt=--`` gives ``--opt`` the value ``--`` (3.11 drops it, leaving an empty list
    no option expects) for its type to refuse; the subcommands' parsers are of this class too."""

    def _get_values(self, action, arg_strings):
        if action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pdevidence", description=__doc__,
                                epilog="exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
    p.add_argument("--root", type=arguments.project, default=PROJECT,
                   help="project directory (default: this checkout, or the installed copy's own files)")
    p.add_argument("--version", action=_Version, help="print the tool's version and the evidence it carries, then exit")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("cell", help="run one cell")
    c.add_argument("kind", choices=list(cells.SESSION_OF_KIND))
    c.add_argument("experiment", type=arguments.name)
    c.add_argument("side", choices=registry.SIDES)
    c.add_argument("--ref", type=arguments.ref, help="override the registry: a version, a commit SHA or a directory")
    c.add_argument("--force", action="store_true", help="rerun even if the inputs are unchanged")
    _allow_uncontained(c)
    c.set_defaults(func=commands.matrix.cmd_cell)

    m = sub.add_parser("matrix", help="run every cell of one tree kind, then compare")
    m.add_argument("--kind", default="release", choices=["release", "git"])
    m.add_argument("--jobs", type=arguments.positive_int, default=2, help="cells run at once (default 2)")
    m.add_argument("--force", action="store_true")
    _allow_uncontained(m)
    m.set_defaults(func=commands.matrix.cmd_matrix)

    cmp_ = sub.add_parser("compare", help="compare existing cell results; runs no probe")
    cmp_.add_argument("--kind", default="release", choices=["release", "git", "all"])
    cmp_.set_defaults(func=commands.matrix.cmd_compare)

    sub.add_parser("verify", help="check SHA256SUMS.txt").set_defaults(func=commands.evidence.cmd_verify)
    sub.add_parser("checksums", help="regenerate SHA256SUMS.txt").set_defaults(func=commands.evidence.cmd_checksums)
    sub.add_parser("lock-cpu", help="compile the CPU torch channel's hashed closure (needs the PyTorch CPU index)"
                   ).set_defaults(func=commands.evidence.cmd_lock_cpu)

    lt = sub.add_parser("lock-trees", help="pin every wheel file of SGLang releases in constraints/trees.lock.json "
                        "(default: those pinned already and the registry's brackets)")
    lt.add_argument("versions", nargs="*", type=arguments.version)
    lt.set_defaults(func=commands.evidence.cmd_lock_trees)

    sw = sub.add_parser("sweep", help="probe every release (each experiment from its own floor, one import each) and "
                        "classify each")
    sw.add_argument("versions", nargs="*", type=arguments.swept_version,
                    help="releases to probe (default: the registry floor up to the newest)")
    sw.add_argument("--experiment", action="append", type=arguments.name,
                    help="only this experiment (repeatable; default: all)")
    sw.add_argument("--pre", action="store_true", help="also pre- and dev releases (post-releases are always in)")
    sw.add_argument("--jobs", type=arguments.positive_int, default=2)
    sw.add_argument("--cold", action="store_true",
                    help="one environment and one fresh probe process per release instead of the warm engine")
    sw.add_argument("--force", action="store_true", help="reprobe releases whose outcome is cached")
    sw.add_argument("--references", choices=classify.REFERENCES, default="published",
                    help="judge against the published base and head results (default), or the fresh ones in "
                    "runs/ from `nox -s matrix` (republishing, when the published ones are stale)")
    sw.add_argument("--era", type=arguments.era, help="only the releases of this era ('current': of none), written as a part under "
                    "runs/sweep-parts/<era>/ for `sweep-merge` (the CI fan-out)")
    _allow_uncontained(sw)
    sw.set_defaults(func=commands.sweep.cmd_sweep)

    sm = sub.add_parser("sweep-merge", help="join the era parts under runs/sweep-parts/ into the sweep tables")
    sm.add_argument("--experiment", action="append", type=arguments.name,
                    help="only this experiment (repeatable; default: all)")
    sm.add_argument("--partial", action="store_true", help="merge the parts there are, though an era's is missing "
                    "(exit 4 without it): the table says partial everywhere and publish refuses it")
    sm.set_defaults(func=commands.sweep.cmd_sweep_merge)

    ck = sub.add_parser("check", help="is my SGLang affected? run every probe on one build and judge each fix")
    # Each option may repeat; every target named is checked, every tree in one engine per era, nothing built.
    ck.add_argument("--python", type=arguments.interpreter, action="append",
                    help="an existing environment's interpreter (left untouched)")
    ck.add_argument("--release", type=arguments.version, action="append", help="an SGLang release from PyPI")
    # `--version` alone is the tool's version; `check --version X` was --release's spelling and still works.
    ck.add_argument("--version", dest="release", type=arguments.version, action="append", help=argparse.SUPPRESS)
    ck.add_argument("--wheel", type=arguments.wheel, action="append",
                    help="an SGLang wheel file (a backport, a fork's build)")
    ck.add_argument("--path", type=arguments.directory, action="append",
                    help="an SGLang source tree or fork, used unbuilt (checkout root or its python/)")
    ck.add_argument("--git", metavar="SHA", type=arguments.commit, action="append",
                    help="a commit: GitHub's archive, or SGLANG_REPO=<clone>")
    ck.add_argument("--image", type=arguments.image, action="append", metavar="PATH",
                    help="a saved container image (`docker save` tarball, OCI layout directory or tar): every SGLang "
                    "package in it, read without a container runtime")
    ck.add_argument("--json", action="store_true", help=f"print the {check.SCHEMA} document instead of the table")
    ck.add_argument("-v", "--verbose", action="store_true",
                    help="below each answer, every key of every scenario that kept it from fixed, beside base's and "
                    "head's (--json always has them)")
    ck.add_argument("--openvex", type=arguments.output_file, metavar="FILE", help="also write an OpenVEX v0.2.0 document")
    ck.add_argument("--references", choices=classify.REFERENCES, default="published",
                    help="judge against the published base and head results (default), or the fresh ones in "
                    "runs/ (republishing)")
    ck.add_argument("--force", action="store_true", help="probe every tree again, ignoring the outcomes kept for it")
    given = ck.add_mutually_exclusive_group()
    given.add_argument("--server-args", type=arguments.server_args, metavar='"ARGS"',
                       help="the server's arguments (\"--disaggregation-mode decode ...\"): each fix whose code path "
                       "that configuration never enters is not affected (read with each tree's own parser)")
    given.add_argument("--server-args-file", dest="server_args", type=arguments.server_args_file, metavar="FILE",
                       help="a file holding the server's launch command (python -m sglang.launch_server ...)")
    commands.check.add_server_env_arguments(ck)
    _allow_uncontained(ck)
    ck.set_defaults(func=commands.check.cmd_check)

    bi = sub.add_parser("bisect", help="by behaviour, the commit that fixed each bug and the one that brought it in")
    bi.add_argument("experiment", nargs="*", metavar="EXPERIMENT", type=arguments.name,
                    help="the experiments to bisect together (default: all)")
    bi.add_argument("--repo", type=arguments.directory, help="a clone of SGLang (default: SGLANG_REPO)")
    bi.add_argument("--main", type=arguments.commit, help="the main line's ref (default: origin/main, else main)")
    bi.add_argument("--good", type=arguments.commit, help="a pre-fix commit or tag: the fix's range starts there")
    bi.add_argument("--bad", type=arguments.commit, help="a fixed commit or tag: the fix's range ends there")
    bi.add_argument("--every", action="store_true", help="also probe every commit from the fix's start that changes "
                    "the files the probe loads (the registry's loads), and flag each after the fix not fixed")
    bi.add_argument("--json", action="store_true", help="print the report as JSON")
    bi.add_argument("--references", choices=classify.REFERENCES, default="published")
    bi.add_argument("--force", action="store_true", help="probe every commit again, ignoring kept outcomes")
    _allow_uncontained(bi)
    bi.set_defaults(func=commands.bisect.cmd_bisect)

    co = sub.add_parser("corpus", help="check every declared backport (backports/): each release as published, "
                        "with each fix ported, and with each port partial")
    co.add_argument("--release", action="append", type=arguments.version,
                    help="only this release's backport (repeatable)")
    co.add_argument("--references", choices=classify.REFERENCES, default="published",
                    help="judge against the published base and head results (default), or the fresh ones in runs/")
    _allow_uncontained(co)
    co.set_defaults(func=commands.check.cmd_corpus)

    dr = sub.add_parser("drift", help="rerun a release cell on newer torch/transformers; advisory")
    dr.add_argument("experiment", type=arguments.name)
    dr.add_argument("side", choices=registry.SIDES)
    dr.add_argument("--torch", type=arguments.version_or_latest, default=drift.LATEST,
                    help="torch version (default: the newest on PyPI)")
    dr.add_argument("--torchvision", type=arguments.version_or_latest, default=drift.LATEST)
    dr.add_argument("--transformers", type=arguments.version_or_latest,
                    help="also move transformers (a version, or 'latest')")
    _allow_uncontained(dr)
    dr.set_defaults(func=commands.lanes.cmd_drift)

    pub = sub.add_parser("publish", help="the only writer of results/: copy fresh, confirmed results of a kind "
                         "(and sweep/mutation tables) there, write the report, update SHA256SUMS.txt")
    pub.add_argument("--kind", default="release", choices=["release", "git"])
    pub.add_argument("--allow-unconfirmed", action="store_true",
                     help="publish even if the fresh differential is not confirmed (the report says so)")
    pub.set_defaults(func=commands.evidence.cmd_publish)

    mu = sub.add_parser("mutate", help="run the probe under each declared mutant of the fix; name survivors")
    mu.add_argument("experiment", type=arguments.name)
    mu.add_argument("--mutant", action="append", metavar="ID", type=arguments.mutant,
                    help="only this mutant (repeatable; a table of some mutants is not publishable)")
    mu.add_argument("--cold", action="store_true",
                    help="a fresh probe process in the release cell's environment instead of a warm engine child")
    _allow_uncontained(mu)
    mu.set_defaults(func=commands.lanes.cmd_mutate)

    up = sub.add_parser("upstream", help="run the PR's own test files (from the head tree) on one side's tree")
    up.add_argument("experiment", type=arguments.name)
    up.add_argument("side", choices=registry.SIDES)
    up.add_argument("--kind", choices=list(cells.SESSION_OF_KIND), default=None,
                    help="whose tree and environment: git, release or path (default: $PDEVIDENCE_UPSTREAM_KIND, else git)")
    up.add_argument("--tests", type=arguments.directory, metavar="DIR",
                    help=f"an SGLang checkout (or a directory) holding the test files; default ${upstream.TESTS_ENV}, "
                    "else the head commit's tree (SGLANG_REPO or GitHub)")
    up.add_argument("--ref", type=arguments.ref, help="override the side's tree: a version, a commit SHA or a directory")
    _allow_uncontained(up)
    up.set_defaults(func=commands.lanes.cmd_upstream)

    ca = sub.add_parser("cache", help="what pdevidence's caches hold and what each part is for; get the space back")
    verbs = ca.add_subparsers(dest="verb", required=True)
    verbs.add_parser("info", help="where each part lives, its size and last use").add_argument(
        "--json", action="store_true", help="as JSON")
    pr = verbs.add_parser("prune", help="remove what nothing the registry can use, and what is old or over a budget")
    pr.add_argument("--older-than", type=arguments.duration, metavar="DURATION", help="not used for this long: 30d, 12h")
    pr.add_argument("--max-size", type=arguments.size, metavar="SIZE",
                    help="what is cheapest to remake first (exports, unpacked trees, then environments least recently "
                    "used) until this fits: 20G")
    verbs.add_parser("clean", help="remove every entry (what a running run uses stays)")
    ca.set_defaults(func=commands.cache.cmd_cache)
    return p


class _Version(argparse.Action):
    """``--version``: the tool's and its evidence's, for whichever --root comes before it."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(commands.evidence.version_text(getattr(namespace, "root", None) or PROJECT))
        parser.exit()


# The commands that build environments, fetch, unpack or export trees, or keep outcomes: the cache's budget is
# enforced as each ends (lanes/cache.py).
FILLS_CACHE = frozenset({"cell", "sweep", "check", "bisect", "corpus", "drift", "mutate", "upstream"})


def main(argv: list[str] | None = None) -> int:
    """Every command's exit code as docs/operators/exit-codes.md documents it; argparse's own errors (a malformed
    value: the option and the value named) are 2, --help and --version 0."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else USAGE

    def command() -> int:
        settings.check_all()  # a bad setting is one usage error up front, naming the variable
        commands.argument_checks.check_arguments(args)
        paths.bytecode_beside_sources(args.root)
        with debris.run(), sandbox.uncontained_allowed(getattr(args, "allow_uncontained", False)):
            commands.scratch.enter_scratch(args.root)
            grown = caches.growth(args.root)
            code = args.func(args)
            if args.command in FILLS_CACHE:
                commands.cache.keep_within_budget(args.root, grown)
            return code

    children.become_subreaper()  # what a killed child leaves behind is reparented here and reaped
    try:
        with children.stop_on_signals():
            return boundary(command, where=f"`pdevidence {args.command}`")
    except children.Interrupted as exc:
        print(f"{exc}: child processes stopped, no result written by the interrupted cells", file=sys.stderr)
        return exc.exit_code
