"""Adaptations (probes/_probekit.py): how a probe drove an older tree is named in its result.

A synthetic ``sglang`` stands for an older tree's shape (a ServerArgs that needs an
accelerator, a runtime context without ``publish``); the driver runs for real with
this interpreter, as a cell would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import problems

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import dataclasses
from _probekit import ScenarioSet, accepts, publish_server_args, server_args
SET = ScenarioSet("demo")
ARGS = {}

def prepare():
    import sglang
    from sglang.srt.server_args import ServerArgs
    ARGS["args"] = server_args(ServerArgs, SET.adapted, model_path="dummy")
    publish_server_args(ARGS["args"], SET.adapted, role="test")
    return "0.4.9"

@SET.scenario("S1", "a door whose flag the tree may lack")
def s1(observed):
    import sglang
    if accepts(sglang.door, "is_rebootstrap"):
        observed["admitted"] = sglang.door("req", is_rebootstrap=True)
    else:
        SET.adapted("door-without-is-rebootstrap")
        observed["is_rebootstrap"] = "absent"

@SET.scenario("S2", "what the server args hold")
def s2(observed):
    observed["device"] = ARGS["args"].device
    observed["model_path"] = ARGS["args"].model_path
"""

TODAY = {
    "__init__.py": "def door(req, is_rebootstrap=False):\n    return True\n",
    "srt/__init__.py": "",
    "srt/server_args.py": """
import dataclasses
@dataclasses.dataclass
class ServerArgs:
    model_path: str
    device: str = "cuda"
""",
    "srt/runtime_context.py": """
PUBLISHED = []
def publish(args, role):
    PUBLISHED.append(role)
""",
}

OLD = {
    "__init__.py": "def door(req):\n    return True\n",
    "srt/__init__.py": "",
    "srt/server_args.py": """
import dataclasses
@dataclasses.dataclass
class ServerArgs:
    model_path: str
    device: str = None
    tags: list = dataclasses.field(default_factory=list)
    def __post_init__(self):
        raise RuntimeError("No accelerator (CUDA, XPU, HPU) is available.")

def set_global_server_args_for_scheduler(args):
    pass
""",
}


def drive(tmp_path: Path, tree_files: dict[str, str]) -> dict:
    tree = tmp_path / "tree"
    for name, text in tree_files.items():
        (tree / "sglang" / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / "sglang" / name).write_text(text)
    probe = tmp_path / "probe_demo_differential.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PDEVIDENCE_STAND_INS", None)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "probes" / "probe_all.py"), str(probe), "--out-dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "demo.json").read_text())


def test_a_tree_driven_as_written_has_no_adaptations_key(tmp_path):
    doc = drive(tmp_path, TODAY)
    assert "adaptations" not in doc
    assert doc["scenarios"]["S1"]["observed"] == {"admitted": True}


def test_each_adaptation_that_ran_is_named_once_in_sorted_order(tmp_path):
    doc = drive(tmp_path, OLD)
    assert doc["adaptations"] == ["door-without-is-rebootstrap", "publish-global-server-args",
                                  "server-args-defaults"]
    assert problems("result", doc) == []
    assert problems("result", {**doc, "adaptations": ["Server Args"]})  # names are short and stable


def test_a_flag_the_tree_lacks_is_recorded_absent_not_called(tmp_path):
    doc = drive(tmp_path, OLD)
    assert doc["scenarios"]["S1"] == {"title": "a door whose flag the tree may lack",
                                      "observed": {"is_rebootstrap": "absent"}, "error": None}


def test_server_args_that_need_an_accelerator_fall_back_to_the_defaults_on_the_cpu(tmp_path):
    doc = drive(tmp_path, OLD)
    assert doc["scenarios"]["S2"]["observed"] == {"device": "cpu", "model_path": "dummy"}


@pytest.mark.parametrize(("context", "route"), [
    ("class _C:\n    def set_server_args(self, args):\n        pass\ndef get_context():\n    return _C()\n",
     "publish-set-server-args"),
    (None, "server-args-unpublished"),
])
def test_server_args_are_published_by_the_route_the_tree_has(tmp_path, context, route):
    files = {**TODAY, "srt/server_args.py": TODAY["srt/server_args.py"]}
    files.pop("srt/runtime_context.py")
    if context is not None:
        files["srt/runtime_context.py"] = context
    assert drive(tmp_path, files)["adaptations"] == [route]


def test_class_facts_and_accepts_look_at_the_tree_not_its_version(tmp_path):
    sys.path.insert(0, str(ROOT / "probes"))
    try:
        import _probekit
    finally:
        sys.path.remove(str(ROOT / "probes"))

    def result_path(self, batch):
        return batch.return_logprob

    assert _probekit.class_fact(result_path, "batch.return_logprob", why="test")
    assert not _probekit.class_fact(result_path, "self.server_args", why="test")
    with pytest.raises(_probekit.SourceUnreadable, match="the source of len cannot be read"):
        _probekit.class_fact(len, "anything", why="test")  # no source: no answer, never a False
    assert _probekit.accepts(result_path, "batch") and not _probekit.accepts(result_path, "is_retracted")
