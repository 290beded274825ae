"""Cell environments: the declared torch channel, the interpreter found up front, what uv is asked."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pdevidence import environments, registry
from pdevidence.core import debris, errors, paths
from pdevidence.core.errors import HarnessError
from pdevidence.registry import TorchChannel
from pdevidence.sources import trees
from synthetic import wheel_bytes

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
THIS = f"{PY}.{sys.version_info.micro}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No override, no pyenv, no interpreter on PATH unless a test puts one there."""
    for name in ("PDEVIDENCE_TORCH", "PDEVIDENCE_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin") + os.pathsep + "/usr/bin:/bin")
    environments._find_python.cache_clear()
    yield
    environments._find_python.cache_clear()


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def link_python(directory: Path, name: str = f"python{PY}") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).symlink_to(sys.executable)
    return directory / name


# --- the torch channel -----------------------------------------------------------------------


@pytest.mark.parametrize("declared", list(TorchChannel))
def test_the_registry_channel_is_used_without_asking_the_network(declared, capsys):
    choice = environments.choose_torch(declared)

    assert (choice.requested, choice.channel) == ("registry", declared)
    assert declared.value in choice.note
    assert capsys.readouterr().err == ""


def test_an_override_equal_to_the_registry_is_quiet(monkeypatch, capsys):
    monkeypatch.setenv("PDEVIDENCE_TORCH", "pypi")

    choice = environments.choose_torch(TorchChannel.PYPI)

    assert (choice.requested, choice.channel) == ("pypi", TorchChannel.PYPI)
    assert capsys.readouterr().err == ""


def test_an_override_that_differs_from_the_published_channel_says_compare_will_differ(monkeypatch, capsys):
    monkeypatch.setenv("PDEVIDENCE_TORCH", "cpu")

    environments._warn_once.cache_clear()
    choice = environments.choose_torch(TorchChannel.PYPI)
    assert environments.choose_torch(TorchChannel.PYPI) == choice

    assert (choice.requested, choice.channel) == ("cpu", TorchChannel.CPU)
    assert "environment as different" in choice.note
    assert capsys.readouterr().err == f"warning: {choice.note}\n"  # once


@pytest.mark.parametrize("value", ["auto", "cuda"])
def test_an_unknown_channel_is_a_usage_error(value, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_TORCH", value)

    with pytest.raises(HarnessError) as caught:
        environments.choose_torch(TorchChannel.PYPI)

    assert caught.value.code == errors.USAGE
    assert repr(value) in str(caught.value) and "pypi, cpu" in str(caught.value)


def test_the_cpu_channel_without_a_compiled_closure_stops_with_what_to_do(tmp_path):
    cpu = environments.TorchChoice("cpu", TorchChannel.CPU)

    for missing in (None, tmp_path / "cells-py312-cpu.txt"):
        with pytest.raises(HarnessError) as caught:
            environments.closure_for(cpu, tmp_path / "cells.txt", missing)
        assert caught.value.code == errors.ENVIRONMENT
        assert "nox -s lock_cpu" in str(caught.value) and "unset PDEVIDENCE_TORCH" in str(caught.value)


def test_each_channel_installs_its_own_hashed_closure(tmp_path):
    pypi, cpu = tmp_path / "cells.txt", tmp_path / "cells-cpu.txt"
    cpu.write_text("torch==2.14.1+cpu --hash=sha256:00\n")

    assert environments.closure_for(environments.TorchChoice("registry", TorchChannel.PYPI), pypi, cpu) == pypi
    assert environments.closure_for(environments.TorchChoice("cpu", TorchChannel.CPU), pypi, cpu) == cpu


# --- the interpreter -------------------------------------------------------------------------


def test_no_python_is_one_short_message_at_once_naming_every_place_looked(tmp_path):
    started = time.monotonic()
    with pytest.raises(HarnessError) as caught:
        environments.find_python("3.99")

    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert caught.value.code == errors.ENVIRONMENT
    assert "PATH (python3.99)" in message and "PDEVIDENCE_PYTHON" in message
    assert str(tmp_path / "no-pyenv" / "versions" / "3.99.*") in message
    assert "uv cache clean" not in message and len(message.splitlines()) == 2


def test_a_wrong_version_named_by_pdevidence_python_is_named_with_its_version(monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_PYTHON", sys.executable)

    with pytest.raises(HarnessError) as caught:
        environments.find_python("3.99")

    assert f"PDEVIDENCE_PYTHON={sys.executable} is Python {THIS}" in str(caught.value)


def test_a_wrong_version_on_path_is_named_with_its_version(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    link_python(bin_dir, "python3.99")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")

    with pytest.raises(HarnessError, match=rf"python3\.99 is Python {THIS}"):
        environments.find_python("3.99")


def test_a_pyenv_shim_that_fails_does_not_count_and_an_installed_version_does(tmp_path, monkeypatch):
    shims = tmp_path / "shims"
    script(shims / f"python{PY}", "echo 'pyenv: python3.12: command not found' >&2; exit 127\n")
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}/usr/bin:/bin")
    root = tmp_path / "pyenv"
    monkeypatch.setenv("PYENV_ROOT", str(root))

    with pytest.raises(HarnessError, match="does not run"):
        environments.find_python(PY)

    installed = link_python(root / "versions" / THIS / "bin")
    environments._find_python.cache_clear()
    found = environments.find_python(PY)
    assert found.path == str(installed.resolve()) and found.version == THIS


def test_the_same_interpreter_by_path_or_by_pdevidence_python_has_one_identity(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    link_python(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    by_path = environments.find_python(PY)
    monkeypatch.setenv("PDEVIDENCE_PYTHON", sys.executable)
    by_variable = environments.find_python(PY)

    assert by_path.identity() == by_variable.identity() == f"{sys.implementation.name}-{THIS}"


# --- what uv is asked ------------------------------------------------------------------------


@pytest.fixture
def fake_uv(tmp_path, monkeypatch):
    """A uv that records its argv and environment, then does what a real one leaves behind."""
    calls = tmp_path / "uv-calls.jsonl"
    uv = script(tmp_path / "fake-uv", f"""
"{sys.executable}" - "$@" <<'EOF'
import json, os, sys
args = sys.argv[1:]
with open({str(calls)!r}, "a") as fh:
    fh.write(json.dumps({{"args": args, "downloads": os.environ.get("UV_PYTHON_DOWNLOADS")}}) + "\\n")
if args[0] == "venv":
    os.makedirs(os.path.join(args[-1], "bin"), exist_ok=True)
EOF
""")
    monkeypatch.setenv("UV", str(uv))
    link_python(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    return lambda: [json.loads(line) for line in calls.read_text().splitlines()]


def fixture_tree(tmp_path) -> trees.Tree:
    wheel = tmp_path / "sglang-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    return trees.Tree("release", "1.0", "1.0", wheel, "f" * 64, "pypi", wheel.name)


def test_uv_gets_an_explicit_interpreter_never_downloads_and_installs_only_hashed_pins(tmp_path, fake_uv):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    steps = []

    env = environments.ensure(tmp_path, "env", PY, constraints, fixture_tree(tmp_path),
                              environments.choose_torch(TorchChannel.PYPI), log=steps.append)

    calls = fake_uv()
    assert [c["args"][:2] for c in calls] == [["venv", "--quiet"], ["pip", "sync"], ["pip", "install"]]
    assert all(c["downloads"] == "never" for c in calls)
    venv = calls[0]["args"]
    assert "--no-python-downloads" in venv
    assert venv[venv.index("--python") + 1] == str((tmp_path / "bin" / f"python{PY}").resolve())
    assert "--require-hashes" in calls[1]["args"] and calls[1]["args"][-1] == str(constraints)
    assert "--torch-backend" not in calls[1]["args"]
    assert [s.split(" (")[0] for s in steps[:-1]] == [f"creating the environment with {venv[venv.index('--python') + 1]}",
                                                "installing the pinned closure cells.txt",
                                                "installing the SGLang tree release-1.0 --no-deps"]
    assert all(s.endswith("...") for s in steps[:-1])
    assert steps[-1].startswith(f"built {env.path.name} in ")
    assert (env.path / environments.ENV_INFO).exists()


def test_the_closure_and_the_tree_are_compiled_to_bytecode_as_they_are_installed(tmp_path, fake_uv):
    """A contained probe sees its environment read-only: what is not compiled here is compiled by every probe."""
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")

    environments.ensure(tmp_path, "env", PY, constraints, fixture_tree(tmp_path),
                        environments.choose_torch(TorchChannel.PYPI))

    sync, install = fake_uv()[1]["args"], fake_uv()[2]["args"]
    assert "--compile-bytecode" in sync and "--compile-bytecode" in install


@pytest.mark.parametrize("bytecode", [[], ["compiled"]], ids=["not compiled", "compiled, maybe into a prefix"])
def test_an_environment_built_before_bytecode_was_compiled_beside_its_sources_is_rebuilt(tmp_path, fake_uv,
                                                                                        bytecode):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree, torch = fixture_tree(tmp_path), environments.choose_torch(TorchChannel.PYPI)
    env = environments.ensure(tmp_path, "env", PY, constraints, tree, torch)
    before = [environments.find_python(PY).identity(), environments.sha256_file(constraints),
              torch.channel.value, tree.kind, f"{tree.resolved}:{tree.digest}", *bytecode]
    (env.path / environments.ENV_INFO).write_text(
        json.dumps({"key": hashlib.sha256("\0".join(before).encode()).hexdigest()}))

    assert not environments.ensure(tmp_path, "env", PY, constraints, tree, torch).reused


def test_bytecode_is_compiled_beside_the_sources_with_a_pycache_prefix_set(tmp_path, monkeypatch):
    """A real uv: a contained probe reads bytecode only beside its sources (home, where a prefix would be, is
    hidden from it), so the prefix of the shell that built the environment must not take it elsewhere."""
    wheel = tmp_path / "tiny-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes("1.0", "ANSWER = 42\n", project="tiny"))
    closure = tmp_path / "closure.txt"
    closure.write_text(f"tiny @ {wheel.as_uri()} --hash=sha256:{environments.sha256_file(wheel)}\n")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "prefix"))

    env = environments.ensure(tmp_path, "env", PY, closure, None, environments.choose_torch(TorchChannel.PYPI))

    assert list(env.path.glob("lib/python*/site-packages/tiny/__pycache__/__init__.*.pyc"))
    assert not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("installed", [False, True], ids=["checkout", "installed copy"])
def test_the_harness_starts_no_process_with_a_pycache_prefix_and_an_installed_copys_write_no_bytecode(
        monkeypatch, installed):
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/home/someone/.pycache")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)

    paths.bytecode_beside_sources(paths.BUNDLE if installed else paths.CHECKOUT)

    assert "PYTHONPYCACHEPREFIX" not in os.environ
    assert os.environ.get("PYTHONDONTWRITEBYTECODE") == ("1" if installed else None)


def test_two_runs_that_need_one_environment_build_it_once(tmp_path, fake_uv):
    """The loser of the race waits for the winner's lock and then finds the environment built."""
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree, torch = fixture_tree(tmp_path), environments.choose_torch(TorchChannel.PYPI)
    with ThreadPoolExecutor(max_workers=4) as pool:
        envs = list(pool.map(lambda _: environments.ensure(tmp_path, "env", PY, constraints, tree, torch),
                             range(4)))

    assert [c["args"][0] for c in fake_uv()].count("venv") == 1
    assert sorted(e.reused for e in envs) == [False, True, True, True]


def test_a_cell_starts_as_a_linked_copy_of_its_closure_environment_bytecode_and_all(tmp_path, fake_uv):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    torch = environments.choose_torch(TorchChannel.PYPI)
    closure_env = environments.ensure(tmp_path, "closure", PY, constraints, None, torch)
    compiled = closure_env.path / "lib" / "torch" / "__pycache__" / "__init__.cpython-312.pyc"
    compiled.parent.mkdir(parents=True)
    compiled.write_bytes(b"bytecode")
    calls = len(fake_uv())

    cell = environments.ensure(tmp_path, "cell", PY, constraints, fixture_tree(tmp_path), torch, seed=closure_env)

    assert [c["args"][:2] for c in fake_uv()[calls:]] == [["pip", "install"]]
    copied = cell.path / compiled.relative_to(closure_env.path)
    assert copied.stat().st_ino == compiled.stat().st_ino
    assert cell.commands[0][:3] == ["cp", "--archive", "--link"]
    # The cell's own marker, not the closure's: the closure environment is still what it was.
    assert json.loads((cell.path / environments.ENV_INFO).read_text())["key"] != \
        json.loads((closure_env.path / environments.ENV_INFO).read_text())["key"]
    assert environments.ensure(tmp_path, "closure", PY, constraints, None, torch).reused


def test_an_unchanged_environment_is_reused_without_calling_uv(tmp_path, fake_uv):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree, torch = fixture_tree(tmp_path), environments.choose_torch(TorchChannel.PYPI)
    environments.ensure(tmp_path, "env", PY, constraints, tree, torch)
    before = len(fake_uv())

    assert environments.ensure(tmp_path, "env", PY, constraints, tree, torch).reused
    assert len(fake_uv()) == before


def test_a_path_tree_is_never_built_its_python_dir_goes_on_the_path(tmp_path, fake_uv):
    """Its build backend is the tree's own code, and a build cannot run in the sandbox: nothing installs it."""
    fork = tmp_path / "fork"
    (fork / "python" / "sglang").mkdir(parents=True)
    (fork / "python" / "sglang" / "__init__.py").write_text("__version__ = '1.0'\n")
    (fork / "python" / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree, torch = trees.path_tree(fork), environments.choose_torch(TorchChannel.PYPI)

    built = environments.ensure(tmp_path, "env", PY, constraints, tree, torch)
    reused = environments.ensure(tmp_path, "env", PY, constraints, tree, torch)

    assert reused.reused and [c["args"][:2] for c in fake_uv()] == [["venv", "--quiet"], ["pip", "sync"]]
    assert built.commands and not any("install" in command for command in built.commands)
    assert environments.unbuilt(tree) == {"PYTHONPATH": str(fork / "python")}
    assert environments.unbuilt(fixture_tree(tmp_path)) == {}


def test_the_cpu_channel_syncs_its_compiled_closure_with_hashes_required(tmp_path, fake_uv, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_TORCH", "cpu")
    cpu = tmp_path / "cells-cpu.txt"
    cpu.write_text("")

    choice = environments.choose_torch(TorchChannel.PYPI)
    environments.ensure(tmp_path, "env", PY, environments.closure_for(choice, tmp_path / "cells.txt", cpu),
                        fixture_tree(tmp_path), choice)

    sync = fake_uv()[1]["args"]
    assert sync[-1] == str(cpu) and "--require-hashes" in sync
    assert sync[sync.index("--torch-backend") + 1] == "cpu"


def test_no_python_fails_before_uv_is_called(tmp_path, fake_uv, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")

    with pytest.raises(HarnessError, match="no Python 3.99"):
        environments.ensure(tmp_path, "env", "3.99", tmp_path / "cells.txt", fixture_tree(tmp_path),
                            environments.choose_torch(TorchChannel.PYPI))

    assert not (tmp_path / "uv-calls.jsonl").exists()


def test_compiling_the_cpu_closure_asks_uv_for_hashes_against_the_cpu_index(tmp_path, fake_uv):
    source = tmp_path / "cells.in"
    source.write_text("torch==2.14.1\n")

    environments.compile_cpu_closure(source, tmp_path / "out" / "cells-cpu.txt", "3.12")

    args = fake_uv()[0]["args"]
    assert args[:2] == ["pip", "compile"] and "--generate-hashes" in args
    assert args[args.index("--torch-backend") + 1] == "cpu"
    assert args[args.index("--python-version") + 1] == "3.12"
    assert args[-2:] == ["-o", str(tmp_path / "out" / "cells-cpu.txt")]


# --- environments shared by runs -------------------------------------------------------------


def test_the_closure_environments_path_holds_the_torch_channel_and_how_bytecode_is_compiled(demo_project, monkeypatch):
    reg = registry.load(demo_project)
    pypi = environments.closure_environment_path(reg, reg.constraints)
    monkeypatch.setenv("PDEVIDENCE_TORCH", "cpu")
    cpu = environments.closure_environment_path(reg, reg.constraints)
    monkeypatch.setattr(environments, "BYTECODE", "compiled some other way")
    other_bytecode = environments.closure_environment_path(reg, reg.constraints)

    assert len({pypi, cpu, other_bytecode}) == 3
    assert pypi.parent == cpu.parent == other_bytecode.parent


def test_each_key_has_its_own_environment_none_rebuilds_another(tmp_path, fake_uv):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree = fixture_tree(tmp_path)
    pypi = environments.ensure(tmp_path, "env", PY, constraints, tree, environments.choose_torch(TorchChannel.PYPI))
    cpu = environments.ensure(tmp_path, "env", PY, constraints, tree, environments.TorchChoice("cpu", TorchChannel.CPU))

    assert pypi.path != cpu.path
    assert environments.ensure(tmp_path, "env", PY, constraints, tree,
                               environments.choose_torch(TorchChannel.PYPI)).reused


def holds_it(env: environments.CellEnvironment) -> bool:
    """Whether a run holds the environment: no one can lock its in-use file exclusively."""
    fd = os.open(env.path / debris.IN_USE, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.parametrize("built", [True, False], ids=["built", "reused"])
def test_a_run_holds_the_environment_it_builds_or_reuses_until_it_ends(tmp_path, fake_uv, built):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree, torch = fixture_tree(tmp_path), environments.choose_torch(TorchChannel.PYPI)
    if not built:
        with debris.run():
            environments.ensure(tmp_path, "env", PY, constraints, tree, torch)

    with debris.run():
        env = environments.ensure(tmp_path, "env", PY, constraints, tree, torch)
        assert env.reused is not built and holds_it(env)
    assert not holds_it(env)


def test_a_rebuild_never_deletes_an_environment_a_run_is_using_the_next_sweep_does_once_it_is_unused(
        tmp_path, fake_uv):
    constraints = tmp_path / "cells.txt"
    constraints.write_text("")
    tree, torch = fixture_tree(tmp_path), environments.choose_torch(TorchChannel.PYPI)
    home = tmp_path / "envs"
    reader = subprocess.Popen([sys.executable, "-c", USES_IT, str(home), str(constraints), str(tree.install_target)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        used = Path(reader.stdout.readline().strip())  # the reader's environment, a module of it imported
        (used / environments.ENV_INFO).write_text("{}")  # as a killed build leaves it: to be built again

        rebuilt = environments.ensure(home, "env", PY, constraints, tree, torch)

        assert rebuilt.path == used and not rebuilt.reused
        asides = list(home.glob(f".{used.name}.aside-*"))
        assert len(asides) == 1 and (asides[0] / "imported.py").read_text() == "in use\n"
        with debris.run():  # a later run's sweep
            debris.enter(home, [debris.Place(home)])
        assert asides[0].exists()  # still in use
    finally:
        reader.kill()
        reader.wait()
    with debris.run():
        debris.enter(home, [debris.Place(home)])
    assert not asides[0].exists()


# A run that uses an environment and goes on importing from it.
USES_IT = f"""
import sys, time
from pathlib import Path
from pdevidence import environments
from pdevidence.registry import TorchChannel
from pdevidence.sources import trees

home, closure, wheel = map(Path, sys.argv[1:])
tree = trees.Tree("release", "1.0", "1.0", wheel, "f" * 64, "pypi", wheel.name)
env = environments.ensure(home, "env", "{PY}", closure, tree, environments.choose_torch(TorchChannel.PYPI))
(env.path / "imported.py").write_text("in use\\n")
print(env.path, flush=True)
time.sleep(60)
"""
