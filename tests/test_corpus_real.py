"""The backport corpus on real SGLang releases: each fix ported into a release of every era reads `fixed`,
its partial port `partial` (`fixed` where no partial port exists), the release as published `affected`.

Slow (``--sglang``): one ``corpus`` run (every declared release, three trees each, one warm engine per era)
into a temporary runs directory; the tests read what that run wrote. A fix a backport file does not port is
expected, on all three trees, to read what the published sweep reads on the release (``lanes/corpus.py``):
porting one fix must not move another's answer, unless the port declares it does.
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

pytestmark = [pytest.mark.sglang, pytest.mark.scheduled]  # the scheduled lane (--scheduled)
# Eras that lack a fix and have no port of it yet, and why: the gap stays visible here until it is closed.
NOT_PORTED = {
    ("offload_rid", "torch2.9-tf5"): "0.5.10's #37026 port would sit on the #24226 port; their two partial ports "
                                     "together leave the R2 control departing (corpus.md)",
    ("offload_rid", "torch2.11-tf5-sgl-kernel"): "as 0.5.10: 0.5.12's manager is the same file",
    # #27372 is ported into 0.4.10, 0.5.3, 0.5.5.post3, 0.5.7 and 0.5.9 too, #35049 on it into 0.4.10, 0.5.3, 0.5.9
    # and 0.5.10 (issue 44).
    ("deferred_release_nixl", "torch2.11-tf5-sgl-kernel"): "not yet: 0.5.12-0.5.15.post1, read pre-fix from this "
                                                          "round, have no NIXL ABORT handler (#30352) for the hold "
                                                          "to wait on",
    ("retract_resume", "torch2.7-tf4"): "no partial port to tell: 0.4.8-0.4.10.post2 commit only the hidden states "
                                        "from the slot (no top-k), so copying them is the whole fix",
    # Issue 43's SWA fixes are ported into 0.5.9, 0.5.10 and 0.5.12 (#27779) and 0.5.12 (#25805), with no partial
    # port (partial = []: each is one clause).
    ("swa_free", "torch2.11-tf5"): "not yet: issue 43 ports #27779 into 0.5.9, 0.5.10 and 0.5.12; 0.5.13 and "
                                   "0.5.13.post1 (free_swa in allocator/swa.py, the fix's parent as published) would "
                                   "take the fix's own diff",
    # #26380 is ported into 0.5.9, 0.5.10 and 0.5.12 (torch2.9-tf4 to torch2.11-tf5-sgl-kernel).
    **{("war_barrier", era): "not yet: up to 0.5.3 the overlap worker's own thread (TpModelWorkerClient; in 0.3.x "
                             "TpModelWorker's forward_thread) launches "
                             "each forward from a queue, so a wait in the scheduler's loop fences only forwards "
                             "already launched; a port needs the worker's launch_done first, and the probe's "
                             "scheduler has no tp_worker to record it"
       for era in ("torch2.5-tf4-vllm", "pre-pd", "torch2.5-tf4.48", "torch2.5-tf4", "torch2.6-tf4", "torch2.7-tf4")},
    ("war_barrier", "torch2.8-tf4"): "not yet: 0.5.3 runs the thread-based worker (as torch2.7-tf4); 0.5.3.post1 "
                                     "to 0.5.5.post3 schedule on the default stream their init takes "
                                     "(self.default_stream; no device_module to ask), a stream the probe's "
                                     "scheduler refuses (it did not make it): a port's wait there raises",
    ("deferred_release_nixl", "torch2.9-tf5"): "not yet: 0.5.10-0.5.11, pre-fix since X9 drives their sender (issue "
                                               "44), have neither the NIXL ABORT handler (#30352) nor the transfer "
                                               "worker the hold and its drain ack are built on",
    ("deferred_release_nixl", "torch2.11-tf5"): "0.5.16's NIXL worker keeps no per-room count of outstanding chunks, "
                                                "the count #35360's drain ack is built on (0.5.18 has it)",
}


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


def test_each_fix_is_ported_fully_and_partially_into_a_release_of_every_era_that_lacks_it(corpus):
    """Alone proves: for each fix, the corpus ports it into a release of every era in which the published sweep
    finds a release without it but those NOT_PORTED names (a decode-offload fix has no era before 0.5.10: those
    releases lack the code path), and each ported fix's three trees read affected, fixed and partial (fixed, where
    its port declares that no partial port exists)."""
    _, doc = corpus
    reg = registry.load(PROJECT)
    ported = {(b.release, name) for b in backports.load_all(PROJECT, list(reg.experiments)) for name in b.ports}

    def era(version: str) -> str:
        return reg.era_of(version).name if reg.era_of(version) else "current"

    for name in reg.experiments:
        sweep = json.loads((PROJECT / "results" / f"sweep-{name}.json").read_text())
        lacking = {era(r["version"]) for r in sweep["releases"] if r["classification"] == "pre-fix"}
        eras = {a["era"] or "current" for a in doc["answers"]
                if a["experiment"] == name and (a["release"], name) in ported}
        gaps = {era for (fix, era) in NOT_PORTED if fix == name}
        assert eras == lacking - gaps, f"{name}: no backport in era(s) {sorted(lacking - gaps - eras)}"
    whole = {(b.release, name) for b in backports.load_all(PROJECT, list(reg.experiments))
             for name, port in b.ports.items() if not port.has_partial}
    statuses = {(a["variant"], a["status"], (a["release"], a["experiment"]) in whole) for a in doc["answers"]
                if (a["release"], a["experiment"]) in ported}
    assert statuses == {("pristine", "affected", False), ("backport", "fixed", False), ("partial", "partial", False),
                        ("pristine", "affected", True), ("backport", "fixed", True), ("partial", "fixed", True)}
