"""What the real tests (``--sglang``) share: the registry's bracket releases, the command line in its own process,
and where the answer of the decode-offload experiments is known.

The session's shared real runs (the release matrix, one sweep of every bracket release) are fixtures in
``conftest.py``; they use these.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from packaging.version import Version

from pdevidence import registry
from pdevidence.core.paths import PROJECT


# What `check` answers, with its defaults (CUDA; each gate as the release ships it), on the releases the real tests
# check: a fix present but off reads affected. 0.5.20: admission is fixed from 0.5.21; prefill from 0.5.20,
# offload_slots from 0.5.13, offload_rid from 0.5.19, abort_notify from 0.5.13, retract_resume from 0.5.12,
# grammar_release from 0.5.16, swa_free from 0.5.14, swa_tail from 0.5.12.post1, war_barrier from 0.5.13 (on CUDA,
# where it always runs); the deferred releases carried behind their gate, off by default. 0.5.21 turns them on.
CHECKED = {"0.5.20": {"admission": "affected", "prefill": "fixed", "offload_slots": "fixed", "offload_rid": "fixed",
                      "abort_notify": "fixed", "deferred_release": "affected", "deferred_release_nixl": "affected",
                      "retract_resume": "fixed", "grammar_release": "fixed", "swa_free": "fixed", "swa_tail": "fixed",
                      "war_barrier": "fixed"}}
CHECKED["0.5.21"] = {**CHECKED["0.5.20"], "admission": "fixed", "deferred_release": "fixed",
                     "deferred_release_nixl": "fixed"}


def bracket_releases(reg: registry.Registry) -> list[str]:
    """Every experiment's release bracket (the last release without its fix, the first with it), oldest first."""
    return sorted({v for exp in reg.experiments.values() for v in exp.releases.values() if v}, key=Version)


def each_era_newest(reg: registry.Registry) -> list[str]:
    """The newest bracket release of each era the bracket releases are in, oldest first: where the default lane holds
    a run to its twin (contained or not, warm engine or fresh process), the scheduled lane taking every release."""
    brackets = bracket_releases(reg)
    return sorted({max((v for v in brackets if reg.era_of(v) == reg.era_of(version)), key=Version)
                   for version in brackets}, key=Version)


def bracket_cells(reg: registry.Registry) -> list[tuple[str, str, str]]:
    """(experiment, side, release) of every release-backed cell of the matrix, in the registry's order."""
    return [(name, side, exp.releases[side]) for name, exp in reg.experiments.items() for side in ("base", "head")
            if exp.releases.get(side)]


def cli_run(runs: Path, *argv: str, extra_env: Mapping[str, str] | None = None,
            timeout: float = 3600) -> subprocess.CompletedProcess:
    """``python -m pdevidence --root <project> ...`` in its own process, writing to ``runs``."""
    env = {**os.environ, "PDEVIDENCE_RUNS": str(runs), "PYTHONPATH": str(PROJECT), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(PROJECT), *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)


# The decode-offload experiments, and from which release on their probes' answer is known from the wheels
# (docs/maintainers/offload.md). Below 0.5.3 no release has a DecodeKVCacheOffloadManager: not affected. From
# 0.5.3 the manager ships, first offloading only finished requests; where offloading while decoding starts
# (somewhere after 0.5.4.post3, by 0.5.12) was not read release by release, and the published sweep does not
# classify these experiments yet: on those releases the real tests assert nothing of them but what they are about.
OFFLOAD_KNOWN_FROM = {"offload_slots": "0.5.12",  # its base release
                      "offload_rid": "0.5.13"}  # 0.5.12 predates #24226: its acknowledgements release otherwise
MANAGER_FIRST = "0.5.3"


# The transfer probes read every PD release (docs/maintainers/abort_notify.md, transfer.md, deferred_release_nixl.md)
# and their answers are pinned. abort_notify and deferred_release drive the old decodes' timeout and a client abort
# (N4 and N12, D9 and D10); deferred_release_nixl a client abort (X10), and its whole loop (X9) through a prefill
# sender posting its chunks itself where there is no transfer worker (0.5.5.post1 to 0.5.11).
# 0.5.8's paged allocator launches a Triton kernel with no CPU implementation in its module (the SWA sweeps: error).
# war_barrier answers on every release with PD (0.4.4.post2-0.4.5.post2: the plain loop, their PD loops absent).
UNANSWERED = {"swa_free": [("0.5.8", "0.5.9")],
              "swa_tail": [("0.5.8", "0.5.9")]}


def answer_known(experiment: str, version: str) -> bool:
    """Whether the real tests may pin what ``experiment`` answers on release ``version``: always for the
    experiments the published sweep classifies on every release; for the offload ones, outside 0.5.3 up to
    OFFLOAD_KNOWN_FROM; for the others listed, outside their UNANSWERED ranges (where the sweep reads error or
    neither)."""
    if experiment in UNANSWERED:
        return not any(Version(low) <= Version(version) < Version(high) for low, high in UNANSWERED[experiment])
    if experiment not in OFFLOAD_KNOWN_FROM:
        return True
    v = Version(version)
    return v < Version(MANAGER_FIRST) or v >= Version(OFFLOAD_KNOWN_FROM[experiment])
