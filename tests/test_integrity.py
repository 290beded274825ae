"""SHA256SUMS.txt: in sync with the probes and published results, in sha256sum -c format."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest
from synthetic import make_project, write_cell

from pdevidence import cli
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity


def test_the_committed_sums_match_the_committed_files():
    """Fails when a probe or a published result changed without `nox -s checksums`."""
    integrity.verify(PROJECT)


@pytest.mark.skipif(not shutil.which("sha256sum"), reason="coreutils sha256sum not installed")
def test_sha256sum_accepts_the_file(tmp_path):
    project = make_project(tmp_path)
    write_cell(project / "results", "base")
    integrity.regenerate(project)
    done = subprocess.run(["sha256sum", "-c", "SHA256SUMS.txt"], cwd=project, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "probes/probe_demo.py: OK" in done.stdout


def test_a_changed_probe_makes_the_sums_stale(tmp_path):
    project = make_project(tmp_path)
    integrity.regenerate(project)
    (project / "probes" / "probe_demo.py").write_text("print('changed')\n")
    with pytest.raises(errors.HarnessError, match="probes/probe_demo.py") as err:
        integrity.verify(project)
    assert err.value.code == errors.INTEGRITY


def test_an_unlisted_published_result_is_reported(tmp_path):
    project = make_project(tmp_path)
    integrity.regenerate(project)
    write_cell(project / "results", "head")
    assert integrity.problems(project) == {
        "results/demo.head.release-1.1.0.json": "not listed in SHA256SUMS.txt",
        "results/demo.head.release-1.1.0.receipt.json": "not listed in SHA256SUMS.txt",
    }


def test_a_malformed_sums_line_is_named(tmp_path):
    project = make_project(tmp_path)
    (project / "SHA256SUMS.txt").write_text("nonsense\n")
    with pytest.raises(errors.HarnessError, match="line 1"):
        integrity.verify(project)


def test_the_sums_cover_the_registry_the_constraints_and_everything_published(tmp_path):
    project = make_project(tmp_path)
    write_cell(project / "results", "base")
    (project / "results" / "osv").mkdir()
    (project / "results" / "osv" / "PDE-1.json").write_text("{}\n")
    (project / "results" / ".report.md.x.tmp").write_text("half")  # write_atomic's temporary, never covered
    assert integrity.covered_files(project) == [
        "probes/_mutants.py", "probes/_probekit.py", "probes/engine.py", "probes/probe_all.py",
        "probes/probe_demo.py", "probes/probe_mutants.py", "experiments.toml", "constraints/cells.txt",
        "results/demo.base.release-1.0.0.json", "results/demo.base.release-1.0.0.receipt.json",
        "results/osv/PDE-1.json"]


def test_a_changed_registry_makes_the_sums_stale(tmp_path):
    project = make_project(tmp_path)
    integrity.regenerate(project)
    (project / "experiments.toml").write_text((project / "experiments.toml").read_text().replace('"1.1.0"', '"1.2.0"'))
    (rel, why), = integrity.problems(project).items()
    assert rel == "experiments.toml" and why.startswith("SHA-256")


def test_a_published_result_without_its_receipt_fails_verification(tmp_path):
    project = make_project(tmp_path)
    write_cell(project / "results", "base")
    (project / "results" / "demo.base.release-1.0.0.receipt.json").unlink()
    assert integrity.document_problems(project) == {
        "results/demo.base.release-1.0.0.json": "a published result without its receipt "
                                                "demo.base.release-1.0.0.receipt.json"}


def test_write_atomic_creates_world_readable_files(tmp_path):
    from pdevidence.core.files import write_atomic

    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "a.json", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


@pytest.fixture
def published_copy(tmp_path, monkeypatch):
    """The committed registry, constraints, probes, results and sums (no cell environments), with no runs."""
    root = tmp_path / "copy"
    for rel in [*integrity.covered_files(PROJECT), integrity.SUMS_FILE]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT / rel, root / rel)
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    integrity.verify(root)
    return root


def published_evidence():
    top = PROJECT / "results"
    return sorted(p.name for p in top.iterdir() if p.name.endswith(".receipt.json") or p.name.startswith("report."))


@pytest.mark.parametrize("name", published_evidence())
def test_a_flipped_byte_in_a_committed_receipt_or_report_is_named_by_verify_and_compare(published_copy, capsys,
                                                                                         name):
    path = published_copy / "results" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert cli.main(["--root", str(published_copy), "verify"]) == errors.INTEGRITY
    assert f"results/{name}" in capsys.readouterr().err
    assert cli.main(["--root", str(published_copy), "compare"]) == errors.INTEGRITY
    assert f"results/{name}" in capsys.readouterr().out


@pytest.mark.parametrize("content", ["{}", '{"python": {}}'])
def test_an_emptied_committed_receipt_exits_5_even_with_blessed_sums(published_copy, capsys, content):
    receipt = next((published_copy / "results").glob("*.receipt.json"))
    receipt.write_text(content)
    (published_copy / integrity.SUMS_FILE).write_text(integrity.render(published_copy))
    for command in ("verify", "compare"):
        assert cli.main(["--root", str(published_copy), command]) == errors.INTEGRITY
        captured = capsys.readouterr()
        assert f"results/{receipt.name}" in captured.out + captured.err
        assert "Traceback" not in captured.err
