"""`check --server-args`: answers that know the configuration, on a synthetic fork.

The fork's ``sglang.srt.server_args`` is a tiny ``ServerArgs`` with ``add_cli_args`` (a required
model path, the PD mode, the decode offload switch); the registry's demo experiment needs decode
mode with offload on. The warm engine runs with this interpreter, as in test_forks.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project, result_doc, write_cell
from test_forks import ERAS, make_fork, quiet_git, world, write_closures  # noqa: F401 - fixtures

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.documents import integrity

NEEDS = """
[experiments.demo.needs]
server_args = { disaggregation_mode = ["decode"], disaggregation_decode_enable_offload_kvcache = [true] }
why = "the offload manager runs only on a decode server with offload on"
"""
# As a release's: a dataclass whose add_cli_args declares each option, and whose __post_init__ refuses what the
# release refuses before its model-independent short circuit (``dummy``), then needs an accelerator (a check
# stands in the cpu) and the model's config (a directory here). ``# derived`` is where a test adds a derivation.
SERVER_ARGS_PY = '''
import argparse
import dataclasses
import os


@dataclasses.dataclass
class ServerArgs:
    model_path: str = None
    device: str = None
    disaggregation_mode: str = "null"
    disaggregation_decode_enable_offload_kvcache: bool = False
    decode_offload_preset: bool = False
    tp_size: int = 1

    def __post_init__(self):
        if self.disaggregation_decode_enable_offload_kvcache and self.disaggregation_mode != "decode":
            raise ValueError("The argument disaggregation-decode-enable-offload-kvcache is only supported for "
                             "decode side.")
        if self.model_path.lower() == "dummy":
            return
        if self.device is None:
            raise RuntimeError("No accelerator (CUDA, XPU, NPU) is available.")
        if not os.path.isdir(self.model_path):
            raise OSError(f"no model config at {self.model_path}")
        # derived

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", type=str, required=True)
        parser.add_argument("--device", type=str, default=None)
        parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        parser.add_argument("--disaggregation-mode", type=str, default="null", choices=["null", "prefill", "decode"])
        parser.add_argument("--disaggregation-decode-enable-offload-kvcache", action="store_true")
        parser.add_argument("--decode-offload-preset", action="store_true")
'''
# A preset only the resolution expands: on a decode server it turns the offload on (the parser leaves it off).
PRESET = """        if self.decode_offload_preset and self.disaggregation_mode == "decode":
            self.disaggregation_decode_enable_offload_kvcache = True
"""
DECODE = "--disaggregation-mode decode"
OFFLOAD = f"{DECODE} --disaggregation-decode-enable-offload-kvcache"


def configured_fork(world, needs: str, server_args_py: str) -> Path:
    """An unfixed fork (its door admits a rejected request) whose tree has ``server_args_py``; the registry's demo
    experiment gains ``needs`` and reference cells made by that registry."""
    registry_file = world.root / "experiments.toml"
    registry_file.write_text(registry_file.read_text() + needs)
    for side, version in (("base", "1.0.0"), ("head", "1.1.0")):
        write_cell(world.root / "results", side, result_doc(side, version))
    integrity.regenerate(world.root)
    found = make_fork(world.tmp / "fork", guard=False, tag=None)
    srt = found / "python" / "sglang" / "srt"
    srt.mkdir()
    (srt / "__init__.py").write_text("")
    (srt / "server_args.py").write_text(server_args_py)
    return found


@pytest.fixture
def fork(world):
    """An unfixed fork with a server parser; the demo experiment needs a decode server with offload on."""
    return configured_fork(world, NEEDS, SERVER_ARGS_PY)


def check(world, capsys, *argv: str) -> tuple[int, dict, str]:
    code = cli.main(["--root", str(world.root), "check", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_a_configuration_that_never_enters_the_path_is_not_affected_resting_on_it(world, fork, capsys, tmp_path):
    vex = tmp_path / "vex.json"
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", DECODE, "--openvex", str(vex))
    assert code == errors.CONFIRMED
    [answer] = doc["experiments"]
    assert answer["status"] == "not affected"
    assert answer["justification"] == "vulnerable_code_not_in_execute_path"
    assert answer["rests_on"] == "configuration"
    assert answer["configuration"]["enters_path"] is False
    assert answer["configuration"]["code_status"] == "affected"  # the code alone still lacks the fix
    assert answer["configuration"]["unmet"] == {"disaggregation_decode_enable_offload_kvcache": False}
    assert "server configuration given (--server-args)" in answer["evidence"][0]
    assert doc["configuration"]["values"] == {"disaggregation_mode": "decode",
                                              "disaggregation_decode_enable_offload_kvcache": False}
    assert (doc["configuration"]["args"], doc["configuration"]["unestablished"]) == (DECODE.split(), {})
    # No model path given: the tree's resolution stops, and its code derives neither attribute.
    assert doc["configuration"]["resolution"]["completed"] is False
    assert doc["configuration"]["resolution"]["derived"] == []
    assert problems("check", doc) == []
    [statement] = json.loads(vex.read_text())["statements"]
    assert statement["status"] == "not_affected"
    assert statement["justification"] == "vulnerable_code_not_in_execute_path"
    assert "server configuration given" in statement["impact_statement"]
    assert "rests on the server configuration given (--server-args: --disaggregation-mode decode)" in \
        statement["status_notes"] and "its code alone: affected" in statement["status_notes"]
    assert problems("openvex-0.2.0", json.loads(vex.read_text())) == []
    cli.main(["--root", str(world.root), "check", "--path", str(fork), "--server-args", DECODE])
    table = capsys.readouterr().out
    assert "server configuration: --disaggregation-mode decode; this tree reads" in table
    assert "not in the execute path of the configuration given" in table and "its code alone: affected" in table


def test_a_configuration_that_enters_the_path_gets_the_codes_answer(world, fork, capsys):
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", OFFLOAD)
    assert code == errors.BEHAVIOUR_DIFFERS
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", True)
    assert problems("check", doc) == []
    # Without server arguments the answer is about the code, as it always was: no configuration in it.
    code, doc, _ = check(world, capsys, "--path", str(fork))
    assert code == errors.BEHAVIOUR_DIFFERS and "configuration" not in doc and "rests_on" not in doc["experiments"][0]


def test_the_launch_command_in_a_file_is_read_past_its_program(world, fork, capsys, tmp_path):
    launch = tmp_path / "decode.sh"
    launch.write_text("# the decode server\nCUDA_VISIBLE_DEVICES=0 python3 -m sglang.launch_server \\\n"
                      "    --model-path /models/x --tp-size 2 \\\n    --disaggregation-mode decode \\\n"
                      "    --disaggregation-decode-enable-offload-kvcache\n")
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args-file", str(launch))
    assert code == errors.BEHAVIOUR_DIFFERS and doc["experiments"][0]["status"] == "affected"
    assert doc["configuration"]["args"] == ["--model-path", "/models/x", "--tp-size", "2", "--disaggregation-mode",
                                            "decode", "--disaggregation-decode-enable-offload-kvcache"]
    assert doc["configuration"]["source"] == str(launch)
    launch.write_text("sglang serve --model-path /models/x --disaggregation-mode decode\n")
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args-file", str(launch))
    assert code == errors.CONFIRMED and doc["experiments"][0]["rests_on"] == "configuration"


def test_an_option_the_trees_parser_does_not_define_is_a_usage_error_naming_it(world, fork, capsys):
    code, _, err = check(world, capsys, "--path", str(fork), "--server-args", f"{DECODE} --no-such-option 3")
    assert code == errors.USAGE
    assert "--no-such-option" in err and "unrecognized arguments" in err
    code, _, err = check(world, capsys, "--path", str(fork), "--server-args", "--disaggregation-mode sideways")
    assert code == errors.USAGE and "--disaggregation-mode: argument --disaggregation-mode: invalid choice" in err


@pytest.mark.parametrize("argv", [
    ["--server-args", '--model-path "/models/x'],  # a quote left open
    ["--server-args", "decode"],  # no option at all
])
def test_a_malformed_server_argument_string_is_a_usage_error_before_anything_runs(world, fork, capsys, argv):
    code, _, err = check(world, capsys, "--path", str(fork), *argv)
    assert code == errors.USAGE and "--server-args" in err
    assert not (world.tmp / "runs" / "check").exists()  # refused before any probe ran


def test_a_file_without_one_launch_command_is_a_usage_error(world, fork, capsys, tmp_path):
    launch = tmp_path / "both.sh"
    launch.write_text("python -m sglang.launch_server --disaggregation-mode prefill &\n"
                      "python -m sglang.launch_server --disaggregation-mode decode\n")
    code, _, err = check(world, capsys, "--path", str(fork), "--server-args-file", str(launch))
    assert code == errors.USAGE and "2 SGLang launch commands" in err
    launch.write_text("echo hello\n")
    code, _, err = check(world, capsys, "--path", str(fork), "--server-args-file", str(launch))
    assert code == errors.USAGE and "no SGLang launch command" in err


def test_a_tree_whose_parser_lacks_an_option_the_path_needs_is_answered_about_the_code(world, fork, capsys):
    server_args = fork / "python" / "sglang" / "srt" / "server_args.py"
    server_args.write_text(server_args.read_text().replace(
        '        parser.add_argument("--disaggregation-decode-enable-offload-kvcache", action="store_true")\n', ""))
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", DECODE)
    assert code == errors.BEHAVIOUR_DIFFERS
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"]) == ("affected", "code")
    assert answer["configuration"]["enters_path"] is None
    assert answer["configuration"]["undefined"] == ["disaggregation_decode_enable_offload_kvcache"]


@pytest.mark.parametrize(("needs", "message"), [
    ('server_args = { disaggregation_mode = [] }\nwhy = "x"', "non-empty array"),
    ('server_args = { disaggregation_mode = ["decode"] }\nwhy = "x"\nwhen = "y"', "unknown key"),
    ('server_args = {}\nwhy = "x"', "names no attribute"),
    ('server_args = { "Disaggregation-Mode" = ["decode"] }\nwhy = "x"', "not a ServerArgs attribute name"),
    ('server_args = { disaggregation_mode = ["decode"] }', "missing key 'why'"),
    ('server_args = { disaggregation_mode = ["decode"] }\nexcludes = { grammar_backend = [] }\nwhy = "x"',
     "values that keep off"),
    ('server_args = { disaggregation_mode = ["decode"] }\nexcludes = { "Grammar" = ["none"] }\nwhy = "x"',
     "not a ServerArgs attribute name"),
])
def test_the_registrys_needs_are_strictly_validated(tmp_path, needs, message):
    root = make_project(tmp_path, REGISTRY + f"\n[experiments.demo.needs]\n{needs}\n")
    with pytest.raises(errors.HarnessError, match=message):
        registry.load(root)


def test_the_server_arguments_are_part_of_what_an_outcome_is_kept_by(world, fork, capsys):
    assert check(world, capsys, "--path", str(fork), "--server-args", DECODE)[0] == errors.CONFIRMED
    assert check(world, capsys, "--path", str(fork), "--server-args", OFFLOAD)[0] == errors.BEHAVIOUR_DIFFERS
    code, _, err = check(world, capsys, "--path", str(fork), "--server-args", DECODE)
    assert code == errors.CONFIRMED and "outcomes reused" in err
    kept = sorted(Path(p).name for p in (world.tmp / "work" / "outcomes").glob("*/config.json"))
    assert kept == ["config.json", "config.json"]


# --- the tree's own resolution: what __post_init__ derives, refuses, and what cannot be established here --------


def _edit_server_args(fork: Path, old: str, new: str) -> None:
    path = fork / "python" / "sglang" / "srt" / "server_args.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_value_only_the_trees_resolution_turns_on_is_judged_as_the_server_runs_it(world, fork, capsys):
    _edit_server_args(fork, "        # derived\n", PRESET)
    model = fork / "python" / "model"  # beside the package: the probe process sees it
    model.mkdir()  # the model's config is here: the resolution runs through (the cpu standing in for the device)
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args",
                         f"--model-path {model} {DECODE} --decode-offload-preset")
    [answer] = doc["experiments"]
    # The parser leaves the offload off; the server the preset starts has it on, so it enters the path.
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", True)
    assert doc["configuration"]["values"]["disaggregation_decode_enable_offload_kvcache"] is True
    assert doc["configuration"]["resolution"] == {"stand_ins": {"device": "cpu"}, "completed": True, "stopped": None}
    assert code == errors.BEHAVIOUR_DIFFERS and problems("check", doc) == []


def test_a_value_the_trees_resolution_may_derive_but_cannot_resolve_here_never_decides(world, fork, capsys):
    _edit_server_args(fork, "        # derived\n", PRESET)
    # No model config here: the resolution stops before the preset; its code derives the offload switch.
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args",
                         f"--model-path /models/absent {DECODE} --decode-offload-preset")
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", None)
    why = answer["configuration"]["unestablished"]["disaggregation_decode_enable_offload_kvcache"]
    assert "derives it and stopped here (OSError" in why and "no model config" in why
    assert doc["configuration"]["resolution"]["derived"] == ["disaggregation_decode_enable_offload_kvcache"]
    assert "disaggregation_decode_enable_offload_kvcache" not in doc["configuration"]["values"]
    assert code == errors.BEHAVIOUR_DIFFERS and problems("check", doc) == []
    cli.main(["--root", str(world.root), "check", "--path", str(fork), "--server-args", DECODE])
    assert "the configuration given cannot tell: disaggregation_decode_enable_offload_kvcache has no established " \
        "value" in capsys.readouterr().out


def test_a_configuration_the_trees_resolution_refuses_is_a_usage_error_naming_it(world, fork, capsys):
    # The parser takes the offload switch on a prefill server; the tree's own resolution refuses it.
    code, _, err = check(world, capsys, "--path", str(fork), "--server-args",
                         "--model-path /models/m --disaggregation-mode prefill "
                         "--disaggregation-decode-enable-offload-kvcache")
    assert code == errors.USAGE
    assert "--disaggregation-decode-enable-offload-kvcache: this tree's ServerArgs refuses the configuration: " \
        "ValueError: The argument disaggregation-decode-enable-offload-kvcache is only supported" in err


ENUM_MODE = '''
import enum


class DisaggregationMode(enum.Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class Opaque:  # an object the tree compares itself, not plain data
    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return self.text == getattr(other, "text", other)
'''


def test_an_enum_value_is_compared_by_its_value(world, fork, capsys):
    _edit_server_args(fork, "import os\n", "import os\n" + ENUM_MODE)
    _edit_server_args(fork, 'type=str, default="null", choices=["null", "prefill", "decode"]',
                      "type=DisaggregationMode, default=DisaggregationMode.NULL")
    _edit_server_args(fork, 'self.disaggregation_mode != "decode"', 'self.disaggregation_mode.value != "decode"')
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", OFFLOAD)
    [answer] = doc["experiments"]
    assert (answer["status"], answer["configuration"]["enters_path"]) == ("affected", True)
    assert doc["configuration"]["values"]["disaggregation_mode"] == "decode"
    assert code == errors.BEHAVIOUR_DIFFERS and problems("check", doc) == []


def test_a_value_that_is_not_plain_data_never_decides(world, fork, capsys):
    _edit_server_args(fork, "import os\n", "import os\n" + ENUM_MODE)
    _edit_server_args(fork, 'type=str, default="null", choices=["null", "prefill", "decode"]', "type=Opaque")
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", OFFLOAD)
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", None)
    assert "its value is a Opaque" in answer["configuration"]["unestablished"]["disaggregation_mode"]
    # An established value off the path still decides: the offload switch is off.
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", DECODE)
    assert (doc["experiments"][0]["status"], code) == ("not affected", errors.CONFIRMED)


def test_a_tree_that_cannot_run_is_not_affected_only_where_the_configuration_alone_decides(world, fork, capsys):
    (fork / "python" / "sglang" / "__init__.py").write_text("GUARD = False\n")  # prepare() finds no __version__
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", DECODE)
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], code) == ("not affected", "configuration", errors.CONFIRMED)
    assert answer["configuration"]["code_status"] == "cannot run"
    assert "its code was not observed (its probe could not run: AttributeError" in answer["evidence"][0]
    assert problems("check", doc) == []
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", OFFLOAD)  # it enters the path
    assert (doc["experiments"][0]["status"], code) == ("cannot run", errors.ENVIRONMENT)


def test_a_tree_whose_parser_cannot_be_built_establishes_nothing_and_its_answers_stay_cannot_run(world, fork, capsys):
    (fork / "python" / "sglang" / "__init__.py").write_text("raise ImportError('a kernel this machine lacks')\n")
    code, doc, _ = check(world, capsys, "--path", str(fork), "--server-args", DECODE)
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], code) == ("cannot run", "code", errors.ENVIRONMENT)
    assert answer["configuration"]["enters_path"] is None
    assert "this tree's parser cannot be built here (ImportError: a kernel this machine lacks)" in \
        doc["configuration"]["unestablished"]["disaggregation_mode"]
    assert doc["configuration"]["values"] == {} and problems("check", doc) == []


EXCLUDES = """
[experiments.demo.needs]
server_args = { disaggregation_mode = ["decode"] }
excludes = { grammar_backend = ["none"] }
why = "a grammar judges a token only with a grammar backend"
"""
# As a release's: a grammar backend whose resolution fills in the default when none is given.
GRAMMAR_ARGS_PY = SERVER_ARGS_PY.replace(
    "    tp_size: int = 1\n", "    tp_size: int = 1\n    grammar_backend: str = None\n").replace(
    '        parser.add_argument("--decode-offload-preset", action="store_true")\n',
    '        parser.add_argument("--decode-offload-preset", action="store_true")\n'
    '        parser.add_argument("--grammar-backend", type=str, default=None)\n')


@pytest.mark.parametrize(("backend", "status", "enters"), [
    ("none", "not affected", False),  # the one value that keeps the path off
    ("xgrammar", "affected", True),
    ("a-plugin-backend", "affected", True),  # any other value enters: a plugin may register more backends
])
def test_a_value_the_needs_exclude_keeps_the_path_off_and_any_other_enters(world, capsys, backend, status, enters):
    found = configured_fork(world, EXCLUDES, GRAMMAR_ARGS_PY)
    _, doc, _ = check(world, capsys, "--path", str(found), "--server-args", f"{DECODE} --grammar-backend {backend}")
    [answer] = doc["experiments"]
    assert (answer["status"], answer["configuration"]["enters_path"]) == (status, enters)
    assert answer["configuration"]["needs"] == {"disaggregation_mode": ["decode"], "grammar_backend": ["not", "none"]}
    if not enters:
        assert answer["configuration"]["unmet"] == {"grammar_backend": "none"}
        assert 'grammar_backend = "none" (the path needs any but "none")' in answer["evidence"][0]
    assert problems("check", doc) == []


def test_an_answer_about_a_configuration_says_what_it_assumed_where_no_argument_says_it():
    from pdevidence.documents.vocabulary import CheckStatus
    from pdevidence.lanes.check import ConfigAnswer

    needs = {"page_size": ["> 1"]}
    enters = ConfigAnswer(True, needs, {}, [], CheckStatus.FIXED, "paged SWA", assumes="the model has SWA layers")
    unknown = ConfigAnswer(None, needs, {}, [], CheckStatus.FIXED, "paged SWA", {"page_size": "derived"},
                           assumes="the model has SWA layers")
    off = ConfigAnswer(False, needs, {"page_size": 1}, [], CheckStatus.FIXED, "paged SWA",
                       assumes="the model has SWA layers")
    assert enters.describe().endswith("; assumed, as no server argument says it: the model has SWA layers")
    assert "assumed, as no server argument says it" in unknown.describe()
    assert "assumed" not in off.describe()  # off the path: nothing rests on the model
    assert enters.to_json()["assumes"] == "the model has SWA layers"
    assert "assumes" not in ConfigAnswer(True, needs, {}, [], CheckStatus.FIXED, "x").to_json()
