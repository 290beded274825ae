"""The mutation lane: operators on a tiny synthetic module, the kill rule, the table."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pdevidence import environments, registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity, provenance, results
from pdevidence.documents.tables import MutationTable
from pdevidence.documents.vocabulary import Behaviour, MutantStatus
from pdevidence.cells import allprobes
from pdevidence.judge.compare import expected_file
from pdevidence.lanes import check, mutate

sys.path.insert(0, str(PROJECT / "probes"))

import _mutants  # noqa: E402

# What made the tables these tests judge (a block no checkout matches: only its shape matters here).
MADE = provenance.Provenance({"probes/probe_demo.py": "d" * 64}, "0" * 64)


def judge(exp, doc):
    return mutate.judge(exp, doc, MADE)


SYNTHETIC = '''
import functools

LIMIT = 3


def helper(x):
    return x * 10


def guard(req):
    """A docstring that mentions req.held or req.retracted, which no edit may touch."""
    # a comment about req.held
    return req.aborted and not (req.retracted or req.held)


def stamp(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class Door:
    def __init__(self):
        self.queue = []

    @stamp
    def add(self, req):
        if guard(req):
            return "retired"
        self.queue.append(req)
        return "admitted"

    def limit(self):
        return LIMIT


def counter():
    calls = 0

    def bump(step):
        nonlocal calls
        calls += step
        return calls

    return bump
'''


class Req:
    def __init__(self, aborted=False, retracted=False, held=False):
        self.aborted, self.retracted, self.held = aborted, retracted, held


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    (tmp_path / "synthmod.py").write_text(textwrap.dedent(SYNTHETIC))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("synthmod", None)
    module = importlib.import_module("synthmod")
    yield module
    sys.modules.pop("synthmod", None)


def spec(**fields):
    base = {"id": "m1", "title": "t", "kind": "removes-fix", "operator": "noop"}
    return _mutants.MutantSpec.from_json({**base, **fields})


def test_constant_reaches_names_imported_elsewhere(synthetic):
    imported_guard = synthetic.guard  # like `from utils import guard` in another module
    with _mutants.applied(spec(target="synthmod:guard", operator="constant", value=True)):
        assert imported_guard(Req()) is True
        assert synthetic.Door().add(Req()) == "retired"
    assert imported_guard(Req()) is False


def test_noop_on_a_method_and_restore(synthetic):
    door = synthetic.Door()
    original = synthetic.Door.limit.__code__
    with _mutants.applied(spec(target="synthmod:Door.limit")):
        assert door.limit() is None
    assert door.limit() == 3 and synthetic.Door.limit.__code__ is original


def test_swap_calls_the_replacement_and_removes_its_global(synthetic):
    with _mutants.applied(spec(target="synthmod:guard", operator="swap", replacement="synthmod:helper")) as patch:
        assert synthetic.guard(2) == 20
        assert set(patch.injected) <= set(vars(synthetic))
    assert not [name for name in vars(synthetic) if name.startswith("__pdevidence")]


def test_edit_drops_one_clause_outside_docstring_and_comments(synthetic):
    held = Req(aborted=True, held=True)
    assert synthetic.guard(held) is False
    with _mutants.applied(spec(target="synthmod:guard", operator="edit", old="req.held", new="False")):
        assert synthetic.guard(held) is True
        assert synthetic.guard(Req(aborted=True, retracted=True)) is False
    assert synthetic.guard(held) is False


def test_edit_of_a_decorated_method_changes_the_wrapped_function(synthetic):
    door = synthetic.Door()
    with _mutants.applied(spec(target="synthmod:Door.add", operator="edit", old="if guard(req):", new="if False:")):
        assert door.add(Req(aborted=True)) == "admitted"
    assert door.add(Req(aborted=True)) == "retired"


def test_edit_keeps_a_closure_working(synthetic):
    bump = synthetic.counter()
    target = spec(target="synthmod:counter.bump", operator="edit", old="calls += step", new="calls += 2 * step")
    # A nested function is not reachable by attribute: not applicable, never passed.
    with pytest.raises(_mutants.NotApplicable):
        _mutants.apply(target)
    fn = bump
    original = fn.__code__
    source, first = _mutants.edited_source(target, fn)
    fn.__code__ = _mutants._compile(fn, source, first)
    try:
        assert bump(1) == 2 and bump(1) == 4
    finally:
        fn.__code__ = original


def test_edit_whose_text_is_missing_is_a_clear_error(synthetic):
    with pytest.raises(_mutants.MutantError, match=r"'req.gone' occurs 0 time\(s\).*expected 1"):
        _mutants.apply(spec(target="synthmod:guard", operator="edit", old="req.gone", new="False"))
    # Text found only in the docstring or a comment does not count either.
    with pytest.raises(_mutants.MutantError, match="occurs 1 time"):
        _mutants.apply(spec(target="synthmod:guard", operator="edit", old="req.held", new="False", count=2))
    assert synthetic.guard(Req(aborted=True, held=True)) is False


def test_missing_targets_are_not_applicable(synthetic):
    for target in ("synthmod:nothing", "synthmod:Door.nothing", "no_such_module_here:f"):
        with pytest.raises(_mutants.NotApplicable):
            _mutants.apply(spec(target=target))
    with pytest.raises(_mutants.MutantError, match="not a Python function"):
        _mutants.apply(spec(target="synthmod:LIMIT"))


def test_restore_check_fails_when_the_code_is_not_back(synthetic):
    patch = _mutants.apply(spec(target="synthmod:guard"))
    with pytest.raises(_mutants.RestoreError, match="original code"):
        patch.check()
    patch.restore()
    patch.check()


# ---------------------------------------------------------------- the kill rule


def experiment(mutants: dict) -> registry.Experiment:
    expect = {
        "D": registry.Expectation("D", True, {"retired": False, "streamed": 0, "status": None, "same": True},
                                  {"retired": True, "streamed": 2, "status": 400, "same": True}),
        "C": registry.Expectation("C", False, {"enqueued": True}, {"enqueued": True}),
    }
    muts = {mid: registry.Mutant(id=mid, title=mid, kind=registry.MutantKind(kind), target="m:f",
                                 operator=registry.Operator.NOOP) for mid, kind in mutants.items()}
    return registry.Experiment(name="demo", pr=1, title="t", probe=PROJECT / "probes" / "x.py", upstream_tests=(),
                               git={"base": "0" * 40, "head": "1" * 40}, releases={"base": None, "head": None},
                               expect=expect, mutants=muts)


HEAD = {"D": {"observed": {"retired": True, "streamed": 2, "status": 400, "same": True, "fact": "x"}, "error": None},
        "C": {"observed": {"enqueued": True}, "error": None}}


def under(**changes) -> dict:
    doc = json.loads(json.dumps(HEAD))
    for sid, observed in changes.items():
        if isinstance(observed, str):  # a crash before any observation but "retired"
            doc[sid] = {"observed": {"retired": True}, "error": {"type": observed, "message": "boom"}}
        else:
            doc[sid]["observed"].update(observed)
    return doc


def document(**runs) -> dict:
    return {"tree": {"kind": "release", "ref": "9", "resolved": "9"}, "baseline": HEAD, "mutants": runs}


def applied(scenarios):
    return {"status": "applied", "error": None, "scenarios": scenarios}


def test_removes_fix_is_killed_by_a_move_toward_base_only():
    exp = experiment({"a": "removes-fix", "b": "removes-fix", "c": "removes-fix", "d": "removes-fix",
                      "e": "removes-fix", "f": "removes-fix"})
    result = judge(exp, document(
        a=applied(under(D={"retired": False})),         # equals base
        b=applied(under(D={"streamed": 1})),            # an int closer to base
        c=applied(under(D={"streamed": 3, "same": False, "fact": "y"})),  # away from base; unexpected keys
        d=applied(under(C={"enqueued": False})),         # a control moving does not kill a removes-fix
        e=applied(under(D="AttributeError")),
        f=applied(under(D="KeyError", C={"enqueued": False})),
    ))
    outcome = {m.id: (m.status, m.killed_by) for m in result.mutants}
    assert outcome["a"] == (MutantStatus.KILLED, {"D": ["retired"]})
    assert outcome["b"] == (MutantStatus.KILLED, {"D": ["streamed"]})
    assert outcome["c"][0] is MutantStatus.SURVIVED
    assert outcome["d"][0] is MutantStatus.SURVIVED
    # A crash kills (named as such); keys it left unobserved (status, base null) never count.
    assert outcome["e"] == (MutantStatus.KILLED, {"D": ["error:AttributeError"]})
    assert outcome["f"] == (MutantStatus.KILLED, {"D": ["error:KeyError"]})


def test_over_broad_is_killed_by_a_control_only():
    exp = experiment({"wide": "over-broad", "quiet": "over-broad"})
    result = judge(exp, document(wide=applied(under(C={"enqueued": False})),
                                        quiet=applied(under(D={"retired": False}))))
    outcome = {m.id: (m.status, m.killed_by) for m in result.mutants}
    assert outcome == {"wide": (MutantStatus.KILLED, {"C": ["enqueued"]}), "quiet": (MutantStatus.SURVIVED, {})}
    crash = mutate.scenario_kills(registry.MutantKind.OVER_BROAD, exp.expect["C"], HEAD["C"],
                                  {"observed": {"enqueued": False}, "error": {"type": "ValueError"}})
    assert crash == ["enqueued", "error:ValueError"]


def test_leaks_is_killed_by_a_key_base_and_head_agree_on_wherever_it_sits():
    """A fix right on the keys it changes and wrong where both sides agree (D.same, the control C)."""
    exp = experiment({"telling": "leaks", "control": "leaks", "changing": "leaks", "fact": "leaks"})
    result = judge(exp, document(telling=applied(under(D={"same": False})),
                                 control=applied(under(C={"enqueued": False})),
                                 changing=applied(under(D={"retired": False})),  # a key the fix changes: not a leak
                                 fact=applied(under(D={"fact": "y"}))))  # a key the registry does not expect
    outcome = {m.id: (m.status, m.killed_by) for m in result.mutants}
    assert outcome == {"telling": (MutantStatus.KILLED, {"D": ["same"]}),
                       "control": (MutantStatus.KILLED, {"C": ["enqueued"]}),
                       "changing": (MutantStatus.SURVIVED, {}), "fact": (MutantStatus.SURVIVED, {})}


def reference(side: str, exp: registry.Experiment) -> dict:
    """A published result of ``side``: what the registry expects there (the control as it expects it)."""
    observed = {sid: dict(getattr(e, side)) for sid, e in exp.expect.items()}
    return {"schema": "pd-differential-probe/1", "experiment": exp.name, "side": side,
            "tree": {"kind": "release", "ref": side, "resolved": side},
            "scenarios": {sid: {"title": sid, "observed": obs, "error": None} for sid, obs in observed.items()}}


def checked(exp: registry.Experiment, result: dict) -> check.ExperimentCheck:
    """What ``check`` answers for a build that observes ``result``."""
    outcome = allprobes.Outcome(exp.name, result, None)
    return check.judge(exp, outcome, reference("base", exp), reference("head", exp))


def test_each_mutant_run_is_a_result_check_judges_and_no_over_broad_one_reads_fixed():
    exp = experiment({"gone": "removes-fix", "wide": "over-broad", "crash": "over-broad", "absent": "over-broad"})
    doc = document(gone=applied(under(D={"retired": False, "streamed": 0, "status": None})),
                   wide=applied(under(C={"enqueued": False})), crash=applied(under(C="AttributeError")),
                   absent={"status": "not applicable", "error": "no such function", "scenarios": {}})
    doc["adaptations"] = ["older-door"]
    found = mutate.mutant_results(exp, doc)
    assert set(found) == {"gone", "wide", "crash"}  # only what ran under its mutant
    assert found["wide"]["adaptations"] == ["older-door"] and found["wide"]["tree"] == doc["tree"]
    assert checked(exp, mutate.as_result(exp, doc, doc["baseline"], "baseline")).status is check.Status.FIXED
    answers = {mid: checked(exp, result) for mid, result in found.items()}
    assert {mid: a.status for mid, a in answers.items()} == {
        "gone": check.Status.AFFECTED, "wide": check.Status.DEVIATES, "crash": check.Status.UNKNOWN}
    assert answers["wide"].to_json()["explain"] == {"C": {"enqueued": {"tree": False, "base": True, "head": True}}}
    assert answers["crash"].error == "C: AttributeError: boom"
    table = judge(exp, doc)  # the lane's kills and check's answer name the same controls
    assert {m.id: sorted(m.killed_by) for m in table.mutants if m.kind is registry.MutantKind.OVER_BROAD
            and m.status is MutantStatus.KILLED} == {mid: answers[mid].deciding for mid in ("wide", "crash")}


def test_baseline_that_is_not_head_fails_the_run():
    exp = experiment({"a": "removes-fix"})
    doc = document(a=applied(under()))
    doc["baseline"] = under(D={"streamed": 0})
    with pytest.raises(errors.HarnessError, match=r"D.streamed: 0, expected 2") as exc:
        judge(exp, doc)
    assert exc.value.code == errors.BEHAVIOUR_DIFFERS


def test_state_left_behind_by_a_mutant_fails_the_run():
    doc = document(a=applied(under(D={"retired": False})))
    doc["baseline_after"] = under(C={"enqueued": False})
    with pytest.raises(errors.HarnessError, match=r"ran differently after the mutants \(C\)"):
        judge(experiment({"a": "removes-fix"}), doc)


def test_table_score_survivors_and_exit_code(tmp_path):
    exp = experiment({"a": "removes-fix", "gone": "removes-fix", "bad": "over-broad", "s": "over-broad"})
    result = judge(exp, document(
        a=applied(under(D={"retired": False})),
        gone={"status": "not applicable", "error": "no such function", "scenarios": {}},
        bad={"status": "error", "error": "edit text not found", "scenarios": {}},
        s=applied(under()),
    ))
    assert result.score == {"killed": 1, "by_observation": 1, "only_raising": 0, "applicable": 4, "total": 4}
    assert result.exit_code == errors.BEHAVIOUR_DIFFERS
    text = mutate.table(result)
    assert text.splitlines()[-1] == "demo: 1 of 4 mutants killed (1 by observation, 0 only by raising)"
    assert "survived: s" in text and "error: bad" in text and "edit text not found" in text
    assert "error: gone" in text
    row = next(line for line in text.splitlines() if line.startswith("a "))
    assert row.split()[2:5] == [".", "K", "killed"]
    path = tmp_path / "mutate.demo.json"
    path.write_text(json.dumps(result.to_json()))
    assert MutationTable.load(path) == result
    all_killed = judge(experiment({"a": "removes-fix"}), document(a=applied(under(D={"retired": False}))))
    assert all_killed.exit_code == errors.CONFIRMED


def test_a_mutant_not_applicable_on_the_lanes_own_tree_is_an_error_and_the_lane_is_not_confirmed():
    # Every other mutant killed: dropping the one whose target vanished would read confirmed.
    exp = experiment({"a": "removes-fix", "b": "removes-fix", "gone": "removes-fix"})
    result = judge(exp, document(
        a=applied(under(D={"retired": False})), b=applied(under(D={"streamed": 0})),
        gone={"status": "not applicable", "error": "synthmod:Door.gone: 'gone' is not on this tree",
              "scenarios": {}}))
    gone = next(m for m in result.mutants if m.id == "gone")
    assert gone.status is MutantStatus.ERROR
    assert gone.error.startswith("not applicable on release 9, the tree it was written for: synthmod:Door.gone")
    assert result.score["applicable"] == 3 and result.exit_code == errors.BEHAVIOUR_DIFFERS
    text = mutate.table(result)
    assert "error: gone [removes-fix] gone (not applicable on release 9" in text
    assert text.splitlines()[-1].startswith("demo: 2 of 3 mutants killed")


def test_a_table_that_kept_a_not_applicable_mutant_is_not_confirmed(tmp_path):
    exp = experiment({"a": "removes-fix", "gone": "removes-fix"})
    doc = judge(exp, document(a=applied(under(D={"retired": False})), gone=applied(under(D={"retired": False})))
                ).to_json()
    doc["mutants"][1].update(status="not applicable", killed_by={}, error="no such function")
    doc["score"].update(killed=1, by_observation=1, applicable=1)  # as a table of the old rule scored it
    result = MutationTable.from_doc(doc, source="an older table")
    assert result.exit_code == errors.BEHAVIOUR_DIFFERS and [m.id for m in result.unkilled] == ["gone"]
    assert "not applicable: gone" in mutate.table(result)


def test_kills_by_observation_and_kills_only_by_raising_are_counted_apart(tmp_path):
    exp = experiment({"seen": "removes-fix", "crash": "removes-fix", "both": "removes-fix"})
    result = judge(exp, document(
        seen=applied(under(D={"retired": False})),
        crash=applied(under(D="AttributeError")),
        both=applied({**under(D="KeyError"), "D": {"observed": {"retired": False}, "error": {"type": "KeyError"}}}),
    ))
    assert [m.only_raised for m in result.mutants] == [False, True, False]
    assert result.score == {"killed": 3, "by_observation": 2, "only_raising": 1, "applicable": 3, "total": 3}
    # A crash can never read as fixed (sweep: error, check: unknown), so it still counts as a kill.
    assert result.exit_code == errors.CONFIRMED
    text = mutate.table(result)
    assert text.splitlines()[-1] == "demo: 3 of 3 mutants killed (2 by observation, 1 only by raising)"
    rows = {line.split()[0]: line for line in text.splitlines()[1:4]}
    assert rows["crash"].split()[2:] == [".", "E", "killed", "(only", "by", "raising)"]
    assert rows["both"].split()[2:] == [".", "K", "killed"]
    path = tmp_path / "mutate.demo.json"
    path.write_text(json.dumps(result.to_json()))
    assert MutationTable.load(path).score == result.score


def test_a_schema_1_mutation_table_loads_with_both_counts_derived_from_its_kills(tmp_path):
    result = judge(experiment({"seen": "removes-fix", "crash": "removes-fix"}), document(
        seen=applied(under(D={"retired": False})), crash=applied(under(D="AttributeError"))))
    doc = result.to_json()
    doc["schema"] = "pdevidence-mutate/1"
    doc["score"] = {"killed": 2, "applicable": 2, "total": 2}  # as /1 wrote it
    loaded = MutationTable.from_doc(doc, source="v1")
    assert loaded.score == {"killed": 2, "by_observation": 1, "only_raising": 1, "applicable": 2, "total": 2}
    assert loaded.doc is doc and "only_raising" not in doc["score"]


def test_true_is_not_the_count_1_for_the_baseline_or_a_kill():
    expect = {"D": registry.Expectation("D", True, {"sent": 1}, {"sent": 0})}
    exp = experiment({"m": "removes-fix"})
    exp = registry.Experiment(**{**vars(exp), "expect": expect})
    head = {"D": {"observed": {"sent": 0}, "error": None}}
    # Under the mutant the probe observes True where base sent 1: not base's value, and no count.
    doc = {"tree": {"kind": "release", "ref": "9", "resolved": "9"}, "baseline": head,
           "mutants": {"m": applied({"D": {"observed": {"sent": True}, "error": None}})}}
    assert judge(exp, doc).mutants[0].status is MutantStatus.SURVIVED
    doc["mutants"]["m"] = applied({"D": {"observed": {"sent": 1}, "error": None}})
    assert judge(exp, doc).mutants[0].status is MutantStatus.KILLED
    # A baseline observing False where the registry's head says 0 is not the head it expects.
    doc["baseline"] = {"D": {"observed": {"sent": False}, "error": None}}
    with pytest.raises(errors.HarnessError, match="D.sent: False, expected 0"):
        judge(exp, doc)


def test_loader_rejects_a_tampered_score(tmp_path):
    result = judge(experiment({"a": "removes-fix"}), document(a=applied(under(D={"retired": False}))))
    doc = result.to_json()
    doc["score"]["killed"] = 0
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(errors.HarnessError, match="does not match its mutants"):
        MutationTable.load(path)


def test_registry_mutants_are_well_formed_for_the_driver():
    reg = registry.load(PROJECT)
    for exp in reg.experiments.values():
        for mutant in exp.mutants.values():
            assert _mutants.MutantSpec.from_json(mutant.spec()).id == mutant.id


def run_lane(runs: Path, name: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PDEVIDENCE_RUNS": str(runs), "PYTHONPATH": str(PROJECT)}
    return subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(PROJECT), "mutate", name, *argv],
                          env=env, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="module")
def real_lanes(tmp_path_factory):
    """Each real lane run once per way of running it, into a runs directory of its own; the tests read what it
    wrote."""
    ran = {}

    def lane(name: str, *argv: str) -> tuple[Path, subprocess.CompletedProcess]:
        if (name, *argv) not in ran:
            runs = tmp_path_factory.mktemp(f"mutate-{name}{''.join(argv)}")
            ran[(name, *argv)] = runs, run_lane(runs, name, *argv)
        return ran[(name, *argv)]

    return lane


# The experiments whose mutants the registry declares: the lane runs on each experiment's head release.
# Controls no declared mutant breaks yet, and why: the gap stays visible here until a mutant closes it.
UNEXERCISED_CONTROLS = {
    ("offload_slots", "O7"): "a prompt shorter than a page: no over-broad mutant of #24226 touches the page alignment",
    ("abort_notify", "N12"): "the decode alone, a day after a client abort: #27372's mutants act on what the prefill "
                             "ranks are told and do, and a day is past any wait whatever they are told",
    ("deferred_release_nixl", "X10"): "the decode alone, a day after a client abort: #35360's mutants act on the "
                                      "prefill's acks and the decode's wait for them, and a day is past any hold's "
                                      "deadline whatever the acks",
    ("swa_free", "F6"): "a model without sliding-window layers: #27779 edits the SWA allocator's free_swa only, and "
                        "the plain paged allocator F6 drives has none",
    ("swa_tail", "T5"): "page size 1: the preallocation takes SWA for every token, no tail, so no mutant of #25805's "
                        "clearing outside the tail has slots to act on",
    ("swa_tail", "T6"): "a model without sliding-window layers: no SWA mapping for a mutant of #25805 to clear",
}
MUTATED = [name for name, exp in registry.load(PROJECT).experiments.items() if exp.mutants]


@pytest.mark.sglang
@pytest.mark.scheduled
@pytest.mark.parametrize("name", MUTATED)
def test_real_lane_kills_every_mutant_and_every_scenario_kills(name, real_lanes):
    """Alone proves: on the real head release, every declared mutant of the fix is killed by observation (none only
    by raising, the weaker kill the lane still counts), every scenario kills one, and every kind of mutant is
    declared."""
    runs, done = real_lanes(name)
    result = MutationTable.load(runs / f"mutate.{name}.json")
    score = result.score
    assert done.stdout.rstrip().splitlines()[-1] == (f"{name}: {score['killed']} of {score['applicable']} mutants "
                                                     f"killed ({score['by_observation']} by observation, "
                                                     f"{score['only_raising']} only by raising)")
    assert f"engine: {name} done in" in done.stdout  # a warm engine child ran the driver
    assert result.score["applicable"] == len(registry.load(PROJECT).experiment(name).mutants)  # all apply there
    assert [m.id for m in result.unkilled] == []
    assert score["by_observation"] == score["killed"], f"killed only by raising: {score['only_raising']}"
    assert done.returncode == errors.CONFIRMED, done.stdout[-2000:] + done.stderr[-2000:]
    killers = {sid for m in result.mutants for sid in m.killed_by}
    idle = {sid for (exp, sid) in UNEXERCISED_CONTROLS if exp == name}
    assert killers == set(result.scenarios) - idle, f"scenarios that kill nothing: {set(result.scenarios) - killers}"
    assert {m.kind for m in result.mutants} == set(registry.MutantKind)


def published(exp: registry.Experiment, side: str) -> dict:
    """The published release result of ``side`` (its sums verified), as ``check`` judges against it."""
    name = f"results/{expected_file(exp, side, 'release')}"
    assert integrity.problem(PROJECT, name) is None, name
    return results.load(PROJECT / name, experiment=exp.name, side=side)


# Over-broad mutants an earlier form of the fix is: the lane kills them (their controls depart from head), but a
# registry rule sets those controls aside for check, which answers for the server's platform (CUDA by default),
# where they behave as the fix: fixed, by that rule.
AS_AN_EARLIER_FIX = {("war_barrier", "gate_everywhere"): "barrier_on_every_platform"}  # 163b970 waits everywhere


@pytest.mark.sglang
@pytest.mark.scheduled
@pytest.mark.parametrize("name", MUTATED)
def test_real_lane_no_mutant_reads_fixed_through_checks_judge(name, real_lanes):
    """Alone proves (from the lane's own runs, nothing probed again): each mutant's observations on the head release, as the lane's driver document keeps them, judged as
    ``check`` judges a build that carries the mutant: the unmutated run reads fixed, no mutant does, and each
    over-broad one shows the controls that killed it in the lane departing (deviates) or raising, named."""
    runs, done = real_lanes(name)
    assert done.returncode == errors.CONFIRMED, done.stdout[-2000:] + done.stderr[-2000:]
    exp = registry.load(PROJECT).experiment(name)
    doc = json.loads((runs / "mutate" / f"{name}.probe.json").read_text())
    base, head = published(exp, "base"), published(exp, "head")

    def answer(result: dict) -> check.ExperimentCheck:
        return check.judge(exp, allprobes.Outcome(name, result, None), base, head)

    assert answer(mutate.as_result(exp, doc, doc["baseline"], "baseline")).status is check.Status.FIXED
    answers = {mid: answer(result) for mid, result in mutate.mutant_results(exp, doc).items()}
    over_broad = [mid for mid, m in exp.mutants.items() if m.kind is registry.MutantKind.OVER_BROAD]
    assert set(over_broad) <= set(answers) and over_broad  # every one ran on the head release
    earlier = {mid: rule for (fix, mid), rule in AS_AN_EARLIER_FIX.items() if fix == name}
    assert {mid for mid, a in answers.items() if a.status is check.Status.FIXED} == set(earlier), \
        {mid: a.to_json() for mid, a in answers.items() if a.status is check.Status.FIXED}
    for mid, rule in earlier.items():
        assert any(note.startswith(f"{rule}:") for note in answers[mid].not_deciding), mid
    over_broad = [mid for mid in over_broad if mid not in earlier]
    killed = {m.id: set(m.killed_by) for m in MutationTable.load(runs / f"mutate.{name}.json").mutants}
    controls = {sid for sid, e in exp.expect.items() if not e.changes}
    for mid in over_broad:
        got = answers[mid]
        caught = {sid for sid, b in got.scenarios.items() if sid in controls}
        assert caught == killed[mid], (mid, got.to_json())
        deviating = set(got.deviations)
        assert {sid for sid in deviating if sid in controls} | \
            {sid for sid in caught if got.scenarios[sid] is Behaviour.ERROR} == caught
        # A telling scenario may deviate too, but only on a key base and head agree on (an agreed key is a control
        # wherever it sits), never on one the fix changes.
        for sid in deviating - controls:
            expected = exp.expect[sid]
            changing = {key for key in expected.base if expected.base[key] != expected.head.get(key)}
            assert not set(got.deviations[sid]) & changing, (mid, sid, got.to_json())
        # Fixed where the scenarios tell, it deviates; an over-broad fix that also moves a telling scenario
        # (B_owner_dropped re-retires B4's and B8's retired request) matches neither there: unknown; one that
        # undoes part of the fix too (state_shared_by_all hands every request the last one's state) is partial.
        assert got.status in (check.Status.DEVIATES, check.Status.UNKNOWN, check.Status.PARTIAL), (mid, got.to_json())


@pytest.mark.sglang
@pytest.mark.scheduled
def test_real_lane_in_the_engine_writes_what_the_fresh_process_writes(real_lanes):
    """Alone proves: one lane (admission) both ways: the engine child and a fresh process (--cold) observe the same under every
    mutant, so the driver documents and the tables are the same bytes (neither holds a time)."""
    warm, done_warm = real_lanes("admission")
    cold, done_cold = real_lanes("admission", "--cold")
    assert done_cold.returncode == errors.CONFIRMED, done_cold.stdout[-2000:] + done_cold.stderr[-2000:]
    assert "engine:" not in done_cold.stdout and "in a fresh process" in done_cold.stdout
    for name in ("mutate/admission.probe.json", "mutate.admission.json"):
        assert (warm / name).read_bytes() == (cold / name).read_bytes(), name


DEMO_PROBE = '''
from _probekit import ScenarioSet

DEMO = ScenarioSet("demo")


def prepare():
    import synthmod  # noqa: F401
    return "1.0"


class Req:
    def __init__(self, **marks):
        self.aborted, self.retracted, self.held = (marks.get(k, False) for k in ("aborted", "retracted", "held"))


@DEMO.scenario("D", "an aborted request at the door")
def d(observed):
    import synthmod
    observed["retired"] = synthmod.Door().add(Req(aborted=True)) == "retired"


@DEMO.scenario("C", "an aborted request that holds something")
def c(observed):
    import synthmod
    observed["retired"] = synthmod.Door().add(Req(aborted=True, held=True)) == "retired"
'''


def test_driver_runs_every_mutant_in_one_process_and_records_each_status(tmp_path):
    import subprocess

    (tmp_path / "synthmod.py").write_text(textwrap.dedent(SYNTHETIC))
    (tmp_path / "probe_demo.py").write_text(DEMO_PROBE)
    specs = [
        {"id": "door", "title": "t", "kind": "removes-fix", "target": "synthmod:Door.add", "operator": "edit",
         "old": "if guard(req):", "new": "if False:", "count": 1},
        {"id": "wide", "title": "t", "kind": "over-broad", "target": "synthmod:guard", "operator": "edit",
         "old": "req.held", "new": "False", "count": 1},
        {"id": "gone", "title": "t", "kind": "removes-fix", "target": "synthmod:Door.gone", "operator": "noop"},
        {"id": "stale", "title": "t", "kind": "removes-fix", "target": "synthmod:guard", "operator": "edit",
         "old": "req.gone", "new": "False", "count": 1},
    ]
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(PROJECT / "probes" / "probe_mutants.py"), "--probe",
                           str(tmp_path / "probe_demo.py"), "--mutants", str(tmp_path / "specs.json"),
                           "--out", str(out)], env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    observed = {mid: {sid: sc["observed"]["retired"] for sid, sc in run["scenarios"].items()}
                for mid, run in doc["mutants"].items()}
    assert {sid: sc["observed"]["retired"] for sid, sc in doc["baseline"].items()} == {"D": True, "C": False}
    assert observed["door"] == {"D": False, "C": False} and observed["wide"] == {"D": True, "C": True}
    assert {mid: run["status"] for mid, run in doc["mutants"].items()} == {
        "door": "applied", "wide": "applied", "gone": "not applicable", "stale": "error"}
    assert "occurs 0 time(s)" in doc["mutants"]["stale"]["error"]
    assert doc["baseline_after"] == doc["baseline"]


IN_CELL = ("_mutants.py", "_probekit.py", "_standins.py", "probe_mutants.py", "probe_all.py", "engine.py")


# The demo probe's differential: D changes (the fix retires an aborted request), C is a control.
DEMO_EXPERIMENT = registry.Experiment(**{**experiment({}).__dict__, "expect": {
    "D": registry.Expectation("D", True, {"retired": False}, {"retired": True}),
    "C": registry.Expectation("C", False, {"retired": False}, {"retired": False})}})


def demo_lane(tmp_path, monkeypatch, mutants: dict, probe_text: str = DEMO_PROBE, *, cold: bool = False,
              only: list[str] | None = None):
    """A whole lane on the synthetic module: the harness runs the real driver in a warm engine child (this
    interpreter as the closure environment), or with ``cold`` in a fresh process."""
    import shutil
    from types import SimpleNamespace

    from pdevidence.cells import cells
    from pdevidence.sources import trees

    probes = tmp_path / "probes"
    probes.mkdir(exist_ok=True)
    for name in IN_CELL:
        shutil.copy(PROJECT / "probes" / name, probes / name)
    (probes / "probe_demo.py").write_text(probe_text)
    (tmp_path / "synthmod.py").write_text(textwrap.dedent(SYNTHETIC))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PDEVIDENCE_WORK", str(tmp_path / "work"))
    muts = {mid: registry.Mutant(id=mid, title=mid, **fields) for mid, fields in mutants.items()}
    exp = registry.Experiment(**{**DEMO_EXPERIMENT.__dict__, "probe": probes / "probe_demo.py", "mutants": muts})
    reg = SimpleNamespace(root=tmp_path, experiment=lambda name: exp, era_of=lambda version: None)
    tree = trees.Tree("release", "9.9", "9.9", tmp_path / "tree", None, "pypi", "test")
    tree.install_target.mkdir(exist_ok=True)  # the engine puts it first on the child's path
    monkeypatch.setattr(cells, "resolve_tree", lambda reg, cell: tree)
    monkeypatch.setattr(cells, "cell_slug", lambda reg, cell, tree: "demo.head.release-9.9")
    monkeypatch.setattr(environments, "cell_environment", lambda reg, tree, slug: SimpleNamespace(interpreter=sys.executable))
    monkeypatch.setattr(environments, "closure_environment", lambda reg, era=None, log=None: SimpleNamespace(
        interpreter=sys.executable, path=tmp_path / "closure-env"))
    monkeypatch.setattr(mutate, "made_by", lambda reg, experiment, tree: MADE)
    result = mutate.run(reg, "demo", cold=cold, mutants=only, log=lambda msg: None)
    assert result.provenance == MADE and result.parameters.mutants == (only or list(mutants))
    return result


EDIT = registry.Operator.EDIT


DOOR_MUTANTS = {
    "door": dict(kind=registry.MutantKind.REMOVES_FIX, target="synthmod:Door.add", operator=EDIT,
                 old="if guard(req):", new="if False:"),
    "wide": dict(kind=registry.MutantKind.OVER_BROAD, target="synthmod:guard", operator=EDIT,
                 old="req.held", new="False"),
}


@pytest.mark.parametrize("cold", [False, True], ids=["engine", "cold"])
def test_lane_end_to_end_kills_by_observation(tmp_path, monkeypatch, cold):
    result = demo_lane(tmp_path, monkeypatch, DOOR_MUTANTS, cold=cold)
    assert {m.id: m.killed_by for m in result.mutants} == {"door": {"D": ["retired"]}, "wide": {"C": ["retired"]}}
    assert result.exit_code == errors.CONFIRMED and result.tree == {"kind": "release", "ref": "9.9", "resolved": "9.9"}


def test_lane_with_a_mutant_whose_target_left_its_own_tree_is_not_confirmed(tmp_path, monkeypatch):
    moved = dict(kind=registry.MutantKind.REMOVES_FIX, target="synthmod:Door.admit", operator=EDIT,
                 old="if guard(req):", new="if False:")
    result = demo_lane(tmp_path, monkeypatch, {**DOOR_MUTANTS, "moved": moved})
    assert {m.id: m.status for m in result.mutants} == {
        "door": MutantStatus.KILLED, "wide": MutantStatus.KILLED, "moved": MutantStatus.ERROR}
    assert result.exit_code == errors.BEHAVIOUR_DIFFERS
    assert "error: moved [removes-fix] moved (not applicable on release 9.9, the tree it was written for: " \
           "synthmod:Door.admit: 'admit' is not on this tree" in mutate.table(result)


ADAPTING_PROBE = DEMO_PROBE + '''

@DEMO.scenario("A", "a scenario that adapts the probe to the tree")
def a(observed):
    DEMO.adapted("demo-adaptation")
    observed["ran"] = True
'''


def test_the_lane_keeps_each_mutants_observations_and_check_judges_them(tmp_path, monkeypatch):
    demo_lane(tmp_path, monkeypatch, DOOR_MUTANTS, ADAPTING_PROBE)
    doc = json.loads((tmp_path / "runs" / "mutate" / "demo.probe.json").read_text())
    assert doc["adaptations"] == ["demo-adaptation"]
    answers = {mid: checked(DEMO_EXPERIMENT, result).status
               for mid, result in mutate.mutant_results(DEMO_EXPERIMENT, doc).items()}
    assert answers == {"door": check.Status.AFFECTED, "wide": check.Status.DEVIATES}


WHERE_PROBE = DEMO_PROBE + '''

@DEMO.scenario("W", "which program runs the scenarios")
def w(observed):
    import os
    import sys
    observed["main"] = os.path.basename(sys.modules["__main__"].__file__)
'''


def test_the_lane_runs_the_driver_in_an_engine_child_and_writes_the_table_a_fresh_process_writes(tmp_path,
                                                                                                  monkeypatch):
    warm = demo_lane(tmp_path, monkeypatch, DOOR_MUTANTS, WHERE_PROBE)
    driver_doc = json.loads((tmp_path / "runs" / "mutate" / "demo.probe.json").read_text())
    assert driver_doc["baseline"]["W"]["observed"]["main"] == "engine.py"
    assert {mid: run["scenarios"]["W"]["observed"]["main"] for mid, run in driver_doc["mutants"].items()} == {
        "door": "engine.py", "wide": "engine.py"}
    cold = demo_lane(tmp_path, monkeypatch, DOOR_MUTANTS, WHERE_PROBE, cold=True)
    driver_doc = json.loads((tmp_path / "runs" / "mutate" / "demo.probe.json").read_text())
    assert driver_doc["baseline"]["W"]["observed"]["main"] == "probe_mutants.py"
    assert mutate.write(warm, tmp_path / "w").read_bytes() == mutate.write(cold, tmp_path / "c").read_bytes()


def test_mutant_selects_some_mutants_and_an_unknown_one_is_a_usage_error(tmp_path, monkeypatch):
    result = demo_lane(tmp_path, monkeypatch, DOOR_MUTANTS, only=["wide"])
    assert [m.id for m in result.mutants] == ["wide"] and result.score["killed"] == 1
    with pytest.raises(errors.HarnessError, match="declares no mutant nope") as exc:
        demo_lane(tmp_path, monkeypatch, DOOR_MUTANTS, only=["nope"])
    assert exc.value.code == errors.USAGE


REBINDING = DEMO_PROBE + '''

@DEMO.scenario("R", "rebinds guard when it is a no-op")
def r(observed):
    import synthmod
    if synthmod.guard(Req()) is None:
        synthmod.guard = lambda req: False
'''


@pytest.mark.parametrize("cold", [False, True], ids=["engine", "cold"])
def test_lane_aborts_with_exit_3_when_a_restore_fails(tmp_path, monkeypatch, cold):
    # A scenario that rebinds the target under the mutant leaves another function there: the check must notice.
    with pytest.raises(errors.HarnessError, match="exited with status 3") as exc:
        demo_lane(tmp_path, monkeypatch, {"g": dict(kind=registry.MutantKind.REMOVES_FIX, target="synthmod:guard",
                                                    operator=registry.Operator.NOOP)}, REBINDING, cold=cold)
    assert exc.value.code == errors.ENVIRONMENT
    assert "restore failed" in str(exc.value)


CRASHING = DEMO_PROBE + '''

@DEMO.scenario("X", "the process dies when guard is a no-op")
def x(observed):
    import os
    import synthmod
    if synthmod.guard(Req()) is None:
        os._exit(9)
'''


def test_a_driver_child_that_dies_fails_the_lane_with_its_status_and_writes_no_table(tmp_path, monkeypatch):
    with pytest.raises(errors.HarnessError, match="exited with status 9; no table written") as exc:
        demo_lane(tmp_path, monkeypatch, {"g": dict(kind=registry.MutantKind.REMOVES_FIX, target="synthmod:guard",
                                                    operator=registry.Operator.NOOP)}, CRASHING)
    assert exc.value.code == errors.ENVIRONMENT and "--cold" in exc.value.todo
    assert not (tmp_path / "runs" / "mutate.demo.json").exists()
    assert not list((tmp_path / "runs" / "mutate").glob("*.probe.json*"))
