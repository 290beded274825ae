"""An experiment whose code path is older than PD sweeps from its own floor; the others keep the registry's."""

from __future__ import annotations

import pytest
from synthetic import REGISTRY, make_project, result_doc

from pdevidence import registry
from pdevidence.cells import allprobes
from pdevidence.documents.vocabulary import Classification
from pdevidence.lanes import sweep

# A second experiment, ``old``, reads back to 0.9.0: below the registry's floor (1.0.0), which ``demo`` keeps.
OLDER = REGISTRY + REGISTRY.split("[experiments.demo]", 1)[1].join(["\n[experiments.demo]", ""]).replace(
    "experiments.demo", "experiments.old").replace('probe = "probes/probe_demo.py"',
                                                   'probe = "probes/probe_demo.py"\nrelease_floor = "0.9.0"')
WHEELS = [{"filename": f"sglang-{v}-py3-none-any.whl", "upload-time": f"2026-01-0{i}T00:00:00Z"}
          for i, v in enumerate(("0.8.0", "0.9.0", "0.9.5", "1.0.0", "1.1.0"), 1)]


PROBED: list[str] = []  # the releases the engine was asked for, in the order asked
ASKED: dict[str, list[str]] = {}  # per release, the experiments it was probed for


@pytest.fixture
def reg(tmp_path, monkeypatch):
    reg = registry.load(make_project(tmp_path / "project", OLDER))
    probed = PROBED
    probed.clear()
    ASKED.clear()

    def probe(reg, versions, wanted, lock, out_dir, jobs, force, log):
        probed.extend(versions)
        ASKED.update({v: wanted[v] for v in versions})
        return {v: ({name: allprobes.Outcome(name, result_doc("base", v)) for name in wanted[v]}, None)
                for v in versions}

    monkeypatch.setattr(sweep.trees, "index_files", lambda project: WHEELS)
    monkeypatch.setattr(sweep.trees, "release_tree", lambda version, python, lock: version)
    monkeypatch.setattr(sweep, "references", lambda reg, exp, published, fresh=False: sweep.References(
        {"base": result_doc("base", "1.0.0"), "head": result_doc("head", "1.1.0")}, {}))
    monkeypatch.setattr(sweep, "_warm", lambda reg, versions, *a: probe(reg, versions, *a))
    return reg


def versions(found, name):
    return [o.version for o in found[name]]


def test_the_registry_reads_both_experiments_with_their_floors(reg):
    assert set(reg.experiments) == {"demo", "old"}
    assert (reg.floor("demo"), reg.floor("old")) == ("1.0.0", "0.9.0")
    assert sweep.lowest_floor(reg) == "0.9.0" and sweep.lowest_floor(reg, ["demo"]) == "1.0.0"


def test_a_default_sweep_probes_from_the_lowest_floor_and_each_experiment_keeps_its_own(reg, tmp_path):
    found, _, _ = sweep.sweep(reg, ["demo", "old"], published=tmp_path, out_dir=tmp_path)
    assert PROBED == ["0.9.0", "0.9.5", "1.0.0", "1.1.0"]  # never 0.8.0: below every floor
    # Below demo's floor only old is probed: nothing is probed to be discarded.
    assert ASKED == {"0.9.0": ["old"], "0.9.5": ["old"], "1.0.0": ["demo", "old"], "1.1.0": ["demo", "old"]}
    assert versions(found, "old") == ["0.9.0", "0.9.5", "1.0.0", "1.1.0"]
    assert versions(found, "demo") == ["1.0.0", "1.1.0"]
    assert all(o.classification is Classification.PRE_FIX for o in found["old"])


def test_a_sweep_of_the_registry_floors_experiment_alone_never_probes_below_it(reg, tmp_path):
    found, _, _ = sweep.sweep(reg, ["demo"], published=tmp_path, out_dir=tmp_path)
    assert PROBED == ["1.0.0", "1.1.0"] and versions(found, "demo") == ["1.0.0", "1.1.0"]


def test_releases_named_on_the_command_line_are_read_by_every_experiment(reg, tmp_path):
    found, _, _ = sweep.sweep(reg, ["demo", "old"], published=tmp_path, out_dir=tmp_path, versions=["0.9.5", "1.1.0"])
    assert versions(found, "demo") == versions(found, "old") == ["0.9.5", "1.1.0"]
    assert ASKED == {"0.9.5": ["demo", "old"], "1.1.0": ["demo", "old"]}
    # An era's part is the default list cut to the era: floored, though its versions are passed in.
    floored, _, _ = sweep.sweep(reg, ["demo", "old"], published=tmp_path, out_dir=tmp_path,
                                versions=["0.9.5", "1.1.0"], floored=True)
    assert versions(floored, "demo") == ["1.1.0"] and versions(floored, "old") == ["0.9.5", "1.1.0"]
    assert ASKED == {"0.9.5": ["old"], "1.1.0": ["demo", "old"]}


def test_a_floored_release_below_every_swept_floor_is_not_probed_at_all(reg, tmp_path):
    found, _, _ = sweep.sweep(reg, ["demo"], published=tmp_path, out_dir=tmp_path, versions=["0.9.5", "1.1.0"],
                              floored=True)
    assert PROBED == ["1.1.0"] and versions(found, "demo") == ["1.1.0"]


def test_a_release_that_could_not_be_made_ready_fails_only_for_the_experiments_it_was_probed_for(reg, tmp_path,
                                                                                                monkeypatch):
    monkeypatch.setattr(sweep, "_warm", lambda reg, versions, wanted, *a: {v: ("no wheel", None) for v in versions})
    found, _, _ = sweep.sweep(reg, ["demo", "old"], published=tmp_path, out_dir=tmp_path)
    assert versions(found, "old") == ["0.9.0", "0.9.5", "1.0.0", "1.1.0"] and versions(found, "demo") == ["1.0.0",
                                                                                                            "1.1.0"]
    assert {o.classification for o in found["old"] + found["demo"]} == {Classification.FAILED}
