"""The same code, written otherwise, answers the same: 0.5.12 with its decoding offload call reworded.

Slow (``--sglang``). Whether a tree offloads a request's KV while it decodes is observed by running the
tree's own decode step (``probes/_decode_step.py``), so neither a comment line before the call nor the
call made through an alias of the manager may move 0.5.12 from affected to *not affected* (offloads at
finish only), as a reading of its text did. Each variant is the 0.5.12 wheel laid out as a fork's
checkout (``test_forks_real.lay_out_fork``) with one edit made at test time, checked as a ``--path``
tree against this checkout's fresh release cells: the session's ``release_matrix``, whose cells are written
whether or not the published evidence is current (between a probe change and its republish the matrix's
comparison with it fails; its cells stand).
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
from test_forks_real import lay_out_fork

from pdevidence import cli, registry
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.sources import trees

pytestmark = [pytest.mark.sglang, pytest.mark.scheduled]  # the scheduled lane (--scheduled)

VERSION = "0.5.12"
OFFLOAD = ("offload_slots", "offload_rid")
PROCESSOR = "python/sglang/srt/managers/scheduler_output_processor_mixin.py"
# 0.5.12's call for a request that still decodes, and the line after its guarded block.
CALL = "            self.decode_offload_manager.offload_kv_cache(req)\n\n        if req.finished():"
VARIANTS = {
    "comment": "            # offload what the request has decoded so far\n" + CALL,
    "alias": ("            manager = self.decode_offload_manager\n"
              "            manager.offload_kv_cache(req)\n\n        if req.finished():"),
}


def check(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["--root", str(PROJECT), "check", *argv, "--references", "fresh", "--json"])
    return {e["experiment"]: e for e in json.loads(out.getvalue())["experiments"] if e["experiment"] in OFFLOAD}


@pytest.fixture(scope="module")
def fresh_cells(release_matrix):
    """This checkout's release cells (the matrix's), judged against as `--references fresh` does: whether the
    published evidence is current or not (mid-republish), so the matrix's exit code is not this module's concern."""
    return release_matrix.runs


@pytest.fixture(scope="module")
def pristine(fresh_cells):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(fresh_cells))
        return check("--version", VERSION)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_0_5_12_with_its_decoding_offload_call_reworded_answers_as_0_5_12(fresh_cells, pristine, tmp_path,
                                                                         monkeypatch, variant):
    """Alone proves: a comment before 0.5.12's decoding offload call, or the call through an alias of the
    manager, leaves both offload experiments as on 0.5.12 (affected), never not affected."""
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(fresh_cells))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    reg = registry.load(PROJECT)
    release = trees.release_tree(VERSION, reg.python, trees.LockFile(tree_lock_file(reg.root)))
    fork = lay_out_fork(release, tmp_path / "sglang-fork", f"v{VERSION}")
    processor = fork / PROCESSOR
    source = processor.read_text(encoding="utf-8")
    assert source.count(CALL) == 1
    processor.write_text(source.replace(CALL, VARIANTS[variant]), encoding="utf-8")

    ours = check("--path", str(fork))
    assert {name: pristine[name]["status"] for name in OFFLOAD} == {name: "affected" for name in OFFLOAD}
    for name in OFFLOAD:
        assert ours[name]["status"] == pristine[name]["status"], (name, ours[name])
        assert ours[name]["scenarios"] == pristine[name]["scenarios"], name
