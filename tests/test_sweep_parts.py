"""The sweep split by era (CI fan-out): which releases each era's job probes, and merging the parts."""

from __future__ import annotations

import json

import pytest
from synthetic import REGISTRY, make_project

from pdevidence import cli, registry
from pdevidence.core import errors
from pdevidence.documents.tables import ReleaseOutcome, SweepParameters, SweepTable
from pdevidence.documents.vocabulary import Classification
from pdevidence.lanes import sweep, sweep_parts

ERAS = REGISTRY + """
[eras.old]
releases = "<1.0.0"
constraints = "constraints/old.txt"
"""


@pytest.fixture
def reg(tmp_path):
    project = make_project(tmp_path / "project", ERAS)
    (project / "constraints" / "old.txt").write_text("")
    return registry.load(project)


def part(reg, era: str, *releases: tuple[str, Classification], as_of: str = "2026-10-01T00:00:00Z",
         references: dict | None = None) -> None:
    """A part as `sweep --era` writes it in this checkout."""
    outcomes = [ReleaseOutcome(v, c) for v, c in releases]
    path = sweep_parts.part_dir(reg.root / "runs", era) / "sweep-demo.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    parameters = SweepParameters(explicit=False, pre=False, floor="1.0.0",
                                 references=references or {"demo.base.release-1.0.0.json": "a" * 64})
    path.write_text(json.dumps(sweep.document("demo", outcomes, as_of, sweep.made_by(reg, ["demo"]), parameters)))


def test_each_era_job_probes_its_own_releases_and_current_the_rest(reg):
    versions = ["0.9.0", "0.9.5", "1.0.0", "1.1.0"]
    assert sweep_parts.era_names(reg) == ["current", "old"]
    assert sweep_parts.in_era(reg, "old", versions) == ["0.9.0", "0.9.5"]
    assert sweep_parts.in_era(reg, "current", versions) == ["1.0.0", "1.1.0"]
    with pytest.raises(errors.HarnessError, match="unknown era 'older'") as err:
        sweep_parts.in_era(reg, "older", versions)
    assert err.value.code == errors.USAGE


def test_merged_parts_are_the_table_one_sweep_would_write(reg, monkeypatch, capsys):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(reg.root / "runs"))
    part(reg, "current", ("1.1.0", Classification.FIXED), ("1.0.0", Classification.PRE_FIX),
         as_of="2026-10-01T00:00:00Z")
    part(reg, "old", ("0.9.0", Classification.PRE_FIX), as_of="2025-01-01T00:00:00Z")
    assert cli.main(["--root", str(reg.root), "sweep-merge"]) == errors.CONFIRMED
    table = json.loads((reg.root / "runs" / "sweep-demo.json").read_text())
    assert [r["version"] for r in table["releases"]] == ["0.9.0", "1.0.0", "1.1.0"]
    assert (table["first_fixed"], table["as_of"]) == ("1.1.0", "2026-10-01T00:00:00Z")
    assert table["parameters"]["explicit"] is False
    assert "first fixed release: 1.1.0" in capsys.readouterr().out


def test_a_release_that_lost_its_fix_in_any_part_fails_the_merge(reg, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(reg.root / "runs"))
    part(reg, "old", ("0.9.0", Classification.FIXED))
    part(reg, "current", ("1.0.0", Classification.PRE_FIX), ("1.1.0", Classification.ERROR))
    assert cli.main(["--root", str(reg.root), "sweep-merge"]) == errors.RELEASE_WATCH
    table = json.loads((reg.root / "runs" / "sweep-demo.json").read_text())
    assert (table["regressions"], table["flagged"]) == (["1.0.0"], ["1.0.0", "1.1.0"])


def test_a_missing_era_part_is_refused_naming_it(reg, monkeypatch, capsys):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(reg.root / "runs"))
    part(reg, "current", ("1.0.0", Classification.PRE_FIX), ("1.1.0", Classification.FIXED))
    assert cli.main(["--root", str(reg.root), "sweep-merge"]) == errors.INCOMPLETE == 4
    err = capsys.readouterr().err
    assert "the sweep is missing era parts: old (runs/sweep-parts/old/sweep-demo.json)" in err
    assert "--partial" in err
    assert not (reg.root / "runs" / "sweep-demo.json").exists()


def test_a_partial_merge_records_the_missing_era_and_says_partial(reg, monkeypatch, capsys):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(reg.root / "runs"))
    part(reg, "current", ("1.0.0", Classification.PRE_FIX), ("1.1.0", Classification.FIXED))
    assert cli.main(["--root", str(reg.root), "sweep-merge", "--partial"]) == errors.CONFIRMED
    assert "PARTIAL SWEEP (no part for era old)" in capsys.readouterr().out
    table = SweepTable.load(reg.root / "runs" / "sweep-demo.json")
    assert table.parameters.missing_eras == ("old",) and table.partial == "no part for era old"


def test_an_era_with_no_release_writes_an_empty_part_the_merge_counts_as_there(reg, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(reg.root / "runs"))
    monkeypatch.setattr(sweep, "default_releases", lambda reg, pre=False, experiments=None: ["1.0.0", "1.1.0"])
    monkeypatch.setattr(sweep.trees, "index_files", lambda project: [])
    monkeypatch.setattr(sweep, "references", lambda reg, exp, published, fresh=False: sweep.References(
        {}, {"demo.base.release-1.0.0.json": "a" * 64}))
    monkeypatch.setattr(sweep, "_warm", lambda *a, **kw: pytest.fail("no release to probe: no engine"))
    assert cli.main(["--root", str(reg.root), "sweep", "--era", "old"]) == errors.CONFIRMED
    empty = SweepTable.load(sweep_parts.part_file(reg.root / "runs" / sweep_parts.PARTS, "old", "demo"))
    assert empty.releases == [] and empty.flagged == []
    part(reg, "current", ("1.0.0", Classification.PRE_FIX), ("1.1.0", Classification.FIXED))
    merged = sweep_parts.merge(reg, reg.root / "runs" / sweep_parts.PARTS, ["demo"])["demo"]
    assert [o.version for o in merged.outcomes] == ["1.0.0", "1.1.0"] and merged.parameters.missing_eras == ()


def test_a_part_under_no_era_of_the_registry_is_refused(reg):
    part(reg, "current", ("1.0.0", Classification.PRE_FIX))
    part(reg, "old", ("0.9.0", Classification.PRE_FIX))
    part(reg, "sweep-part-sweep-era-old", ("0.9.5", Classification.PRE_FIX))
    with pytest.raises(errors.HarnessError, match="sweep parts of no era of the registry.*sweep-part-sweep-era-old") \
            as err:
        sweep_parts.merge(reg, reg.root / "runs" / sweep_parts.PARTS, ["demo"])
    assert err.value.code == errors.USAGE


def test_a_release_in_two_parts_or_no_part_at_all_is_refused(reg):
    parts = reg.root / "runs" / sweep_parts.PARTS
    with pytest.raises(errors.HarnessError, match="no sweep part for demo") as err:
        sweep_parts.merge(reg, parts, ["demo"], partial=True)
    assert err.value.code == errors.INCOMPLETE
    part(reg, "old", ("0.9.0", Classification.PRE_FIX))
    part(reg, "current", ("0.9.0", Classification.PRE_FIX))
    with pytest.raises(errors.HarnessError, match="0.9.0 is in two sweep parts") as err:
        sweep_parts.merge(reg, parts, ["demo"])
    assert err.value.code == errors.USAGE


def test_parts_made_by_another_checkout_or_judged_against_other_results_are_refused(reg):
    parts = reg.root / "runs" / sweep_parts.PARTS
    part(reg, "old", ("0.9.0", Classification.PRE_FIX))
    part(reg, "current", ("1.0.0", Classification.PRE_FIX), references={"demo.base.release-1.0.0.json": "b" * 64})
    with pytest.raises(errors.HarnessError, match="judged against other base and head results") as err:
        sweep_parts.merge(reg, parts, ["demo"])
    assert err.value.code == errors.STALE
    part(reg, "current", ("1.0.0", Classification.PRE_FIX))
    (reg.root / "probes" / "engine.py").write_text("# another engine\n")
    with pytest.raises(errors.HarnessError, match="probes/engine.py: made by another driver") as err:
        sweep_parts.merge(reg, parts, ["demo"])
    assert err.value.code == errors.STALE
