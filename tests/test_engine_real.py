"""The warm engine on real SGLang releases: the same documents a fresh process writes, and a cached rerun.

Slow (``--sglang``): the bracket releases probed twice, once in a fresh process per
release (``sweep --cold``) and once through the engine (``sweep --force``), each into
its own runs directory; the tests compare what those runs wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pdevidence.core.paths import PROJECT

pytestmark = pytest.mark.sglang

BRACKETS = ["0.5.19", "0.5.20", "0.5.21"]  # prefill base, prefill head = admission base, admission head


def sweep(runs, *argv):
    env = {**os.environ, "PDEVIDENCE_RUNS": str(runs), "PYTHONPATH": str(PROJECT)}
    done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(PROJECT), "sweep", *argv, *BRACKETS],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    cold, warm = tmp_path_factory.mktemp("cold"), tmp_path_factory.mktemp("warm")
    said_cold = sweep(cold, "--cold")
    said_warm = sweep(warm, "--force")
    return cold, warm, said_cold, said_warm


def test_the_engine_writes_what_a_fresh_process_writes_for_each_bracket_release(both):
    cold, warm, said_cold, said_warm = both
    assert "engine: probing" in said_warm and "engine:" not in said_cold
    for version in BRACKETS:
        for experiment in ("admission", "prefill"):
            fresh = cold / "sweep" / f"release-{version}" / f"{experiment}.json"
            forked = warm / "sweep" / f"release-{version}" / f"{experiment}.json"
            assert forked.read_bytes() == fresh.read_bytes(), f"{experiment} on {version}"
    for experiment in ("admission", "prefill"):
        assert (warm / f"sweep-{experiment}.json").read_bytes() == (cold / f"sweep-{experiment}.json").read_bytes()


def test_an_unchanged_rerun_reuses_every_outcome_and_writes_the_same_table(both, tmp_path):
    _, warm, _, _ = both
    said = sweep(tmp_path)
    assert f"{len(BRACKETS)} tree(s) unchanged" in said and "engine: probing" not in said
    for experiment in ("admission", "prefill"):
        assert (tmp_path / f"sweep-{experiment}.json").read_bytes() == (warm / f"sweep-{experiment}.json").read_bytes()
