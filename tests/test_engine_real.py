"""The warm engine on real SGLang releases: the same documents a fresh process writes, and a cached rerun.

Slow (``--sglang``): the session's bracket sweep (``bracket_sweep``: ``sweep --force`` of every bracket release
through the warm engine) is held to one ``sweep --cold`` of the same releases (a fresh probe process per release,
each in its own environment), each into its own runs directory; the tests compare what those runs wrote.
"""

from __future__ import annotations

import re

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT
from real_runs import cli_run

pytestmark = pytest.mark.sglang

EXPERIMENTS = list(registry.load(PROJECT).experiments)
PROBING = re.compile(r"engine( \([^)]*\))?: probing")  # an engine (today's closure's, or an era's) probing trees


def sweep(runs, versions, *argv):
    done = cli_run(runs, "sweep", *argv, *versions, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def cold(bracket_sweep, tmp_path_factory):
    runs = tmp_path_factory.mktemp("cold")
    return runs, sweep(runs, bracket_sweep.releases, "--cold")


def test_the_engine_writes_what_a_fresh_process_writes_for_each_bracket_release(bracket_sweep, cold):
    """Alone proves: the warm engine (a forked child per tree, SGLang's closure imported once) writes, byte for
    byte, the result documents and sweep tables a fresh process per release writes."""
    runs, said_cold = cold
    assert PROBING.search(bracket_sweep.said) and not PROBING.search(said_cold)
    for version in bracket_sweep.releases:
        for experiment in EXPERIMENTS:
            fresh = runs / "sweep" / f"release-{version}" / f"{experiment}.json"
            assert bracket_sweep.result(version, experiment).read_bytes() == fresh.read_bytes(), \
                f"{experiment} on {version}"
    for experiment in EXPERIMENTS:
        assert (bracket_sweep.runs / f"sweep-{experiment}.json").read_bytes() == \
            (runs / f"sweep-{experiment}.json").read_bytes()


def test_an_unchanged_rerun_reuses_every_outcome_and_writes_the_same_table(bracket_sweep, tmp_path):
    """Alone proves: a sweep of real releases whose inputs did not change probes nothing (every outcome from the
    cache) and writes the same tables."""
    said = sweep(tmp_path, bracket_sweep.releases)
    # One engine per era, each saying how many of its trees were unchanged.
    assert sum(int(n) for n in re.findall(r"(\d+) tree\(s\) unchanged", said)) == len(bracket_sweep.releases), said
    assert not PROBING.search(said), said
    for experiment in EXPERIMENTS:
        assert (tmp_path / f"sweep-{experiment}.json").read_bytes() == \
            (bracket_sweep.runs / f"sweep-{experiment}.json").read_bytes()
