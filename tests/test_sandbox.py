"""Untrusted trees run contained (core/sandbox.py): hostile trees the tests build, checked as an operator would.

Each hostile tree is a fake ``sglang`` package whose ``__init__`` does one hostile thing at import:
writes into $HOME, /tmp and the checkout, a raw ``_socket`` connection to a listener this test
starts, a fork bomb, a memory hog, reading a secret outside the tree into its answer. It is checked
through ``check --path`` (the warm engine), a release cell (a fresh probe process) and ``check
--python``. Nothing gets out; the answer is the tree's real behaviour or ``cannot run`` naming what
was refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import venv
from pathlib import Path
from types import SimpleNamespace

import pytest
from synthetic import REGISTRY, make_project, result_doc, serve_index, wheel_bytes, with_real_probes, write_cell
from test_engine import DOOR_PROBE

from pdevidence import cli, environments
from pdevidence.core import children, errors, sandbox
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity
from pdevidence.registry import TorchChannel

PROBE = DOOR_PROBE + """
if __name__ == "__main__":  # a cell runs the probe itself
    from _probekit import main
    raise SystemExit(main(SET, prepare))
"""
# A fixed tree: what a hostile tree is besides its hostile preamble.
FIXED = '\n__version__ = "1.1.0"\nGUARD = True\n'
TOKEN = "pdevidence-hostile-9f3c"  # names every file a hostile tree leaves and every process it starts


def usable(tool: str) -> bool:
    """Whether ``tool`` contains a process here; on CI (which installs bubblewrap) it must."""
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PDEVIDENCE_SANDBOX", tool)
            sandbox.detect()
        return True
    except errors.HarnessError:
        if tool == sandbox.Tool.BUBBLEWRAP.value and os.environ.get("CI"):
            raise
        return False


TOOLS = [pytest.param(tool, marks=pytest.mark.skipif(not usable(tool), reason=f"{tool} cannot contain here"))
         for tool in (sandbox.Tool.BUBBLEWRAP.value, sandbox.Tool.UNSHARE.value)]


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A project with published base/head results of the demo experiment; the warm engine's closure is
    this interpreter; $HOME is a directory of the test's, so an escape lands where the test looks."""
    root = with_real_probes(make_project(tmp_path / "project", REGISTRY), PROBE)
    write_cell(root / "results", "base", result_doc("base", "1.0.0"))
    write_cell(root / "results", "head", result_doc("head", "1.1.0"))
    integrity.regenerate(root)
    home = tmp_path / "home"
    home.mkdir()
    for name, value in {"PDEVIDENCE_WORK": tmp_path / "work", "PDEVIDENCE_RUNS": tmp_path / "runs",
                        "HOME": home, "PYTHONDONTWRITEBYTECODE": "1"}.items():
        monkeypatch.setenv(name, str(value))
    env = SimpleNamespace(interpreter=Path(sys.executable), path=tmp_path / "closure-env",
                          torch=SimpleNamespace(channel=TorchChannel.PYPI))
    monkeypatch.setattr(environments, "closure_environment", lambda reg, era=None, log=None: env)
    monkeypatch.setattr(environments, "find_python", lambda version: SimpleNamespace(identity=lambda: "cpython-3.12.1"))
    return SimpleNamespace(root=root, tmp=tmp_path, home=home)


def hostile_tree(world, name: str, preamble: str) -> Path:
    tree = world.tmp / name
    (tree / "sglang").mkdir(parents=True)
    (tree / "sglang" / "__init__.py").write_text(preamble + FIXED)
    return tree


def check(world, capsys, *target: str) -> tuple[int, dict, str]:
    """``check <target> --json``: its exit code, its document, and everything it printed."""
    code = cli.main(["--root", str(world.root), "check", *target, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, out + err


def statuses(doc: dict) -> dict[str, str]:
    return {e["experiment"]: e["status"] for e in doc["experiments"]}


def leftovers(world) -> list[str]:
    """Every file a hostile tree left outside its sandbox, and every process of it still running."""
    places = [world.home, Path("/tmp"), Path("/var/tmp"), world.root, world.root / "probes", world.tmp]
    found = [str(p / TOKEN) for p in places if (p / TOKEN).exists()]
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and TOKEN.encode() in (proc / "cmdline").read_bytes():
                found.append(f"process {proc.name}")
    return found


@pytest.fixture(autouse=True)
def clean_up_escapes():
    """Whatever a failing test let out is removed (processes killed), so it cannot fail the next one."""
    yield
    for where in (Path("/tmp"), Path("/var/tmp")):
        (where / TOKEN).unlink(missing_ok=True)
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if proc.name.isdigit() and TOKEN.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), 9)


@pytest.fixture(params=TOOLS)
def tool(request, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_SANDBOX", request.param)
    return request.param


# --- hostile trees through check --path (the warm engine) ----------------------------------------


def test_writes_into_home_and_tmp_stay_in_the_sandbox_and_the_tree_answers_as_itself(world, tool, capsys):
    tree = hostile_tree(world, "writer", f"""
import os
for where in (os.path.expanduser("~"), "/tmp", "/var/tmp"):
    with open(os.path.join(where, {TOKEN!r}), "w") as fh:
        fh.write("escaped")
""")
    code, doc, said = check(world, capsys, "--path", str(tree))
    assert statuses(doc) == {"demo": "fixed"} and code == errors.CONFIRMED, said
    assert doc["containment"]["tool"] == tool
    assert leftovers(world) == []


@pytest.mark.parametrize("where", ["tree", "probes", "project"])
def test_a_write_into_the_checkout_or_the_tree_never_reaches_them(world, tool, capsys, where):
    target = {"tree": world.tmp / "checkout-writer", "project": world.root, "probes": world.root / "probes"}[where]
    tree = hostile_tree(world, "checkout-writer", f"open({str(target / TOKEN)!r}, 'w').write('escaped')\n")
    code, doc, said = check(world, capsys, "--path", str(tree))
    assert leftovers(world) == [] and not (target / TOKEN).exists()
    if where != "project":  # read-only where the sandbox shows them: refused, and the refusal is the answer
        assert statuses(doc) == {"demo": "cannot run"} and code == errors.ENVIRONMENT, said
        assert "Read-only file system" in doc["experiments"][0]["error"], said
    # The project itself is not there at all: a write lands in the sandbox's own scratch (the test's project
    # is under /tmp) or is refused, never in the checkout.


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_a_raw_socket_to_a_listener_of_the_machine_never_connects(world, tool, capsys, family):
    if family == "tcp":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        address = listener.getsockname()
        connect = f"s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.connect({address!r})\n"
    else:  # an agent's or a daemon's socket on the file system
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address = str(world.tmp / "agent.sock")
        listener.bind(address)
        connect = f"s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\ns.connect({address!r})\n"
    listener.listen(8)
    listener.settimeout(0.5)
    tree = hostile_tree(world, "caller", "import _socket\n" + connect)
    with listener:
        code, doc, said = check(world, capsys, "--path", str(tree))
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody came
    assert statuses(doc) == {"demo": "cannot run"}, said
    assert any(why in doc["experiments"][0]["error"]
               for why in ("Connection refused", "Network is unreachable", "No such file")), said


def test_a_fork_bomb_is_stopped_at_the_process_limit_and_nothing_of_it_outlives_the_check(world, tool, capsys,
                                                                                          monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_PROBE_PROCESSES", "64")
    if sandbox.detect().limits.processes_by is None:
        pytest.skip(f"processes are not limited here: {sandbox.detect().limits.why_unlimited}")
    # Bounded (4096 children, each gone after 60 s): if the limit failed, the machine would still recover.
    tree = hostile_tree(world, "bomb", f"""
import os
for _ in range(4096):
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "60", {TOKEN!r}])
""")
    code, doc, said = check(world, capsys, "--path", str(tree))
    assert statuses(doc) == {"demo": "cannot run"}, said
    assert "Resource temporarily unavailable" in doc["experiments"][0]["error"], said
    assert leftovers(world) == []


# Each hog and what stops it: a private allocation at import and in a scenario, past the limit per process
# (RLIMIT_DATA: MemoryError); shared memory, which that limit does not count, past the sandbox's memory cgroup (the
# kernel's OOM killer: SIGKILL), where the harness runs as root with a writable one.
HOGS = {
    "import": "HOG = bytearray(4 << 30)\n",
    "scenario": "def __getattr__(name):\n    return bytearray(4 << 30)  # sglang.GUARD, read by scenario D1\n",
    "shared": "import mmap\nHOG = mmap.mmap(-1, 2 << 30)\nfor _ in range(2 << 10):\n    HOG.write(bytes(1 << 20))\n",
}


@pytest.mark.parametrize("hog", HOGS)
def test_a_memory_hog_is_stopped_at_the_memory_limit_and_cannot_run_naming_it(world, tool, capsys, monkeypatch,
                                                                             hog):
    monkeypatch.setenv("PDEVIDENCE_PROBE_MEMORY", "1G")
    if hog == "shared" and sandbox.detect().limits.memory_by != "rlimit+cgroup":
        pytest.skip("no memory cgroup here: shared memory is not limited")
    tree = hostile_tree(world, f"hog-{hog}", HOGS[hog])
    if hog == "scenario":  # the import is fine: GUARD is read through the module's __getattr__
        init = tree / "sglang" / "__init__.py"
        init.write_text(init.read_text().replace("GUARD = True\n", ""))
    code, doc, said = check(world, capsys, "--path", str(tree))
    assert doc and statuses(doc) == {"demo": "cannot run"} and code == errors.ENVIRONMENT, said
    error = doc["experiments"][0]["error"]
    assert "the memory limit of 1 GiB" in error and "PDEVIDENCE_PROBE_MEMORY" in error, said
    if hog == "shared":
        assert "killed by the kernel" in error and "memory cgroup" in error, said
    else:
        assert error.startswith("MemoryError") and "per process" in error, said
    if hog == "scenario":
        assert "in scenario D1" in error, said
    # Not kept: the same check with room enough probes the tree again (and a scenario hog still hits 1 GiB).
    code, doc, said = check(world, capsys, "--path", str(tree))
    assert "outcomes reused" not in said, said


def test_a_secret_outside_the_tree_never_reaches_the_answer(world, tool, capsys, monkeypatch):
    secret = world.tmp / "secret.txt"
    secret.write_text("s3cr3t-file-content")
    (world.home / ".netrc").write_text("machine x password s3cr3t-netrc")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-env")
    reads = {"file": f"open({str(secret)!r}).read()", "home": "open(os.path.expanduser('~/.netrc')).read()",
             "env": "os.environ.get('AWS_SECRET_ACCESS_KEY', 'none')"}
    for what, read in reads.items():
        tree = hostile_tree(world, f"reader-{what}", f"import os\nSTOLEN = {read}\n")
        init = tree / "sglang" / "__init__.py"
        init.write_text(init.read_text().replace('__version__ = "1.1.0"', '__version__ = "1.1.0+" + STOLEN'))
        code, doc, said = check(world, capsys, "--path", str(tree))
        runs = "".join(p.read_text(errors="replace") for p in (world.tmp / "runs").rglob("*") if p.is_file())
        assert "s3cr3t" not in said + runs, what
        if what == "env":  # the environment is cleared: the tree runs, its version says it found nothing
            assert statuses(doc) == {"demo": "fixed"} and doc["target"]["sglang_version"] == "1.1.0+none", said
        else:
            assert statuses(doc) == {"demo": "cannot run"}, said
            assert "No such file or directory" in doc["experiments"][0]["error"], said


# --- a fresh probe process (a release cell) and an existing environment (check --python) ---------------


def test_a_hostile_release_in_a_cell_is_contained_and_its_receipt_says_how(tmp_path, http_server, monkeypatch,
                                                                             tool, capsys):
    """A release from an index nobody pinned: its cell's fresh probe process runs contained."""
    root = with_real_probes(make_project(tmp_path / "project", REGISTRY.replace('python = "3.12"',
                                                                                f'python = "{_py()}"')), PROBE)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    home = tmp_path / "home"
    home.mkdir()
    writes = f"import _socket, os\nopen(os.path.join(os.path.expanduser('~'), {TOKEN!r}), 'w').write('escaped')\n"
    calls = f"_socket.socket(_socket.AF_INET, _socket.SOCK_STREAM).connect({listener.getsockname()!r})\n"
    index = serve_index(http_server, {
        "sglang-1.0.0-py3-none-any.whl": wheel_bytes("1.0.0", writes + '__version__ = "1.0.0"\nGUARD = False\n'),
        "sglang-1.1.0-py3-none-any.whl": wheel_bytes("1.1.0", writes + calls + FIXED)})
    for name, value in {"PDEVIDENCE_INDEX_URL": index, "PDEVIDENCE_CACHE": tmp_path / "cache", "HOME": home,
                        "PDEVIDENCE_WORK": root / ".cells", "PDEVIDENCE_RUNS": root / "runs"}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("PDEVIDENCE_TORCH", raising=False)
    with listener:
        assert cli.main(["--root", str(root), "cell", "release", "demo", "base"]) == errors.CONFIRMED
        assert cli.main(["--root", str(root), "cell", "release", "demo", "head"]) == errors.ENVIRONMENT
        with pytest.raises(TimeoutError):
            listener.accept()
    said = capsys.readouterr()
    assert "probe probe_demo.py exited with status 3" in said.err
    assert "Connection refused" in said.err or "Network is unreachable" in said.err
    receipt = json.loads((root / "runs" / "demo.base.release-1.0.0.receipt.json").read_text())
    assert receipt["schema"] == "pdevidence-receipt/4" and receipt["containment"]["tool"] == tool
    assert sandbox.record_problem(receipt["containment"]) is None
    assert not (home / TOKEN).exists()


def _py() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def test_a_hostile_environment_checked_with_python_is_contained_too(world, tool, capsys):
    env = world.tmp / "serving-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = next(env.glob("lib/python*/site-packages"))
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text(f"""
import os
for where in (os.path.expanduser("~"), "/tmp", {str(env)!r}):
    with open(os.path.join(where, {TOKEN!r}), "w") as fh:
        fh.write("escaped")
""" + FIXED)
    code, doc, said = check(world, capsys, "--python", str(env / "bin" / "python"))
    assert statuses(doc) == {"demo": "cannot run"}, said  # the environment itself is read-only
    assert "Read-only file system" in doc["experiments"][0]["error"], said
    assert doc["containment"]["tool"] == tool
    assert leftovers(world) == [] and not (env / TOKEN).exists()


@pytest.mark.parametrize("hog", ["import", "shared"])
def test_an_environment_checked_with_python_past_the_memory_limit_cannot_run_naming_it(world, tool, capsys,
                                                                                     monkeypatch, hog):
    """A fresh probe process (not the engine): its MemoryError, or the kernel's kill at the memory cgroup limit."""
    monkeypatch.setenv("PDEVIDENCE_PROBE_MEMORY", "1G")
    if hog == "shared" and sandbox.detect().limits.memory_by != "rlimit+cgroup":
        pytest.skip("no memory cgroup here: shared memory is not limited")
    env = world.tmp / "serving-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = next(env.glob("lib/python*/site-packages"))
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text(HOGS[hog] + FIXED)
    code, doc, said = check(world, capsys, "--python", str(env / "bin" / "python"))
    assert doc and statuses(doc) == {"demo": "cannot run"} and code == errors.ENVIRONMENT, said
    error = doc["experiments"][0]["error"]
    assert "the memory limit of 1 GiB" in error and "PDEVIDENCE_PROBE_MEMORY" in error, said
    assert ("killed by the kernel" if hog == "shared" else "per process") in error, said


# --- where nothing contains: the operator decides ------------------------------------------------------


def test_where_nothing_contains_a_tree_not_pinned_is_refused_with_how_to_install_bubblewrap(world, capsys,
                                                                                            monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_SANDBOX", "none")
    tree = hostile_tree(world, "unpinned", "")
    code, doc, said = check(world, capsys, "--path", str(tree))
    assert code == errors.ENVIRONMENT and doc == {}
    assert "refusing to run the tree path-local" in said and "apt-get install bubblewrap" in said
    assert "--allow-uncontained" in said
    assert not (world.tmp / "work" / "logs").exists()  # refused before anything ran


def test_the_operator_may_run_it_uncontained_and_the_answer_says_so(world, capsys, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_SANDBOX", "none")
    tree = hostile_tree(world, "unpinned", "")
    code, doc, said = check(world, capsys, "--path", str(tree), "--allow-uncontained")
    assert statuses(doc) == {"demo": "fixed"} and code == errors.CONFIRMED, said
    assert {key: doc["containment"][key] for key in ("tool", "version", "why_not", "allowed_by")} == {
        "tool": "none", "version": None, "why_not": "PDEVIDENCE_SANDBOX=none", "allowed_by": "--allow-uncontained"}
    cli.main(["--root", str(world.root), "check", "--path", str(tree), "--allow-uncontained"])
    assert "ran NOT contained (PDEVIDENCE_SANDBOX=none); ran because the operator passed --allow-uncontained" in \
        capsys.readouterr().out


# --- the pieces ------------------------------------------------------------------------------------------


def test_the_environment_is_cleared_to_what_a_probe_needs(monkeypatch):
    from pdevidence.lanes.upstream_pytest import RECORD_ENV

    sys.path.insert(0, str(PROJECT / "probes"))
    try:
        import _standins
    finally:
        sys.path.remove(str(PROJECT / "probes"))
    monkeypatch.setenv("PDEVIDENCE_PROBE_PASS_ENV", "MY_SETTING")
    in_cell = {_standins.ENV: "sgl_kernel", RECORD_ENV: "/tmp/record", "HF_HUB_OFFLINE": "1"}
    env = sandbox.environment({"PATH": "/usr/bin", "HOME": "/home/me", "PYTHONPATH": "/x", "LC_ALL": "C",
                               "SGLANG_FLAG": "1", "GITHUB_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "k",
                               "HF_TOKEN": "h", "SSH_AUTH_SOCK": "/run/agent", "MY_SETTING": "kept",
                               "PDEVIDENCE_INDEX_URL": "https://user:token@index.example/simple",
                               "TMPDIR": "/home/me/tmp", **in_cell})
    assert env == {"PATH": "/usr/bin", "HOME": "/home/me", "PYTHONPATH": "/x", "LC_ALL": "C", "SGLANG_FLAG": "1",
                   "MY_SETTING": "kept", "TMPDIR": "/tmp", **in_cell}


def test_what_an_interpreter_needs_is_read_from_its_venv_and_pth_files(tmp_path):
    base = Path(sys.executable).resolve()
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(base)
    (env / "pyvenv.cfg").write_text(f"home = {base.parent}\n")
    site = env / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    editable = tmp_path / "src" / "sglang-checkout"
    editable.mkdir(parents=True)
    (site / "__editable__.sglang.pth").write_text(f"{editable}\nimport __editable___sglang_finder\n")
    found = sandbox.interpreter_paths(env / "bin" / "python")
    assert {env, env / "bin", base.parent.parent, editable} <= set(found)


def test_mounts_go_parents_first_and_hide_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ops = sandbox._mounts(sandbox._Resolved([tmp_path / "home" / ".pyenv", tmp_path / "tree"], [tmp_path / "out"],
                                            tmp_path))
    paths = [path for _, path, _ in ops]
    assert ("tmpfs", "/tmp", "-") in ops and ("tmpfs", str(tmp_path / "home"), "-") in ops
    assert paths.index("/tmp") < paths.index(str(tmp_path / "home")) < paths.index(str(tmp_path / "home" / ".pyenv"))
    assert ("rw", str(tmp_path / "out"), "-") in ops and ("ro", str(tmp_path / "tree"), "-") in ops


@pytest.mark.parametrize(("setting", "value", "accepted"), [
    ("PDEVIDENCE_PROBE_MEMORY", "8G", 8 << 30), ("PDEVIDENCE_PROBE_MEMORY", "512M", 512 << 20),
    ("PDEVIDENCE_PROBE_MEMORY", "1048576", 1 << 20), ("PDEVIDENCE_PROBE_PROCESSES", "64", 64),
    ("PDEVIDENCE_PROBE_MEMORY", "lots", None), ("PDEVIDENCE_PROBE_PROCESSES", "0", None),
    ("PDEVIDENCE_SANDBOX", "chroot", None)])
def test_the_sandbox_settings_are_parsed_up_front(monkeypatch, setting, value, accepted):
    from pdevidence.core import settings

    monkeypatch.setenv(setting, value)
    if accepted is None:
        with pytest.raises(errors.HarnessError, match=setting):
            settings.get(setting)
    else:
        assert settings.get(setting) == accepted


def test_asking_for_a_tool_that_is_not_there_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PDEVIDENCE_SANDBOX", "bubblewrap")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no prlimit
    with pytest.raises(errors.HarnessError, match="PDEVIDENCE_SANDBOX=bubblewrap, but no bwrap on PATH") as caught:
        sandbox.detect()
    assert "apt-get install bubblewrap" in caught.value.todo


def test_a_pinned_tree_may_run_where_nothing_contains_it(monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_SANDBOX", "none")
    assert sandbox.admit(True, "a pinned release") is sandbox.Allowed.PINNED
    with pytest.raises(errors.HarnessError, match="refusing to run a fork uncontained"):
        sandbox.admit(False, "a fork")
    with sandbox.uncontained_allowed():
        assert sandbox.admit(False, "a fork") is sandbox.Allowed.OPERATOR
    with pytest.raises(errors.HarnessError):
        sandbox.admit(False, "a fork")


def test_a_contained_process_sees_no_home_no_tmp_of_the_machine_and_has_no_capabilities(tool, tmp_path,
                                                                                        monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (tmp_path / "beside").touch()
    Path("/tmp", TOKEN).touch()
    monkeypatch.setenv("HOME", str(home))
    out = tmp_path / "out"
    code = ("import os, json, sys; print(json.dumps({'home': os.listdir(os.path.expanduser('~')),"
            " 'tmp': os.path.exists('/tmp/' + sys.argv[1]), 'beside': sorted(os.listdir(sys.argv[2])),"
            " 'caps': [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0],"
            " 'pid': os.getpid(), 'run': os.path.exists('/run')}))")
    with sandbox.launch([sys.executable, "-c", code, TOKEN, str(tmp_path)], sandbox.View(write=(out,)),
                        dict(os.environ), trusted=False, what="a test") as launch:
        done = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout)
    assert (seen["home"], seen["tmp"], seen["beside"], seen["caps"], seen["run"]) == (
        [], False, ["home", "out"], "0000000000000000", False), done.stderr
    assert seen["pid"] < 10  # its own PID namespace


def test_a_killed_sandbox_leaves_no_zombie_behind(tool, tmp_path, gone):
    """Killing a contained child's group orphans the sandbox's init (bubblewrap's child, unshare's): the
    harness is their subreaper and collects it, and everything below it, before ``wait`` returns."""
    from test_signals import descendants

    children.become_subreaper()
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            "sys.argv[1]]); print('ready', flush=True); time.sleep(60)")
    with sandbox.launch([sys.executable, "-c", code, TOKEN], sandbox.View(write=(tmp_path / "out",)),
                        dict(os.environ), trusted=False, what="a test") as launch:
        proc = children.popen(launch.argv, env=launch.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        if proc.stdout.readline() != "ready\n":
            pytest.fail(f"the contained child did not start: {children.wait(proc)[1]}")
        inside = descendants(proc.pid)
        with pytest.raises(subprocess.TimeoutExpired):
            children.wait(proc, timeout=0.1)
    assert len(inside) >= 2  # the sandbox's init (the contained interpreter, or what runs it) and its child
    assert [pid for pid in [proc.pid, *inside] if not gone(pid)] == []  # not even a zombie


def test_a_file_others_may_not_read_is_not_in_the_sandbox_and_the_interpreter_still_runs(tool, tmp_path,
                                                                                       monkeypatch):
    """Run as root, the sandbox's root owns every root-only file it is shown: so none is shown, in a system
    directory (here one of the test's) or in /etc."""
    system = tmp_path / "system"
    (system / "ssl" / "private").mkdir(parents=True)
    (system / "ssl" / "certs").mkdir()
    (system / "ld.so.cache").write_text("public")
    (system / "ssl" / "certs" / "ca.pem").write_text("public")
    (system / "ssl" / "private" / "key.pem").write_text("s3cr3t")
    (system / "shadow").write_text("s3cr3t")
    (system / "link").symlink_to("ld.so.cache")
    for path, mode in ((system, 0o755), (system / "ld.so.cache", 0o644), (system / "shadow", 0o600),
                       (system / "ssl" / "private", 0o700)):
        path.chmod(mode)
    monkeypatch.setattr(sandbox, "SYSTEM", (*sandbox.SYSTEM, str(system)))
    code = ("import json, os, sys; top = sys.argv[1]; print(json.dumps({'seen': sorted("
            "os.path.relpath(os.path.join(d, n), top) for d, ds, fs in os.walk(top) for n in ds + fs), "
            "'read': open(os.path.join(top, 'link')).read(), 'shadow': os.path.exists('/etc/shadow'), "
            "'passwd': os.path.exists('/etc/passwd')}))")
    with sandbox.launch([sys.executable, "-c", code, str(system)], sandbox.View(), dict(os.environ), trusted=False,
                        what="a test") as launch:
        done = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"seen": ["ld.so.cache", "link", "ssl", "ssl/certs", "ssl/certs/ca.pem"], "read": "public",
                    "shadow": False, "passwd": True}


def test_bubblewrap_is_told_the_same_view_each_mask_made_read_only_once_its_entries_are_in(tmp_path, monkeypatch):
    system = tmp_path / "etc"
    system.mkdir()
    (system / "passwd").write_text("public")
    (system / "shadow").write_text("s3cr3t")
    (system / "shadow").chmod(0o600)
    monkeypatch.setattr(sandbox, "SYSTEM", (str(system),))
    argv = sandbox._bwrap(SimpleNamespace(executable="bwrap"), sandbox._Resolved([], [], tmp_path))
    assert str(system / "shadow") not in argv
    mask = argv.index("--tmpfs", argv.index(str(system)) - 1)
    bound = argv.index("--ro-bind", mask)
    assert argv[mask + 1] == str(system) and argv[bound + 1:bound + 3] == [str(system / "passwd")] * 2
    assert argv.index("--remount-ro", bound) == argv.index(str(system), bound) - 1


def test_releases_from_the_index_share_an_engine_and_a_tree_the_operator_brings_gets_its_own(tmp_path):
    from pdevidence.cells import engine, warm
    from pdevidence.sources.trees import Tree

    def task(tree: Tree) -> engine.TreeTask:
        return engine.TreeTask(tree.label(), tmp_path, {}, tree.pinned, shared=warm._from_the_index(tree))

    releases = [Tree("release", v, v, tmp_path, "a" * 64, "pypi", "x.whl", pinned=v == "1.0.0") for v in ("1.0.0", "1.0.0.post1")]
    brought = [Tree("path", "fork", "local", tmp_path, None, "path", "/src/fork"),
               Tree("wheel", "w.whl", "2.0.0", tmp_path, "b" * 64, "file", "/w.whl")]
    groups = warm._groups([task(t) for t in (brought[0], *releases, brought[1])])
    assert [[t.label for t in group] for group in groups] == [
        ["release-1.0.0", "release-1.0.0.post1"], [brought[0].label()], [brought[1].label()]]


def test_where_nothing_contains_an_environment_is_refused_before_its_interpreter_runs(world, capsys, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_SANDBOX", "none")
    env = world.tmp / "serving-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    code, doc, said = check(world, capsys, "--python", str(env / "bin" / "python"))
    assert code == errors.ENVIRONMENT and doc == {}
    assert f"refusing to run the interpreter {env / 'bin' / 'python'} uncontained" in said
