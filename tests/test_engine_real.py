"""The warm engine on real SGLang releases: the same documents a fresh process writes, and a cached rerun.

Slow (``--sglang``): the session's bracket sweep (``bracket_sweep``: ``sweep --force`` of every bracket release
through the warm engine) is held to one ``sweep --cold`` of the newest bracket release of each era (a fresh probe
process per release, each in its own environment: every era's engine against fresh processes; every bracket
release's engine run is held to the matrix's lone probes in ``test_one_process_real.py``), each into its own runs
directory; the tests compare what those runs wrote.
"""

from __future__ import annotations

import json
import re

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT
from real_runs import cli_run, each_era_newest

pytestmark = pytest.mark.sglang

EXPERIMENTS = list(registry.load(PROJECT).experiments)
EACH_ERA = each_era_newest(registry.load(PROJECT))
PROBING = re.compile(r"engine( \([^)]*\))?: probing")  # an engine (today's closure's, or an era's) probing trees


def sweep(runs, versions, *argv):
    done = cli_run(runs, "sweep", *argv, *versions, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def cold(bracket_sweep, tmp_path_factory):
    runs = tmp_path_factory.mktemp("cold")
    return runs, sweep(runs, EACH_ERA, "--cold")


def rows(table: str, versions: list[str]) -> list[dict]:
    return [row for row in json.loads(table)["releases"] if row["version"] in versions]


def test_the_engine_writes_what_a_fresh_process_writes_on_each_era(bracket_sweep, cold):
    """Alone proves: the warm engine (a forked child per tree, SGLang's closure imported once) writes, byte for
    byte, the result documents a fresh process per release writes, and the same sweep rows, in every era."""
    runs, said_cold = cold
    assert PROBING.search(bracket_sweep.said) and not PROBING.search(said_cold)
    for version in EACH_ERA:
        for experiment in EXPERIMENTS:
            fresh = runs / "sweep" / f"release-{version}" / f"{experiment}.json"
            assert bracket_sweep.result(version, experiment).read_bytes() == fresh.read_bytes(), \
                f"{experiment} on {version}"
    for experiment in EXPERIMENTS:
        warm = (bracket_sweep.runs / f"sweep-{experiment}.json").read_text()
        assert rows(warm, EACH_ERA) == rows((runs / f"sweep-{experiment}.json").read_text(), EACH_ERA), experiment


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
