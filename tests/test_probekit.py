"""The probes' shared machinery, without SGLang."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import socket
import sys

import pytest

from pdevidence.core.paths import PROJECT as ROOT


@pytest.fixture
def kit(monkeypatch):
    # block_network patches the socket module; restore it after each test.
    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, getattr(socket.socket, name))
    monkeypatch.setattr(socket, "create_connection", socket.create_connection)
    monkeypatch.syspath_prepend(str(ROOT / "probes"))  # the kit imports _standins beside it, as in a cell
    spec = importlib.util.spec_from_file_location("_probekit_under_test", ROOT / "probes" / "_probekit.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def make_set(kit):
    demo = kit.ScenarioSet("demo")

    @demo.scenario("S2", "records a value")
    def _(obs):
        obs["enqueued"] = True
        obs["count"] = 2

    @demo.scenario("S1", "fails half-way")
    def _(obs):
        obs["before"] = 1
        raise AttributeError("'Req' object at 0x7f3a2b has no attribute 'kv' (/home/me/venv/lib/sglang/x.py)")

    return demo


def test_a_failing_scenario_is_recorded_and_the_others_still_run(kit):
    doc = kit.build_document(make_set(kit), "base", {"kind": "release", "ref": "1", "resolved": "1"})
    assert doc["scenarios"]["S2"] == {"title": "records a value", "observed": {"enqueued": True, "count": 2},
                                      "error": None}
    failed = doc["scenarios"]["S1"]
    assert failed["observed"] == {"before": 1}
    assert failed["error"]["type"] == "AttributeError"


def test_error_messages_carry_no_object_ids_or_directories(kit):
    doc = kit.build_document(make_set(kit), "base", {"kind": "path", "ref": "x", "resolved": "x"})
    message = doc["scenarios"]["S1"]["error"]["message"]
    assert "0x7f3a2b" not in message and "/home/me" not in message
    assert "0x?" in message and "x.py" in message


def test_output_is_byte_identical_across_runs_and_sorted(kit):
    tree = {"kind": "release", "ref": "1", "resolved": "1"}
    first = kit.dumps(kit.build_document(make_set(kit), "head", tree))
    second = kit.dumps(kit.build_document(make_set(kit), "head", tree))
    assert first == second
    assert list(json.loads(first)) == sorted(json.loads(first))
    assert first.endswith("\n")


def test_observations_must_be_json_scalars(kit):
    bad = kit.ScenarioSet("demo")

    @bad.scenario("S1", "records an object")
    def _(obs):
        obs["queue"] = object()

    doc = kit.build_document(bad, "base", {"kind": "path", "ref": "x", "resolved": "x"})
    # A probe bug must not crash the run: it becomes that scenario's error.
    assert doc["scenarios"]["S1"]["observed"] == {}
    assert doc["scenarios"]["S1"]["error"]["type"] == "TypeError"


def test_duplicate_scenario_ids_are_refused(kit):
    demo = kit.ScenarioSet("demo")
    demo.scenario("S1", "one")(lambda obs: None)
    with pytest.raises(ValueError, match="duplicate"):
        demo.scenario("S1", "two")(lambda obs: None)



def test_a_guarded_scenario_records_what_the_tree_lacks_when_it_runs_and_ends_there(kit):
    demo = kit.ScenarioSet("demo")
    lacking = {}
    scenario = demo.guarded(lambda *, aborts=True: {**lacking, **({"receiver_abort": "absent"} if aborts else {})})

    @scenario("S1", "aborts")
    def s1(obs):
        obs["ran"] = True

    @scenario("S2", "never aborts", aborts=False)
    def s2(obs):
        obs["ran"] = True

    lacking["decode_abort"] = "absent"  # what prepare() finds, after the scenarios were declared
    doc = kit.build_document(demo, "base", {"kind": "path", "ref": "x", "resolved": "x"})
    assert doc["scenarios"]["S1"]["observed"] == {"decode_abort": "absent", "receiver_abort": "absent"}
    assert doc["scenarios"]["S2"]["observed"] == {"decode_abort": "absent"}
    lacking.clear()
    doc = kit.build_document(demo, "base", {"kind": "path", "ref": "x", "resolved": "x"})
    assert doc["scenarios"]["S1"]["observed"] == {"receiver_abort": "absent"}
    assert doc["scenarios"]["S2"]["observed"] == {"ran": True}
    assert [s.id for s in demo.scenarios] == ["S1", "S2"]

def test_recorder_keeps_arguments_and_can_fail_after_recording(kit):
    sender = kit.Recorder("sender.abort", raises=RuntimeError("transport down"))
    with pytest.raises(RuntimeError):
        sender(7, is_insert=False)
    assert sender.count == 1
    assert sender.arg("is_insert") is False
    assert sender.arg("index", position=0) == 7


def test_network_is_blocked_loudly(kit):
    kit.block_network()
    with pytest.raises(kit.NetworkBlocked, match="127.0.0.1"):
        socket.create_connection(("127.0.0.1", 9))


def test_main_writes_the_document_atomically(kit, tmp_path, monkeypatch):
    monkeypatch.setattr(kit, "block_network", lambda: None)
    out = tmp_path / "r.json"
    code = kit.main(make_set(kit), lambda: "9.9.9", ["--side", "head", "--tree-kind", "release", "--out", str(out)])
    assert code == kit.EXIT_OK
    doc = json.loads(out.read_text())
    assert doc["tree"] == {"kind": "release", "ref": "9.9.9", "resolved": "9.9.9"}
    assert doc["sglang_version"] == "9.9.9"
    assert list(tmp_path.iterdir()) == [out]


def test_main_cannot_run_when_sglang_does_not_import(kit, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kit, "block_network", lambda: None)

    def broken():
        raise ImportError("No module named 'sglang'")

    out = tmp_path / "r.json"
    assert kit.main(make_set(kit), broken, ["--out", str(out)]) == kit.EXIT_CANNOT_RUN
    assert not out.exists()
    assert "No module named 'sglang'" in capsys.readouterr().err


def test_bad_arguments_are_a_usage_error(kit, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["probe"])
    assert kit.main(make_set(kit), lambda: "1", ["--tree-kind", "svn"]) == kit.EXIT_USAGE


def test_a_spy_records_then_runs_the_real_callable(kit):
    spy = kit.Spy("release", lambda req, is_insert: f"released {req}")
    assert spy("r1", is_insert=False) == "released r1"
    assert spy.count == 1 and spy.arg("is_insert") is False


def test_swapped_restores_attributes_even_when_the_block_raises(kit):
    import types

    module = types.SimpleNamespace(send=print)
    with pytest.raises(RuntimeError):
        with kit.swapped(module, send="recorder"):
            assert module.send == "recorder"
            raise RuntimeError
    assert module.send is print


@pytest.mark.parametrize("has_pd", [False, True])
def test_a_tree_without_pd_disaggregation_records_only_that_and_prepares_nothing(kit, tmp_path, monkeypatch, has_pd):
    package = tmp_path / "sglang"
    for sub in ("srt", "srt/managers", *(("srt/disaggregation",) if has_pd else ())):  # a server runtime, PD or not
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("__version__ = '0.4.4.post1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    prepared = []
    version, absent = kit.prepare_tree(make_set(kit), lambda: prepared.append(1) or "prepared")
    assert (version, absent, prepared) == (("prepared", False, [1]) if has_pd else ("0.4.4.post1", True, []))
    doc = kit.build_document(make_set(kit), "sweep", {"kind": "release", "ref": version, "resolved": version},
                             pd_absent=absent)
    if not has_pd:
        assert doc["scenarios"] == {sid: {"title": title, "observed": {"pd_disaggregation": "absent"}, "error": None}
                                    for sid, title in (("S2", "records a value"), ("S1", "fails half-way"))}
    # A fix outside PD (the plain overlap loop is older than PD) is prepared and driven on such a tree all the same.
    outside_pd = dataclasses.replace(make_set(kit), needs_pd=False)
    assert kit.prepare_tree(outside_pd, lambda: "prepared") == ("prepared", False)


class Collaborator:
    """A tree's collaborator: ``a`` the probe writes itself, ``b`` only another tree's idiom calls."""

    def a(self):
        raise AssertionError("the real method must never run")

    def b(self, rid, *, tokens=None):
        raise AssertionError("the real method must never run")

    def count(self) -> int:
        raise AssertionError("the real method must never run")

    @property
    def size(self):
        return 1


def test_a_stand_in_records_every_method_of_the_tree_s_class_it_was_not_written_with(kit):
    written = kit.Recorder("thing.a", returns="written")
    thing = kit.stand_in((Collaborator,), "thing", a=written, page_size=4)
    assert thing.a() == "written" and written.count == 1  # as written
    assert thing.b("rid-1", tokens=[1, 2]) is None  # no AttributeError for a name only another tree calls
    assert thing.b.count == 1 and thing.b.arg("rid", 0) == "rid-1"
    assert thing.count() == 0  # the empty value of the type it declares
    assert kit.recorded(thing) == ["thing.b('rid-1', tokens=list[2])", "thing.count()"]
    assert thing.page_size == 4 and not isinstance(thing, Collaborator)
    with pytest.raises(AttributeError):  # an attribute, not a method: given explicitly or absent
        thing.size
    with pytest.raises(AttributeError, match="^the probe's thing stand-in has no attribute 'c': the probe did not "
                       "write it, and the tree's Collaborator defines no such method$") as lacked:
        thing.c()  # what and why: a scenario's error names the probe's gap
    assert (lacked.value.name, lacked.value.obj) == ("c", thing)
    assert not hasattr(thing, "c") and getattr(thing, "c", "absent") == "absent"  # the tree's own tests still work
    with pytest.raises(AttributeError, match="^the probe's bare stand-in has no attribute 'c': the probe did not "
                       "write it, and the tree has no class for its role here to take methods from$"):
        kit.stand_in((), "bare").c


def test_a_stand_in_s_record_is_the_same_on_every_run(kit):
    def record():
        thing = kit.stand_in((Collaborator,), "thing")
        thing.b(object(), tokens={"a": 1})
        return kit.recorded(thing)

    assert record() == record() == ["thing.b(object, tokens=dict[1])"]


def test_a_hand_written_stand_in_class_keeps_its_methods_and_records_the_others(kit):
    class Controller:
        def __init__(self):
            self.queue = []

        def a(self):
            return "written"

    made = kit.stand_in_class(Controller, (Collaborator,), "controller")()
    assert made.a() == "written" and made.queue == [] and made.b("r") is None
    assert kit.recorded(made) == ["controller.b('r')"]


def test_the_tree_s_classes_are_found_where_it_keeps_them_and_missing_ones_skipped(kit):
    found = kit.tree_classes("no_such_module:Thing", "json:NoSuchClass", "json:JSONDecoder", "json:dumps")
    assert found == (json.JSONDecoder,)
    roles = kit.Collaborators(decoder=("json:JSONDecoder",))
    with pytest.raises(AttributeError):  # before find(): only what it was written with
        roles.make("decoder", "decoder").decode("x")
    roles.find()
    assert roles.classes("decoder") == (json.JSONDecoder,)
    assert roles.make("decoder", "decoder").decode("x") is None
    with pytest.raises(KeyError):
        roles.classes("decodr")


def test_a_source_that_cannot_be_read_is_the_scenario_s_error_never_a_false(kit):
    """What a tree's code reads, asked of code whose source cannot be read, is no answer: the scenario
    that asked records the error, and no observation of it reads as the tree lacking the token."""
    namespace: dict = {}
    exec("def result_path(self, batch):\n    return batch.accept_token\n", namespace)  # no file behind it
    demo = kit.ScenarioSet("demo")

    @demo.scenario("S1", "asks what the tree's result path reads")
    def _(obs):
        obs["reads_grammar"] = kit.class_fact(namespace["result_path"], "accept_token", why="the kit's own test")

    result = kit.run_scenario(demo.scenarios[0])
    assert result["observed"] == {}
    assert result["error"]["type"] == "SourceUnreadable"
    assert "the source of result_path cannot be read" in result["error"]["message"]


class Params:
    """Sampling parameters as a tree's: stop strings unset until the tokenizer manager normalizes them."""

    def __init__(self, max_new_tokens):
        self.max_new_tokens, self.stop_strs = max_new_tokens, None

    def normalize(self, tokenizer):
        assert tokenizer is None
        self.stop_strs = []


class Req:
    def __init__(self, rid, text, prompt, params):
        self.rid, self.origin_input_ids, self.sampling_params = rid, prompt, params


def test_a_served_req_reads_as_a_server_hands_it_over(kit):
    """A finish check reads the stop strings, the vocabulary size and the EOS set: a server sets all three, and
    no probe's token reaches either bound."""
    req = kit.served_req(Req, Params, "r", [1, 2, 3], max_new_tokens=4)
    assert (req.rid, req.origin_input_ids, req.sampling_params.max_new_tokens) == ("r", [1, 2, 3], 4)
    assert req.sampling_params.stop_strs == []
    assert req.vocab_size == kit.VOCAB and req.eos_token_ids == {kit.EOS} and kit.EOS < kit.VOCAB
