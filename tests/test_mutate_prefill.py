"""The prefill probe's adequacy: its scenarios match the registry, and a head tree
without the fix's gates shows the base behaviour end to end (not a crash)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdevidence import environments, registry
from pdevidence.cells import cells
from pdevidence.core.locking import exclusive
from pdevidence.core.paths import PROJECT, work_dir

sys.path.insert(0, str(PROJECT / "probes"))

import _probekit  # noqa: E402

REG = registry.load(PROJECT)
PREFILL = REG.experiment("prefill")


def test_every_prefill_scenario_is_expected_and_every_expectation_runs():
    scenario_set, _prepare = _probekit.load_probe(PREFILL.probe)  # no SGLang import until prepare()
    assert [sc.id for sc in scenario_set.scenarios] and {sc.id for sc in scenario_set.scenarios} == set(PREFILL.expect)


# Every gate of the fix asks is_aborted; answering False for all at once (the registry's
# edits each remove one gate, and edits of one function do not compose) leaves the old paths.
GATES_OFF = {"id": "gates_off", "title": "every gate of the fix removed", "kind": "removes-fix",
             "target": "sglang.srt.disaggregation.utils:is_aborted", "operator": "constant", "value": False}


@pytest.mark.sglang
def test_head_without_its_gates_runs_the_old_paths_to_the_base_expectations(tmp_path):
    """Alone proves: the prefill probe is adequate end to end: its head release with every gate of the fix
    removed at once (no single registry mutant can: edits of one function do not compose) runs the old paths to
    the base expectations, every scenario without an error. Specific to prefill's probe and its gates."""
    cell = cells.Cell("prefill", "head", "release")
    tree = cells.resolve_tree(REG, cell)
    slug = cells.cell_slug(REG, cell, tree)
    specs, out = tmp_path / "specs.json", tmp_path / "out.json"
    specs.write_text(json.dumps([GATES_OFF]))
    with exclusive(work_dir(REG.root) / "locks" / f"{slug}.lock", f"cell {cell.name}"):
        env = environments.cell_environment(REG, tree, slug)
        done = subprocess.run([str(env.interpreter), str(PROJECT / "probes" / "probe_mutants.py"), "--probe",
                               str(PREFILL.probe), "--mutants", str(specs), "--out", str(out)],
                              capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(out.read_text())["mutants"]["gates_off"]
    assert run["status"] == "applied", run["error"]
    for sid, expect in PREFILL.expect.items():
        scenario = run["scenarios"][sid]
        assert scenario["error"] is None, (sid, scenario["error"])
        assert {k: scenario["observed"].get(k, "<missing>") for k in expect.base} == expect.base, sid
