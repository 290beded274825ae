"""What argparse alone cannot check, checked before any command runs."""

from __future__ import annotations

import argparse

from .. import registry
from ..core import arguments, paths, settings
from ..core.errors import HarnessError, usage
from ..lanes import sweep_parts
from ..sources import backports


# Commands that write the project's own files (published evidence, sums, locks): never an installed copy's.
WRITES_PROJECT = ("publish", "checksums", "lock-cpu", "lock-trees")
# Options (or positionals) whose value the registry must know, by the attribute argparse stores them in.
EXPERIMENT_OPTIONS = {"cell": "experiment", "drift": "experiment", "mutate": "experiment", "upstream": "experiment",
                      "sweep": "--experiment", "sweep-merge": "--experiment", "bisect": "experiment"}


def _unknown(option: str, value: str, known: list[str], what: str) -> HarnessError:
    return usage(f"{option} {value!r} is not {what}", expected=f"one of: {', '.join(known) or '(none declared)'}")


def check_arguments(args) -> None:
    """What argparse alone cannot check, checked before anything runs: names the registry must know, a --ref
    that fits its tree kind, a commit a clone must resolve; and an installed copy's files stay as installed."""
    if args.command in WRITES_PROJECT and paths.bundled(args.root):
        raise usage(f"`pdevidence {args.command}` writes the project's files, and {args.root} is the copy an "
                    "installed pdevidence carries", todo="run it in a checkout of pdevidence (or pass --root <checkout>)")
    option = EXPERIMENT_OPTIONS.get(args.command)
    reg = registry.load(args.root) if option or args.command == "sweep" else None
    names = getattr(args, "experiment", None)
    for value in ([names] if isinstance(names, str) else names or []):
        if value not in reg.experiments:
            raise _unknown(option, value, sorted(reg.experiments), "an experiment of the registry")
    if getattr(args, "era", None) and args.era not in sweep_parts.era_names(reg):
        raise _unknown("--era", args.era, sweep_parts.era_names(reg), "an era of the registry")
    for value in getattr(args, "mutant", None) or []:
        known = sorted(reg.experiment(args.experiment).mutants)
        if value not in known:
            raise _unknown("--mutant", value, known, f"a mutant of {args.experiment}")
    if getattr(args, "ref", None):
        kind = args.kind or settings.get("PDEVIDENCE_UPSTREAM_KIND")
        fits = {"release": arguments.version, "git": arguments.commit, "path": arguments.directory}[kind]
        try:
            fits(args.ref)
        except argparse.ArgumentTypeError as exc:
            raise usage(f"--ref: {exc} (a {kind} tree)") from None
        if kind == "git":
            _resolvable("--ref", args.ref)
    for sha in getattr(args, "git", None) or []:
        _resolvable("--git", sha)
    if args.command == "bisect" and args.repo is None:
        for option in ("main", "good", "bad"):
            if getattr(args, option):
                _resolvable(f"--{option}", getattr(args, option))
    if args.command == "corpus":
        declared = sorted(path.name.removeprefix(backports.FILE_PREFIX).removesuffix(".toml")
                          for path in backports.files(args.root))
        for release in args.release or []:
            if release not in declared:
                raise _unknown("--release", release, declared, "a release with a declared backport")


def _resolvable(option: str, ref: str) -> None:
    """A commit other than by its full SHA needs a clone to resolve it."""
    if not arguments.full_sha(ref) and not settings.get("SGLANG_REPO"):
        raise usage(f"{option} {ref!r} is not a full 40-hex commit SHA and there is no clone to resolve it",
                    todo="pass the full SHA, or set SGLANG_REPO=<clone> so the ref can be resolved")


# What code that names its own temporaries leaves when killed, in each scratch directory: an atomic write's and
