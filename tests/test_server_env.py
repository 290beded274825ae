"""`check --server-env`: a fix behind an environment variable (the registry's gate), on a synthetic fork.

The fork's ``sglang.srt.environ`` is a tiny ``Envs`` shaped as a release's (fields with ``get()`` and ``parse``;
a value ``parse`` refuses warns and falls back to the default); the registry's demo experiment is gated on its
``SGLANG_DEMO_GATE``. The fixed fork answers fixed in its probe (which runs the fix with the gate on), so the
environment decides what the server runs. The warm engine runs with this interpreter, as in test_forks.py.
"""

from __future__ import annotations

import argparse
import json

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project, result_doc, write_cell
from test_forks import ERAS, make_fork, quiet_git, world, write_closures  # noqa: F401 - fixtures

from pdevidence import cli, registry
from pdevidence.core import arguments, errors
from pdevidence.documents import integrity

GATE = "SGLANG_DEMO_GATE"
GATE_TABLE = f"""
[experiments.demo.gate]
variable = "{GATE}"
on = "true"
why = "the door retires rejected requests only on a server whose environment sets it"
"""
ENVIRON_PY = '''
import os
import warnings


class EnvField:
    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name):
        self.name = name

    def get(self):
        value = os.getenv(self.name)
        if value is None:
            return self.default
        try:
            return self.parse(value)
        except ValueError as e:
            warnings.warn(f"Invalid value for {self.name}: {e}, using default")
            return self.default


class EnvBool(EnvField):
    def parse(self, value):
        if value.lower() in ("true", "1", "yes", "y"):
            return True
        if value.lower() in ("false", "0", "no", "n"):
            return False
        raise ValueError(f'"{value}" is not a valid boolean value')


class EnvFloat(EnvField):
    def parse(self, value):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f'"{value}" is not a valid float value')


class Envs:
    SGLANG_DEMO_GATE = EnvBool(False)
    SGLANG_DEMO_TIMEOUT = EnvFloat(30.0)


envs = Envs()
'''
# A variable the tree reads outside its Envs, its own way.
LEGACY_PY = 'import os\n\nKNOB = os.environ.get("SGLANG_LEGACY_KNOB")\n'


def _fork(world, path, *, guard: bool, environ: bool = True):
    found = make_fork(world.tmp / path, guard=guard, tag=None)
    srt = found / "python" / "sglang" / "srt"
    srt.mkdir()
    (srt / "__init__.py").write_text("")
    (srt / "legacy.py").write_text(LEGACY_PY)
    if environ:
        (srt / "environ.py").write_text(ENVIRON_PY)
    return found


def with_gate(world, table: str = GATE_TABLE):
    """The world's registry with the demo's gate ``table`` added; its base and head results made by it."""
    registry_file = world.root / "experiments.toml"
    registry_file.write_text(registry_file.read_text() + table)
    for side, version in (("base", "1.0.0"), ("head", "1.1.0")):
        write_cell(world.root / "results", side, result_doc(side, version))
    integrity.regenerate(world.root)
    return world


@pytest.fixture
def gated(world):
    """The registry's demo gated on SGLANG_DEMO_GATE; its base and head results made by it."""
    return with_gate(world)


@pytest.fixture
def fork(gated):
    """A fork that carries the fix (its door retires a rejected request, observed with the gate on)."""
    return _fork(gated, "fork", guard=True)


def check(world, capsys, *argv: str) -> tuple[int, dict, str]:
    code = cli.main(["--root", str(world.root), "check", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_a_fix_the_default_environment_leaves_off_is_affected_and_says_what_turns_it_on(gated, fork, capsys,
                                                                                         tmp_path, monkeypatch):
    monkeypatch.setenv(GATE, "true")  # the checking shell's own environment is not the server's
    vex = tmp_path / "vex.json"
    code, doc, _ = check(gated, capsys, "--path", str(fork), "--openvex", str(vex))
    assert code == errors.BEHAVIOUR_DIFFERS
    [answer] = doc["experiments"]
    assert answer["status"] == "affected" and answer["deciding"] == []
    assert answer["scenarios"] == {"D1": "fixed"}  # the code, run with the gate on, is fixed
    assert answer["gate"] == {"variable": GATE, "on": "true", "state": "off", "given": False,
                              "assumed_defaults": True, "value": False, "code_status": "fixed",
                              "why": "its default: not given", "gate_why": answer["gate"]["gate_why"]}
    assert doc["environment"] == {"variables": {}, "source": None, "values": {}, "named": [], "undefined": [],
                                  "envs_error": None}
    assert problems("check", doc) == []
    [statement] = json.loads(vex.read_text())["statements"]
    assert statement["status"] == "affected"
    assert statement["action_statement"].startswith(f"Set {GATE}=true in the server's environment")
    assert "no --server-env given: the defaults assumed" in statement["status_notes"]
    assert problems("openvex-0.2.0", json.loads(vex.read_text())) == []
    cli.main(["--root", str(gated.root), "check", "--path", str(fork)])
    table = capsys.readouterr().out
    assert "server environment: none given: every variable at this tree's default" in table
    assert (f"affected     PR #1  gate {GATE} = false, its default (no --server-env given: the defaults assumed): "
            f"off; the fix is present but off: set {GATE}=true in the server's environment to turn it on") in table


def test_the_variable_given_on_turns_the_answer_fixed(gated, fork, capsys):
    code, doc, _ = check(gated, capsys, "--path", str(fork), "--server-env", f"{GATE}=yes")
    assert code == errors.CONFIRMED
    [answer] = doc["experiments"]
    assert (answer["status"], answer["gate"]["state"], answer["gate"]["value"]) == ("fixed", "on", True)
    assert (answer["gate"]["given"], answer["gate"]["assumed_defaults"]) == (True, False)
    assert doc["environment"]["values"] == {GATE: True} and doc["environment"]["source"] == "--server-env"
    assert problems("check", doc) == []
    # Given off, as given: affected, not an assumption.
    code, doc, _ = check(gated, capsys, "--path", str(fork), "--server-env", f"{GATE}=0")
    assert code == errors.BEHAVIOUR_DIFFERS
    assert (doc["experiments"][0]["gate"]["state"], doc["experiments"][0]["gate"]["given"]) == ("off", True)


def test_an_env_file_is_read_as_docker_reads_it_and_the_option_given_wins(gated, fork, capsys, tmp_path, monkeypatch):
    env_file = tmp_path / "decode.env"
    env_file.write_text(f"# the decode server\n\n{GATE}=true\n  SGLANG_DEMO_TIMEOUT\nSGLANG_UNSET_HERE\n")
    monkeypatch.setenv("SGLANG_DEMO_TIMEOUT", "12.5")  # a bare name takes the caller's value
    monkeypatch.delenv("SGLANG_UNSET_HERE", raising=False)  # ... and is left out where the caller has none
    code, doc, _ = check(gated, capsys, "--path", str(fork), "--server-env-file", str(env_file))
    assert code == errors.CONFIRMED
    assert doc["environment"]["variables"] == {GATE: "true", "SGLANG_DEMO_TIMEOUT": "12.5"}
    assert doc["environment"]["values"] == {GATE: True, "SGLANG_DEMO_TIMEOUT": 12.5}
    assert doc["environment"]["source"] == str(env_file)
    code, doc, _ = check(gated, capsys, "--path", str(fork), "--server-env-file", str(env_file),
                         "--server-env", f"{GATE}=false")
    assert code == errors.BEHAVIOUR_DIFFERS and doc["environment"]["values"][GATE] is False
    assert doc["environment"]["source"] == f"{env_file} and --server-env"


@pytest.mark.parametrize("given", [f"{GATE}=maybe", "SGLANG_DEMO_TIMEOUT=soon"])
def test_a_value_the_trees_envs_refuses_is_a_usage_error_naming_the_variable(gated, fork, capsys, given):
    code, doc, err = check(gated, capsys, "--path", str(fork), "--server-env", given)
    assert code == errors.USAGE and doc == {}
    name, value = given.split("=")
    assert f"this tree's Envs refuses {name}={value!r}" in err and f"fix or drop {name}" in err


def test_a_variable_the_tree_names_nowhere_is_a_warning_and_one_read_elsewhere_is_not(gated, fork, capsys):
    code, doc, err = check(gated, capsys, "--path", str(fork), "--server-env", "SGLANG_DEMO_GAET=true",
                           "--server-env", "SGLANG_LEGACY_KNOB=1", "--server-env", f"{GATE}=true")
    assert code == errors.CONFIRMED  # a warning, not a refusal: the gate itself was given right
    assert (doc["environment"]["undefined"], doc["environment"]["named"]) == (["SGLANG_DEMO_GAET"],
                                                                            ["SGLANG_LEGACY_KNOB"])
    assert "WARNING: --server-env SGLANG_DEMO_GAET: this tree defines no such variable" in err
    assert "SGLANG_LEGACY_KNOB" not in err
    cli.main(["--root", str(gated.root), "check", "--path", str(fork), "--server-env", "SGLANG_DEMO_GAET=true"])
    captured = capsys.readouterr()
    assert "WARNING: --server-env SGLANG_DEMO_GAET" in captured.out and "WARNING" in captured.err


def test_a_tree_that_does_not_define_the_variable_answers_by_its_code_alone(gated, capsys):
    ungated = _fork(gated, "ungated", guard=True, environ=False)  # a fix that always runs
    code, doc, _ = check(gated, capsys, "--path", str(ungated))
    assert code == errors.CONFIRMED
    assert (doc["experiments"][0]["status"], doc["experiments"][0]["gate"]["state"]) == ("fixed", "undefined")
    unfixed = _fork(gated, "unfixed", guard=False)  # the gate off changes nothing where the code lacks the fix
    code, doc, _ = check(gated, capsys, "--path", str(unfixed))
    assert (doc["experiments"][0]["status"], doc["experiments"][0]["gate"]["code_status"]) == ("affected", "affected")


def test_a_tree_that_names_the_variable_outside_its_envs_is_never_an_all_clear(gated, capsys):
    found = _fork(gated, "outside", guard=True)
    srt = found / "python" / "sglang" / "srt"
    (srt / "environ.py").write_text(ENVIRON_PY.replace("    SGLANG_DEMO_GATE = EnvBool(False)\n", ""))
    (srt / "legacy.py").write_text(f'import os\nON = os.environ.get("{GATE}")\n')
    code, doc, _ = check(gated, capsys, "--path", str(found), "--server-env", f"{GATE}=true")
    assert code == errors.BEHAVIOUR_DIFFERS
    assert (doc["experiments"][0]["status"], doc["experiments"][0]["gate"]["state"]) == ("unknown", "unread")
    assert doc["experiments"][0]["gate"]["why"] == "named outside its Envs"


# 0.4.x's boolean reader (sglang.srt.utils): a tree with no sglang.srt.environ reads its variables with it.
UTILS_PY = '''
import os


def get_bool_env_var(name, default="false"):
    return os.getenv(name, default).lower() in ("true", "1")
'''


@pytest.mark.parametrize("helper", [True, False], ids=["get_bool_env_var", "os.environ"])
def test_a_tree_with_no_environ_reads_a_gate_it_names_as_its_own_boolean_reader_does(gated, capsys, helper):
    """0.4.x has no sglang.srt.environ: a port of a gated fix written in its idiom reads the gate with the tree's
    get_bool_env_var, and so does the check (or, where the tree has no such helper, os.environ as it would read
    it); the gate's record says which. A tree with no environ that names no gate (every such release) is
    unchanged: undefined, answered by its code alone (test above)."""
    found = _fork(gated, "bare", guard=True, environ=False)
    srt = found / "python" / "sglang" / "srt"
    if helper:
        (srt / "utils.py").write_text(UTILS_PY)
        (srt / "legacy.py").write_text(f'from sglang.srt.utils import get_bool_env_var\n\n'
                                       f'ON = get_bool_env_var("{GATE}")\n')
    else:
        (srt / "legacy.py").write_text(f'import os\nON = os.environ.get("{GATE}", "false").lower() == "true"\n')
    reader = ("read with this tree's sglang.srt.utils.get_bool_env_var (it has no sglang.srt.environ)" if helper else
              "read from os.environ as a get_bool_env_var reads it (true or 1): this tree has neither "
              "sglang.srt.environ nor that helper")
    code, doc, _ = check(gated, capsys, "--path", str(found), "--server-env", f"{GATE}=true")
    assert code == errors.CONFIRMED
    [answer] = doc["experiments"]
    assert (answer["status"], answer["gate"]["state"], answer["gate"]["value"]) == ("fixed", "on", True)
    assert answer["gate"]["why"] == f"{reader}, as given"
    assert doc["environment"]["named"] == [GATE] and problems("check", doc) == []
    code, doc, _ = check(gated, capsys, "--path", str(found))
    assert code == errors.BEHAVIOUR_DIFFERS
    [answer] = doc["experiments"]
    assert (answer["status"], answer["gate"]["state"], answer["gate"]["value"]) == ("affected", "off", False)
    assert answer["gate"]["why"] == f"{reader}, its default: not given"


def test_a_tree_whose_envs_does_not_import_here_reads_nothing_and_is_never_an_all_clear(gated, capsys):
    found = _fork(gated, "broken", guard=True)
    (found / "python" / "sglang" / "srt" / "environ.py").write_text("raise ImportError('libcuda.so.1')\n")
    code, doc, _ = check(gated, capsys, "--path", str(found), "--server-env", f"{GATE}=true")
    assert code == errors.BEHAVIOUR_DIFFERS
    assert (doc["experiments"][0]["status"], doc["experiments"][0]["gate"]["state"]) == ("unknown", "unread")
    assert doc["environment"]["envs_error"] == "ImportError: libcuda.so.1"
    assert (doc["environment"]["values"], doc["environment"]["named"], doc["environment"]["undefined"]) == ({}, [], [])
    assert problems("check", doc) == []


def test_the_environment_is_part_of_what_an_outcome_is_kept_by(gated, fork, capsys):
    assert check(gated, capsys, "--path", str(fork), "--server-env", f"{GATE}=true")[0] == errors.CONFIRMED
    assert check(gated, capsys, "--path", str(fork))[0] == errors.BEHAVIOUR_DIFFERS
    code, _, err = check(gated, capsys, "--path", str(fork), "--server-env", f"{GATE}=true")
    assert code == errors.CONFIRMED and "outcomes reused" in err
    kept = sorted(p.name for p in (gated.tmp / "work" / "outcomes").glob("*/environment.json"))
    assert kept == ["environment.json", "environment.json"]


def test_an_ungated_registry_without_an_environment_reads_none(world, capsys):
    fixed = _fork(world, "plain", guard=True)
    code, doc, _ = check(world, capsys, "--path", str(fixed))
    assert code == errors.CONFIRMED and "environment" not in doc and "gate" not in doc["experiments"][0]


@pytest.mark.parametrize(("gate", "message"), [
    ('variable = "SGLANG_X"\non = "true"', "missing key 'why'"),
    ('variable = "SGLANG-X"\non = "true"\nwhy = "w"', "not an environment variable name"),
    ('variable = "SGLANG_X"\non = ""\nwhy = "w"', "empty"),
    ('variable = "SGLANG_X"\non = true\nwhy = "w"', "expected"),
    ('variable = "SGLANG_X"\non = "true"\nwhy = "w"\ndefault = "false"', "unknown key"),
])
def test_the_registrys_gate_is_strictly_validated(tmp_path, gate, message):
    root = make_project(tmp_path, REGISTRY + f"\n[experiments.demo.gate]\n{gate}\n")
    with pytest.raises(errors.HarnessError, match=message):
        registry.load(root)


def test_the_registrys_gate_is_parsed_into_the_experiment(tmp_path):
    root = make_project(tmp_path, REGISTRY + GATE_TABLE)
    gate = registry.load(root).experiment("demo").gate
    assert (gate.variable, gate.on) == (GATE, "true") and gate.why.startswith("the door")


@pytest.mark.parametrize(("value", "message"), [
    ("1X=true", "'1X' is not an environment variable name"),
    ("=true", "'' is not an environment variable name"),
    ("A B=c", "'A B' is not an environment variable name"),
])
def test_a_malformed_variable_is_a_usage_error_before_anything_runs(value, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        arguments.server_env(value)


def test_an_env_file_names_the_line_of_a_malformed_variable(tmp_path):
    env_file = tmp_path / "bad.env"
    env_file.write_text("A=1\nexport B=2\n")
    with pytest.raises(argparse.ArgumentTypeError, match=r"bad.env', line 2: 'export B' is not"):
        arguments.server_env_file(str(env_file))
    env_file.write_text('A="quoted"\nB=x=y\nC=\n')  # the value after the first = taken literally, as docker does
    assert arguments.server_env_file(str(env_file)).values() == {"A": '"quoted"', "B": "x=y", "C": ""}
