"""A fresh clone stays clean whatever you run, and every file the harness writes is 0644."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from synthetic import serve_index, wheel_bytes

from pdevidence.core import errors
from pdevidence.core.paths import PROJECT


def modes(root) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in root.rglob("*") if p.is_file()}


def test_a_fresh_clone_stays_clean_after_any_command(tmp_path, http_server):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(PROJECT), str(clone)], check=True, timeout=120)
    cache = tmp_path / "cache"
    # A release no lock pins, from a local index; no interpreter for the cells, so check stops after the tree.
    index = serve_index(http_server, {"sglang-9.9.9-py3-none-any.whl": wheel_bytes("9.9.9", "")})
    no_python = tmp_path / "no-python"  # a program, but no interpreter: a setting that is well-formed, not Python
    no_python.write_text("#!/bin/sh\nexit 1\n")
    no_python.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(clone), "PDEVIDENCE_CACHE": str(cache), "PDEVIDENCE_INDEX_URL": index,
           "PDEVIDENCE_PYTHON": str(no_python)}
    for name in ("PDEVIDENCE_RUNS", "PDEVIDENCE_WORK", "PDEVIDENCE_TORCH", "SGLANG_REPO"):
        env.pop(name, None)

    def run(*argv: str, **extra: str) -> int:
        done = subprocess.run([sys.executable, *argv], cwd=clone, env={**env, **extra}, capture_output=True,
                              text=True, timeout=300)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode

    assert run("-m", "pdevidence", "verify") == errors.CONFIRMED
    assert run("-m", "pdevidence", "compare") == errors.INCOMPLETE  # no fresh results
    assert run("-m", "pdevidence", "check", "--version", "9.9.9") == errors.ENVIRONMENT
    assert run("-m", "pdevidence", "check", "--version", "0.5.20", PDEVIDENCE_PROBE_TIMEOUT="abc") == errors.USAGE
    assert run("-m", "pdevidence", "cell", "release", "admission", "base") == errors.ENVIRONMENT
    assert run("-m", "nox", "-l") == errors.CONFIRMED

    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == ""
    seen = json.loads((cache / "trees.seen.json").read_text())  # the unpinned release went to the user cache
    assert list(seen["release"]["sglang==9.9.9"]["files"]) == ["sglang-9.9.9-py3-none-any.whl"]
    written = {**modes(clone / "runs"), **{f"cache/{k}": v for k, v in modes(cache).items() if k.endswith(".json")}}
    assert "report.json" in written and "cache/trees.seen.json" in written
    assert {name: mode for name, mode in written.items() if mode != 0o644} == {}
