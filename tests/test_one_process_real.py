"""One process, same answers: the warm engine runs every probe of a tree in one process; a cell runs one probe per
process.

Slow (``--sglang``), and it runs nothing of its own: it reads two of the session's shared runs. The bracket sweep
(``bracket_sweep``) probed every bracket release through the warm engine, all experiments in one process per
release (``probes/probe_all.py``, in a child of the engine, as ``check`` runs it); the release matrix
(``release_matrix``) ran each experiment's probe alone, in its own fresh process, on its base and head release,
as a cell runs it. The test compares what those runs wrote, scenario by scenario and key by key, with compare's
typed equality (``true`` is not ``1``): every published reference was made one probe per process, so check and
the sweep judge a tree fairly only if the two give the same observations on the releases the references were
made on.
"""

from __future__ import annotations

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT
from pdevidence.documents import results
from pdevidence.judge.compare import same
from real_runs import bracket_cells

pytestmark = pytest.mark.sglang

CELLS = bracket_cells(registry.load(PROJECT))


def differences(together: dict, alone: dict) -> list[str]:
    """Every scenario, observation key and error on which the two runs disagree (typed)."""
    out = []
    for sid in sorted(set(together["scenarios"]) | set(alone["scenarios"])):
        one, own = together["scenarios"].get(sid), alone["scenarios"].get(sid)
        if one is None or own is None:
            out.append(f"{sid}: only {'alone' if one is None else 'together'}")
            continue
        for key in sorted(set(one["observed"]) | set(own["observed"])):
            a, b = one["observed"].get(key, "<missing>"), own["observed"].get(key, "<missing>")
            if not same(a, b):
                out.append(f"{sid}.{key}: together {a!r}, alone {b!r}")
        if not same(one.get("error"), own.get("error")):
            out.append(f"{sid}: error together {one.get('error')!r}, alone {own.get('error')!r}")
    return out


@pytest.mark.parametrize(("experiment", "side", "version"), CELLS, ids=[f"{e}-{s}-{v}" for e, s, v in CELLS])
def test_the_engine_observes_in_one_process_what_each_probe_observes_alone(bracket_sweep, release_matrix,
                                                                          experiment, side, version):
    """Alone proves: all probes imported together in one engine child observe, key by key, what each probe
    observes alone in a fresh process, on every release a reference is made on (no probe leaks into another)."""
    together = results.load(bracket_sweep.result(version, experiment), experiment=experiment)
    alone = release_matrix.result(experiment, side)
    assert together["scenarios"], "the engine ran no scenario"
    assert differences(together, alone) == [], f"{experiment} on {version}"
    assert together["sglang_version"] == alone["sglang_version"] == version
