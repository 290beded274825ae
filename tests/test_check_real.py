"""`check` on real SGLang: a release, a release env as "your environment", a partial backport, an over-broad
fix, a broken build.

Slow (about 30 s of SGLang import per probe process, four of them): runs with ``--sglang``. Every answer is
read from what this module's own runs wrote, and the session's bracket sweep (``bracket_sweep``) for what the
sweep says of 0.5.20. The environments are the user cache's: a release's cell environment is shared by every
cell, lane and checkout that installs it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from real_runs import CHECKED

from pdevidence import cli, environments, registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT, tree_lock_file
from pdevidence.documents.vocabulary import Classification
from pdevidence.lanes import check, sweep
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

# The partial backport: 0.5.21 with the fix taken out of the decode door only (A2),
# by turning its `is_unadmitted_reject(req)` test into `False`. A few tokens, edited at test time.
DECODE_DOOR = ("srt/disaggregation/decode.py", "and is_unadmitted_reject(req):", "and False:")
# An over-broad fix: 0.5.21 whose door predicate drops its holds_kv clause (the registry's predicate_drops_kv
# mutant, as a vendor's build would carry it): a re-entry still holding a KV row (A10) is retired.
HOLDS_KV = ("srt/disaggregation/utils.py", "        or req.kv.holds_kv\n", "")


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(tmp_path_factory.mktemp("runs")))
        yield registry.load(PROJECT)


def run_check(*argv: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--root", str(PROJECT), "check", *argv, "--json"])
    return code, json.loads(out.getvalue())


def statuses(doc: dict) -> dict[str, str]:
    return {e["experiment"]: e["status"] for e in doc["experiments"]}


def release_env(reg, version: str, slug: str):
    tree = trees.release_tree(version, reg.python, trees.LockFile(tree_lock_file(reg.root)))
    return environments.cell_environment(reg, tree, f"{slug}.{tree.label()}")


def snapshot(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.lstat().st_mtime_ns for p in sorted(directory.rglob("*"))}


@pytest.fixture(scope="module")
def version_check(reg):
    return run_check("--version", "0.5.20")


@pytest.fixture(scope="module")
def swept(reg, bracket_sweep):
    """Per experiment, the shared bracket sweep's row for 0.5.20 (a bracket release of admission and prefill)."""
    return {name: bracket_sweep.row(name, "0.5.20") for name in reg.experiments}


def telling(reg, experiment: str) -> list[str]:
    """The scenarios the registry declares as telling base from head, as check lists them."""
    return sorted(sid for sid, e in reg.experiment(experiment).expect.items() if e.changes)


# What check answers, with the defaults, on a release the sweep classified so: a fix present but off is affected.
AS_CHECKED = {**check.STATUS_OF, Classification.PRESENT_OFF: check.Status.AFFECTED}

def test_0_5_20_has_the_prefill_fix_but_not_the_admission_fix(reg, version_check):
    """Alone proves: `check --version` of a real release answers each fix as its brackets say (0.5.20: admission
    is fixed from 0.5.21; prefill from 0.5.20, offload_slots from 0.5.13, offload_rid from 0.5.19), deciding
    by the scenarios the registry declares telling, with the exit code of an affected build."""
    code, doc = version_check
    # 0.5.20 carries both deferred releases behind their gate, off by default: present but off reads affected.
    assert statuses(doc) == CHECKED["0.5.20"]
    assert code == errors.BEHAVIOUR_DIFFERS
    assert doc["target"]["kind"] == "release" and doc["target"]["resolved"] == "0.5.20"
    admission = doc["experiments"][0]
    assert admission["deciding"] == telling(reg, "admission") and len(admission["result_sha256"]) == 64
    assert "A2" in admission["deciding"]  # the decode door, not only the prefill one


def test_a_release_env_as_your_environment_agrees_with_the_sweep_and_is_left_untouched(reg, swept, version_check):
    """Alone proves: `check --python` on an environment SGLang is installed in reads its version from it, leaves
    it untouched, and answers per scenario what the sweep and `check --version` answer on that release."""
    env = release_env(reg, "0.5.20", sweep.SWEEP_SIDE)  # the sweep's own cell, reused
    before = snapshot(env.path)
    code, doc = run_check("--python", str(env.interpreter))
    assert snapshot(env.path) == before
    assert doc["target"] == {"kind": "python", "ref": str(env.interpreter), "resolved": "0.5.20", "sha256": None,
                             "sglang_version": "0.5.20"}
    for entry in doc["experiments"]:
        row = swept[entry["experiment"]]
        assert entry["status"] == AS_CHECKED[Classification(row["classification"])].value
        assert entry["scenarios"] == row["scenarios"]
    assert [e["scenarios"] for e in doc["experiments"]] == [e["scenarios"] for e in version_check[1]["experiments"]]
    assert code == version_check[0]


def link_tree(src: Path, dest: Path) -> None:
    """A copy of an installed package that shares its files' storage (hard links; a copy where they cannot)."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dest, copy_function=link, ignore=shutil.ignore_patterns("__pycache__"))


def patched_release(reg, tmp_path: Path, version: str, edit: tuple[str, str, str]) -> tuple[Path, Path]:
    """An environment whose SGLang is release ``version`` with one edit (file, old, new), made at test time:
    its interpreter, and the release cell's own copy of the file (which must stay intact)."""
    cell = release_env(reg, version, check.CHECK_SIDE)
    site = next(cell.path.glob("lib/python*/site-packages"))
    env = tmp_path / "patched-venv"
    subprocess.run([str(cell.interpreter), "-m", "venv", "--without-pip", str(env)], check=True)
    patched_site = next(env.glob("lib/python*/site-packages"))
    # Everything else from the release cell; SGLang itself from the patched copy, which comes first.
    (patched_site / "release-cell.pth").write_text(f"{site}\n")
    link_tree(site / "sglang", patched_site / "sglang")
    target = patched_site / "sglang" / edit[0]
    source = target.read_text(encoding="utf-8")
    assert source.count(edit[1]) == 1
    target.unlink()  # a hard link: never write through it into the release cell
    target.write_text(source.replace(edit[1], edit[2]), encoding="utf-8")
    return env / "bin" / "python", site / "sglang" / edit[0]


def test_a_partial_backport_is_partial_and_names_the_door_without_the_fix(reg, tmp_path):
    """Alone proves: a real build carrying the admission fix at one door only reads `partial`, names that door
    and the keys that kept it from fixed (the other fixes, untouched by the edit, stay as on 0.5.21)."""
    python, original = patched_release(reg, tmp_path, "0.5.21", DECODE_DOOR)
    code, doc = run_check("--python", str(python))
    assert statuses(doc) == {**CHECKED["0.5.21"], "admission": "partial"}
    admission = doc["experiments"][0]
    assert admission["scenarios"] == {sid: "pre-fix" if sid == "A2" else "fixed" for sid in telling(reg, "admission")}
    assert admission["deciding"] == ["A2"]
    # What kept it from fixed: A2's keys, each as base observes it, beside head's.
    assert admission["explain"]["A2"]["retired"] == {"tree": False, "base": False, "head": True}
    assert list(admission["explain"]) == ["A2"]
    assert code == errors.BEHAVIOUR_DIFFERS
    assert DECODE_DOOR[1] in original.read_text()  # the release cell is intact


def test_an_over_broad_fix_deviates_names_the_control_and_its_values_and_is_not_vex_fixed(reg, tmp_path):
    """Alone proves: a real build whose admission fix is over-broad reads `deviates`, names the control it
    departs on with its values, and its OpenVEX statement is under investigation, never fixed (the other fixes,
    untouched by the edit, stay as on 0.5.21)."""
    python, original = patched_release(reg, tmp_path, "0.5.21", HOLDS_KV)
    vex = tmp_path / "vex.json"
    code, doc = run_check("--python", str(python), "--openvex", str(vex))
    assert statuses(doc) == {**CHECKED["0.5.21"], "admission": "deviates"}
    assert code == errors.BEHAVIOUR_DIFFERS
    admission = doc["experiments"][0]
    assert {sid for sid, b in admission["scenarios"].items() if b != "fixed"} == {"A10"} == set(admission["deciding"])
    assert admission["scenarios"]["A10"] == "deviates"
    assert admission["explain"]["A10"]["retired"] == {"tree": True, "base": False, "head": False}
    assert admission["explain"]["A10"]["enqueued"] == {"tree": False, "base": True, "head": True}
    statement = next(s for s in json.loads(vex.read_text())["statements"] if "38935" in s["vulnerability"]["@id"])
    assert statement["status"] == "under_investigation"
    assert "A10: " in statement["status_notes"] and "retired true (base false, head false)" in statement["status_notes"]
    assert HOLDS_KV[1] in original.read_text()  # the release cell is intact


def test_a_tree_that_cannot_import_cannot_run_and_says_why(reg, tmp_path):
    """Alone proves: a source tree whose `sglang` fails to import answers `cannot run` for every fix, with the
    import error, and the exit code of an environment problem (never a verdict about the fixes)."""
    tree = tmp_path / "broken-sglang"
    (tree / "sglang").mkdir(parents=True)
    # A bracket release's version: its era is the default lane's own (an older one would build a closure for this).
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "sglang"\nversion = "0.5.20"\n\n[tool.setuptools]\npackages = ["sglang"]\n')
    (tree / "sglang" / "__init__.py").write_text("from sglang.srt import sgl_kernel_ops  # a build that lost a module\n")
    code, doc = run_check("--path", str(tree))
    assert statuses(doc) == {name: "cannot run" for name in reg.experiments}
    assert all("ModuleNotFoundError" in e["error"] and "sglang.srt" in e["error"] for e in doc["experiments"])
    assert code == errors.ENVIRONMENT


# --- answers that know the configuration (check --server-args) -------------------------------------------------
# Both checks judge against fresh release cells, as `--references fresh` does while republishing: the session's
# release matrix (tests/conftest.py), built once for every real test that reads cells.


@pytest.fixture(scope="module")
def fresh_matrix(release_matrix):
    return release_matrix.runs


def test_0_5_12_decode_without_offload_is_not_affected_by_the_offload_fix_and_with_offload_affected(fresh_matrix,
                                                                                                   monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_RUNS", str(fresh_matrix))
    decode = "--model-path /models/m --disaggregation-mode decode"
    code, off = run_check("--version", "0.5.12", "--references", "fresh", "--server-args", decode)
    answer = {e["experiment"]: e for e in off["experiments"]}
    assert answer["offload_slots"]["status"] == "not affected"
    assert answer["offload_slots"]["justification"] == "vulnerable_code_not_in_execute_path"
    assert answer["offload_slots"]["configuration"]["code_status"] == "affected"  # 0.5.12 is pre-fix
    assert off["configuration"]["values"] == {"disaggregation_decode_enable_offload_kvcache": False,
                                              "disaggregation_transfer_backend": "mooncake"}  # the default
    # 0.5.12's resolution derives the PD mode (a diffusion model resets it), the grammar backend and the speculative
    # algorithm (the paths of grammar_release and retract_resume read them), the hybrid SWA pool's switch and the
    # page size (the SWA fixes' paths) and, without the model's config here, stops before that step: the mode is
    # not established, so the configuration does not decide the prefill fix.
    resolution = off["configuration"]["resolution"]
    assert (resolution["completed"], resolution["derived"]) == \
        (False, ["disable_hybrid_swa_memory", "disaggregation_mode", "grammar_backend", "page_size",
                 "speculative_algorithm"])
    assert (answer["prefill"]["rests_on"], answer["prefill"]["configuration"]["enters_path"]) == ("code", None)
    assert "derives it and stopped here" in answer["prefill"]["configuration"]["unestablished"]["disaggregation_mode"]
    # The tree's own model-independent route (a dummy model) runs its resolution through, the cpu standing in
    # for the accelerator: the mode is established, and a decode server runs no prefill result path.
    code, dummy = run_check("--version", "0.5.12", "--references", "fresh", "--server-args",
                            "--model-path dummy --disaggregation-mode decode")
    assert dummy["configuration"]["resolution"]["completed"] is True
    assert dummy["configuration"]["resolution"]["stand_ins"] == {"device": "cpu"}
    prefill = next(e for e in dummy["experiments"] if e["experiment"] == "prefill")
    assert (prefill["status"], prefill["rests_on"]) == ("not affected", "configuration")
    code, on = run_check("--version", "0.5.12", "--references", "fresh", "--server-args",
                         f"{decode} --disaggregation-decode-enable-offload-kvcache")
    answer = {e["experiment"]: e for e in on["experiments"]}
    # Offload on, the mode not established here: the code's answer, the configuration not deciding.
    assert (answer["offload_slots"]["status"], answer["offload_slots"]["configuration"]["enters_path"]) == \
        ("affected", None)
    assert code == errors.BEHAVIOUR_DIFFERS
    code, on = run_check("--version", "0.5.12", "--references", "fresh", "--server-args", "--model-path dummy "
                         "--disaggregation-mode decode --disaggregation-decode-enable-offload-kvcache")
    answer = {e["experiment"]: e for e in on["experiments"]}
    assert (answer["offload_slots"]["status"], answer["offload_slots"]["configuration"]["enters_path"]) == \
        ("affected", True)
    # An option 0.5.12's own parser does not define: refused by that parser, in the probe process.
    code, _ = run_check_code("--version", "0.5.12", "--references", "fresh", "--server-args",
                             f"{decode} --no-such-option")
    assert code == errors.USAGE
    # A configuration 0.5.12's own resolution refuses whatever the model: a usage error naming the option.
    code, _, err = run_check_err("--version", "0.5.12", "--references", "fresh", "--server-args",
                                 f"{decode} --ssl-keyfile /etc/key.pem")
    assert code == errors.USAGE and "--ssl-keyfile: this tree's ServerArgs refuses the configuration" in err


def run_check_err(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["--root", str(PROJECT), "check", *argv, "--json"])
    return code, out.getvalue(), err.getvalue()


def run_check_code(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--root", str(PROJECT), "check", *argv, "--json"])
    return code, out.getvalue()


def test_an_unpacked_setuptools_scm_wheel_given_as_a_path_runs_in_its_releases_era_and_answers(reg, tmp_path):
    """Alone proves: a tree whose version only setuptools-scm wrote (sglang/_version.py, no version.py literal)
    is read as that version, without importing it, and runs in its release's era, where every probe answers (in
    today's closure, 0.5.12's scheduler could not import sgl_kernel: `cannot run`)."""
    wheel = trees.release_tree("0.5.12", reg.python, trees.LockFile(tree_lock_file(reg.root))).install_target
    unpacked = tmp_path / "sglang-0.5.12"
    shutil.unpack_archive(wheel, unpacked, "zip")
    code, doc = run_check("--path", str(unpacked))
    assert doc["target"]["source_version"] == {"version": "0.5.12", "local": None, "source": "sglang/_version.py",
                                               "told": "0.5.12"}
    assert doc["target"]["era"] == reg.era_of("0.5.12").name
    assert "cannot run" not in statuses(doc).values(), doc["experiments"]
    assert code != errors.ENVIRONMENT
