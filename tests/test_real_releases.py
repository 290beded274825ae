"""The real thing: the release-backed matrix on SGLang from PyPI, then compare.

Slow (a cell per experiment and side, each probe alone in its own process, in the user cache's environments):
runs with ``--sglang``; CI runs it. The matrix is the session's shared one (``release_matrix`` in conftest.py),
run afresh into a temporary runs directory; the tests read what that run wrote.
"""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from pdevidence import registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT, results_dir
from real_runs import cli_run

pytestmark = pytest.mark.sglang


def snapshot(directory):
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def git_status():
    return subprocess.run(["git", "-C", str(PROJECT), "status", "--porcelain", "--untracked-files=all"],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def matrix(release_matrix):
    return release_matrix.code, release_matrix.pairs, release_matrix.before


@pytest.fixture(scope="module")
def runs(release_matrix):
    return release_matrix.runs


def test_the_matrix_leaves_results_and_the_checkout_as_they_were(matrix):
    """Alone proves: a real matrix run writes nothing into results/ or the checkout (only into its runs)."""
    assert (snapshot(results_dir(PROJECT)), git_status()) == matrix[2]


def test_a_cell_rerun_in_another_process_gives_the_same_bytes(matrix, runs):
    """Alone proves: a real cell forced to run again, through the `cell` command in another process, writes the
    same bytes (one cell stands for all: the matrix's cells share the path)."""
    result = runs / "admission.head.release-0.5.21.json"
    first = result.read_bytes()
    done = cli_run(runs, "cell", "release", "admission", "head", "--force")
    assert done.returncode == errors.CONFIRMED, done.stdout + done.stderr
    assert "reusing admission.head" not in done.stdout  # it really ran the probe again
    assert result.read_bytes() == first


def test_the_report_is_byte_identical_from_two_processes(matrix, runs):
    """Alone proves: `compare` of real results gives a byte-identical report (JSON, Markdown, SVG) every time."""
    reports = []
    for _ in range(2):
        done = cli_run(runs, "compare")
        assert done.returncode == errors.CONFIRMED, done.stdout + done.stderr
        reports.append({name: (runs / name).read_bytes() for name in ("report.json", "report.md", "report.svg")})
    assert reports[0] == reports[1]


def observed(pair, scenario, side):
    return {key: k[side] for key, k in pair["grid"][scenario]["keys"].items()}


def test_every_experiment_confirms_the_published_differential(matrix):
    """Alone proves: on the bracket releases from PyPI, every experiment of the registry shows its declared
    differential and each cell's result is byte-identical to the published one."""
    code, pairs, _ = matrix
    assert {name: p["verdict"] for name, p in pairs.items()} == {
        name: "differential confirmed" for name in registry.load(PROJECT).experiments}
    assert code == errors.CONFIRMED
    for pair in pairs.values():
        assert {p["status"] for p in pair["published"].values()} == {"identical"}, pair["published"]


def test_admission_rejected_requests_are_retired_at_both_doors_only_after_the_fix(matrix):
    """Alone proves: the admission differential is the one the fix claims, read key by key from the real run
    (not only "as declared"): rejected requests get a sender or receiver before the fix and are retired after."""
    pair = matrix[1]["admission"]
    a1b, a1h = observed(pair, "A1", "base"), observed(pair, "A1", "head")
    assert (a1b["sender_created"], a1b["enqueued"], a1b["retired"]) == (True, True, False)
    assert (a1h["sender_created"], a1h["enqueued"], a1h["retired"]) == (False, False, True)
    assert a1h["abort_streamed"] == 1 and a1h["finished_status"] == 400
    a2b, a2h = observed(pair, "A2", "base"), observed(pair, "A2", "head")
    assert (a2b["receiver_created"], a2b["enqueued"]) == (True, True)
    assert (a2h["receiver_created"], a2h["enqueued"], a2h["retired"]) == (False, False, True)


def test_admission_controls_and_reentries_do_not_change(matrix):
    """Alone proves: admission's controls stay admitted on both sides of the real bracket."""
    pair = matrix[1]["admission"]
    for scenario in ("A3p", "A3d", "A4", "A5", "A6p", "A6d", "A7r", "A7b", "A8", "A10", "A11"):
        assert pair["grid"][scenario]["status"] == "unchanged", scenario
        assert observed(pair, scenario, "head")["enqueued"] is True, scenario


def test_prefill_aborted_results_are_retired_once_only_after_the_fix(matrix):
    """Alone proves: the prefill differential key by key: cached unfinished, requeued and sent before the fix;
    released once, not requeued, not sent after."""
    pair = matrix[1]["prefill"]
    b1b, b1h = observed(pair, "B1", "base"), observed(pair, "B1", "head")
    assert b1b["cached_unfinished"] and b1b["enqueued_inflight"] and not b1b["kv_released"]
    assert not b1h["cached_unfinished"] and not b1h["enqueued_inflight"]
    assert b1h["kv_released"] == 1 and b1h["release_inserts_prefix"] is False and b1h["abort_streamed"] == 1
    b2b, b2h = observed(pair, "B2", "base"), observed(pair, "B2", "head")
    assert b2b["requeued"] and not b2h["requeued"]
    b4b, b4h = observed(pair, "B4", "base"), observed(pair, "B4", "head")
    assert b4b["kv_chunk_sent"] and not b4h["kv_chunk_sent"]


def test_prefill_normal_results_are_processed_the_same(matrix):
    """Alone proves: prefill's controls are processed the same on both sides of the real bracket."""
    for scenario in ("B3m", "B9", "B9g", "B10", "B11"):
        assert matrix[1]["prefill"]["grid"][scenario]["status"] == "unchanged", scenario
