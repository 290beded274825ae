"""The backport corpus on real SGLang releases: each fix ported into a release of every era reads `fixed`,
its partial port `partial`, the release as published `affected`.

Slow (``--sglang``): one ``corpus`` run (every declared release, three trees each, one warm engine per era)
into a temporary runs directory; the tests read what that run wrote. A fix no backport file ports (the
decode-offload ones have none yet) is expected, on all three trees, to read what the published sweep reads on
the release (``lanes/corpus.py``): porting one fix must not move another's answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT
from pdevidence.sources import backports

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    env = {**os.environ, "PDEVIDENCE_RUNS": str(runs), "PYTHONPATH": str(PROJECT)}
    done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(PROJECT), "corpus"],
                          env=env, capture_output=True, text=True, timeout=3600)
    doc = json.loads((runs / "corpus.json").read_text()) if (runs / "corpus.json").exists() else None
    return done, doc


def test_every_answer_is_the_expected_one(corpus):
    """Alone proves: `check`'s judge sees each ported fix in a real release that carries it (fixed), not in the
    release as published (affected) and half in a partial port (partial), in every era's closure; and a fix
    not ported reads on the three trees what the sweep reads on the release."""
    done, doc = corpus
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    wrong = [a for a in doc["answers"] if a["status"] != a["expected"]]
    assert wrong == []


def test_each_fix_is_ported_fully_and_partially_into_a_release_of_every_era(corpus):
    """Alone proves: the corpus covers every PD era for each fix it ports, and each ported fix's three trees
    read affected, fixed and partial. Only the fixes some backport file ports: a decode-offload fix cannot be
    ported into the eras before the offload manager (0.5.3), and none is ported yet."""
    _, doc = corpus
    reg = registry.load(PROJECT)
    ported = {(b.release, name) for b in backports.load_all(PROJECT, list(reg.experiments)) for name in b.ports}
    for name in sorted({name for _, name in ported}):
        eras = {a["era"] or "current" for a in doc["answers"]
                if a["experiment"] == name and (a["release"], name) in ported}
        before_pd = reg.era_of(reg.release_floor).name  # the sweep's floor: the last release without PD
        pd_eras = {"current", *(era for era in reg.eras if era != before_pd)}
        assert eras == pd_eras, f"{name}: no backport in era(s) {sorted(pd_eras - eras)}"
    statuses = {(a["variant"], a["status"]) for a in doc["answers"] if (a["release"], a["experiment"]) in ported}
    assert statuses == {("pristine", "affected"), ("backport", "fixed"), ("partial", "partial")}
