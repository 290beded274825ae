"""Loading the registry: what it declares, and clear errors when it is malformed."""

from __future__ import annotations

import re

import pytest
from synthetic import REGISTRY, make_project

from pdevidence import registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT


def load_text(tmp_path, text):
    make_project(tmp_path, text)
    return registry.load(tmp_path)


def test_the_project_registry_declares_both_experiments_with_full_pins():
    reg = registry.load(PROJECT)
    assert set(reg.experiments) == {"admission", "prefill", "offload_slots", "offload_rid", "abort_notify",
                                    "deferred_release", "deferred_release_nixl", "retract_resume",
                                    "grammar_release", "swa_free", "swa_tail", "war_barrier"}
    # war_barrier pins PR #26380's merge commit and its parent; its gate holds off CUDA only.
    assert reg.experiment("war_barrier").git == {"base": "dea85c30f48ed3d5faecf58e6f7f1118a37f2580",
                                                 "head": "163b97012707d712e141e7ee486b72e2b0d8e60d"}
    assert reg.experiment("war_barrier").gate.platforms == ("cuda",)
    admission = reg.experiment("admission")
    assert admission.pr == 38935
    assert admission.git == {"base": "17ba2c2e7c7b81f31a8a9e693e7435ab262c16b4",
                             "head": "8f3d6944b76c428d884582cb6c82a39db1465360"}
    assert reg.experiment("prefill").git["head"] == "2ee5742af92db2727236460473554c2ee8c4ddaa"
    # offload_slots pins PR #24226's merge commit and its parent; offload_rid's merge commit is not known here.
    assert reg.experiment("offload_slots").git == {"base": "c4a7d1209231e662c4447fe3d3326d8c3d1087b7",
                                                   "head": "643d44d699285fe21e6cd347864277b72a358dba"}
    assert reg.experiment("offload_rid").git == {}
    assert reg.experiment("offload_slots").releases == {"base": "0.5.12", "head": "0.5.13"}
    assert reg.experiment("offload_rid").releases == {"base": "0.5.18", "head": "0.5.19"}
    assert reg.experiment("deferred_release").git == {"base": "c60952d9330091b0db5b11b2cdbc00fd3063a935",
                                                      "head": "97dedd1ce9b161c476e0a91106857f210b5bfa41"}
    assert reg.experiment("abort_notify").git == {"base": "86b9bf5812b72968013a3bb1618ee83183ff35d5",
                                                  "head": "57909f731b0fb325f0313946cf358a23fbe0fd00"}
    assert reg.experiment("abort_notify").releases == {"base": "0.5.12", "head": "0.5.13"}
    assert reg.experiment("deferred_release_nixl").git == {"base": "aa215e55230bc9b0eb503b5a3886c015c2e5f526",
                                                           "head": "adca19c4970933fa1990fecf3541b527d3153594"}
    assert reg.experiment("deferred_release_nixl").releases == {"base": "0.5.18", "head": "0.5.19"}
    assert reg.experiment("retract_resume").git == {"base": "e264b5785d827cdfca80f2eb7d2b108a8a9c37a6",
                                                    "head": "ec4560304b79d856acc9410f9d23f25cfeb0fe73"}
    assert reg.experiment("retract_resume").releases == {"base": "0.5.11", "head": "0.5.12"}
    assert reg.experiment("grammar_release").git == {"base": "43241b7f3fdb2ac0146171bda14b35399b377e5d",
                                                     "head": "bbb5702a3c7faba97ab425b15808cbe5f3ab6f7c"}
    assert reg.experiment("grammar_release").releases == {"base": "0.5.15", "head": "0.5.16"}
    assert reg.experiment("grammar_release").needs.excludes == {"grammar_backend": ("none",)}
    assert reg.experiment("swa_free").git == {"base": "22c7285a2680946afae6e867bf623b68bbba5886",
                                              "head": "54cba63b6c753cb48785a603506956619f3a615e"}
    assert reg.experiment("swa_free").releases == {"base": "0.5.13", "head": "0.5.14"}
    assert reg.experiment("swa_tail").git == {"base": "a7555fc997f36ef3f0ed53a7632cece1e93e6314",
                                              "head": "c9153da5dca5fb1ee1a0bd765432dd56e1fc0e5b"}
    assert reg.experiment("swa_tail").releases == {"base": "0.5.12", "head": "0.5.13"}
    for exp in reg.experiments.values():
        assert exp.probe.exists(), exp.probe
        assert exp.expect, f"{exp.name} declares no expected differential"


GATE = """
[experiments.demo.gate]
variable = "DEMO_FIX_ON"
on = "true"
why = "off by default"
"""


def test_a_gate_names_the_server_variable_that_turns_the_fix_on(tmp_path):
    assert load_text(tmp_path, REGISTRY + GATE).experiment("demo").gate == registry.Gate("DEMO_FIX_ON", "true",
                                                                                         "off by default")
    assert registry.load(PROJECT).experiment("admission").gate is None  # no table: the fix's code always runs


NEEDS = """
[experiments.demo.needs]
server_args = { disaggregation_mode = ["decode"] }
above = { page_size = 1 }
assumes = "the model has sliding-window layers"
why = "paged SWA only"
"""


def test_needs_may_bound_an_integer_attribute_and_say_what_they_assume(tmp_path):
    needs = load_text(tmp_path, REGISTRY + NEEDS).experiment("demo").needs
    assert needs.attributes == ["disaggregation_mode", "page_size"]
    assert needs.unmet({"disaggregation_mode": "decode", "page_size": 16}) == []
    assert needs.unmet({"disaggregation_mode": "decode", "page_size": 1}) == ["page_size"]
    assert needs.unmet({"disaggregation_mode": "decode", "page_size": True}) == ["page_size"]  # typed: not an int
    assert needs.undefined({"disaggregation_mode": "decode"}) == ["page_size"]
    assert needs.wanted() == {"disaggregation_mode": ["decode"], "page_size": ["> 1"]}
    assert needs.assumes == "the model has sliding-window layers"


@pytest.mark.parametrize(("text", "message"), [
    (GATE.replace('"DEMO_FIX_ON"', '"demo fix"'), "not an environment variable name"),
    (GATE.replace('on = "true"', ""), "missing key 'on'"),
    (NEEDS.replace("page_size = 1", 'page_size = "1"'), "an integer bound"),
    (NEEDS.replace("above = { page_size = 1 }", "above = { disaggregation_mode = 1 }"), "also in server_args"),
])
def test_a_malformed_gate_or_bound_is_refused_by_name(tmp_path, text, message):
    with pytest.raises(errors.HarnessError, match=message):
        load_text(tmp_path, REGISTRY + text)


KERNELS = """
[experiments.demo.cpu_kernels."sglang.srt.mem_cache.allocator.paged:alloc_extend_kernel"]
cpu = "alloc_extend_naive"
why = "the module's own CPU implementation"
"""


def test_a_kernel_is_answered_only_by_a_name_in_its_own_module(tmp_path):
    exp = load_text(tmp_path, REGISTRY + KERNELS).experiment("demo")
    assert exp.cpu_kernels == {"sglang.srt.mem_cache.allocator.paged:alloc_extend_kernel":
                               ("alloc_extend_naive", "the module's own CPU implementation")}
    with pytest.raises(errors.HarnessError, match="not a name in the kernel's own module"):
        load_text(tmp_path, REGISTRY + KERNELS.replace('"alloc_extend_naive"', '"probes._swa:naive"'))


def test_an_experiment_without_git_pins_names_the_missing_commit(tmp_path):
    exp = registry.load(PROJECT).experiment("offload_rid")
    with pytest.raises(Exception, match="no pinned base commit"):
        exp.pin("git", "base")


def test_expectations_distinguish_changes_from_controls(tmp_path):
    demo = load_text(tmp_path, REGISTRY).experiment("demo")
    assert demo.expect["D1"].changes and demo.expect["D1"].head == {"enqueued": False, "retired": True}
    assert not demo.expect["D2"].changes and demo.expect["D2"].base == demo.expect["D2"].head


def test_a_control_declares_the_keys_that_differ_beside_it_and_why(tmp_path):
    text = REGISTRY.replace("keys = { enqueued = true }",
                            'keys = { enqueued = true }\nbeside = { keys = ["tree_error"], why = "the base raises" }')
    control = load_text(tmp_path, text).experiment("demo").expect["D2"]
    assert control.beside == registry.Beside(("tree_error",), "the base raises")


@pytest.mark.parametrize("beside, message", [
    ('{ keys = ["enqueued"], why = "x" }', r"D2\.beside\.keys: enqueued is what the control holds"),
    ('{ keys = [], why = "x" }', "name the keys that differ beside the control, and why"),
    ('{ keys = ["k"] }', "missing key 'why'"),
])
def test_a_beside_declaration_that_would_hide_the_control_or_says_nothing_is_refused(tmp_path, beside, message):
    with pytest.raises(errors.HarnessError, match=message):
        load_text(tmp_path, REGISTRY.replace("keys = { enqueued = true }", f"keys = {{ enqueued = true }}\nbeside = {beside}"))


def test_unknown_experiment_lists_the_valid_ones(tmp_path):
    reg = load_text(tmp_path, REGISTRY)
    with pytest.raises(errors.HarnessError) as err:
        reg.experiment("admision")
    assert err.value.code == errors.USAGE
    assert "demo" in str(err.value)


def test_unknown_side_is_a_usage_error():
    with pytest.raises(errors.HarnessError, match="base, head") as err:
        registry.check_side("middle")
    assert err.value.code == errors.USAGE


def test_unset_release_bracket_says_how_to_find_it(tmp_path):
    reg = load_text(tmp_path, REGISTRY.replace('head = "1.1.0"', ""))
    with pytest.raises(errors.HarnessError, match="sweep") as err:
        reg.experiment("demo").pin("release", "head")
    assert err.value.code == errors.USAGE


@pytest.mark.parametrize("broken, message", [
    ("python = ", "not valid TOML"),
    (REGISTRY.replace(f'base = "{"a" * 40}"', 'base = "abc"'), "full 40-hex commit SHA"),
    (REGISTRY.replace("pr = 1", 'pr = "one"'), "expected int"),
    (REGISTRY.replace('probe = "probes/probe_demo.py"', ""), "missing key 'probe'"),
    (REGISTRY.replace("head = { enqueued = false, retired = true }",
                      "head = { enqueued = true, retired = false }"), "base and head expect the same"),
    ('schema = 1\npython = "3.12"\ntorch_channel = "pypi"\nconstraints = "c"\nrelease_floor = "1"\n'
     '[experiments]\n', "no experiments"),
    (REGISTRY.replace('head = "1.1.0"', 'haed = "1.1.0"'), r"unknown key experiments\.demo\.releases\.haed; did you mean 'head'"),
    (REGISTRY.replace('base = "1.0.0"', 'bsae = "1.0.0"'), r"unknown key experiments\.demo\.releases\.bsae; did you mean 'base'"),
    (REGISTRY.replace("changes = false", "changes = false\nchanegs = 1"), r"experiments\.demo\.expect\.D2\.chanegs; did you mean 'changes'"),
    (REGISTRY.replace('title = "', 'titel = "x"\ntitle = "'), r"unknown key experiments\.demo\.titel; did you mean 'title'"),
    (REGISTRY.replace('[experiments.demo.releases]\nbase = "1.0.0"\nhead = "1.1.0"', "").replace(
        'probe = "probes/probe_demo.py"', 'probe = "probes/probe_demo.py"\nreleases = "x"'),
     r"experiments\.demo\.releases: expected table, got string"),
    (REGISTRY.replace('head = "1.1.0"', 'head = "one"'), "not a PEP 440 version"),
    (REGISTRY.replace('torch_channel = "pypi"', 'torch_channel = "cuda"'), "torch_channel: 'cuda' is not one of: pypi, cpu"),
    (REGISTRY.replace("keys = { enqueued = true }", "keys = { enqueued = [1] }"), "expected a boolean, integer or string"),
    (REGISTRY.replace("schema = 1", "schema = 2"), "not a schema this harness reads"),
    (REGISTRY.replace("pr = 1", "pr = true"), "expected integer, got boolean"),
])
def test_malformed_registries_name_the_problem(tmp_path, broken, message):
    with pytest.raises(errors.HarnessError, match=message) as err:
        load_text(tmp_path, broken)
    assert err.value.code == errors.USAGE
    assert "experiments.toml" in str(err.value)


def test_missing_registry_says_where_to_run_from(tmp_path):
    with pytest.raises(errors.HarnessError, match="top directory"):
        registry.load(tmp_path)


MUTANTS = """
[experiments.demo.mutants.M1]
title = "the door check always says admit"
kind = "removes-fix"
target = "demo.utils:is_reject"
operator = "constant"
value = false

[experiments.demo.mutants.M2]
title = "drop the resource clause"
kind = "over-broad"
target = "demo.utils:is_reject"
operator = "edit"
old = "and not held"
new = ""
"""


def test_mutants_are_typed_with_their_operator_fields(tmp_path):
    demo = load_text(tmp_path, REGISTRY + MUTANTS).experiment("demo")
    m1, m2 = demo.mutants["M1"], demo.mutants["M2"]
    assert (m1.kind, m1.operator, m1.value) == (registry.MutantKind.REMOVES_FIX, registry.Operator.CONSTANT, False)
    assert (m2.kind, m2.operator, m2.old, m2.new, m2.count) == (
        registry.MutantKind.OVER_BROAD, registry.Operator.EDIT, "and not held", "", 1)
    assert m2.spec()["kind"] == "over-broad"


@pytest.mark.parametrize("broken, message", [
    (MUTANTS.replace('kind = "removes-fix"', 'kind = "removes"'), "kind: 'removes' is not one of"),
    (MUTANTS.replace('operator = "constant"\nvalue = false', 'operator = "constant"'), "missing key 'value'"),
    (MUTANTS.replace('old = "and not held"', 'olde = "and not held"'), "unknown key .*M2.olde; did you mean 'old'"),
    (MUTANTS.replace('target = "demo.utils:is_reject"\noperator = "constant"',
                     'target = "demo.utils.is_reject"\noperator = "constant"'), "not \"module.path:Qualified.name\""),
    (MUTANTS.replace('operator = "constant"', 'operator = "delete"'), "'delete' is not one of: constant"),
])
def test_malformed_mutants_name_the_key(tmp_path, broken, message):
    with pytest.raises(errors.HarnessError, match=message) as err:
        load_text(tmp_path, REGISTRY + broken)
    assert err.value.code == errors.USAGE


def test_a_registry_typo_exits_2_from_the_command_line_naming_the_key(tmp_path, capsys):
    from pdevidence import cli
    make_project(tmp_path, REGISTRY.replace('base = "1.0.0"', 'bsae = "1.0.0"'))
    assert cli.main(["--root", str(tmp_path), "compare"]) == errors.USAGE
    assert "experiments.demo.releases.bsae; did you mean 'base'" in capsys.readouterr().err


ERAS = REGISTRY + """
[stand_ins.gpu_kernels]
why = "compiled CUDA kernels imported at top level; the probed doors never call them"

[eras.old]
releases = ">=0.4.0,<1.0.0"
constraints = "constraints/old.txt"
stand_ins = ["gpu_kernels"]
note = "the closure the 0.x releases were built for"

[experiments.demo.not_affected.no_door]
scenario = "D1"
key = "door"
value = "absent"
justification = "vulnerable_code_not_present"
why = "the door the fix guards is not in this tree"
"""


def test_a_release_runs_in_the_era_that_holds_it_and_a_newer_one_in_todays_closure(tmp_path):
    reg = load_text(tmp_path, ERAS)
    assert reg.era_of("0.4.5").name == "old" and reg.era_of("0.9.9").stand_ins == ("gpu_kernels",)
    assert reg.era_of("1.0.0") is None and reg.era_of(None) is None and reg.era_of("not-a-version") is None
    assert reg.eras["old"].constraints == tmp_path / "constraints" / "old.txt"
    assert reg.eras["old"].kernel is None  # no kernel range declared
    kernel = load_text(tmp_path, ERAS.replace('note = "the closure', 'kernel = "<0.4.3"\nnote = "the closure'))
    assert kernel.eras["old"].kernel.contains("0.4.2.post2") and not kernel.eras["old"].kernel.contains("0.4.3")


@pytest.mark.parametrize("broken, message", [
    (ERAS.replace('stand_ins = ["gpu_kernels"]', 'stand_ins = ["vllm"]'), "'vllm' is not declared in \\[stand_ins\\]"),
    (ERAS.replace('releases = ">=0.4.0,<1.0.0"', 'releases = "0.4 to 1.0"'), "not a version specifier"),
    (ERAS.replace('note = "the closure', 'kernel = "0.3 or newer"\nnote = "the closure'),
     "eras.old.kernel: '0.3 or newer' is not a version specifier"),
    (ERAS.replace('justification = "vulnerable_code_not_present"', 'justification = "not_vulnerable"'),
     "is not one of: vulnerable_code_not_present, vulnerable_code_not_in_execute_path"),
    (ERAS.replace('why = "the door', 'reason = "the door'), "unknown key experiments.demo.not_affected.no_door.reason"),
])
def test_eras_stand_ins_and_not_affected_rules_are_checked_strictly(tmp_path, broken, message):
    with pytest.raises(errors.HarnessError, match=message) as err:
        load_text(tmp_path, broken)
    assert err.value.code == errors.USAGE


@pytest.mark.parametrize("releases, held", [
    (">=0.9", "0.9"), ("<0.4.1", "0.4.0"), ("==0.5.3", "0.5.3"), (">0.9,<=1.2", "0.9.0.0.1"), (">=0.1", "0.4.0")])
def test_two_eras_that_hold_one_release_are_refused_naming_both_and_the_release(tmp_path, releases, held):
    overlap = ERAS + f'[eras.overlap]\nreleases = "{releases}"\nconstraints = "constraints/o.txt"\n'
    with pytest.raises(errors.HarnessError, match=rf"eras\.overlap\.releases: .* overlaps eras\.old .*both hold "
                       rf"{re.escape(held)}") as err:
        load_text(tmp_path, overlap)
    assert err.value.code == errors.USAGE


def test_an_era_of_source_trees_only_holds_no_release_and_overlaps_none(tmp_path):
    trees_only = ERAS + '[eras.commits]\nconstraints = "constraints/c.txt"\nnote = "the main line between releases"\n'
    reg = load_text(tmp_path, trees_only)
    assert reg.eras["commits"].releases is None and not reg.eras["commits"].holds("0.4.5")
    assert reg.era_of("0.4.5").name == "old" and reg.era_of("1.0.0") is None


def test_eras_that_touch_but_do_not_overlap_load():
    reg = registry.load(PROJECT)  # the real eras: each bound of one is the other's edge, excluded there
    assert len(reg.eras) > 1 and reg.era_of("0.5.13").name == "torch2.11-tf5"


def test_a_not_affected_rule_on_a_scenario_the_experiment_does_not_expect_is_refused(tmp_path):
    with pytest.raises(errors.HarnessError, match=r"experiments\.demo\.not_affected\.no_door\.scenario: 'D9' is "
                       "not a scenario this experiment expects") as err:
        load_text(tmp_path, ERAS.replace('scenario = "D1"', 'scenario = "D9"'))
    assert err.value.code == errors.USAGE


def test_a_not_affected_rule_holds_on_its_typed_observation_only(tmp_path):
    rule = load_text(tmp_path, ERAS).experiment("demo").not_affected["no_door"]
    assert rule.justification is registry.Justification.CODE_NOT_PRESENT
    assert rule.holds({"scenarios": {"D1": {"observed": {"door": "absent"}}}})
    assert not rule.holds({"scenarios": {"D1": {"observed": {"door": "present"}}}})
    assert not rule.holds({"scenarios": {"D2": {"observed": {"door": "absent"}}}})
    truthy = registry.NotAffected("x", "D1", "door", True, rule.justification, "")
    assert not truthy.holds({"scenarios": {"D1": {"observed": {"door": 1}}}})


ASIDE = REGISTRY + """
[experiments.demo.not_deciding.older_intake]
when = { "D1.intake" = "inline" }
keys = { D1 = ["retired"] }
why = "the older intake retires the request itself"
"""


@pytest.mark.parametrize("broken, message", [
    (ASIDE.replace('D1 = ["retired"]', 'D9 = ["enqueued"]'), "'D9' is not a scenario this experiment expects"),
    (ASIDE.replace('D1 = ["retired"]', 'D2 = ["retired"]'), "keys.D2: retired is not a key D2 expects"),
    (ASIDE.replace('D1 = ["retired"]', 'D1 = ["sent"]'), "keys.D1: sent is not a key D1 expects"),
    (ASIDE.replace('D1 = ["retired"]', 'D1 = "retired"'), 'expected an array of keys, or "all"'),
    (ASIDE.replace('"D1.intake"', '"intake"'), "'intake' is neither \"adaptation\" nor"),
    (ASIDE.replace('why = "the older', 'reason = "the older'), "missing|unknown key"),
])
def test_not_deciding_rules_name_what_the_experiment_expects(tmp_path, broken, message):
    with pytest.raises(errors.HarnessError, match=message) as err:
        load_text(tmp_path, broken)
    assert err.value.code == errors.USAGE


def test_a_not_deciding_rule_may_set_a_control_key_aside(tmp_path):
    rule = load_text(tmp_path, ASIDE.replace('D1 = ["retired"]', 'D2 = ["enqueued"]')) \
        .experiment("demo").not_deciding["older_intake"]
    assert rule.keys == {"D2": ("enqueued",)}


# What the oldest trees cannot express, as the prefill probe records it there: a release with no insert
# flag, no abortable sender, no cache-side abort, no KV-less mamba slot and no grammar in the result path.
OLDEST_TREE = ["no-cache-abort-release", "no-grammar-in-result", "no-req-mamba-slot", "no-sender-abort",
               "release-without-insert-flag"]


def oldest_tree(side_doc: dict, adaptations: list[str]) -> dict:
    """``side_doc`` as a tree of the first PD releases observes it: what it cannot express differs."""
    import copy

    doc = copy.deepcopy(side_doc)
    doc["tree"] = {"kind": "release", "ref": "0.4.5", "resolved": "0.4.5"}
    doc["adaptations"] = adaptations
    scenarios = doc["scenarios"]
    for sid in ("B1", "B1b", "B2d"):
        scenarios[sid]["observed"]["sender_aborted"] = 0
    for sid in ("B1", "B1b"):
        if scenarios[sid]["observed"]["release_inserts_prefix"] is not None:
            scenarios[sid]["observed"]["release_inserts_prefix"] = "absent"
    scenarios["B1h"]["observed"]["cache_aborted"] = 0
    scenarios["B7"]["observed"] = {"abort_streamed": 0, "mamba_freed": 0}
    scenarios["B6"]["observed"] = {"abort_streamed": 0, "cached_unfinished": 1, "kv_chunk_sent": 1, "kv_released": 0}
    return doc


def test_prefill_rules_set_aside_only_what_the_oldest_trees_cannot_express():
    import json

    from pdevidence.documents.vocabulary import Classification
    from pdevidence.judge import classify

    exp = registry.load(PROJECT).experiment("prefill")
    base, head = (json.loads((PROJECT / "results" / f"prefill.{side}.release-{v}.json").read_text())
                  for side, v in (("base", "0.5.19"), ("head", "0.5.20")))
    ported = classify.classify(oldest_tree(head, OLDEST_TREE), base, head, exp)
    assert ported.classification is Classification.FIXED  # a port there is seen
    assert classify.classify(oldest_tree(base, OLDEST_TREE), base, head, exp).classification \
        is Classification.PRE_FIX  # and the release as published is still affected
    # Each rule holds only where the tree records the fact: without it, the same port matches neither side.
    for fact in OLDEST_TREE:
        rest = [name for name in OLDEST_TREE if name != fact]
        assert classify.classify(oldest_tree(head, rest), base, head, exp).classification \
            is not Classification.FIXED, fact


# --- an experiment's own release floor ----------------------------------------------------------------------------
FLOOR = REGISTRY.replace('probe = "probes/probe_demo.py"', 'probe = "probes/probe_demo.py"\nrelease_floor = "0.9.0"')


def test_an_experiment_may_reach_below_the_registry_floor_and_the_others_keep_it(tmp_path):
    reg = load_text(tmp_path, FLOOR)
    assert reg.experiment("demo").release_floor == "0.9.0" and reg.floor("demo") == "0.9.0"
    plain = load_text(tmp_path, REGISTRY)
    assert plain.experiment("demo").release_floor is None and plain.floor("demo") == "1.0.0"


@pytest.mark.parametrize("floor, message", [
    ('"1.0.0"', "experiments.demo.release_floor: '1.0.0' is not older than the registry's release_floor '1.0.0'"),
    ('"1.0.1"', "experiments.demo.release_floor: '1.0.1' is not older than the registry's release_floor"),
    ('"old"', "experiments.demo.release_floor: 'old' is not a PEP 440 version"),
    ("3", "experiments.demo.release_floor: expected string, got integer"),
])
def test_an_experiment_floor_that_does_not_reach_further_back_is_refused(tmp_path, floor, message):
    with pytest.raises(errors.HarnessError, match=re.escape(message)) as err:
        load_text(tmp_path, FLOOR.replace('release_floor = "0.9.0"', f"release_floor = {floor}"))
    assert err.value.code == errors.USAGE


def test_an_experiment_floor_above_its_own_pre_fix_release_is_refused(tmp_path):
    below = FLOOR.replace('release_floor = "1.0.0"', 'release_floor = "2.0.0"').replace(
        'release_floor = "0.9.0"', 'release_floor = "1.5.0"')
    with pytest.raises(errors.HarnessError, match=re.escape("experiments.demo.release_floor: '1.5.0' is newer than "
                                                            "its pre-fix release '1.0.0'")):
        load_text(tmp_path, below)


def test_war_barrier_reads_back_to_a_scheduler_without_the_overlap_loop_in_the_era_of_its_day():
    reg = registry.load(PROJECT)
    assert reg.floor("war_barrier") == "0.3.3" and reg.floor("admission") == reg.release_floor == "0.4.4.post1"
    # 0.3.3 (no overlap loop) to 0.4.2.post3 import their scheduler with the vLLM and outlines they import at top
    # level (real: they call both at import), outlines' pyairports (gone from PyPI) stood in.
    for version in ("0.3.0", "0.3.3", "0.3.4", "0.3.6", "0.4.2.post3"):
        assert reg.era_of(version).name == "torch2.5-tf4-vllm"
        assert reg.era_of(version).stand_ins == ("sgl_kernel", "triton-driver", "pyairports")
    assert reg.era_of("0.4.2.post4").name == "pre-pd" and "vllm" in reg.era_of("0.4.2.post4").stand_ins
    # 0.4.3.post1 and post2 import a name of transformers' mllama that 4.51 dropped: torch2.5-tf4.48's 4.48.3.
    assert reg.era_of("0.4.3").name == "pre-pd" and reg.era_of("0.4.3.post1").name == "torch2.5-tf4.48"
