"""Cells end to end on a fixture experiment whose "SGLang" is a fixture package.

The cell machinery is real: uv environments, the probe subprocess, results,
receipts, the cell cache, nox sessions. Only SGLang is a stand-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synthetic import PY

from pdevidence import environments, registry
from pdevidence.cells import cells
from pdevidence.core import errors
from pdevidence.core.files import sha256_file
from pdevidence.core.paths import PROJECT
from pdevidence.documents import receipts, results


def run_cell(root, side="base", **kw):
    reg = registry.load(root)
    return cells.run_cell(reg, cells.Cell("demo", side, "release"), log=lambda msg: None, **kw)


def test_a_release_cell_writes_a_result_and_a_receipt(demo_project):
    outcome = run_cell(demo_project, "head")
    assert outcome.result.name == "demo.head.release-1.1.0.json"
    doc = results.load(outcome.result, experiment="demo", side="head")
    assert doc["tree"] == {"kind": "release", "ref": "1.1.0", "resolved": "1.1.0"}
    assert doc["scenarios"]["D1"]["observed"] == {"enqueued": False, "retired": True}
    receipt = json.loads(outcome.receipt.read_text())
    assert receipt["tree"]["source"] == "pypi" and len(receipt["tree"]["sha256"]) == 64
    assert receipt["packages"]["sglang"] == "1.1.0"
    assert receipt["python"]["version"].startswith(PY)
    assert receipt["torch"]["channel"] == "pypi" and receipt["torch"]["override"] is None
    assert receipt["schema"] == receipts.RECEIPT_SCHEMA
    # What the cell is, as the cache key has it: the interpreter's identity, not its path.
    assert receipt["python"]["implementation"] == sys.implementation.name
    assert receipt["python"]["identity"] == environments.find_python(PY).identity()
    assert receipt["result"]["sha256"] == sha256_file(outcome.result)
    assert receipt["exit_status"] == 0 and receipt["duration_s"] >= 0
    assert any("probe_demo.py" in part for part in receipt["commands"][-1])


def test_an_unchanged_cell_is_reused_and_a_changed_probe_reruns_it(demo_project):
    first = run_cell(demo_project)
    assert not first.reused
    assert run_cell(demo_project).reused
    assert not run_cell(demo_project, force=True).reused
    probe = demo_project / "probes" / "probe_demo.py"
    probe.write_text(probe.read_text() + "\n# changed\n")
    assert not run_cell(demo_project).reused


def test_the_receipt_records_the_torch_override(demo_project, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_TORCH", "pypi")  # the registry's own channel, named explicitly
    torch = json.loads(run_cell(demo_project).receipt.read_text())["torch"]
    assert (torch["channel"], torch["override"], torch["requested"]) == ("pypi", "pypi", "pypi")


def test_a_stored_receipt_that_does_not_load_means_rerun(demo_project):
    first = run_cell(demo_project)
    first.receipt.write_text("{not json")
    again = run_cell(demo_project)
    assert not again.reused and receipts.Receipt.load(again.receipt)


def test_a_stored_receipt_in_an_older_schema_means_rerun(demo_project):
    first = run_cell(demo_project)
    doc = json.loads(first.receipt.read_text())
    doc["schema"] = "pdevidence-receipt/1"
    first.receipt.write_text(json.dumps(doc))
    assert receipts.Receipt.load(first.receipt).schema_version == 1  # it loads: only its schema is older

    again = run_cell(demo_project)

    assert not again.reused
    assert receipts.Receipt.load(again.receipt).schema_version == receipts.RECEIPT_SCHEMA_VERSION


def test_a_hanging_probe_is_killed_and_leaves_no_result(demo_project, monkeypatch):
    monkeypatch.setenv("DEMO_PROBE_MODE", "hang")
    monkeypatch.setenv("PDEVIDENCE_PROBE_TIMEOUT", "3")
    with pytest.raises(errors.HarnessError, match="did not finish within 3 s") as err:
        run_cell(demo_project)
    assert err.value.code == errors.ENVIRONMENT
    assert not list((demo_project / "runs").glob("*.json"))
    assert not list((demo_project / "runs").glob(".*"))


def test_a_crashing_forced_rerun_keeps_the_previous_result(demo_project, monkeypatch):
    first = run_cell(demo_project)
    before = {p.name: p.read_bytes() for p in (first.result, first.receipt)}
    monkeypatch.setenv("DEMO_PROBE_MODE", "crash")

    with pytest.raises(errors.HarnessError, match="probe crashed on purpose"):
        run_cell(demo_project, force=True)

    runs = demo_project / "runs"
    assert {p.name: p.read_bytes() for p in runs.iterdir()} == before  # byte-identical, nothing else


def test_a_result_whose_inputs_changed_is_removed_before_its_cell_reruns(demo_project, monkeypatch):
    run_cell(demo_project)
    probe = demo_project / "probes" / "probe_demo.py"
    probe.write_text(probe.read_text() + "\n# changed\n")
    monkeypatch.setenv("DEMO_PROBE_MODE", "crash")

    with pytest.raises(errors.HarnessError, match="probe crashed on purpose"):
        run_cell(demo_project)

    # A stale result must not outlive a failed rerun and be compared as if it were current.
    assert list((demo_project / "runs").iterdir()) == []


def test_leftovers_of_an_interrupted_run_are_removed_by_the_next_run(demo_project):
    runs = demo_project / "runs"
    staged = runs / ".demo.base.release-1.0.0.partial"
    staged.mkdir(parents=True)
    (staged / "demo.base.release-1.0.0.json").write_text("{half")
    (runs / ".demo.base.release-1.0.0.json.partial").write_text("{half")

    outcome = run_cell(demo_project)

    assert sorted(p.name for p in runs.iterdir()) == sorted([outcome.result.name, outcome.receipt.name])


def test_two_runs_of_one_cell_at_once_share_the_work_safely(demo_project):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda _: run_cell(demo_project), range(2)))
    assert sorted(o.reused for o in outcomes) == [False, True]
    results.load(outcomes[0].result, experiment="demo", side="base")


def nox(root, *args):
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    return subprocess.run([sys.executable, "-m", "nox", "-f", str(root / "noxfile.py"), *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_nox_lists_cells_by_experiment_and_side(demo_project):
    listed = json.loads(nox(demo_project, "--list", "--json", "-t", "cell").stdout)
    names = {s["session"] for s in listed}
    assert {"probe(demo, base)", "probe(demo, head)", "release(demo, base)", "release(demo, head)"} <= names


def test_the_main_session_runs_the_matrix_and_confirms_the_differential(demo_project):
    done = nox(demo_project, "-s", "matrix")
    assert done.returncode == errors.CONFIRMED, done.stdout + done.stderr
    assert "DIFFERENTIAL CONFIRMED" in done.stdout
    report = json.loads((demo_project / "runs" / "report.json").read_text())
    assert report["pairs"][0]["grid"]["D1"]["status"] == "changed"
    assert not (demo_project / "results").exists()  # only `publish` writes results/


@pytest.mark.parametrize(("published", "code"), [
    (None, errors.ENVIRONMENT),  # the failed cell outranks the comparison's "incomplete"
    ("results/stray.json", errors.INTEGRITY),  # an unlisted published file outranks the failed cell
])
def test_a_matrix_with_a_failed_cell_still_compares_and_exits_with_the_worst_code(demo_project, monkeypatch,
                                                                                  published, code):
    from pdevidence import cli

    monkeypatch.setenv("DEMO_PROBE_MODE", "crash-head")
    if published:
        (demo_project / published).parent.mkdir()
        (demo_project / published).write_text("{}\n")

    assert cli.main(["--root", str(demo_project), "matrix", "--jobs", "1"]) == code

    (pair,) = json.loads((demo_project / "runs" / "report.json").read_text())["pairs"]
    assert pair["verdict"] == "incomplete"
    assert any("no result for release(demo, head)" in reason for reason in pair["reasons"])
    assert (demo_project / "runs" / "demo.base.release-1.0.0.json").exists()


def _registry_edited_after(demo_project, monkeypatch, cell_runs: int):
    """Edit experiments.toml (as a merge would) after each of the first ``cell_runs`` cell runs of a matrix."""
    real, edits = cells.run_cell, []

    def run_then_edit(reg, cell, **kw):
        try:
            return real(reg, cell, **kw)
        finally:
            if len(edits) < cell_runs:
                edits.append(cell.name)
                path = demo_project / "experiments.toml"
                path.write_text(path.read_text() + f"\n# merged while {cell.name} ran\n")

    monkeypatch.setattr(cells, "run_cell", run_then_edit)


def test_a_registry_edited_while_the_matrix_runs_reruns_its_stale_cells_never_counts_them(demo_project,
                                                                                           monkeypatch, capsys):
    """Seen republishing: a matrix reused the first cells against the registry as it was when they were checked;
    the registry changed before the comparison, which then stopped at stale evidence (exit 8). A cell that
    started after the edit was worse: made by the registry the run had read, labelled with the new one."""
    from pdevidence import cli

    assert cli.main(["--root", str(demo_project), "matrix", "--jobs", "1"]) == errors.CONFIRMED
    _registry_edited_after(demo_project, monkeypatch, cell_runs=1)
    capsys.readouterr()

    assert cli.main(["--root", str(demo_project), "matrix", "--jobs", "1"]) == errors.CONFIRMED

    said = capsys.readouterr()
    assert "release(demo, base): inputs unchanged, reusing" in said.out  # checked before the edit
    assert "experiments.toml changed after this run read it" in said.err  # head: refused, not mislabelled
    assert "inputs changed while the matrix ran: running release(demo, base), release(demo, head) again" in said.out
    reg = registry.load(demo_project)
    for side in ("base", "head"):
        result = demo_project / "runs" / f"demo.{side}.release-{'1.0.0' if side == 'base' else '1.1.0'}.json"
        receipt = receipts.Receipt.load(results.receipt_path(result))
        assert receipt.stale(demo_project) == [] and receipt.provenance.files["experiments.toml"] == reg.digest


def test_a_registry_that_keeps_changing_under_the_matrix_is_refused_never_counted(demo_project, monkeypatch,
                                                                                   capsys):
    from pdevidence import cli

    _registry_edited_after(demo_project, monkeypatch, cell_runs=4)  # after every run of both passes
    assert cli.main(["--root", str(demo_project), "matrix", "--jobs", "1"]) == errors.STALE
    assert "experiments.toml changed after this run read it" in capsys.readouterr().err
    (pair,) = json.loads((demo_project / "runs" / "report.json").read_text())["pairs"]
    assert pair["verdict"] != "differential confirmed"


def test_unknown_experiment_in_a_cell_is_a_usage_error(demo_project):
    from pdevidence import cli

    assert cli.main(["--root", str(demo_project), "cell", "release", "nope", "base"]) == errors.USAGE
    assert cli.main(["--root", str(demo_project), "cell", "release", "demo", "middle"]) == errors.USAGE


def test_a_git_cell_without_github_points_to_the_ways_out(demo_project, monkeypatch, unreachable_url):
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}.tar.gz")
    monkeypatch.delenv("SGLANG_REPO", raising=False)  # no local clone either: only the ways out are left
    reg = registry.load(demo_project)
    with pytest.raises(errors.HarnessError, match="SGLANG_REPO") as err:
        cells.run_cell(reg, cells.Cell("demo", "base", "git"), log=lambda msg: None)
    assert "release" in str(err.value) and err.value.code == errors.ENVIRONMENT


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_fixture_sglang(repo, version, fixed):
    package = repo / "python" / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (repo / "python" / "pyproject.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "sglang"
        version = "{version}"
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
    """))
    (package / "__init__.py").write_text(f"__version__ = {version!r}\nRETIRES_REJECTED = {fixed}\n")
    # As SGLang's own .gitignore does: installing the tree leaves these behind.
    (repo / ".gitignore").write_text("build/\n*.egg-info/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", version)
    return git(repo, "rev-parse", "HEAD")


def test_git_cells_run_from_a_local_clone_at_the_pinned_commits(demo_project, tmp_path, monkeypatch):
    repo = tmp_path / "sglang-clone"
    repo.mkdir()
    git(repo, "init", "-q")
    base = commit_fixture_sglang(repo, "1.0.0", False)
    head = commit_fixture_sglang(repo, "1.1.0", True)
    registry_file = demo_project / "experiments.toml"
    registry_file.write_text(registry_file.read_text().replace("a" * 40, base).replace("b" * 40, head))
    monkeypatch.setenv("SGLANG_REPO", str(repo))
    reg = registry.load(demo_project)
    outcomes = {side: cells.run_cell(reg, cells.Cell("demo", side, "git"), log=lambda msg: None)
                for side in ("base", "head")}
    assert outcomes["base"].result.name == f"demo.base.git-{base[:12]}.json"
    docs = {side: results.load(o.result) for side, o in outcomes.items()}
    assert docs["base"]["tree"] == {"kind": "git", "ref": base, "resolved": base}
    # Each side is its own commit, not the clone's checked-out HEAD.
    assert docs["base"]["scenarios"]["D1"]["observed"]["retired"] is False
    assert docs["head"]["scenarios"]["D1"]["observed"]["retired"] is True
    receipt = json.loads(outcomes["base"].receipt.read_text())
    assert receipt["tree"]["source"] == "clone" and receipt["tree"]["origin"] == str(repo)


def test_a_git_cell_loads_the_exported_commit_as_it_is_never_building_it(demo_project, clone, monkeypatch):
    repo, base, _ = clone
    monkeypatch.setenv("SGLANG_REPO", str(repo))
    outcome = cells.run_cell(registry.load(demo_project), cells.Cell("demo", "base", "git", base),
                             log=lambda msg: None)
    receipt = json.loads(outcome.receipt.read_text())
    # No build ran outside the sandbox: the tree's build backend is its own code.
    assert not [c for c in receipt["commands"] if "install" in c], receipt["commands"]
    assert "sglang" not in receipt["packages"]
    exported = next((Path(os.environ["PDEVIDENCE_CACHE"]) / "trees").glob(f"commit-{base}"))
    assert not list(exported.rglob("*.egg-info")) and not (exported / "python" / "build").exists()
    assert list(exported.glob("python/sglang/__pycache__/__init__.*.pyc"))  # compiled once, where it lies
    assert results.load(outcome.result)["scenarios"]["D1"]["observed"]["retired"] is False


@pytest.fixture
def clone(tmp_path):
    """A fixture SGLang repository: base (1.0.0, not fixed), then head (1.1.0, fixed)."""
    repo = tmp_path / "sglang-clone"
    repo.mkdir()
    git(repo, "init", "-q")
    base = commit_fixture_sglang(repo, "1.0.0", False)
    head = commit_fixture_sglang(repo, "1.1.0", True)
    return repo, base, head


def test_a_cached_git_tree_is_not_rerun_because_sglang_repo_changed(demo_project, clone, monkeypatch,
                                                                     unreachable_url):
    repo, base, _ = clone
    monkeypatch.setenv("SGLANG_REPO", str(repo))
    cell = cells.Cell("demo", "base", "git", base)
    assert not cells.run_cell(registry.load(demo_project), cell, log=lambda msg: None).reused

    monkeypatch.delenv("SGLANG_REPO")
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}.tar.gz")
    assert cells.run_cell(registry.load(demo_project), cell, log=lambda msg: None).reused


def test_the_interpreter_named_by_path_or_by_pdevidence_python_keeps_the_cache(demo_project, monkeypatch):
    assert not run_cell(demo_project).reused
    monkeypatch.setenv("PDEVIDENCE_PYTHON", sys.executable)
    assert run_cell(demo_project).reused


def test_a_git_ref_is_resolved_to_its_full_sha_through_the_clone(demo_project, clone, monkeypatch):
    repo, _, head = clone
    monkeypatch.setenv("SGLANG_REPO", str(repo))

    outcome = cells.run_cell(registry.load(demo_project), cells.Cell("demo", "head", "git", "HEAD"),
                             log=lambda msg: None)

    assert outcome.result.name == f"demo.head.git-{head[:12]}.json"
    assert results.load(outcome.result)["tree"]["resolved"] == head


@pytest.mark.parametrize("ref", ["HEAD", "8f3d6944b76c", "main"])
def test_a_git_ref_that_is_not_a_full_sha_and_cannot_be_resolved_is_a_usage_error(demo_project, ref, monkeypatch):
    monkeypatch.delenv("SGLANG_REPO", raising=False)
    with pytest.raises(errors.HarnessError, match="not a full 40-hex commit SHA") as caught:
        cells.run_cell(registry.load(demo_project), cells.Cell("demo", "head", "git", ref), log=lambda msg: None)
    assert caught.value.code == errors.USAGE


def test_a_source_trees_cell_records_the_closure_of_the_era_its_version_chooses(demo_project, clone):
    repo, base, _ = clone
    git(repo, "checkout", "-q", base)  # the fixture's pyproject says 1.0.0
    (demo_project / "constraints" / "era.txt").write_text("# the 1.0 era's closure\n")
    with open(demo_project / "experiments.toml", "a") as registry_file:
        registry_file.write('\n[eras.one]\nreleases = ">=1.0.0,<1.1.0"\nconstraints = "constraints/era.txt"\n')
    outcome = cells.run_cell(registry.load(demo_project), cells.Cell("demo", "base", "path", str(repo)),
                             log=lambda msg: None)
    # Known only once the tree is read: the receipt names the closure the environment installed, not today's.
    assert receipts.Receipt.load(outcome.receipt).constraints.file == "constraints/era.txt"


def test_a_path_cell_keys_on_head_and_its_uncommitted_changes(demo_project, clone):
    repo, _, head = clone
    cell = cells.Cell("demo", "head", "path", str(repo))

    def run():
        return cells.run_cell(registry.load(demo_project), cell, log=lambda msg: None)

    clean = run()
    assert clean.result.name == f"demo.head.path-{head[:12]}.json" and not clean.reused
    assert run().reused
    init = repo / "python" / "sglang" / "__init__.py"
    init.write_text(init.read_text().replace("RETIRES_REJECTED = True", "RETIRES_REJECTED = False"))
    dirty = run()
    assert dirty.result.name.startswith(f"demo.head.path-{head[:12]}-dirty-") and not dirty.reused
    assert results.load(dirty.result)["scenarios"]["D1"]["observed"]["retired"] is False
    assert run().reused  # (untracked files' content counts too: test_trees)


def test_the_cpu_channel_without_its_closure_stops_with_exit_3_before_any_download(demo_project, monkeypatch,
                                                                                    capsys, http_server):
    from pdevidence import cli

    monkeypatch.setenv("PDEVIDENCE_TORCH", "cpu")
    assert cli.main(["--root", str(demo_project), "cell", "release", "demo", "base"]) == errors.ENVIRONMENT
    err = capsys.readouterr().err
    assert "CPU torch channel needs a hashed closure" in err and "nox -s lock_cpu" in err
    assert http_server.hits() == 0 and not (demo_project / ".cells" / "envs").exists()


def test_each_step_of_a_cold_cell_is_one_line_naming_the_cell(demo_project):
    lines = []
    cells.run_cell(registry.load(demo_project), cells.Cell("demo", "base", "release"), log=lines.append)
    steps = [line for line in lines if line.endswith("...")]
    assert [s.split(":")[0] for s in steps] == ["release(demo, base)"] * len(steps)
    assert any("(uv venv)" in s for s in steps) and any("(uv pip sync" in s for s in steps)
    assert any("running probe_demo.py" in s for s in steps)


def cell_marker(project: Path) -> Path:
    """A release cell's environment is in the user's cache, named by its tree and closure environment."""
    reg = registry.load(project)
    tree = cells.resolve_tree(reg, cells.Cell("demo", "base", "release"))
    return environments.cell_environment(reg, tree, "demo.base.release-1.0.0").path / environments.ENV_INFO


def test_every_document_and_marker_a_cell_writes_is_0644(demo_project):
    outcome = run_cell(demo_project)
    marker = cell_marker(demo_project)
    for path in (outcome.result, outcome.receipt, marker):
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_a_cells_result_and_receipt_are_on_disk_before_they_have_their_names(demo_project, monkeypatch):
    """The probe's output is written by another process: the rename that names it syncs it first, so a power cut
    leaves no named result or receipt with nothing in it."""
    synced, unsynced = set(), []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.add(os.fstat(fd).st_ino)
        real_fsync(fd)

    def replace(src, dst):
        if Path(src).is_file() and os.stat(src).st_ino not in synced:
            unsynced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    outcome = run_cell(demo_project)
    assert outcome.result.is_file() and outcome.receipt.is_file()
    assert unsynced == []


def test_a_truncated_environment_marker_means_rebuild(demo_project):
    run_cell(demo_project)
    marker = cell_marker(demo_project)
    marker.write_text('{"key": "')
    said = []

    cells.run_cell(registry.load(demo_project), cells.Cell("demo", "base", "release"), force=True, log=said.append)

    assert any("built environment" in line for line in said), said
    assert json.loads(marker.read_text())["key"]


def test_a_release_of_an_era_gets_one_environment_name_whichever_lane_asks(tmp_path):
    from synthetic import REGISTRY, make_project

    from pdevidence.sources import trees
    root = make_project(tmp_path, REGISTRY + '[eras.old]\nreleases = "<1.0"\nconstraints = "constraints/old.txt"\n')
    (root / "constraints" / "old.txt").write_text("torch==2.5.1\n")
    reg = registry.load(root)
    cell = cells.Cell("demo", "base", "release")
    old = trees.Tree("release", "0.9.0", "0.9.0", root / "w.whl", "0" * 64, "pypi", "")
    today = trees.Tree("release", "1.0.0", "1.0.0", root / "w.whl", "0" * 64, "pypi", "")
    era_closure = environments.closure(reg, environments.era_of(reg, old))
    # run_cell names it with the closure it picked; mutate and upstream ask without one.
    assert cells.cell_slug(reg, cell, old) == cells.cell_slug(reg, cell, old, era_closure) \
        == f"demo.base.release-0.9.0.{sha256_file(root / 'constraints' / 'old.txt')[:8]}"
    assert cells.cell_slug(reg, cell, today) == "demo.base.release-1.0.0"
