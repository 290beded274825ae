"""Shared state under concurrency and crashes: many runs on one cold cache, a run killed at each fault point, a
full disk, and what killed runs leave.

Every run is a process of its own (``concurrent_run.py``) on a synthetic project, releases served by a local
index and a fake uv that records each environment it builds (a venv of this interpreter's, a wheel unpacked into
it). Two eras: 1.0.x runs in ``old``, 1.1.0 in today's closure. The demo experiment's fix has one mutant.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from synthetic import (REGISTRY, make_project, publishable_project, result_doc, serve_index, wheel_bytes,
                       with_real_probes, write_cell)
from test_sandbox import PROBE

from pdevidence import environments
from pdevidence.core import errors, faults, inuse, settings
from pdevidence.documents import integrity, receipts, results, tables

HERE = Path(__file__).resolve().parent
ERAS = REGISTRY + """
[experiments.demo.mutants.M1]
title = "the door lets an aborted request in"
kind = "removes-fix"
target = "sglang:guarded"
operator = "constant"
value = false

[eras.old]
releases = "<1.1.0"
constraints = "constraints/era-old.txt"
"""
RELEASES = {"1.0.0": False, "1.0.1": False, "1.1.0": True}  # version: carries the fix
ANSWER = {False: (errors.BEHAVIOUR_DIFFERS, "affected"), True: (errors.CONFIRMED, "fixed")}
# The uv the runs get: ``venv`` makes a venv of the interpreter running it (slowly enough for the other runs to
# arrive while it builds), ``pip install`` unpacks a wheel into the environment, ``pip list`` reads what is there.
FAKE_UV = """#!{python}
import glob, json, os, sys, time, venv, zipfile
args = sys.argv[1:]
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
if args[0] == "venv":
    time.sleep(0.3)
    venv.EnvBuilder(symlinks=True, with_pip=False).create(args[-1])
    sys.exit()
env = os.path.dirname(os.path.dirname(args[args.index("--python") + 1]))
site = glob.glob(os.path.join(env, "lib", "python*", "site-packages"))[0]
if args[:2] == ["pip", "install"]:
    zipfile.ZipFile(args[-1]).extractall(site)
elif args[:2] == ["pip", "list"]:
    found = glob.glob(os.path.join(site, "*.dist-info"))
    print(json.dumps([dict(zip(("name", "version"), os.path.basename(d)[:-10].split("-"))) for d in found]))
"""


def sglang(version: str, guard: bool, preamble: str = "") -> str:
    return f'{preamble}__version__ = "{version}"\nGUARD = {guard}\n\ndef guarded():\n    return GUARD\n'


def wheels(**sources: str) -> dict[str, bytes]:
    """Every release's wheel; ``sources`` replaces a release's ``sglang/__init__.py`` (``v1_0_1="..."``)."""
    return {f"sglang-{v}-py3-none-any.whl": wheel_bytes(v, sources.get("v" + v.replace(".", "_"), sglang(v, fixed)))
            for v, fixed in RELEASES.items()}


@pytest.fixture
def world(tmp_path, http_server):
    """The project, its index, its cold cache and the environment every run gets."""
    root = with_real_probes(make_project(tmp_path / "project", ERAS), PROBE.replace("sglang.GUARD", "sglang.guarded()"))
    (root / "constraints" / "era-old.txt").write_text("# the old era's closure\n")
    write_cell(root / "results", "base", result_doc("base", "1.0.0"))
    write_cell(root / "results", "head", result_doc("head", "1.1.0"))
    integrity.regenerate(root)
    index = serve_index(http_server, wheels())
    calls = tmp_path / "uv-calls.jsonl"
    uv = tmp_path / "fake-uv"
    uv.write_text(FAKE_UV.format(python=sys.executable, calls=str(calls)))
    uv.chmod(0o755)
    env = {**os.environ, "UV": str(uv), "PDEVIDENCE_INDEX_URL": index, "PDEVIDENCE_CACHE": str(tmp_path / "cache"),
           "PDEVIDENCE_WORK": str(tmp_path / "work"), "PDEVIDENCE_RUNS": str(tmp_path / "runs"),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(HERE.parent)}
    env.pop("PDEVIDENCE_TORCH", None)
    return root, tmp_path, env, http_server, calls


def run(world, *argv: str, fault: str | None = None, preexec=None) -> subprocess.CompletedProcess:
    root, _, env, _, _ = world
    env = {**env, "PDEVIDENCE_FAULT": fault} if fault else env
    return subprocess.run([sys.executable, str(HERE / "concurrent_run.py"), "--root", str(root), *argv],
                          env=env, capture_output=True, text=True, timeout=300, preexec_fn=preexec)


def check(world, version: str, **kw) -> subprocess.CompletedProcess:
    return run(world, "check", "--version", version, "--json", **kw)


def assert_right(done: subprocess.CompletedProcess, version: str) -> None:
    code, status = ANSWER[RELEASES[version]]
    assert done.returncode == code, done.stderr
    assert [e["status"] for e in json.loads(done.stdout)["experiments"]] == [status], done.stderr


def builds(world) -> list[str]:
    """The environments the fake uv created, one line each."""
    calls = world[4]
    return [args[-1] for args in map(json.loads, calls.read_text().splitlines()) if args[0] == "venv"] \
        if calls.exists() else []


def leftovers(world) -> list[str]:
    """Half-made things the runs left in the cache, the work directory or the runs (locks and run tokens aside),
    and environments never finished."""
    tmp = world[1]
    hidden = [p for top in ("cache", "work", "runs") for p in (tmp / top).rglob(".*")
              if not p.name.endswith(".lock") and not p.name.startswith(".pdevidence-")
              and inuse.MARKERS not in p.relative_to(tmp).parts]  # what a run used, and when: kept
    unfinished = [p for p in (tmp / "cache" / "envs").glob("[!.]*")
                  if p.is_dir() and not (p / environments.ENV_INFO).exists()]
    return sorted(str(p.relative_to(tmp)) for p in hidden + unfinished)


@pytest.mark.parametrize("versions", [["1.0.0"] * 4, ["1.0.0", "1.0.1", "1.0.0", "1.0.1"],
                                      ["1.0.0", "1.1.0", "1.0.1", "1.1.0"]],
                         ids=["one release", "one era", "two eras"])
def test_runs_at_once_on_a_cold_cache_all_answer_right_and_make_each_thing_once(world, versions):
    with ThreadPoolExecutor(len(versions)) as pool:
        done = list(pool.map(lambda v: check(world, v), versions))
    for version, ran in zip(versions, done):
        assert ran.returncode != errors.INTERNAL, ran.stderr
        assert_right(ran, version)
    _, tmp, _, server, _ = world
    for version in set(versions):
        assert server.hits(f"/files/sglang-{version}-py3-none-any.whl") == 1
    made = builds(world)
    assert len(made) == len(set(made)) == len({version < "1.1.0" for version in versions})
    unpacked = sorted(p.name.split(".")[0] for p in (tmp / "cache" / "unpacked").iterdir()
                      if not p.name.startswith("."))
    assert len(unpacked) == len(set(versions))
    assert leftovers(world) == []


@pytest.mark.parametrize("point", ["download", "unpack", "environment", "probe", "outcome", "write"])
def test_a_run_killed_at_any_point_loses_nothing_and_the_next_run_answers_right(world, point):
    killed = check(world, "1.0.0", fault=point)
    assert killed.returncode == -9, killed.stderr
    assert leftovers(world)  # what the kill left ...
    assert_right(check(world, "1.1.0"), "1.1.0")  # another era: none of it is the next run's to reuse
    assert leftovers(world) == []  # ... the next run removed
    assert_right(check(world, "1.0.0"), "1.0.0")
    again = check(world, "1.0.0")
    assert_right(again, "1.0.0")
    assert "outcomes reused" in again.stderr + again.stdout


def test_a_run_killed_after_replacing_an_outcome_leaves_the_next_one_right(world):
    assert_right(check(world, "1.0.0"), "1.0.0")
    assert run(world, "check", "--version", "1.0.0", "--force", fault="outcome").returncode == -9
    assert_right(check(world, "1.0.0"), "1.0.0")
    assert leftovers(world) == []  # the outcome moved aside, the one staged and the run's own copy: gone


def test_a_prune_beside_a_running_check_frees_space_and_both_answer_right(world):
    for version in ("1.0.0", "1.1.0"):  # both eras' environments, wheels, unpacked trees and outcomes
        assert_right(check(world, version), version)
    with ThreadPoolExecutor(1) as pool:
        checking = pool.submit(run, world, "check", "--version", "1.0.0", "--json", "--force")
        prunes = []
        while not checking.done():  # a budget of nothing: all that the check does not hold right then goes
            prunes.append(run(world, "cache", "prune", "--max-size", "0"))
        assert_right(checking.result(), "1.0.0")
    assert [p.returncode for p in prunes] == [errors.CONFIRMED] * len(prunes), [p.stderr for p in prunes]
    assert any("freed" in p.stdout and not p.stdout.startswith("removed 0") for p in prunes)
    assert leftovers(world) == []
    assert_right(check(world, "1.1.0"), "1.1.0")  # what went is made again


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))  # Python ignores SIGXFSZ: a write fails with EFBIG


def test_a_run_that_starts_while_another_probes_leaves_the_others_files_alone(world, http_server):
    serve_index(http_server, wheels(v1_0_1=sglang("1.0.1", False, preamble="import time\ntime.sleep(6)\n")))
    tmp = world[1]
    engine_logs = tmp / "work" / "logs" / "engine"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(check, world, "1.0.1")
        deadline = time.monotonic() + 60
        while not (engine_logs.exists() and any(engine_logs.iterdir())):  # probing: its engine has started
            assert time.monotonic() < deadline and not first.done(), first.result().stderr
            time.sleep(0.05)
        probing = list((tmp / "runs" / "check").glob(".probing.*"))
        assert probing
        swept = run(world, "verify")  # every command cleans up as it starts
        assert swept.returncode == errors.CONFIRMED, swept.stderr
        assert not first.done() and all(p.exists() for p in probing)
        assert_right(first.result(), "1.0.1")


# --- every lane at once ------------------------------------------------------------------------------


SWEPT = {"1.0.0": "pre-fix", "1.0.1": "pre-fix", "1.1.0": "fixed"}  # what the sweep finds of each release
BASE_CELL = "demo.base.release-1.0.0.json"


def sweep_found(world) -> dict[str, str]:
    """The sweep table the runs wrote: each release's classification."""
    table = tables.SweepTable.load(world[1] / "runs" / "sweep-demo.json")
    return {r.version: r.classification.value for r in table.releases}


def cell_observed(world) -> dict:
    """What the base cell observed, once its receipt vouches for its result."""
    runs = world[1] / "runs"
    receipts.Receipt.load(results.receipt_path(runs / BASE_CELL), experiment="demo", side="base")
    return {sid: sc["observed"] for sid, sc in results.load(runs / BASE_CELL, experiment="demo")["scenarios"].items()}


def test_a_sweep_checks_a_cell_and_mutants_at_once_on_a_cold_cache_all_answer_right_and_build_once(world):
    lanes = {"sweep": ("sweep",), "check 1.0.0": ("check", "--version", "1.0.0", "--json"),
             "check 1.1.0": ("check", "--version", "1.1.0", "--json"), "cell": ("cell", "release", "demo", "base"),
             "mutate": ("mutate", "demo")}
    with ThreadPoolExecutor(len(lanes)) as pool:
        done = dict(zip(lanes, pool.map(lambda argv: run(world, *argv), lanes.values())))
    assert {name: ran.returncode for name, ran in done.items()} == {
        "sweep": errors.CONFIRMED, "check 1.0.0": errors.BEHAVIOUR_DIFFERS, "check 1.1.0": errors.CONFIRMED,
        "cell": errors.CONFIRMED, "mutate": errors.CONFIRMED}, {name: ran.stderr for name, ran in done.items()}
    assert_right(done["check 1.0.0"], "1.0.0")
    assert_right(done["check 1.1.0"], "1.1.0")
    assert sweep_found(world) == SWEPT
    assert cell_observed(world) == {"D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}}
    assert tables.MutationTable.load(world[1] / "runs" / "mutate.demo.json").score["killed"] == 1
    made = builds(world)
    assert len(made) == len(set(made)) == 2  # each era's closure environment, once; the cell's is a linked copy
    server = world[3]
    assert all(server.hits(f"/files/sglang-{version}-py3-none-any.whl") == 1 for version in RELEASES)
    assert leftovers(world) == []
    integrity.verify(world[0])  # the published evidence is as it was


def whole(runs: dict[str, subprocess.CompletedProcess], wanted: dict[str, int]) -> str:
    """Each run that did not exit as ``wanted``, with all it wrote to stderr: a race that loses once in twenty
    rounds must be readable from the one round's log (pytest cuts a message that is not a string)."""
    return "\n".join(f"--- {name}: exit {ran.returncode}, expected {wanted[name]}; its stderr:\n{ran.stderr}"
                     for name, ran in runs.items() if ran.returncode != wanted[name])


def test_a_sweep_a_cell_mutants_and_a_check_answer_right_while_prunes_run_beside_them(world):
    """Issue 38: every kind of run at once on one cold cache, and `cache prune` with a budget of nothing over and
    over beside them: what a run holds is never taken from it, what went is made again, nothing is left half-made."""
    lanes = {"sweep": ("sweep",), "check 1.1.0": ("check", "--version", "1.1.0", "--json"),
             "cell": ("cell", "release", "demo", "base"), "mutate": ("mutate", "demo")}
    with ThreadPoolExecutor(len(lanes)) as pool:
        running = {name: pool.submit(run, world, *argv) for name, argv in lanes.items()}
        prunes = []
        while not all(lane.done() for lane in running.values()):
            prunes.append(run(world, "cache", "prune", "--max-size", "0"))
        done = {name: lane.result() for name, lane in running.items()}
    confirmed = dict.fromkeys(lanes, errors.CONFIRMED)
    assert {name: ran.returncode for name, ran in done.items()} == confirmed, whole(done, confirmed)
    assert_right(done["check 1.1.0"], "1.1.0")
    assert sweep_found(world) == SWEPT
    assert cell_observed(world) == {"D1": {"enqueued": True, "retired": False}, "D2": {"enqueued": True}}
    assert tables.MutationTable.load(world[1] / "runs" / "mutate.demo.json").score["killed"] == 1
    pruned = {f"prune {n}": ran for n, ran in enumerate(prunes, start=1)}
    assert prunes and all(ran.returncode == errors.CONFIRMED for ran in prunes), \
        whole(pruned, dict.fromkeys(pruned, errors.CONFIRMED))
    assert leftovers(world) == []
    assert_right(check(world, "1.0.0"), "1.0.0")  # after the prunes, from what is left or made again
    integrity.verify(world[0])


@pytest.mark.parametrize("point", ["probe", "outcome"])
def test_a_sweep_killed_while_probing_or_keeping_an_outcome_answers_right_when_rerun(world, point):
    killed = run(world, "sweep", fault=point)
    assert killed.returncode == -9, killed.stderr
    assert leftovers(world)  # its private copy of the outputs, and the outcome it was keeping
    rerun = run(world, "sweep")
    assert rerun.returncode == errors.CONFIRMED, rerun.stderr
    assert sweep_found(world) == SWEPT
    assert leftovers(world) == []


# --- check --python: an environment the operator has ---------------------------------------------------


def serving(world, guard: bool, hold: Path | None = None) -> Path:
    """The interpreter of an environment SGLang is installed in, as ``check --python`` is given one; whether it
    carries the fix is read from a file beside its code at import (upgrading it rewrites that file), and, given
    ``hold``, the probe process (not the harness's look at its version) waits as it exits, after its probes wrote
    their results, until ``hold`` exists."""
    env = world[1] / "serving"
    if not env.exists():
        venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    package = next(env.glob("lib/python*/site-packages")) / "sglang"
    package.mkdir(exist_ok=True)
    (package / "guard.txt").write_text(str(guard))
    (package / "__init__.py").write_text(f"""import atexit, os, sys, time
GUARD = open(os.path.join(os.path.dirname(__file__), "guard.txt")).read() == "True"
__version__ = "1.1.0" if GUARD else "1.0.0"

def _held(hold={str(hold) if hold else ""!r}, until=time.monotonic() + 120):
    probing = os.path.basename(sys.argv[0]) == "probe_all.py"
    while hold and probing and not os.path.exists(hold) and time.monotonic() < until:
        time.sleep(0.05)

atexit.register(_held)

def guarded():
    return GUARD
""")
    return env / "bin" / "python"


def statuses(done: subprocess.CompletedProcess) -> list[list[str]]:
    """Each target's answers, from ``check --json`` (one document, or a list of them)."""
    docs = json.loads(done.stdout)
    return [[e["status"] for e in doc["experiments"]] for doc in (docs if isinstance(docs, list) else [docs])]


def test_one_interpreter_named_twice_is_probed_once_and_answered_for_each_name(world):
    python = serving(world, guard=False)
    spelled_otherwise = python.parent.parent / "bin" / ".." / "bin" / "python"
    done = run(world, "check", "--python", str(python), "--python", str(spelled_otherwise), "--json")
    assert done.returncode == errors.BEHAVIOUR_DIFFERS, done.stderr
    assert statuses(done) == [["affected"], ["affected"]]
    assert done.stderr.count("running every probe with") == 1


def test_runs_at_once_checking_one_interpreter_take_turns_and_each_reads_its_own_answer(world):
    root, tmp, env, _, _ = world
    hold = tmp / "serving" / "let-the-first-end"  # in the environment: what the sandbox shows the probe of it
    python = serving(world, guard=False, hold=hold)
    written = tmp / "runs" / "check"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run, world, "check", "--python", str(python), "--json")
        deadline = time.monotonic() + 60
        while not list(written.glob("python-*/demo.json")):  # its probes are done; it is held before it reads them
            assert time.monotonic() < deadline and not first.done(), first.result().stderr
            time.sleep(0.05)
        serving(world, guard=True, hold=hold)  # upgraded meanwhile: the second run checks the fix
        second = subprocess.Popen([sys.executable, str(HERE / "concurrent_run.py"), "--root", str(root), "check",
                                   "--python", str(python), "--json"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        said = []
        for line in second.stderr:  # until it says it waits: only then may the first go on
            said.append(line)
            if "waiting: another process is using the output of checking" in line:
                break
        hold.touch()
        out, rest = second.communicate(timeout=300)
        assert statuses(first.result()) == [["affected"]], first.result().stderr
    assert f"waiting: another process is using the output of checking {python}" in "".join(said), "".join(said) + rest
    assert statuses(subprocess.CompletedProcess([], second.returncode, out, rest)) == [["fixed"]], rest


def test_a_full_disk_is_an_environment_problem_naming_the_path_and_leaves_nothing_half_written(world, http_server):
    big = wheel_bytes("1.0.0", sglang("1.0.0", False) + "# " + os.urandom(4000).hex() + "\n")
    http_server.serve("/files/sglang-1.0.0-py3-none-any.whl", big)
    done = check(world, "1.0.0", preexec=_small_files)
    assert done.returncode == errors.ENVIRONMENT, done.stderr
    assert "cannot write" in done.stderr and "sglang-1.0.0-py3-none-any.whl" in done.stderr
    assert "File too large" in done.stderr and "Traceback" not in done.stderr
    assert not [p for p in (world[1] / "cache").rglob("*") if p.suffix in (".part", ".tmp")]


def test_an_atomic_write_over_the_limit_is_exit_3_naming_the_path_with_no_temporary_left(tmp_path):
    code = f"""
from pathlib import Path
from pdevidence.core.errors import HarnessError
from pdevidence.core.files import write_atomic
try:
    write_atomic(Path({str(tmp_path / 'doc.json')!r}), "x" * 10000)
except HarnessError as exc:
    print(exc.code, exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=_small_files,
                          env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert done.stdout.startswith(f"{errors.ENVIRONMENT} cannot write {tmp_path / 'doc.json'}"), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_fault_point_is_tested():
    tested = {"download", "unpack", "environment", "probe", "outcome", "write", "publish", "prune"}  # prune: test_cache.py
    assert tested == set(faults.POINTS)


# --- publish -------------------------------------------------------------------------------------------


@pytest.fixture
def to_publish(tmp_path):
    return publishable_project(tmp_path / "publish")


def publish(project: Path, work: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PDEVIDENCE_WORK": str(work), "PYTHONPATH": str(HERE.parent)}
    env.pop("PDEVIDENCE_RUNS", None)
    if fault:
        env["PDEVIDENCE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(project), "publish"], env=env,
                          capture_output=True, text=True, timeout=300)


def test_publishes_at_once_never_interleave_even_from_other_work_directories(to_publish, tmp_path):
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda i: publish(to_publish, tmp_path / f"work-{i}"), range(3)))
    assert [d.returncode for d in done] == [errors.CONFIRMED] * 3, [d.stderr for d in done]
    integrity.verify(to_publish)
    assert not [p.name for p in to_publish.iterdir() if p.name.startswith(".results.") and p.name != ".results.lock"]


def test_a_publish_killed_mid_swap_is_rolled_back_and_the_next_one_publishes(to_publish, tmp_path):
    assert publish(to_publish, tmp_path / "work").returncode == errors.CONFIRMED
    before = (to_publish / "SHA256SUMS.txt").read_bytes()
    killed = publish(to_publish, tmp_path / "work", fault="publish")
    assert killed.returncode == -9, killed.stderr
    assert not (to_publish / "results").exists()  # moved aside, not yet replaced: what the next run repairs
    assert (to_publish / "SHA256SUMS.txt").read_bytes() == before  # not committed
    assert publish(to_publish, tmp_path / "work").returncode == errors.CONFIRMED
    integrity.verify(to_publish)


# --- locks ---------------------------------------------------------------------------------------------


def test_a_run_that_waits_names_who_holds_the_lock_and_gives_up_after_its_timeout(tmp_path, capsys):
    from pdevidence.core.errors import HarnessError
    from pdevidence.core.locking import exclusive

    lock = tmp_path / "thing.lock"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from pdevidence.core.locking import exclusive
with exclusive(Path({str(lock)!r}), "the thing"):
    print("held", flush=True)
    time.sleep(30)
""", "--holding"], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(HarnessError) as raised:
            with exclusive(lock, "the thing", timeout=0.3):
                pass
        said = capsys.readouterr().err
        assert f"waiting: another process is using the thing ({lock}): pid {holder.pid} (-c --holding)" in said
        assert raised.value.code == errors.ENVIRONMENT
        assert f"gave up after 0.3 s waiting for the thing ({lock}), held by pid {holder.pid}" in str(raised.value)
    finally:
        holder.kill()
        holder.wait()
    with exclusive(lock, "the thing", timeout=5):  # its holder died: the kernel let it go
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def held_by_another(path: Path, **kw) -> int:
    """A lock on ``path`` held as another process holds it (flock locks belong to an open file, not a process)."""
    import fcntl
    fd = os.open(path, os.O_RDONLY | kw.get("flags", 0))
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_every_lock_wait_is_bounded_by_default_and_says_how_to_wait_longer(tmp_path, monkeypatch, capsys):
    from pdevidence.core.errors import HarnessError
    from pdevidence.core.locking import exclusive

    monkeypatch.delenv("PDEVIDENCE_LOCK_TIMEOUT", raising=False)
    assert settings.get("PDEVIDENCE_LOCK_TIMEOUT") == 7200  # unset: two hours, not forever

    lock = tmp_path / "thing.lock"
    lock.write_text("")
    monkeypatch.setenv("PDEVIDENCE_LOCK_TIMEOUT", "0.2")
    fd = held_by_another(lock)
    try:
        with pytest.raises(HarnessError) as raised:
            with exclusive(lock, "the thing"):
                pass
    finally:
        os.close(fd)
    assert "(giving up after 0.2 s)" in capsys.readouterr().err
    assert "PDEVIDENCE_LOCK_TIMEOUT=<seconds>" in str(raised.value)


def test_a_run_stopped_mid_sweep_makes_the_others_give_up_not_hang(tmp_path, monkeypatch):
    from pdevidence.core import debris
    from pdevidence.core.errors import HarnessError

    monkeypatch.setenv("PDEVIDENCE_LOCK_TIMEOUT", "0.2")
    root = tmp_path / "cache"
    root.mkdir()
    fd = held_by_another(root, flags=os.O_DIRECTORY)  # as a sweep holds it
    raised = []

    def enter():
        with debris.run():
            try:
                debris.enter(root)
            except HarnessError as exc:
                raised.append(exc)

    entering = threading.Thread(target=enter, daemon=True)
    entering.start()
    entering.join(10)
    os.close(fd)
    entering.join(10)
    assert raised and f"gave up after 0.2 s waiting for {root}" in str(raised[0])
