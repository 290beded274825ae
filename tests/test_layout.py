"""The package's shape: stages import only downward, in-cell code needs nothing of ours, and the settings are
read in one place."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdevidence.core import faults, settings
from pdevidence.core.paths import PROJECT

PROBES = PROJECT / "probes"
# What code running inside a cell's interpreter may import besides the standard library:
# the probed tree and the torch it runs on, the probes' own kit and driver, and (for the upstream plugin)
# the pytest that runs it.
IN_CELL_ALLOWED = {"sglang", "torch", "triton", "_probekit", "_mutants", "_standins", "_offload", "_serverconfig",
                   "_serverenv", "_decode_step", "_kvtransfer", "_transferqueue", "_nixl", "_retract", "_index_keys",
                   "_swa", "probe_all", "pytest",
                   # grammar_release drives the same result path on experiment prefill's world
                   "probe_prefill_differential"}


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


def _environment_reads(path: Path) -> set[str]:
    """The variables ``path`` reads straight from the environment (``os.environ.get``, ``os.environ[...]``,
    ``os.getenv``, ``in os.environ``), each named by a string or by a module constant holding one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}

    def os_attribute(node: ast.AST, name: str) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
                and node.value.id == "os")

    keys = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and (
                os_attribute(node.func, "getenv")
                or isinstance(node.func, ast.Attribute) and node.func.attr == "get" and os_attribute(node.func.value,
                                                                                                    "environ")):
            keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and os_attribute(node.value,
                                                                                                 "environ"):
            keys.append(node.slice)
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) and os_attribute(node.comparators[0],
                                                                                              "environ"):
            keys.append(node.left)
    return {key.value if isinstance(key, ast.Constant) else constants.get(key.id) if isinstance(key, ast.Name)
            else None for key in keys} - {None}


def test_every_setting_is_read_through_core_settings():
    # faults.py compares its variable's value only, and settings.py imports it (check_all validates it).
    exempt = {PROJECT / "pdevidence" / "core" / name for name in ("settings.py", "faults.py")}
    harness = [*(PROJECT / "pdevidence").rglob("*.py"), *(PROJECT / "benchmarks").glob("*.py")]
    read = sorted(f"{path.relative_to(PROJECT)}: {name}" for path in harness
                  if path not in exempt for name in _environment_reads(path) & set(settings.SETTINGS))
    assert not read, "read these through settings.get (parsed and checked there): " + "; ".join(read)
    assert faults.VARIABLE in settings.SETTINGS


def test_the_settings_check_notices_each_way_of_reading_the_environment(tmp_path):
    module = tmp_path / "module.py"
    module.write_text('import os\nNAME = "SGLANG_TREE"\nos.environ.get("SGLANG_REPO")\nos.environ[NAME]\n'
                      'os.getenv("UV")\n"PDEVIDENCE_PYTHON" in os.environ\nos.environ.get("PATH", "")\n'
                      'os.environ["PDEVIDENCE_WORK"] = "w"\ndel os.environ["PDEVIDENCE_CACHE"]\n')
    assert _environment_reads(module) == {"SGLANG_REPO", "SGLANG_TREE", "UV", "PDEVIDENCE_PYTHON", "PATH"}


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


def test_the_bisect_benchmark_takes_its_clone_through_the_settings(tmp_path):
    env = {**os.environ, "SGLANG_REPO": str(tmp_path / "no-such-clone")}
    done = subprocess.run([sys.executable, str(PROJECT / "benchmarks" / "bench_bisect.py")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "SGLANG_REPO=" in done.stderr and "is not a valid setting" in done.stderr
    assert "an existing directory" in done.stderr
