"""Bad input is a usage error: every option of every command (and every setting), given a malformed value, exits 2
naming the option and the value, before anything is fetched or run; never 7, never a traceback.

Property-based (Hypothesis): for each option, values drawn from what it must refuse. The commands themselves,
every child process and every download are replaced by tripwires: a malformed value that got as far as one of
them would end in an internal error (7), and fail the property.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import urllib.request
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

from pdevidence import cli, commands, registry
from pdevidence.commands import argument_checks
from pdevidence.core import arguments, children, errors, faults
from pdevidence.core import settings as harness_settings
from pdevidence.core.paths import PROJECT
from pdevidence.lanes import sweep_parts

REG = registry.load(PROJECT)
EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Each command with every argument well-formed, positionals apart (given after `--`, so a value may start with -).
BASE = {
    "cell": (["cell"], {"kind": "release", "experiment": "admission", "side": "base"}),
    "matrix": (["matrix"], {}), "compare": (["compare"], {}), "verify": (["verify"], {}),
    "checksums": (["checksums"], {}), "lock-cpu": (["lock-cpu"], {}), "lock-trees": (["lock-trees"], {}),
    "sweep": (["sweep"], {}), "sweep-merge": (["sweep-merge"], {}),
    "check": (["check", "--release", "0.5.21"], {}),
    "drift": (["drift"], {"experiment": "admission", "side": "base"}),
    "publish": (["publish"], {}),
    "mutate": (["mutate"], {"experiment": "admission"}),
    "upstream": (["upstream"], {"experiment": "admission", "side": "base"}),
    "corpus": (["corpus"], {}),
    "cache": (["cache", "info"], {}),  # its verbs and their options: tests/test_cache.py
    "bisect": (["bisect"], {"experiment": "offload_slots"}),
}
# Hostile values any option may meet in an operator's script.
HOSTILE = ["0.5.21; rm -rf /", "", " ", "$(id)", "`id`", "a\nb", "../../etc/passwd", "-", "--", "\x00", "☃",
           "0.5.21 ", "x" * 300, "*", "a b"]
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
ENV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


def _version(value: str) -> bool:
    try:
        Version(value)
    except InvalidVersion:
        return False
    return value == value.strip()


def not_in(known) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE), TEXT).filter(lambda v: v not in known)


def not_version(*also: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE), TEXT).filter(lambda v: not _version(v) and v not in also)


def not_positive_int() -> st.SearchStrategy[str]:
    def bad(v: str) -> bool:
        try:
            return int(v) < 1
        except ValueError:
            return True
    return st.one_of(st.integers(max_value=0).map(str), st.sampled_from(HOSTILE), TEXT).filter(bad)


def not_commit() -> st.SearchStrategy[str]:
    """Never a commit: what git's ref rules refuse, a SHA of the wrong length or alphabet, or a ref with no clone
    to resolve it (SGLANG_REPO is unset here)."""
    refused = st.one_of(st.sampled_from(HOSTILE),
                        TEXT.filter(lambda v: not v or v[0] == "-" or ".." in v or any(c in v for c in " ;$`|&<>\n\t'\"*?[]\\:")),
                        st.from_regex(r"[0-9a-f]{41,50}|[g-z]{40}", fullmatch=True))
    return st.one_of(refused, st.from_regex(r"[a-z][a-z0-9]{0,11}", fullmatch=True))


def missing(ground: Path) -> st.SearchStrategy[str]:
    names = st.text(st.characters(whitelist_categories=("Ll", "Nd")), min_size=1, max_size=12)
    return st.one_of(st.sampled_from(HOSTILE), names.map(lambda n: str(ground / "missing" / n)))


def paths(ground: Path, *kinds: str) -> st.SearchStrategy[str]:
    """Paths that are not what an option wants: missing ones, and the ground's ``kinds`` of existing things."""
    return st.one_of(missing(ground), st.sampled_from([str(ground / kind) for kind in kinds]))


@pytest.fixture(scope="module")
def ground(tmp_path_factory):
    """Things a path may wrongly name, and an empty working directory (a relative value names nothing)."""
    top = tmp_path_factory.mktemp("ground")
    (top / "a-directory").mkdir()
    (top / "a-file").write_text("not what you asked for\n")
    (top / "an-executable").write_text("#!/bin/sh\nexit 0\n")
    (top / "an-executable").chmod(0o755)
    (top / "sglang-0.5.21-py3-none-any.whl").write_bytes(b"not a zip")
    (top / "sglang-0.5.21-py3-none-any.whl.d").mkdir()
    (top / "not-a-wheel.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    (top / "cwd").mkdir()
    here = os.getcwd()
    os.chdir(top / "cwd")
    yield top
    os.chdir(here)


def malformed(ground: Path) -> dict[str, st.SearchStrategy[str]]:
    """Per option (``<command> <option or positional>``, ``--root`` for the top level), what it must refuse.
    Options with choices are refused any other value (``choices`` below)."""
    experiments = list(REG.experiments)
    return {
        "--root": st.one_of(paths(ground, "a-file", "a-directory", "cwd"), st.just(str(PROJECT / "probes"))),
        "cell experiment": not_in(experiments), "cell --ref": not_version(),
        "matrix --jobs": not_positive_int(),
        "lock-trees versions": not_version(), "sweep versions": not_version(),
        "sweep --experiment": not_in(experiments), "sweep --jobs": not_positive_int(),
        "sweep --era": not_in(sweep_parts.era_names(REG)), "sweep-merge --experiment": not_in(experiments),
        "check --python": paths(ground, "a-directory", "a-file"),
        "check --release": not_version(), "check --version": not_version(),
        "check --wheel": paths(ground, "a-directory", "a-file", "sglang-0.5.21-py3-none-any.whl",
                               "sglang-0.5.21-py3-none-any.whl.d", "not-a-wheel.zip"),
        "check --path": paths(ground, "a-file", "an-executable"),
        "check --git": not_commit(),
        # A string that does not split as a shell line, or whose first word is no option.
        "check --server-args": st.one_of(st.sampled_from(['"', "'x", "decode", "a b", "x --y", '--a "b']),
                                         TEXT).filter(lambda v: not arguments._accepts(arguments.server_args, v)),
        "check --server-args-file": paths(ground, "a-directory", "a-file"),
        # A name no shell takes (a bare NAME is docker's: its value from here); a file holding one, or none.
        "check --server-env": st.one_of(st.sampled_from(["1X=y", "=v", "A B=c", "export X=1", "X-Y"]),
                                        TEXT).filter(lambda v: not arguments._accepts(arguments.server_env, v)),
        "check --server-env-file": paths(ground, "a-directory", "a-file"),
        "check --server-platform": not_in(list(arguments.SERVER_PLATFORMS)),
        "check --image": paths(ground, "a-directory", "a-file", "an-executable", "not-a-wheel.zip"),
        "check --openvex": st.one_of(st.sampled_from(["", str(ground / "a-directory"), str(ground / "a-file" / "x.json"),
                                                      str(ground / "x") + os.sep, "x" * 300]),
                                     missing(ground).map(lambda p: str(ground / "a-file") + "/" + Path(p).name)),
        "drift experiment": not_in(experiments), "drift --torch": not_version("latest"),
        "drift --torchvision": not_version("latest"), "drift --transformers": not_version("latest"),
        "mutate experiment": not_in(experiments), "mutate --mutant": not_in(list(REG.experiment("admission").mutants)),
        "upstream experiment": not_in(experiments), "upstream --tests": paths(ground, "a-file"),
        "upstream --ref": not_commit(),
        "bisect experiment": not_in(experiments), "bisect --repo": paths(ground, "a-file"),
        "bisect --main": not_commit(), "bisect --good": not_commit(), "bisect --bad": not_commit(),
        "corpus --release": not_in(sorted(p.name.removeprefix("sglang-").removesuffix(".toml")
                                          for p in (PROJECT / "backports").glob("sglang-*.toml"))),
    }


def options() -> dict[str, argparse.Action]:
    """Every option and positional of every command that takes a value, by ``<command> <name>``."""
    parser = cli.parser()
    found = {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.nargs != 0
             and a.dest not in ("help", "command")}
    for command, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.nargs == 0 or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue  # a command's verbs (`cache info`) and their options: the command's own tests
            found[f"{command} {action.option_strings[0] if action.option_strings else action.dest}"] = action
    return found


def argv_with(key: str, value: str) -> list[str]:
    if key == "--root":
        return [f"--root={value}", "verify"]
    command, name = key.split(" ", 1)
    head, positionals = BASE[command]
    positionals = dict(positionals)
    if name.startswith("-"):
        head = [*head, f"{name}={value}"]
    elif name == "versions":
        positionals["versions"] = value
    else:
        positionals[name] = value
    return [*head, "--", *positionals.values()] if positionals else head


def _reached(*args, **kw):
    raise AssertionError("a malformed value got past the checks into the command, a child process or a download")


@pytest.fixture
def tripwires():
    """Every command, child process and download, replaced by what fails the property when reached."""
    verbs = [getattr(commands, name) for name in commands.__all__]
    trip = [mock.patch.object(module, name, _reached) for module in verbs for name in dir(module)
            if name.startswith("cmd_")]
    trip += [mock.patch.object(children, "popen", _reached), mock.patch.object(urllib.request, "urlopen", _reached)]
    with contextlib.ExitStack() as stack:
        for patch in trip:
            stack.enter_context(patch)
        yield


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    err = io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def test_every_option_of_every_command_is_covered_by_the_property(ground):
    """A new option must say what it refuses: it is either a choice or has malformed values below."""
    table = malformed(ground)
    uncovered = [key for key, action in options().items() if not action.choices and key not in table]
    assert not uncovered, f"options without malformed values in this test: {uncovered}"
    assert not set(table) - set(options()), "malformed values for options that do not exist"
    assert set(BASE) == set(cli.parser()._subparsers._group_actions[0].choices)


@pytest.mark.parametrize("key", sorted(options()))
def test_a_malformed_value_of_any_option_is_a_usage_error_naming_the_option_and_the_value(key, ground, tripwires):
    action = options()[key]
    strategy = not_in(list(action.choices)) if action.choices else malformed(ground)[key]
    name = action.option_strings[0] if action.option_strings else action.dest

    @EXAMPLES
    @given(strategy)
    def prop(value: str) -> None:
        code, err = run(argv_with(key, value), env={"SGLANG_REPO": ""})
        assert code == errors.USAGE, err
        assert "Traceback" not in err and "internal error" not in err, err
        assert name in err and repr(value) in err, err

    prop()


def _exists(value: str) -> bool:
    try:
        return Path(value).exists()
    except OSError:  # a name too long: nothing there
        return False


def malformed_settings(ground: Path) -> dict[str, st.SearchStrategy[str]]:
    def no(known):
        return ENV_TEXT.filter(lambda v: v and v not in known)

    def seconds(v: str) -> bool:
        try:
            number = float(v)
        except ValueError:
            return True
        return not (number > 0 and number != float("inf"))

    directory_refused = st.sampled_from([str(ground / "a-file"), str(ground / "a-file" / "below"), "x" * 300])
    missing_directory = st.one_of(st.sampled_from([str(ground / "a-file"), "x" * 300]),
                                  missing(ground).filter(lambda v: v and "\x00" not in v and not _exists(v)))
    program = st.one_of(st.sampled_from([str(ground / "a-file"), str(ground / "a-directory"),
                                         "no-such-program-anywhere"]),
                        missing(ground).filter(lambda v: v and "\x00" not in v and os.sep in v))
    return {
        "PDEVIDENCE_PROBE_TIMEOUT": ENV_TEXT.filter(lambda v: v and seconds(v)),
        "PDEVIDENCE_LOCK_TIMEOUT": ENV_TEXT.filter(lambda v: v and seconds(v)),
        "PDEVIDENCE_DOWNLOAD_BACKOFF": ENV_TEXT.filter(lambda v: v and seconds(v)),
        "PDEVIDENCE_DOWNLOAD_TRIES": ENV_TEXT.filter(lambda v: v and not _positive(re.fullmatch(r"([0-9]+)", v))),
        "PDEVIDENCE_FAULT": no(faults.POINTS),
        "PDEVIDENCE_TORCH": no(harness_settings.TORCH_CHANNELS),
        "PDEVIDENCE_UPSTREAM_KIND": no(harness_settings.TREE_KINDS),
        "PDEVIDENCE_INDEX_URL": ENV_TEXT.filter(lambda v: v and not v.startswith(("http:", "https:", "file:"))),
        "PDEVIDENCE_GIT_ARCHIVE_URL": ENV_TEXT.filter(lambda v: v and "{sha}" not in v),
        "PDEVIDENCE_CACHE": directory_refused, "PDEVIDENCE_WORK": directory_refused,
        "PDEVIDENCE_RUNS": directory_refused,
        "PDEVIDENCE_PYTHON": program, "UV": program,
        "PDEVIDENCE_UPSTREAM_TESTS": missing_directory, "SGLANG_REPO": missing_directory,
        "SGLANG_TREE": missing_directory,
        "PDEVIDENCE_SANDBOX": no(harness_settings.SANDBOX_TOOLS),
        "PDEVIDENCE_PROBE_MEMORY": ENV_TEXT.filter(lambda v: v and not _positive(re.fullmatch(r"([0-9]+)[KMGTkmgt]?", v))),
        "PDEVIDENCE_PROBE_PROCESSES": ENV_TEXT.filter(lambda v: v and not _positive(re.fullmatch(r"([0-9]+)", v))),
        **{name: ENV_TEXT.filter(lambda v: v and not _positive(re.fullmatch(r"([0-9]+)[KMGTkmgt]?", v)))
           for name in ("PDEVIDENCE_ARCHIVE_FILE_BYTES", "PDEVIDENCE_ARCHIVE_BYTES",
                        "PDEVIDENCE_IMAGE_TAR_BYTES")},
        "PDEVIDENCE_CACHE_BUDGET": ENV_TEXT.filter(
            lambda v: v and v != "off" and not _positive(re.fullmatch(r"([0-9]+)[KMGTkmgt]?", v))),
        "PDEVIDENCE_ARCHIVE_MEMBERS": ENV_TEXT.filter(lambda v: v and not _positive(re.fullmatch(r"([0-9]+)", v))),
        "PDEVIDENCE_PROBE_PASS_ENV": ENV_TEXT.filter(
            lambda v: v and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*", v)),
    }


def _positive(found: re.Match | None) -> bool:
    """A number the pattern matched, and above zero."""
    return bool(found) and int(found[1]) > 0


def test_every_setting_is_covered_by_the_property(ground):
    assert set(malformed_settings(ground)) == set(harness_settings.SETTINGS)


@pytest.mark.parametrize("name", sorted(harness_settings.SETTINGS))
def test_a_malformed_setting_is_a_usage_error_naming_the_variable_and_the_value(name, ground, tripwires):
    @EXAMPLES
    @given(malformed_settings(ground)[name])
    def prop(value: str) -> None:
        code, err = run(["check", "--version", "0.5.21"], env={name: value})
        assert code == errors.USAGE, err
        assert "Traceback" not in err and f"{name}={value!r}" in err, err

    prop()


def test_the_issues_version_is_a_usage_error_not_an_internal_one(tripwires):
    code, err = run(["check", "--version", "0.5.21; rm -rf /"], env={})
    assert code == errors.USAGE and "Traceback" not in err
    assert "argument --version: '0.5.21; rm -rf /' is not a release version (PEP 440)" in err


def test_a_relative_root_is_made_absolute_as_cells_run_probes_from_other_directories(monkeypatch):
    monkeypatch.chdir(PROJECT / "probes")
    assert cli.parser().parse_args(["--root", "..", "verify"]).root == PROJECT.resolve()


def test_a_release_is_check_release_and_the_older_check_version_still_names_one():
    for spelling in ("--release", "--version"):
        assert cli.parser().parse_args(["check", spelling, "0.5.20"]).release == ["0.5.20"]


def test_version_means_one_thing_in_the_help_the_tools_own_version():
    """`pdevidence --version` is the tool's version; a release is `check --release`: only one is shown as --version."""
    check_help = cli.parser()._subparsers._group_actions[0].choices["check"].format_help()
    assert "--release" in check_help and "--version" not in check_help
    code, out = 0, io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--version"])
    assert code == 0 and out.getvalue().startswith("pdevidence ")


def test_the_tripwires_replace_every_commands_body(tripwires):
    """The property below is only as good as this: every verb the parser dispatches to trips."""
    for verb, sub in cli.parser()._subparsers._group_actions[0].choices.items():
        with pytest.raises(AssertionError, match="got past the checks"):
            sub.get_default("func")(None)


@pytest.mark.parametrize("era", sweep_parts.era_names(REG))
def test_every_era_of_the_registry_is_a_valid_era_option(era):
    """The CI fan-out runs `sweep --era <era>` for each era: their names hold . and - (torch2.9-tf5)."""
    args = cli.parser().parse_args(["sweep", "--era", era])
    argument_checks.check_arguments(args)
    assert args.era == era
