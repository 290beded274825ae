"""SHA256SUMS.txt: in sync with the probes and published results, in sha256sum -c format."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from pdevidence import errors, integrity
from pdevidence.paths import PROJECT
from synthetic import make_project, write_cell


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
