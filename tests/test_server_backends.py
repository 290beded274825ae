"""`check --server-args` and the transfer backend: a fix on another backend, an alias the tree resolves, and a
backend no experiment's probed code covers, on a synthetic fork.

The fork's ``ServerArgs`` is test_server_args.py's with a transfer backend whose resolution (after the model's
config, as 0.5.19 on) rewrites ``mooncake_tcp`` to ``mooncake``; the registry's demo experiment needs a decode
server on Mooncake, so Mooncake is the only backend the probes cover.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project
from test_forks import world, write_closures  # noqa: F401 - fixtures
from test_server_args import SERVER_ARGS_PY, check, configured_fork

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.lanes.check import outside_probes

NEEDS = """
[experiments.demo.needs]
server_args = { disaggregation_mode = ["decode"], disaggregation_transfer_backend = ["mooncake"] }
why = "the deferred release runs only on a decode server whose KV moves over Mooncake"
"""
BACKEND_FIELD = '    tp_size: int = 1\n'
BACKEND_OPTION = '        parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)\n'
MOONCAKE_TCP = """        if self.disaggregation_transfer_backend == "mooncake_tcp":
            self.disaggregation_transfer_backend = "mooncake"
"""


@pytest.fixture
def backends(world):
    """An unfixed fork with a transfer backend option; the demo experiment needs Mooncake on a decode server."""
    field = '    disaggregation_transfer_backend: str = "mooncake"\n'
    source = SERVER_ARGS_PY.replace(BACKEND_FIELD, BACKEND_FIELD + field)
    source = source.replace(BACKEND_OPTION, BACKEND_OPTION + (
        '        parser.add_argument("--disaggregation-transfer-backend", type=str, default="mooncake",\n'
        '                            choices=["mooncake", "mooncake_tcp", "nixl", "mori", "fake"])\n'))
    return configured_fork(world, NEEDS, source.replace("        # derived\n", MOONCAKE_TCP))


def _server(fork, backend: str, *, resolved: bool = True) -> str:
    """A decode server's arguments; ``resolved``: with the model's config here, so the tree's resolution runs
    through and establishes the backend (its code may rewrite it: without, the backend is not established)."""
    model = fork / "python" / "model"  # beside the package: the probe process sees it
    model.mkdir(exist_ok=True)
    given = f"--model-path {model} " if resolved else ""
    return f"{given}--disaggregation-mode decode --disaggregation-transfer-backend {backend}"


def test_a_fix_on_a_backend_the_server_does_not_use_is_not_affected_resting_on_the_configuration(world, backends,
                                                                                                   capsys):
    # No model config here: the resolution stops; but its only write of the backend rewrites mooncake_tcp, so a
    # server given nixl runs nixl: not the backend whose code the fix changes.
    given = _server(backends, "nixl", resolved=False)
    code, doc, _ = check(world, capsys, "--path", str(backends), "--server-args", given)
    [answer] = doc["experiments"]
    assert doc["configuration"]["resolution"]["completed"] is False
    assert doc["configuration"]["values"]["disaggregation_transfer_backend"] == "nixl"
    assert (answer["status"], answer["justification"], answer["rests_on"]) == \
        ("not affected", "vulnerable_code_not_in_execute_path", "configuration")
    assert answer["configuration"]["unmet"] == {"disaggregation_transfer_backend": "nixl"}
    assert code == errors.CONFIRMED and problems("check", doc) == []


def test_a_backend_no_probe_covers_is_said_to_be_outside_what_the_probes_saw(world, backends, capsys, tmp_path):
    vex = tmp_path / "vex.json"
    code, doc, _ = check(world, capsys, "--path", str(backends), "--server-args", _server(backends, "mori"),
                         "--openvex", str(vex))
    [answer] = doc["experiments"]
    # The Mooncake fix's code is not in a mori server's path: that much is known, and answered as such.
    assert (answer["status"], answer["rests_on"]) == ("not affected", "configuration")
    assert doc["configuration"]["outside_probes"] == [{"attribute": "disaggregation_transfer_backend",
                                                       "value": "mori", "covered": ["mooncake"],
                                                       "experiments": ["demo"]}]
    assert code == errors.CONFIRMED and problems("check", doc) == []
    [statement] = json.loads(vex.read_text())["statements"]
    assert statement["status"] == "not_affected"
    assert 'disaggregation_transfer_backend = "mori" is outside what the probes saw' in statement["status_notes"]
    assert "says nothing of whether \"mori\"'s own code has the same bug class" in statement["status_notes"]
    assert problems("openvex-0.2.0", json.loads(vex.read_text())) == []
    cli.main(["--root", str(world.root), "check", "--path", str(backends), "--server-args",
              _server(backends, "mori")])
    table = capsys.readouterr().out
    assert 'OUTSIDE THE PROBES: disaggregation_transfer_backend = "mori" is outside what the probes saw: they ' \
        'looked only at "mooncake" (demo)' in table
    assert 'no answer for disaggregation_transfer_backend = "mori": outside what the probes saw' in table


def test_a_backend_the_probes_cover_enters_the_path_and_gets_the_codes_answer(world, backends, capsys):
    code, doc, _ = check(world, capsys, "--path", str(backends), "--server-args", _server(backends, "mooncake"))
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", True)
    assert doc["configuration"]["outside_probes"] == []
    assert code == errors.BEHAVIOUR_DIFFERS and problems("check", doc) == []


def test_an_alias_counts_as_the_backend_the_trees_resolution_makes_it(world, backends, capsys):
    code, doc, _ = check(world, capsys, "--path", str(backends), "--server-args", _server(backends, "mooncake_tcp"))
    [answer] = doc["experiments"]
    assert doc["configuration"]["values"]["disaggregation_transfer_backend"] == "mooncake"
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", True)
    assert doc["configuration"]["outside_probes"] == [] and code == errors.BEHAVIOUR_DIFFERS


def test_an_alias_the_tree_cannot_resolve_here_gets_the_codes_answer_never_an_all_clear(world, backends, capsys):
    # No model config: the resolution stops before the rewrite, and its code derives the backend.
    given = _server(backends, "mooncake_tcp", resolved=False)
    code, doc, _ = check(world, capsys, "--path", str(backends), "--server-args", given)
    [answer] = doc["experiments"]
    assert (answer["status"], answer["rests_on"], answer["configuration"]["enters_path"]) == ("affected", "code", None)
    assert "disaggregation_transfer_backend" in doc["configuration"]["unestablished"]
    assert doc["configuration"]["outside_probes"] == [] and code == errors.BEHAVIOUR_DIFFERS


@pytest.mark.parametrize(("backend", "outside"), [("mooncake", False), ("nixl", False), ("mori", True),
                                                  ("ascend", True), ("fake", True)])
def test_the_backends_covered_are_those_the_registrys_needs_name(tmp_path, backend, outside):
    two = NEEDS.replace('disaggregation_transfer_backend = ["mooncake"]',
                        'disaggregation_transfer_backend = ["mooncake", "nixl"]')
    exps = list(registry.load(make_project(tmp_path, REGISTRY + two)).experiments.values())
    found = outside_probes(exps, {"disaggregation_mode": "decode", "disaggregation_transfer_backend": backend})
    assert [(o.value, o.covered) for o in found] == ([(backend, ("mooncake", "nixl"))] if outside else [])


def test_a_backend_is_judged_only_where_an_experiment_names_the_attribute_and_its_value_is_established(tmp_path):
    bare = list(registry.load(make_project(tmp_path / "bare", REGISTRY)).experiments.values())
    assert outside_probes(bare, {"disaggregation_transfer_backend": "mori"}) == []  # no probe covers any backend
    named = list(registry.load(make_project(tmp_path / "named", REGISTRY + NEEDS)).experiments.values())
    assert outside_probes(named, {"disaggregation_mode": "decode"}) == []  # not established: cannot tell


# --- which writes of the resolution code can change a value given (probes/_serverconfig.py) -------------------

RESOLUTION = '''
import dataclasses


@dataclasses.dataclass
class ServerArgs:
    backend: str = "a"
    mode: str = "null"
    level: int = 0

    def __post_init__(self):
        if self.backend == "tcp":  # an alias, rewritten
            self.backend = "a"
        if self.mode in ("x", "y") and self.backend == "a":  # a chain: what the alias becomes is rewritten again
            self.backend = "b"
        if self.mode == "y":  # guarded by another attribute: any level may change
            self.level = 2
'''


@pytest.fixture
def resolution(tmp_path, monkeypatch):
    """``derived_attributes`` on RESOLUTION's ServerArgs, in a package laid out as a tree's (no resolution
    package beside it)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "probes"))
    monkeypatch.syspath_prepend(str(tmp_path))
    srt = tmp_path / "sglang" / "srt"
    srt.mkdir(parents=True)
    for init in (tmp_path / "sglang" / "__init__.py", srt / "__init__.py"):
        init.write_text("")
    (srt / "server_args.py").write_text(RESOLUTION)
    tree = ("sglang.srt.server_args", "sglang.srt", "sglang")
    for name in tree:  # an earlier test's tree (another fake sglang) must not answer this import
        monkeypatch.delitem(sys.modules, name, raising=False)
    import _serverconfig
    from sglang.srt.server_args import ServerArgs
    yield lambda **parsed: _serverconfig.derived_attributes(ServerArgs, parsed)
    for name in tree:  # the next test's tree is another
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("backend", "derived"), [("c", False), ("b", False), ("tcp", True), ("a", True)])
def test_a_guarded_rewrite_changes_only_the_values_its_guards_reach(resolution, backend, derived):
    assert resolution(backend=backend) == ({"backend"} if derived else set())


def test_a_write_not_guarded_by_the_attributes_own_value_may_change_any_value(resolution):
    assert resolution(level=5, mode="x") == {"level"}  # the mode is never written
