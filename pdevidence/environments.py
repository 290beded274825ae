"""One isolated uv environment per cell: pinned closure, then the tree --no-deps.

An environment is rebuilt only when its inputs change (Python, constraints,
torch channel, tree); its key is stored inside it, so a warm cell costs a
file read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .errors import HarnessError, usage
from .fetch import sha256_file
from .trees import Tree

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CHANNELS = ("auto", "cpu", "pypi")
ENV_INFO = ".pdevidence-env.json"
# Packages the PyTorch CPU index replaces; everything CUDA-only goes with them.
_CPU_REPLACED = re.compile(r"^(torch|torchvision|triton|nvidia-[\w-]+|cuda-[\w-]+)==")


def uv_executable() -> str:
    """uv as set by ``uv run``/``uvx`` ($UV), else on PATH."""
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        raise HarnessError("uv is not installed", todo="install it: `python3 -m pip install uv`")
    return found


def run(cmd: list[str], log: list[list[str]], *, env: dict | None = None, what: str) -> str:
    """Run a setup command, recording it; a failure says which step and why."""
    log.append(cmd)
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise HarnessError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{tail}",
                           todo="read the output above; `uv cache clean` helps with a corrupt cache")
    return done.stdout


@dataclass
class TorchChoice:
    requested: str
    channel: str  # cpu | pypi
    note: str = ""


def choose_torch(requested: str | None = None, probe_url: str = TORCH_CPU_INDEX) -> TorchChoice:
    """The CPU build when its index answers, PyPI's (CUDA) build otherwise - visibly."""
    requested = requested or os.environ.get("PDEVIDENCE_TORCH", "auto")
    if requested not in TORCH_CHANNELS:
        raise usage(f"PDEVIDENCE_TORCH={requested!r} is not a torch channel",
                    expected=f"one of: {', '.join(TORCH_CHANNELS)}")
    if requested != "auto":
        return TorchChoice(requested, requested, f"forced by PDEVIDENCE_TORCH={requested}")
    try:
        urllib.request.urlopen(urllib.request.Request(probe_url + "/", method="HEAD"), timeout=5).close()
        return TorchChoice("auto", "cpu", f"{probe_url} is reachable")
    except OSError:
        note = (f"{probe_url} is not reachable: using PyPI's torch build (CUDA, runs on the CPU); "
                "set PDEVIDENCE_TORCH=cpu to require the CPU build")
        print(f"warning: {note}", file=sys.stderr)
        return TorchChoice("auto", "pypi", note)


def cpu_requirements(constraints: Path) -> tuple[str, list[str]]:
    """The closure without PyPI's torch family, and the +cpu pins that replace it."""
    kept, torch_pins, skipping = [], [], False
    for line in constraints.read_text(encoding="utf-8").splitlines():
        if line.startswith((" ", "\t")):
            if not skipping:
                kept.append(line)
            continue
        skipping = bool(_CPU_REPLACED.match(line))
        if skipping:
            name, version = line.split(" ")[0].split("==")
            if name in ("torch", "torchvision"):
                torch_pins.append(f"{name}=={version}+cpu")
        else:
            kept.append(line)
    return "\n".join(kept) + "\n", torch_pins


@dataclass
class CellEnvironment:
    path: Path
    python: str
    torch: TorchChoice
    commands: list[list[str]] = field(default_factory=list)
    reused: bool = False

    @property
    def interpreter(self) -> Path:
        return self.path / "bin" / "python"

    def packages(self) -> dict[str, str]:
        out = run([uv_executable(), "pip", "list", "--format", "json", "--python", str(self.interpreter)],
                  [], what="listing installed packages")
        return {p["name"]: p["version"] for p in json.loads(out)}

    def torch_build(self) -> str | None:
        """torch's own version string (``2.14.1+cu130`` vs ``+cpu``), read without importing it."""
        for version_file in (self.path / "lib").glob("python*/site-packages/torch/version.py"):
            match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", version_file.read_text())
            if match:
                return match.group(1)
        return None


def environment_key(python: str, constraints: Path, channel: str, tree: Tree) -> str:
    # A path tree is reinstalled on every run, so its changing HEAD must not force a rebuild.
    identity = str(tree.install_target) if tree.kind == "path" else f"{tree.resolved}:{tree.digest}"
    parts = [python, sha256_file(constraints), channel, tree.kind, identity]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def ensure(path: Path, python: str, constraints: Path, tree: Tree, torch: TorchChoice) -> CellEnvironment:
    """The cell's environment at ``path``, built or reused."""
    env = CellEnvironment(path, python, torch)
    key = environment_key(python, constraints, torch.channel, tree)
    info = path / ENV_INFO
    uv = uv_executable()
    if info.exists() and json.loads(info.read_text()).get("key") == key:
        env.reused = True
        if tree.kind == "path":  # the developer's work in progress: always reinstall it
            _install_tree(uv, env, tree)
        return env
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    python_request = os.environ.get("PDEVIDENCE_PYTHON", python)
    run([uv, "venv", "--quiet", "--python", python_request, str(path)], env.commands,
        what=f"creating a Python {python} environment (is python{python} installed? PDEVIDENCE_PYTHON "
        "can name an interpreter)")
    target = ["--python", str(env.interpreter)]
    if torch.channel == "cpu":
        closure, torch_pins = cpu_requirements(constraints)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
            fh.write(closure)
        try:
            run([uv, "pip", "sync", "--quiet", *target, fh.name], env.commands, what="installing the pinned closure")
        finally:
            os.unlink(fh.name)
        run([uv, "pip", "install", "--quiet", "--no-deps", *target, "--index-url", TORCH_CPU_INDEX, *torch_pins],
            env.commands, what="installing torch from the PyTorch CPU index")
    else:
        run([uv, "pip", "sync", "--quiet", *target, str(constraints)], env.commands,
            what="installing the pinned closure")
    _install_tree(uv, env, tree)
    info.write_text(json.dumps({"key": key}) + "\n", encoding="utf-8")
    return env


def _install_tree(uv: str, env: CellEnvironment, tree: Tree) -> None:
    reinstall = ["--reinstall-package", "sglang"] if tree.kind == "path" else []
    # SGLang's setup.py otherwise looks for a Rust workspace that a CPU cell does not need.
    run([uv, "pip", "install", "--quiet", "--no-deps", *reinstall, "--python", str(env.interpreter),
         str(tree.install_target)], env.commands, env={"SGLANG_BUILD_RUST_EXTS": "none"},
        what=f"installing the SGLang tree {tree.label()}")
