"""Loading the registry: what it declares, and clear errors when it is malformed."""

from __future__ import annotations

import pytest

from pdevidence import errors, registry
from pdevidence.paths import PROJECT
from synthetic import REGISTRY, make_project


def load_text(tmp_path, text):
    make_project(tmp_path, text)
    return registry.load(tmp_path)


def test_the_project_registry_declares_both_experiments_with_full_pins():
    reg = registry.load(PROJECT)
    assert set(reg.experiments) == {"admission", "prefill"}
    admission = reg.experiment("admission")
    assert admission.pr == 38935
    assert admission.git == {"base": "17ba2c2e7c7b81f31a8a9e693e7435ab262c16b4",
                             "head": "8f3d6944b76c428d884582cb6c82a39db1465360"}
    assert reg.experiment("prefill").git["head"] == "2ee5742af92db2727236460473554c2ee8c4ddaa"
    for exp in reg.experiments.values():
        assert exp.probe.exists(), exp.probe
        assert exp.expect, f"{exp.name} declares no expected differential"


def test_expectations_distinguish_changes_from_controls(tmp_path):
    demo = load_text(tmp_path, REGISTRY).experiment("demo")
    assert demo.expect["D1"].changes and demo.expect["D1"].head == {"enqueued": False, "retired": True}
    assert not demo.expect["D2"].changes and demo.expect["D2"].base == demo.expect["D2"].head


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
        reg.experiment("demo").release("head")
    assert err.value.code == errors.USAGE


@pytest.mark.parametrize("broken, message", [
    ("python = ", "not valid TOML"),
    (REGISTRY.replace(f'base = "{"a" * 40}"', 'base = "abc"'), "full 40-hex commit SHA"),
    (REGISTRY.replace("pr = 1", 'pr = "one"'), "expected int"),
    (REGISTRY.replace('probe = "probes/probe_demo.py"', ""), "missing key 'probe'"),
    (REGISTRY.replace("head = { enqueued = false, retired = true }",
                      "head = { enqueued = true, retired = false }"), "base and head expect the same"),
    ('python = "3.12"\nconstraints = "c"\nrelease_floor = "1"\n[experiments]\n', "no experiments"),
])
def test_malformed_registries_name_the_problem(tmp_path, broken, message):
    with pytest.raises(errors.HarnessError, match=message) as err:
        load_text(tmp_path, broken)
    assert err.value.code == errors.USAGE
    assert "experiments.toml" in str(err.value)


def test_missing_registry_says_where_to_run_from(tmp_path):
    with pytest.raises(errors.HarnessError, match="top directory"):
        registry.load(tmp_path)
