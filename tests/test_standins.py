"""Import stand-ins (probes/_standins.py): an old tree imports, and a path that reaches one is an error.

A synthetic ``sglang`` imports a GPU-only package at top level, as releases up to
about 0.5.10 import ``sgl_kernel``; the driver runs for real with this interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SGLANG = """
from gpu_kernels import fused_op
from gpu_kernels.sub import Base

class Door(Base):
    pass

def admit(req):
    return req != "rejected"

def admit_with_kernel(req):
    return fused_op(req)

def admit_swallowing(req):
    try:
        return fused_op(req)
    except Exception:
        return True
"""
PROBE = """
from _probekit import ScenarioSet
SET = ScenarioSet("demo")

def prepare():
    import sglang
    return "0.4.9"

@SET.scenario("S1", "the door, in Python")
def s1(observed):
    import sglang
    observed["admitted"] = sglang.admit("rejected")

@SET.scenario("S2", "a path into the kernel")
def s2(observed):
    import sglang
    observed["admitted"] = sglang.admit_with_kernel("rejected")

@SET.scenario("S3", "a path into the kernel whose exception SGLang swallows")
def s3(observed):
    import sglang
    observed["admitted"] = sglang.admit_swallowing("rejected")
"""


def drive(tmp_path: Path, stand_ins: str | None, sglang: str = SGLANG):
    tree = tmp_path / "tree"
    (tree / "sglang").mkdir(parents=True, exist_ok=True)
    (tree / "sglang" / "__init__.py").write_text(sglang)
    probe = tmp_path / "probe_demo_differential.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PDEVIDENCE_STAND_INS", None)
    if stand_ins is not None:
        env["PDEVIDENCE_STAND_INS"] = stand_ins
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "probes" / "probe_all.py"), str(probe), "--out-dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=60)
    return done, out


def test_without_its_stand_in_the_tree_cannot_run(tmp_path):
    done, out = drive(tmp_path, None)
    assert done.returncode == 3
    error = json.loads((out / "demo.cannot-run.json").read_text())["error"]
    assert error == {"type": "ModuleNotFoundError", "message": "No module named 'gpu_kernels'"}


def test_with_its_stand_in_the_tree_imports_and_the_record_says_what_was_stood_in(tmp_path):
    done, out = drive(tmp_path, "gpu_kernels")
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "demo.json").read_text())
    assert doc["stand_ins"] == {"installed": ["gpu_kernels"], "called": ["gpu_kernels.fused_op"],
                                "touched": ["gpu_kernels", "gpu_kernels.fused_op", "gpu_kernels.sub",
                                            "gpu_kernels.sub.Base"]}
    assert doc["scenarios"]["S1"] == {"title": "the door, in Python", "observed": {"admitted": False}, "error": None}


def test_a_scenario_that_reaches_a_stand_in_is_an_error_even_when_sglang_swallows_it(tmp_path):
    _, out = drive(tmp_path, "gpu_kernels")
    scenarios = json.loads((out / "demo.json").read_text())["scenarios"]
    assert scenarios["S2"]["error"]["type"] == "StandInCalled"
    assert scenarios["S3"]["observed"] == {"admitted": True}  # what SGLang returned is kept for the reader,
    assert scenarios["S3"]["error"] == {"type": "StandInCalled",  # but the scenario is an error, not data
                                        "message": "the scenario called the import stand-in(s) gpu_kernels.fused_op"}


def test_a_result_made_without_stand_ins_has_no_stand_in_key(tmp_path):
    plain = "def admit(req):\n    return req != 'rejected'\n"
    done, out = drive(tmp_path, "", plain)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "demo.json").read_text())
    assert "stand_ins" not in doc and doc["scenarios"]["S1"]["observed"] == {"admitted": False}


# outlines 0.0.4x's airports type, as it reads the data package at import (an enum of the codes it lists).
AIRPORTS = """
from enum import Enum
from pyairports.airports import AIRPORT_LIST

IATA = Enum("Airport", list({(a[3],) for a in AIRPORT_LIST if a[3] != ""}))

def admit(req):
    return req != "rejected"
"""


def test_the_pyairports_stand_in_is_an_empty_airport_list_recorded_as_touched(tmp_path):
    done, out = drive(tmp_path, "pyairports", AIRPORTS)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "demo.json").read_text())
    assert doc["stand_ins"] == {"installed": ["pyairports"], "called": [],
                                "touched": ["pyairports.airports.AIRPORT_LIST"]}
    assert doc["scenarios"]["S1"]["observed"] == {"admitted": False}
    # Any other name of it is no answer: the data package holds only the list.
    done, out = drive(tmp_path, "pyairports", "from pyairports.airports import AIRPORT_CODES\n")
    assert done.returncode == 3 and "AIRPORT_CODES" in (out / "demo.cannot-run.json").read_text()
