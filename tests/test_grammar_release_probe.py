"""The grammar_release probe's measures read the order of what the world recorded; its scripts are the registry's.

No SGLang: the probe module is loaded as a cell loads it (its world needs SGLang only once a scenario runs), and
its measures are fed event sequences written here: the pre-fix one (a release right after the last chunk was
handed over, another at the terminal poll), the bootstrap-pending one (a release, then the last chunk sent from
the pages given back) and the fixed one (one release after the terminal poll).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdevidence import registry
from pdevidence.core.paths import PROJECT

PROBES = PROJECT / "probes"


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(PROBES))
    try:
        spec = importlib.util.spec_from_file_location("grammar_release_probe_under_test",
                                                      PROBES / "probe_grammar_release_differential.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(PROBES))


def measured(probe, events: list[str], *, abort=None, finished=None) -> dict:
    world = SimpleNamespace(events=events, abort=abort)
    req = SimpleNamespace(finished_reason=finished)
    return {key: measure(world, req) for key, measure in probe.MEASURES.items()}


class FINISH_ABORT:  # noqa: N801 - named as SGLang's, since the class name is what finish_reason records
    pass


class FINISH_LENGTH:  # noqa: N801
    pass


def test_pre_fix_after_the_last_chunk_releases_under_the_transfer_and_again_at_its_end(probe):
    grammar_abort = FINISH_ABORT()
    got = measured(probe, ["send", "release", "terminal", "release"], abort=grammar_abort, finished=FINISH_LENGTH())
    assert got == {"release_count": 2, "double_released": True, "released_in_flight": 1, "sent_after_release": 0,
                   "finish_reason": "FINISH_LENGTH", "abort_kept": False}


def test_pre_fix_before_the_last_chunk_sends_it_from_pages_given_back(probe):
    got = measured(probe, ["release", "send", "terminal", "release"], abort=FINISH_ABORT(), finished=FINISH_ABORT())
    assert (got["released_in_flight"], got["sent_after_release"], got["double_released"]) == (0, 1, True)
    assert got["abort_kept"] is False, "a new abort object (the transfer's) is not the grammar's"


def test_fixed_releases_once_after_the_terminal_poll_and_keeps_the_abort(probe):
    grammar_abort = FINISH_ABORT()
    got = measured(probe, ["send", "terminal", "release"], abort=grammar_abort, finished=grammar_abort)
    assert got == {"release_count": 1, "double_released": False, "released_in_flight": 0, "sent_after_release": 0,
                   "finish_reason": "FINISH_ABORT", "abort_kept": True}


def test_a_release_before_any_chunk_is_not_in_flight_and_no_abort_means_no_abort_kept(probe):
    got = measured(probe, ["release"], finished=None)
    assert (got["released_in_flight"], got["sent_after_release"], got["finish_reason"], got["abort_kept"]) \
        == (0, 0, None, None)


def test_a_chunk_after_the_terminal_poll_starts_no_new_flight_for_the_count(probe):
    # once the transfer ended, a later release reads nothing in flight, even with a late chunk recorded
    got = measured(probe, ["send", "terminal", "send", "release"])
    assert got["released_in_flight"] == 0


def test_an_unknown_key_fails_when_the_script_is_written(probe):
    with pytest.raises(KeyError, match="no measure"):
        probe.observe("release_count", "relesae_count")


def test_the_scripts_are_the_registry_s_scenarios_and_observe_every_expected_key(probe):
    exp = registry.load(PROJECT).experiments["grammar_release"]
    scripts = {script.id: script for script in probe.SCRIPTS}
    assert set(exp.expect) == set(scripts), "every expected scenario is a script, and every script is expected"
    for sid, expect in exp.expect.items():
        observed = {key for step in scripts[sid].steps if isinstance(step, probe.Observe) for key in step.keys}
        assert set(expect.base) | set(expect.head) <= observed, sid
    assert [s.id for s in probe.SCENARIOS.scenarios] == [s.id for s in probe.SCRIPTS]


def test_each_scenario_drives_a_final_result_then_the_inflight_queue(probe):
    for script in probe.SCRIPTS:
        first, *rest = script.steps
        assert isinstance(first, probe.Deliver), script.id
        assert any(isinstance(step, probe.Poll) and step.state in probe.TERMINAL for step in rest), script.id
        assert isinstance(rest[-1], probe.Observe), script.id


def test_the_docstring_names_every_scenario_and_key(probe):
    for script in probe.SCRIPTS:
        assert f"- {script.id} " in probe.__doc__, script.id
    for key in probe.MEASURES:
        assert f"``{key}``" in probe.__doc__, key


class RaisingQueue:
    """A world whose inflight queue raises ``exc``, as the oldest trees' failure path does."""

    def __init__(self, exc: BaseException):
        self.exc, self.state = exc, None

    def inflight(self):
        raise self.exc


def test_an_old_tree_s_failed_poll_that_raises_is_a_tree_fact(probe):
    observed = {}
    probe.Poll("Failed").run(RaisingQueue(Exception("Transferring failed")), None, observed)
    assert observed == {"failed_poll": "raises"}


@pytest.mark.parametrize(("state", "exc"), [("Success", Exception("Transferring failed")),
                                            ("Failed", RuntimeError("a probe bug"))])
def test_anything_else_the_queue_raises_stays_the_scenario_s_error(probe, state, exc):
    with pytest.raises(type(exc)):
        probe.Poll(state).run(RaisingQueue(exc), None, {})
