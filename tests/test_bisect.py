"""bisect: the fix commit and the introducing one, found by behaviour on a line of commits.

The search is tested alone (a function from commit to side); the command on git histories the tests
build, where each commit's ``python/sglang/state.json`` says how each experiment behaves there and a
stand-in for check's judge reads it (every commit still exported from the clone as ``check --git`` does);
and once end to end, through the warm engine with this interpreter and the door probe.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from schemas import problems
from synthetic import REGISTRY, make_project, write_cell, write_sweep, write_table
from test_forks import git, make_fork, quiet_git, world  # noqa: F401 (fixtures)

from pdevidence import cli
from pdevidence.core import errors
from pdevidence.documents import integrity
from pdevidence.documents.bisects import BisectDocument, BoundaryReport
from pdevidence.documents.vocabulary import Behaviour, GateState
from pdevidence.documents.vocabulary import CheckStatus as Status
from pdevidence.lanes import bisect_run, check
from pdevidence.lanes.bisect import SKIP_LIMIT, Boundary, Finding, Outcome, Search, Seen, watch
from pdevidence.sources.history import Commit, pr_of

FIXED, PRE, CLEAN, SKIP = Seen(Outcome.FIXED), Seen(Outcome.PRE_FIX), Seen(Outcome.NOT_AFFECTED), \
    Seen(Outcome.SKIPPED, "cannot run: no module named vendor")


# --- the search alone ------------------------------------------------------------------------------


def search(sides: list[Seen], boundary: Boundary = Boundary.FIX, history_ends: bool = False):
    """Bisect a line whose commit ``c<i>`` behaves as ``sides[i]``; the answer, and the commits probed in order."""
    line = [f"c{i}" for i in range(len(sides))]
    found = Search(boundary, line, history_ends)
    probed = []
    while (sha := found.next()) is not None:
        probed.append(sha)
        found.record(sha, sides[int(sha[1:])])
    return found.answer(), probed


def test_a_clean_bracket_is_narrowed_to_the_first_fixed_commit_in_log_steps():
    answer, probed = search([PRE] * 37 + [FIXED] * 27)
    assert (answer.finding, answer.commit, answer.parent) == (Finding.FOUND, "c37", "c36")
    assert probed[:2] == ["c63", "c0"] and len(probed) <= 2 + 6  # both ends, then log2(64) steps


def test_a_commit_that_cannot_run_is_skipped_and_the_range_it_leaves_is_named():
    answer, probed = search([PRE, PRE, SKIP, SKIP, FIXED, FIXED])
    assert answer.finding is Finding.NOT_NARROWED
    assert answer.unnarrowed == ("c2", "c3", "c4")  # the fix is one of them
    assert "2 commit(s) between c1 (pre-fix) and c4 (fixed) were skipped" in answer.why


def test_a_skipped_commit_beside_the_boundary_does_not_hide_it():
    answer, probed = search([PRE, SKIP, PRE, PRE, FIXED, FIXED, SKIP, FIXED])
    assert (answer.finding, answer.commit, answer.parent) == (Finding.FOUND, "c4", "c3")


def test_a_run_of_skipped_commits_is_jumped_over_not_walked():
    answer, probed = search([PRE] * 20 + [SKIP] * 40 + [PRE] * 10 + [FIXED] * 10)
    assert (answer.finding, answer.commit) == (Finding.FOUND, "c70")
    assert len(probed) <= 12  # the middle is skipped: the next tries are far from it, not beside it


def test_a_bracket_of_thousands_no_probe_can_judge_is_named_after_the_skip_limit_not_walked():
    sides = [PRE, *[SKIP] * 5000, FIXED]
    answer, probed = search(sides)
    assert len(probed) == 2 + SKIP_LIMIT  # both ends, then the limit
    assert (answer.finding, len(answer.unnarrowed)) == (Finding.NOT_NARROWED, 5001)
    assert f"5000 commit(s) between c0 (pre-fix) and c5001 (fixed) {SKIP_LIMIT} skipped, {5000 - SKIP_LIMIT} not " \
        "probed" in answer.why


def test_a_range_not_narrowed_is_named_commit_by_commit_up_to_a_limit_then_by_its_ends():
    commits = tuple(Commit(f"{i:040x}", f"work {i}", "2026-01-01T00:00:00+00:00", None) for i in range(20))
    report = BoundaryReport(Boundary.INTRODUCED, "sweep", Finding.NOT_NARROWED, unnarrowed=commits,
                            unnarrowed_commits=20)
    shown = [line for line in report.lines() if line.startswith("    one of: ") or "more" in line]
    assert len(shown) == 11 and shown[5] == "    ... 10 more"  # the text: the first and last five
    assert shown[0].startswith(f"    one of: {commits[0].sha[:12]}") and commits[-1].sha[:12] in shown[-1]
    assert len(report.to_json()["unnarrowed"]) == 20
    ends = BoundaryReport(Boundary.INTRODUCED, "sweep", Finding.NOT_NARROWED, unnarrowed=(commits[0], commits[-1]),
                          unnarrowed_commits=12564)
    assert f"    one of the 12564 commits from: {commits[0].sha[:12]}" in "\n".join(ends.lines())
    assert BoundaryReport.from_doc(ends.to_json()) == ends
    with pytest.raises(ValueError, match="each commit up to 64, else its first and last"):
        BoundaryReport.from_doc({**ends.to_json(), "unnarrowed_commits": 20})


def test_a_commit_fixed_where_it_tells_but_departing_on_a_control_is_the_fixed_side_and_named():
    deviates = Seen(Outcome.FIXED, deviates=("O7",))
    answer, _ = search([PRE, PRE, deviates, deviates, FIXED])
    assert (answer.finding, answer.commit) == (Finding.FOUND, "c2")
    assert deviates.describe() == "fixed (a control deviates)"  # named once in the report, not on every step
    assert Seen(Outcome.FIXED, deviates=("O1", "O7")).describe() == "fixed (2 controls deviate)"
    line = ["c0", "c1", "c2"]
    assert watch(line, dict(zip(line, [FIXED, deviates, FIXED]))).flagged == ("c1",)  # the watch flags it


def test_a_fix_reverted_and_reapplied_names_a_commit_whose_parent_is_pre_fix():
    # c1 fixes, c2 reverts, c5 reapplies: bisection lands on one change (here the reapply), as git bisect does.
    sides = [PRE, FIXED, PRE, PRE, PRE, FIXED, FIXED, FIXED]
    answer, _ = search(sides)
    assert (answer.finding, answer.commit, answer.parent) == (Finding.FOUND, "c5", "c4")
    # Every commit probed (the watch): the first fix, and every commit after it that is not fixed.
    line = [f"c{i}" for i in range(len(sides))]
    watched = watch(line, dict(zip(line, sides)))
    assert (watched.first_fixed, watched.flagged) == ("c1", ("c2", "c3", "c4"))


@pytest.mark.parametrize(("history_ends", "finding"), [(True, Finding.OUTSIDE_HISTORY), (False, Finding.ENDS_DIFFER)])
def test_an_end_not_yet_fixed_is_outside_the_history_when_it_is_its_newest_commit(history_ends, finding):
    answer, probed = search([PRE, PRE, PRE, PRE], history_ends=history_ends)
    assert answer.finding is finding and probed == ["c3", "c0"]  # nothing between is probed
    assert "is pre-fix, not fixed" in answer.why


def test_a_release_cut_from_the_newest_commit_leaves_a_line_of_one_commit_and_the_fix_outside_the_history():
    answer, probed = search([PRE], history_ends=True)
    assert (answer.finding, probed) == (Finding.OUTSIDE_HISTORY, ["c0"])


def test_a_start_already_fixed_or_unjudged_says_the_range_does_not_hold_the_fix():
    for start, said in ((FIXED, "is fixed, not pre-fix"), (SKIP, "skipped (cannot run")):
        answer, _ = search([start, PRE, FIXED])
        assert answer.finding is Finding.ENDS_DIFFER and said in answer.why


def test_the_introducing_commit_is_the_first_pre_fix_one_after_not_affected_ones():
    answer, _ = search([CLEAN, CLEAN, CLEAN, PRE, PRE], Boundary.INTRODUCED)
    assert (answer.finding, answer.commit, answer.parent) == (Finding.FOUND, "c3", "c2")


@pytest.mark.parametrize(("subject", "pr"), [
    ("[BugFix] fix(hicache): fix two slot-reuse races (#24226)", 24226),
    ("Revert \"x (#100)\" (#101)", 101),
    ("Merge pull request #55 from a/b", 55),
    ("a commit naming no PR", None),
])
def test_the_pr_a_subject_names(subject, pr):
    assert pr_of(subject) == pr


# --- on git histories, check's judge stood in for ---------------------------------------------------

TWO = REGISTRY.replace("[experiments.demo.git]", 'loads = ["python/sglang/state.json"]\n\n[experiments.demo.git]') + """
[experiments.other]
pr = 2
title = "Another fix"
probe = "probes/probe_demo.py"
loads = ["python/sglang/state.json"]

[experiments.other.releases]
base = "1.0.0"
head = "1.1.0"
"""
STATUS = {"fixed": Status.FIXED, "pre-fix": Status.AFFECTED, "not affected": Status.NOT_AFFECTED,
          "cannot run": Status.CANNOT_RUN, "neither": Status.UNKNOWN, "present but off": Status.AFFECTED,
          "deviates": Status.DEVIATES}
GATE = """
[experiments.demo.gate]
variable = "SGLANG_DEMO_FIX"
on = "true"
why = "the fix runs only where the server's environment sets it; off by default"
"""


class History:
    """A clone whose main line the test writes commit by commit; each commit says how each experiment behaves."""

    def __init__(self, path: Path):
        self.path = path
        (path / "python" / "sglang").mkdir(parents=True)
        (path / "python" / "sglang" / "__init__.py").write_text("")
        git(path, "init", "-q", "-b", "main")

    def commit(self, subject: str, **states: str) -> str:
        state = self.path / "python" / "sglang" / "state.json"
        state.write_text(json.dumps(states, sort_keys=True))
        (self.path / "log").write_text(subject)  # every commit changes something
        git(self.path, "add", "-A")
        git(self.path, "commit", "-qm", subject)
        return git(self.path, "rev-parse", "HEAD")

    def release(self, version: str) -> str:
        """A release cut on a branch off the main line (its tag is no ancestor of the next release's)."""
        git(self.path, "checkout", "-qb", f"release/v{version}")
        (self.path / "VERSION").write_text(version)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-qm", f"release {version}")
        git(self.path, "tag", f"v{version}")
        git(self.path, "checkout", "-q", "main")
        return git(self.path, "rev-parse", f"v{version}")


class Probed(list):
    kept: list  # what each round was given as its engines kept across rounds


def stand_in_for_check(monkeypatch) -> Probed:
    """check's judge stood in for by each commit's state.json; the commits it probed, in order (``kept``: the
    engines kept across rounds each round was given)."""
    probed, kept = Probed(), []
    probed.kept = kept

    def run_all(reg, targets, *, fresh_references=False, force=False, log=print, server_args=None, engines=None):
        """check's answers, as each commit's state.json writes them: one probe per commit, every experiment."""
        found = []
        kept.append(engines)
        for target, tree in targets:
            probed.append(tree.resolved)
            states = json.loads((tree.install_target / "sglang" / "state.json").read_text())
            found.append(check.CheckResult(target, [
                check.ExperimentCheck(name, exp.pr, STATUS[states[name]], scenarios_of(states[name]),
                                      error="no module named vendor" if states[name] == "cannot run" else None,
                                      explain={"C1": {}} if states[name] == "deviates" else {},
                                      gate=gate_off(exp.gate) if states[name] == "present but off" else None)
                for name, exp in reg.experiments.items()]))
        return found

    monkeypatch.setattr(check, "run_all", run_all)
    return probed


def scenarios_of(state: str) -> dict[str, Behaviour]:
    """The deciding scenario D1 as the state says; a deviating commit also departs on the control C1."""
    fixed = state in ("fixed", "present but off", "deviates")
    return {"D1": Behaviour.FIXED if fixed else Behaviour.PRE_FIX, **({"C1": Behaviour.DEVIATES}
                                                                        if state == "deviates" else {})}


def gate_off(gate) -> check.GateAnswer:
    """check's answer for a server at its defaults: the fix's code answers fixed, its gate off."""
    return check.GateAnswer(gate, GateState.OFF, given=False, assumed_defaults=True, value=False,
                            code_status=Status.FIXED, why="its default")


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = make_project(tmp_path / "project", TWO)
    for name, value in {"PDEVIDENCE_WORK": tmp_path / "work", "PDEVIDENCE_RUNS": tmp_path / "runs",
                        "PDEVIDENCE_CACHE": tmp_path / "cache"}.items():
        monkeypatch.setenv(name, str(value))
    return root, stand_in_for_check(monkeypatch)


def sweep_table(root: Path, experiment: str, releases: dict[str, str]) -> None:
    """A sweep table (/2, the smallest the loader reads) classifying each release."""
    fixed = next((v for v, c in releases.items() if c == "fixed"), None)
    write_table(root / "results" / f"sweep-{experiment}.json", {
        "schema": "pdevidence-sweep/2", "experiment": experiment, "first_fixed": fixed, "regressions": [],
        "as_of": None, "releases": [{"version": v, "classification": c, "scenarios": {}, "differing": [],
                                     "error": None} for v, c in releases.items()]})


def bisect(root: Path, repo: Path, *argv: str) -> tuple[int, dict]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--root", str(root), "bisect", *argv, "--repo", str(repo), "--json"])
    return code, json.loads(out.getvalue())


def lines_of(history: History, n: int, **states: str) -> list[str]:
    return [history.commit(f"work {i}", **states) for i in range(n)]


def test_the_fix_is_found_between_release_branches_on_the_main_line_and_the_line_is_named(project, tmp_path):
    root, probed = project
    h = History(tmp_path / "sglang")
    lines_of(h, 3, demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    before = lines_of(h, 5, demo="pre-fix", other="pre-fix")
    fix = h.commit("Retire rejected requests at the door (#1)", demo="fixed", other="pre-fix")
    lines_of(h, 6, demo="fixed", other="pre-fix")
    h.release("1.1.0")
    assert subprocess.run(["git", "-C", str(h.path), "merge-base", "--is-ancestor", "v1.0.0", "v1.1.0"]).returncode
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]["fix"]
    assert (found["finding"], found["commit"]["sha"], found["parent"]["sha"]) == ("found", fix, before[-1])
    assert (found["commit"]["pr"], found["commit"]["subject"]) == (1, "Retire rejected requests at the door (#1)")
    assert (found["commit"]["scenarios"], found["parent"]["scenarios"]) == ({"D1": "fixed"}, {"D1": "pre-fix"})
    line = found["line"]
    assert (line["main"], line["start_ref"], line["end_ref"]) == ("main", "v1.0.0", "v1.1.0")
    # Each end is where its release branch leaves the main line, not the tagged commit on the branch.
    assert line["start"] == git(h.path, "merge-base", "v1.0.0", "main") != git(h.path, "rev-parse", "v1.0.0")
    assert line["commits"] == 13 and len(probed) == len(set(probed)) <= 2 + 4
    # Every round through one set of engines kept across rounds: each era's closure imported once.
    assert len(probed.kept) > 1 and len({id(e) for e in probed.kept}) == 1 and probed.kept[0] is not None
    assert doc["experiments"][0]["introduced"]["finding"] == "not sought"  # no sweep table says where it came in
    # A finding, not an error: the registry pins another commit for the fix.
    assert any("not the registry's git pin bbbbbbbbbbbb" in n for n in doc["experiments"][0]["notes"])
    assert code == errors.CONFIRMED and doc["exit_code"] == 0


def test_several_experiments_bisect_together_and_each_commit_is_probed_once(project, tmp_path):
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    commits = [h.commit(f"c{i}", demo="fixed" if i >= 9 else "pre-fix", other="fixed" if i >= 4 else "pre-fix")
               for i in range(16)]
    h.release("1.1.0")
    code, doc = bisect(root, h.path, "demo", "other")
    assert [e["fix"]["commit"]["sha"] for e in doc["experiments"]] == [commits[9], commits[4]]
    assert len(probed) == len(set(probed))  # a commit one search probed served the other
    assert sum(len(step["commits"]) for step in doc["steps"]) == len(probed)
    assert all(set(c["outcomes"]) == {"demo", "other"} for step in doc["steps"] for c in step["commits"])
    assert code == errors.CONFIRMED


def test_a_bisection_of_one_experiment_probes_each_commit_for_it_alone(project, tmp_path):
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    lines_of(h, 6, demo="fixed", other="fixed")
    h.release("1.1.0")
    code, doc = bisect(root, h.path, "demo")
    assert doc["steps"] and all(set(c["outcomes"]) == {"demo"} for step in doc["steps"] for c in step["commits"])
    assert code == errors.CONFIRMED


def test_commits_that_cannot_run_are_skipped_and_the_range_left_is_reported(project, tmp_path):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    lines_of(h, 3, demo="pre-fix", other="pre-fix")
    broken = lines_of(h, 3, demo="cannot run", other="pre-fix")
    fix = h.commit("fix", demo="fixed", other="pre-fix")
    h.release("1.1.0")
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]["fix"]
    assert found["finding"] == "not narrowed" and [c["sha"] for c in found["unnarrowed"]] == [*broken, fix]
    assert set(found["skipped"]) == set(broken)
    assert all(why == "skipped (cannot run: no module named vendor)" for why in found["skipped"].values())
    assert code == errors.INCOMPLETE


def test_a_range_of_more_commits_than_named_is_written_by_its_ends_and_its_size(project, tmp_path, monkeypatch):
    monkeypatch.setattr(bisect_run, "UNNARROWED_NAMED", 4)
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    broken = lines_of(h, 6, demo="cannot run", other="pre-fix")
    fix = h.commit("fix", demo="fixed", other="pre-fix")
    h.release("1.1.0")
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]["fix"]
    assert [c["sha"] for c in found["unnarrowed"]] == [broken[0], fix] and found["unnarrowed_commits"] == 7
    assert code == errors.INCOMPLETE


def test_a_fixed_release_after_the_history_ends_is_reported_with_its_newest_commit(project, tmp_path):
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    newest = lines_of(h, 5, demo="pre-fix", other="pre-fix")[-1]  # no v1.1.0: the history ends before it
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]["fix"]
    assert found["finding"] == "outside the history" and found["newest"]["sha"] == newest
    assert found["line"]["end_ref"] == "main" and "no tag v1.1.0 in the history" in found["bracket"]
    assert len(probed) == 2  # its two ends: nothing between is guessed at
    assert code == errors.INCOMPLETE


def test_a_fix_on_a_line_past_the_main_ref_is_outside_its_history_and_main_walks_to_it(project, tmp_path):
    """A clone's main ref may stop short of upstream's line, which another branch carries further (a PR branch
    that merged it): the registry's pin is in the clone, off the line walked; --main names a line holding it."""
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    lines_of(h, 2, demo="pre-fix", other="pre-fix")
    git(h.path, "checkout", "-qb", "upstream")
    lines_of(h, 2, demo="pre-fix", other="pre-fix")
    fix = h.commit("fix (#1)", demo="fixed", other="pre-fix")
    newest = h.commit("after", demo="fixed", other="pre-fix")
    git(h.path, "checkout", "-q", "main")
    registry = root / "experiments.toml"
    registry.write_text(re.sub(r'(\[experiments\.demo\.git\]\nbase = "\w+"\nhead = )"\w+"', rf'\1"{fix}"',
                               registry.read_text()))
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]
    assert found["fix"]["finding"] == "outside the history" and code == errors.INCOMPLETE
    assert f"the registry's git pin {fix[:12]} is in the clone, but not on main's line" in " ".join(found["notes"])
    code, doc = bisect(root, h.path, "demo", "--main", newest)
    assert doc["experiments"][0]["fix"]["commit"]["sha"] == fix and code == errors.CONFIRMED


def test_a_post_release_fixed_by_a_cherry_pick_gives_the_bracket_to_the_next_fixed_release(project, tmp_path):
    """1.0.0.post1 is cut from 1.0.0's branch with the fix picked onto it: it meets the main line where 1.0.0
    does, so no main-line commit between them holds the fix; 1.1.0, after the fix, ends the bracket."""
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    before = lines_of(h, 3, demo="pre-fix", other="pre-fix")
    fix = h.commit("fix (#1)", demo="fixed", other="pre-fix")
    lines_of(h, 2, demo="fixed", other="pre-fix")
    git(h.path, "checkout", "-q", "release/v1.0.0")
    h.commit("pick the fix (#2)", demo="fixed", other="pre-fix")
    git(h.path, "tag", "v1.0.0.post1")
    git(h.path, "checkout", "-q", "main")
    h.release("1.1.0")
    sweep_table(root, "demo", {"1.0.0": "pre-fix", "1.0.0.post1": "fixed", "1.1.0": "fixed"})
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]["fix"]
    assert (found["finding"], found["commit"]["sha"], found["parent"]["sha"]) == ("found", fix, before[-1])
    assert found["line"]["end_ref"] == "v1.1.0"
    assert "1.0.0.post1 meets the main line where 1.0.0 does: the fix came off it; 1.1.0 stands for it" \
        in found["bracket"]


def test_a_last_pre_fix_release_cut_from_the_newest_commit_leaves_the_fix_after_the_history(project, tmp_path):
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    newest = h.commit("newest", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")  # from the newest commit of the main line; no v1.1.0
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]["fix"]
    assert (found["finding"], found["line"]["commits"], found["newest"]["sha"]) == ("outside the history", 1, newest)
    assert probed == [newest] and code == errors.INCOMPLETE


def test_the_introducing_commit_is_sought_from_the_last_release_the_sweep_calls_not_affected(project, tmp_path):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="not affected", other="pre-fix")
    h.release("0.9.0")
    lines_of(h, 4, demo="not affected", other="pre-fix")
    bug = h.commit("Add the door (#7)", demo="pre-fix", other="pre-fix")
    lines_of(h, 2, demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    fix = h.commit("fix", demo="fixed", other="pre-fix")
    h.release("1.1.0")
    sweep_table(root, "demo", {"0.9.0": "not affected", "1.0.0": "pre-fix", "1.1.0": "fixed"})
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]
    assert (found["fix"]["commit"]["sha"], found["introduced"]["commit"]["sha"]) == (fix, bug)
    assert found["introduced"]["commit"]["pr"] == 7 and found["introduced"]["parent"]["outcome"] == "not affected"
    assert found["introduced"]["bracket"].startswith("sweep-demo.json: last not affected 0.9.0, first pre-fix 1.0.0")
    assert code == errors.CONFIRMED


def test_a_gated_fix_is_found_where_its_code_comes_in_judged_with_its_gate_on_and_the_gate_is_said(project,
                                                                                                    tmp_path):
    """check answers affected for a server at its defaults (the gate off); bisect judges the code, as the sweep
    brackets it from the first release carrying it."""
    root, _ = project
    registry = root / "experiments.toml"
    registry.write_text(registry.read_text() + GATE)
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    lines_of(h, 2, demo="pre-fix", other="pre-fix")
    fix = h.commit("fix (#1)", demo="present but off", other="pre-fix")
    lines_of(h, 2, demo="present but off", other="pre-fix")
    h.release("1.1.0")
    sweep_table(root, "demo", {"1.0.0": "pre-fix", "1.1.0": "present but off"})
    code, doc = bisect(root, h.path, "demo")
    found = doc["experiments"][0]
    assert found["fix"]["commit"]["sha"] == fix and "first fixed 1.1.0" in found["fix"]["bracket"]
    assert (found["fix"]["commit"]["outcome"], found["fix"]["parent"]["outcome"]) == ("fixed", "pre-fix")
    assert any("gate on (SGLANG_DEMO_FIX=true" in note for note in found["notes"])
    assert code == errors.CONFIRMED


def test_good_and_bad_override_the_bracket(project, tmp_path):
    root, _ = project
    h = History(tmp_path / "sglang")
    commits = [h.commit(f"c{i}", demo="fixed" if i >= 5 else "pre-fix", other="pre-fix") for i in range(10)]
    code, doc = bisect(root, h.path, "demo", "--good", commits[2], "--bad", commits[7])
    found = doc["experiments"][0]["fix"]
    assert found["commit"]["sha"] == commits[5] and found["line"]["commits"] == 6
    assert found["bracket"].startswith(f"--good {commits[2]}, --bad {commits[7]}")


def test_the_watch_probes_every_commit_changing_what_the_probe_loads_and_flags_a_revert(project, tmp_path):
    root, probed = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    fix = h.commit("fix (#1)", demo="fixed", other="pre-fix")
    (h.path / "README").write_text("docs only")
    git(h.path, "add", "-A")
    git(h.path, "commit", "-qm", "docs: nothing the probe loads")
    quiet = git(h.path, "rev-parse", "HEAD")
    revert = h.commit("Revert fix (#2)", demo="pre-fix", other="pre-fix")
    h.commit("Reapply fix (#3)", demo="fixed", other="pre-fix")
    h.release("1.1.0")
    h.commit("later", demo="fixed", other="pre-fix")
    code, doc = bisect(root, h.path, "demo", "--every")
    watched = doc["experiments"][0]["watch"]
    assert watched["first_fixed"]["sha"] == fix and watched["flagged"] == [revert]
    assert quiet not in [p["sha"] for p in watched["walked"]]  # (the bisection may still probe it)
    assert watched["line"]["end_ref"] == "main"  # the watch runs on to the newest commit
    assert code == errors.RELEASE_WATCH


def test_every_needs_the_files_each_probe_loads(project, tmp_path):
    root, _ = project
    (root / "experiments.toml").write_text(REGISTRY)
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix")
    assert cli.main(["--root", str(root), "bisect", "demo", "--every", "--repo", str(h.path)]) == errors.USAGE


# --- end to end: the warm engine, the door probe, nothing built ---------------------------------------


def test_a_fork_is_bisected_through_the_warm_engine_like_check_git(world, capsys):
    fork = make_fork(world.tmp / "fork", guard=False)  # tagged v0.5.10-npu.rc1: its era is npu
    git(fork, "branch", "-m", "main")
    init = fork / "python" / "sglang" / "__init__.py"
    shas = []
    for i, guard in enumerate((False, False, True, True)):
        init.write_text(init.read_text().replace(f"GUARD = {not guard}", f"GUARD = {guard}") + f"# {i}\n")
        git(fork, "commit", "-qam", f"step {i} (#{10 + i})")
        shas.append(git(fork, "rev-parse", "HEAD"))
    code = cli.main(["--root", str(world.root), "bisect", "demo", "--repo", str(fork), "--good", "v0.5.10-npu.rc1",
                     "--bad", "main", "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    found = doc["experiments"][0]["fix"]
    assert (found["commit"]["sha"], found["commit"]["pr"], found["parent"]["sha"]) == (shas[2], 12, shas[1])
    assert "engine (npu): probing git-" in captured.err and world.eras and set(world.eras) == {"npu"}
    assert code == errors.CONFIRMED


def test_the_text_report_names_the_line_each_boundary_commit_its_parent_and_each_step(project, tmp_path, capsys):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    parent = h.commit("work", demo="pre-fix", other="pre-fix")
    fix = h.commit("Retire at the door (#1)", demo="fixed", other="pre-fix")
    h.release("1.1.0")
    code = cli.main(["--root", str(root), "bisect", "demo", "--repo", str(h.path)])
    out = capsys.readouterr().out.splitlines()
    start = git(h.path, "merge-base", "v1.0.0", "main")
    assert f"    line: main first-parent, {start[:12]} (v1.0.0 meets it) .. {fix[:12]} (v1.1.0 meets it); " \
        "3 commits" in out
    date = git(h.path, "show", "-s", "--format=%cI", fix)[:10]
    assert f"    commit: {fix[:12]} {date} 'Retire at the door (#1)' (PR #1): fixed [D1 fixed]" in out
    assert f"    parent: {parent[:12]} {date} 'work': pre-fix [D1 pre-fix]" in out
    steps = out[out.index("steps (3 commits probed):"):]  # both ends, then the one commit between
    assert [line.split(" (")[0] for line in steps if line.startswith("  step ")] == ["  step 1", "  step 2"]
    assert out[-1].startswith("time: ") and code == errors.CONFIRMED


def test_the_controls_commits_deviate_on_are_named_once_not_on_every_step(project, tmp_path, capsys):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    lines_of(h, 3, demo="pre-fix", other="pre-fix")
    fix = h.commit("fix (#1)", demo="deviates", other="pre-fix")
    lines_of(h, 3, demo="deviates", other="pre-fix")
    h.release("1.1.0")
    code = cli.main(["--root", str(root), "bisect", "demo", "--repo", str(h.path)])
    out = capsys.readouterr().out.splitlines()
    steps = [line for line in out if line.startswith("    ") and "demo fixed" in line]
    assert steps and all("demo fixed (a control deviates)" in line for line in steps)
    named = [line for line in out if "C1" in line and "D1" not in line]
    assert len(named) == 1 and named[0].startswith("  deviating: C1 depart from both sides on ")
    assert fix[:12] in named[0] and code == errors.CONFIRMED


def test_json_prints_the_run_s_receipt_alone_and_the_progress_on_standard_error(project, tmp_path, capsys):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    fix = h.commit("fix (#1)", demo="fixed", other="pre-fix")
    h.release("1.1.0")
    code = cli.main(["--root", str(root), "bisect", "demo", "--repo", str(h.path), "--json"])
    captured = capsys.readouterr()
    assert captured.out == (tmp_path / "runs" / "bisect.run.json").read_text()
    doc = json.loads(captured.out)
    assert doc["schema"] == "pdevidence-bisect-run/1" and doc["experiments"][0]["fix"]["commit"]["sha"] == fix
    assert "bisect: probing" in captured.err and code == errors.CONFIRMED


def test_without_a_clone_bisect_says_where_to_name_one(project, monkeypatch, capsys):
    root, probed = project
    monkeypatch.delenv("SGLANG_REPO", raising=False)
    assert cli.main(["--root", str(root), "bisect", "demo"]) == errors.USAGE
    assert "pass --repo <clone> or set SGLANG_REPO=<clone>" in capsys.readouterr().err and probed == []


@pytest.mark.parametrize(("loads", "said"), [
    ('"python/sglang/a.py"', "expected array"),
    ('["/etc/passwd"]', "'/etc/passwd' is not a path inside the repository"),
    ('["python/../../x.py"]', "is not a path inside the repository"),
])
def test_the_files_a_probe_loads_are_paths_inside_the_repository(tmp_path, loads, said, capsys):
    root = make_project(tmp_path / "project", REGISTRY.replace("[experiments.demo.git]",
                                                               f"loads = {loads}\n\n[experiments.demo.git]"))
    assert cli.main(["--root", str(root), "bisect", "demo", "--repo", str(tmp_path)]) == errors.USAGE
    err = capsys.readouterr().err
    assert "experiments.demo.loads" in err and said in err


# --- the document: written to runs/, published, in the OSV records ------------------------------------


def test_each_experiment_s_document_is_written_to_runs_the_same_bytes_on_a_rerun_and_alone_or_together(
        project, tmp_path):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    commits = [h.commit(f"c{i} (#{i})", demo="fixed" if i >= 9 else "pre-fix",
                        other="fixed" if i >= 4 else "pre-fix") for i in range(16)]
    h.release("1.1.0")
    runs = tmp_path / "runs"
    written = []
    for argv in (["demo", "other"], ["demo", "other"], ["demo"]):
        assert bisect(root, h.path, *argv)[0] == errors.CONFIRMED
        written.append((runs / "bisect-demo.json").read_bytes())
    assert written[0] == written[1] == written[2]  # no time, no path, nor what was bisected beside it
    doc = BisectDocument.load(runs / "bisect-demo.json")
    assert problems("bisect", json.loads(written[0])) == []
    assert (doc.fix.finding, doc.fix.commit.commit.sha, doc.fix.commit.commit.pr) == (Finding.FOUND, commits[9], 9)
    assert [p.commit.sha for p in doc.fix.steps][:2] == [doc.fix.line.end, doc.fix.line.start]  # ends first
    assert doc.fix.commit in doc.fix.steps and doc.fix.parent in doc.fix.steps
    assert str(tmp_path) not in written[0].decode() and b"seconds" not in written[0]
    # The times and the clone are the run's receipt's.
    receipt = json.loads((runs / "bisect.run.json").read_text())
    assert problems("bisect-run", receipt) == []
    assert receipt["schema"] == "pdevidence-bisect-run/1" and receipt["repo"] == str(h.path)
    assert all("seconds" in step for step in receipt["steps"]) and "seconds" in receipt


def test_the_watch_says_what_it_leaves_out_and_when_it_cannot_run(project, tmp_path, capsys):
    root, _ = project
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix", other="pre-fix")
    h.release("1.0.0")
    h.commit("fix (#1)", demo="fixed", other="pre-fix")
    (h.path / "README").write_text("docs only")
    git(h.path, "add", "-A")
    git(h.path, "commit", "-qm", "docs: nothing the probe loads")
    h.commit("later", demo="fixed", other="fixed")
    h.release("1.1.0")
    # other's sweep calls no release pre-fix before its first fixed one: no fix bracket, so no watch.
    sweep_table(root, "other", {"1.0.0": "fixed", "1.1.0": "fixed"})
    code = cli.main(["--root", str(root), "bisect", "demo", "other", "--every", "--repo", str(h.path)])
    out = capsys.readouterr().out
    assert "(1 other commits of the line change none of them: not probed)" in out
    assert "  watch: not run: the watch starts where the fix's bracket does, and it has none (no release before " \
        "the first fixed one is pre-fix)" in out
    assert code == errors.INCOMPLETE  # asked for, and not done


ONE = REGISTRY.replace("[experiments.demo.git]", 'loads = ["python/sglang/state.json"]\n\n[experiments.demo.git]')


@pytest.fixture
def publishable(tmp_path, monkeypatch):
    """One experiment with fresh cells and a sweep table in runs/ (the smallest declared set), and a history whose
    v1.0.0 is pre-fix and v1.1.0 fixed; check's judge stood in for."""
    root = make_project(tmp_path / "project", ONE)
    for side in ("base", "head"):
        write_cell(root / "runs", side)
    write_sweep(root / "runs" / "sweep-demo.json")
    for name, value in {"PDEVIDENCE_WORK": tmp_path / "work", "PDEVIDENCE_CACHE": tmp_path / "cache"}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("PDEVIDENCE_RUNS", raising=False)
    stand_in_for_check(monkeypatch)
    h = History(tmp_path / "sglang")
    h.commit("start", demo="pre-fix")
    h.release("1.0.0")
    lines_of(h, 4, demo="pre-fix")
    fix = h.commit("Retire at the door (#1)", demo="fixed")
    h.release("1.1.0")
    return root, h, fix


def test_publish_takes_the_bisect_document_and_the_osv_record_gains_the_git_range_found(publishable):
    root, h, fix = publishable
    code, _ = bisect(root, h.path, "demo", "--references", "fresh")  # republishing: the sweep in runs/ brackets
    assert code == errors.CONFIRMED
    assert cli.main(["--root", str(root), "publish"]) == errors.CONFIRMED
    published = root / "results" / "bisect-demo.json"
    assert published.read_bytes() == (root / "runs" / "bisect-demo.json").read_bytes()
    assert "results/bisect-demo.json" in integrity.listed(root) and not (root / "results" / "bisect.run.json").exists()
    integrity.verify(root)
    record = json.loads((root / "results" / "osv" / "PDEVIDENCE-2026-1.json").read_text())
    assert problems("osv-1.6", record) == []
    ranges = record["affected"][0]["ranges"]
    assert ranges[1] == {"type": "GIT", "repo": "https://github.com/sgl-project/sglang",
                         "events": [{"introduced": "0"}, {"fixed": fix}]}  # the introduction was not sought
    said = record["database_specific"]["bisect"]
    assert said["fix"] == {"finding": "found", "commit": fix, "pr": 1}
    assert said["introduced"]["finding"] == "not sought"
    assert "results/bisect-demo.json" in record["database_specific"]["evidence_sha256"]
    assert f"fixed by {fix[:12]}" in record["details"]
    # The report names the commit.
    assert f"fixed by commit {fix[:12]} (PR #1)" in (root / "results" / "report.md").read_text()
    # A changed probe makes it stale.
    (root / "probes" / "probe_demo.py").write_text("print('another probe')\n")
    assert any("probes/probe_demo.py: made by another probe" in why
               for why in BisectDocument.load(published).stale(root, "probes/probe_demo.py"))


def test_publish_refuses_a_bisect_document_bracketed_by_another_sweep_than_the_one_published(publishable, capsys):
    root, h, _ = publishable
    assert bisect(root, h.path, "demo", "--references", "fresh")[0] == errors.CONFIRMED
    write_sweep(root / "runs" / "sweep-demo.json", pre=True)  # the sweep rerun after the bisection
    assert cli.main(["--root", str(root), "publish"]) == errors.STALE
    err = capsys.readouterr().err
    assert "bisect-demo.json: bracketed and judged by another sweep-demo.json" in err
    assert not (root / "results" / "bisect-demo.json").exists()


def test_a_bisect_document_that_is_not_one_is_refused_by_its_loader(publishable):
    root, h, _ = publishable
    bisect(root, h.path, "demo", "--references", "fresh")
    path = root / "runs" / "bisect-demo.json"
    doc = json.loads(path.read_text())
    doc["fix"]["commit"] = None  # found, yet no commit named
    path.write_text(json.dumps(doc))
    with pytest.raises(errors.HarnessError, match="is not a bisect document: ValueError: the fix is found, so it "
                       "names its commit and parent"):
        BisectDocument.load(path)


@pytest.mark.parametrize(("breaks", "said"), [
    (lambda d: d["fix"]["line"].update(commits="many"), "TypeError: line"),
    (lambda d: d["fix"]["steps"][0].update(reason=7), "reason must be a string or null"),
    (lambda d: d["fix"].update(finding="probably"), "ValueError: 'probably' is not a valid Finding"),
    (lambda d: d.update(schema="pdevidence-bisect/2"), "schema 'pdevidence-bisect/2', expected pdevidence-bisect/<1>"),
])
def test_the_loader_names_what_is_wrong_with_a_bisect_document(publishable, breaks, said):
    root, h, _ = publishable
    bisect(root, h.path, "demo", "--references", "fresh")
    path = root / "runs" / "bisect-demo.json"
    doc = json.loads(path.read_text())
    breaks(doc)
    with pytest.raises(errors.HarnessError, match=re.escape(said)):
        BisectDocument.from_doc(doc, source=str(path))


# --- what a round can make ready while it probes ------------------------------------------------------------------


def test_while_a_commit_is_probed_the_two_commits_the_search_may_ask_next_are_foreseen():
    line = [f"c{i}" for i in range(9)]
    found = Search(Boundary.FIX, line)
    assert found.upcoming(["c8", "c0"]) == ["c4"]  # both ends as their releases were: the middle next
    for sha, seen in (("c8", FIXED), ("c0", PRE)):
        found.record(sha, seen)
    asked = found.next()
    ahead = found.upcoming([asked])
    found.record(asked, FIXED)
    assert found.next() in ahead and len(ahead) == 2
    assert Search(Boundary.FIX, line).upcoming(["c3"]) == ["c8"]  # a commit it does not ask for: its own ask next


def test_trees_made_ahead_come_in_the_order_planned_and_one_no_longer_wanted_is_dropped():
    import threading

    from pdevidence.lanes.bisect_ahead import Ahead

    begun, gate, made = threading.Event(), threading.Event(), []

    def make(sha):
        begun.set()
        gate.wait()
        made.append(sha)
        if sha == "broken":
            raise RuntimeError("no such commit")
        return sha.upper()

    with Ahead(make) as ahead:
        ahead.plan(["a"], ["b", "c"])
        begun.wait()  # a is being made
        ahead.plan(["a"], ["c", "broken"])  # b is no longer wanted
        gate.set()
        assert ahead.tree("c") == "C" and ahead.tree("a") == "A"
        with pytest.raises(RuntimeError, match="no such commit"):  # raised where it is asked for, not before
            ahead.tree("broken")
    assert made[:2] == ["a", "c"] and "b" not in made
