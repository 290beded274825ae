"""The package's shape: stages import only downward, and in-cell code needs nothing of ours."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdevidence.core.paths import PROJECT

PROBES = PROJECT / "probes"
# What code running inside a cell's interpreter may import besides the standard library:
# the probed tree and the torch it runs on, the probes' own kit and driver, and (for the upstream plugin)
# the pytest that runs it.
IN_CELL_ALLOWED = {"sglang", "torch", "triton", "_probekit", "_mutants", "_standins", "_offload", "_serverconfig",
                   "_serverenv", "_decode_step", "_kvtransfer", "_transferqueue", "_nixl", "probe_all",
                   "pytest"}


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(PROBES.glob("*.py")), ids=lambda p: p.name)
def test_in_cell_code_imports_only_the_standard_library_and_the_probed_tree(path):
    foreign = _top_level_imports(path) - set(sys.stdlib_module_names) - IN_CELL_ALLOWED - {"__future__"}
    assert not foreign, f"{path.name} runs inside a cell but imports {sorted(foreign)}"


def test_the_in_cell_check_notices_a_foreign_import(tmp_path):
    probe = tmp_path / "probe_x.py"
    probe.write_text("import json\nfrom pdevidence.core import errors\nimport sglang.srt\n")
    assert _top_level_imports(probe) - set(sys.stdlib_module_names) - IN_CELL_ALLOWED == {"pdevidence"}


def test_the_stages_import_only_downward():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is in requirements-dev.txt: install it"
    done = subprocess.run([lint, "--no-cache"], cwd=PROJECT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("bench", sorted((PROJECT / "benchmarks").glob("bench_*.py")), ids=lambda p: p.name)
def test_every_benchmark_still_imports_the_harness(bench):
    done = subprocess.run([sys.executable, str(bench), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
