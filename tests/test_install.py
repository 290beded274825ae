"""The installable tool: `uv build` makes a wheel and an sdist; the wheel, installed into a fresh environment, answers
from an empty directory with no clone, keeps its state in the user's cache and state directories, and leaves
site-packages as it was installed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from real_runs import CHECKED
from synthetic import serve_index, wheel_bytes

from pdevidence import __version__, environments, registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT
from pdevidence.documents import integrity, provenance

BUNDLE = "pdevidence/project"
CARRIED = ("experiments.toml", "SHA256SUMS.txt")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """`uv build` of this checkout: the sdist, and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([environments.uv_executable(), "build", "--quiet", "--out-dir", str(out), str(PROJECT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {"wheel": next(out.glob("pdevidence-*.whl")), "sdist": next(out.glob("pdevidence-*.tar.gz"))}


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> dict[str, Path]:
    """The wheel in a fresh venv (bytecode compiled at install, as pip does), and an empty directory to run in."""
    base = tmp_path_factory.mktemp("installed")
    uv = environments.uv_executable()
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(base / "venv")], check=True, timeout=120)
    python = base / "venv" / "bin" / "python"
    subprocess.run([uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python),
                    str(built["wheel"])], check=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (base / "empty").mkdir()
    return {"python": python, "tool": base / "venv" / "bin" / "pdevidence", "site": site, "cwd": base / "empty",
            "home": base}


def tree_hash(top: Path) -> dict[str, str]:
    """Every file and link under ``top`` with its content's SHA-256: what changed, appeared or vanished."""
    found = {}
    for path in sorted(top.rglob("*")):
        rel = path.relative_to(top).as_posix()
        if path.is_symlink():
            found[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = "dir"
    return found


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """An operator's environment: no PDEVIDENCE_* of ours, the user's cache and state in ``home``, and a PATH
    without the tool's own bin directory (pipx and `uv tool` put only the entry point on it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PDEVIDENCE_", "SGLANG_", "XDG_"))
           and k not in ("UV", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONPYCACHEPREFIX")}
    env.update(PATH="/usr/bin:/bin", XDG_CACHE_HOME=str(home / "xdg-cache"), XDG_STATE_HOME=str(home / "xdg-state"))
    return {**env, **extra}


def run(installed, *argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(installed["tool"]), *argv], cwd=installed["cwd"], capture_output=True, text=True,
                          env=env or user_env(installed["home"]), timeout=timeout)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_the_wheel_carries_the_project_files_and_declares_only_what_check_needs(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
        carried = {name.removeprefix(f"{BUNDLE}/"): wheel.read(name) for name in names if name.startswith(BUNDLE)}
        metadata = Parser().parsestr(wheel.read(f"pdevidence-{__version__}.dist-info/METADATA").decode())
    tracked = subprocess.run(["git", "ls-files", *CARRIED, "probes", "constraints", "results", "backports"], cwd=PROJECT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert set(carried) == set(tracked) and set(integrity.covered_files(PROJECT)) <= set(carried)
    assert all(carried[rel] == (PROJECT / rel).read_bytes() for rel in carried)
    assert not [n for n in names if "__pycache__" in n or "/." in n]
    assert {p.relative_to(PROJECT).as_posix() for p in provenance.HARNESS.rglob("*.py")} <= names
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    assert sorted(r.name for r in requires if r.marker is None) == ["packaging", "platformdirs", "uv"]
    # Optional: zstd layers of a saved image (`check --image`), installed as pdevidence[zstd].
    assert [(r.name, str(r.marker)) for r in requires if r.marker is not None] == [("zstandard", 'extra == "zstd"')]
    assert metadata["Version"] == __version__
    with tarfile.open(built["sdist"]) as sdist:  # the checkout's own layout, from which the wheel was built
        tops = {Path(name).parts[1] for name in sdist.getnames() if len(Path(name).parts) > 1}
    assert {"pdevidence", "probes", "constraints", "results", "experiments.toml", "SHA256SUMS.txt",
            "hatch_build.py", "pyproject.toml"} <= tops


def test_the_installed_tool_names_its_version_and_evidence_and_refuses_bad_input_from_an_empty_directory(installed):
    before = tree_hash(installed["site"])
    done = run(installed, "--version")
    assert done.returncode == 0
    sums = hashlib.sha256((PROJECT / integrity.SUMS_FILE).read_bytes()).hexdigest()
    assert done.stdout.startswith(f"pdevidence {__version__}\nevidence: sha256:{sums} ")
    assert "installed copy" in done.stdout and str(installed["site"] / BUNDLE) in done.stdout
    done = run(installed, "check", "--version", "0.5.21; rm -rf /")
    assert done.returncode == errors.USAGE
    assert "argument --version: '0.5.21; rm -rf /' is not a release version" in done.stderr
    done = run(installed, "publish")  # the installed copy's evidence is what it was built with
    assert done.returncode == errors.USAGE and "installed pdevidence" in done.stderr
    assert list(installed["cwd"].iterdir()) == []
    assert tree_hash(installed["site"]) == before


def test_installed_and_checkout_copies_compute_the_same_digests_and_verdict_on_the_evidence(installed):
    ask = "from pdevidence.documents import provenance as p; print(*(p.harness_digest(s) for s in p.Shaped))"
    digests = subprocess.run([str(installed["python"]), "-c", ask], cwd=installed["cwd"], capture_output=True,
                             text=True, check=True, env=user_env(installed["home"])).stdout.split()
    assert digests == [provenance.harness_digest(shaped) for shaped in provenance.Shaped]
    here = subprocess.run([sys.executable, "-m", "pdevidence", "verify"], cwd=PROJECT, capture_output=True,
                          text=True, env=user_env(installed["home"], PYTHONPATH=str(PROJECT)), timeout=120)
    there = run(installed, "verify")
    # Stale or current, the same verdict naming the same digests: only where the files are differs.
    assert there.returncode == here.returncode
    assert there.stderr == here.stderr


def test_the_installed_tool_keeps_its_state_in_the_users_cache_and_never_where_it_runs(installed, http_server):
    """A release from a local index, no interpreter for the cells: the tree goes to the user's cache; the same
    answer as a checkout gives."""
    before = tree_hash(installed["site"])
    index = serve_index(http_server, {"sglang-9.9.9-py3-none-any.whl": wheel_bytes("9.9.9", "")})
    no_python = installed["home"] / "no-python"
    no_python.write_text("#!/bin/sh\nexit 1\n")
    no_python.chmod(0o755)
    env = user_env(installed["home"], PDEVIDENCE_INDEX_URL=index, PDEVIDENCE_PYTHON=str(no_python))
    done = run(installed, "check", "--version", "9.9.9", env=env)
    here = subprocess.run([sys.executable, "-m", "pdevidence", "check", "--version", "9.9.9"], cwd=PROJECT,
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(PROJECT),
                                                               "PDEVIDENCE_RUNS": str(installed["home"] / "runs"),
                                                               "PDEVIDENCE_WORK": str(installed["home"] / "work")})
    assert done.returncode == here.returncode and done.returncode not in (errors.INTERNAL, errors.CONFIRMED)
    cache = installed["home"] / "xdg-cache" / "pdevidence"
    assert (cache / "trees.seen.json").is_file() and list((cache / "wheels").rglob("sglang-9.9.9-*.whl"))
    assert list(installed["cwd"].iterdir()) == []
    assert tree_hash(installed["site"]) == before


@pytest.mark.sglang
def test_the_installed_wheel_checks_a_release_from_an_empty_directory(installed):
    """Alone proves: the installed wheel, from an empty directory with no clone, checks a real release (0.5.21:
    every fix fixed) with its own copy of the evidence, and keeps every environment, tree,
    outcome and run in the user's cache and state directories. Those are a fresh, temporary home's on purpose (the
    one real test with a cold pdevidence cache: the test is about where the tool puts its state, so nothing may be
    there before; uv's own cache is shared, so the closure installs by links)."""
    before = tree_hash(installed["site"])
    uv_cache = subprocess.run([environments.uv_executable(), "cache", "dir"], capture_output=True, text=True,
                              check=True).stdout.strip()
    env = user_env(installed["home"], UV_CACHE_DIR=uv_cache)
    done = run(installed, "check", "--version", "0.5.21", "--json", env=env, timeout=3000)
    assert done.returncode == errors.CONFIRMED, done.stderr
    doc = json.loads(done.stdout)
    assert doc["target"]["resolved"] == "0.5.21"
    # 0.5.21 is admission's head; every other fix came before it (the deferred releases on by default there).
    assert {e["experiment"]: e["status"] for e in doc["experiments"]} == CHECKED["0.5.21"]
    state = installed["home"] / "xdg-state" / "pdevidence" / "runs" / "check"
    written = {p.name for p in state.rglob("*.json")}
    assert {f"{name}.json" for name in registry.load(PROJECT).experiments} <= written
    assert (installed["home"] / "xdg-cache" / "pdevidence" / "envs").is_dir()
    assert list(installed["cwd"].iterdir()) == []
    assert tree_hash(installed["site"]) == before
