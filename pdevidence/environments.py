"""One isolated uv environment per cell: pinned closure, then the tree --no-deps.

An environment's key is its inputs (the interpreter's identity, constraints,
torch channel, tree, how its bytecode is compiled); its name ends with the key and
the key is stored inside it, so a warm cell costs a file read and a lock. Runs share
environments: each holds a shared lock on the ones it uses until it ends, and one
that is rebuilt (found unfinished) is renamed aside, removed only once no run uses
it (``core/debris.py``). The torch channel is declared by the registry,
never sniffed from the network; the interpreter is found once, up front, and
uv never downloads one.

Every environment is compiled to bytecode as it is built: probes run contained, with
the environment read-only and ``PYTHONDONTWRITEBYTECODE`` often set, so bytecode that
is not there when it is built would be compiled from source by every process, and
thrown away. A closure environment (the warm engine's) holds no tree and is shared by
every checkout and the installed tool through the user's cache: one per closure file's
content and interpreter, built once under a lock.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from .core import children, debris, faults, files, settings
from .core.errors import HarnessError
from .core.files import sha256_file
from .core.locking import exclusive
from .core.paths import cache_dir, work_dir
from .registry import Era, Registry, TorchChannel
from .sources import era_choice, importable
from .sources.trees import Tree

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ENV_INFO = ".pdevidence-env.json"
# uv must use the interpreter it is given; a download attempt only costs retries and noise.
UV_ENV = {"UV_PYTHON_DOWNLOADS": "never"}
# Enters every environment's key: an environment built before its bytecode was compiled beside its sources
# (at build time, and never into a PYTHONPYCACHEPREFIX) is rebuilt.
BYTECODE = "compiled beside the sources"
# Where uv's compiler writes what the probes read: a prefix would send it where no contained probe looks.
_NOT_PASSED = ("PYTHONPYCACHEPREFIX",)
# Trees used as they are, on the probe's path (their python/ dir), never installed: a build runs the tree's own
# build backend, and a build cannot be contained (the sandbox has no network; an isolated build environment comes
# from the package index). A commit exported from git is such a tree too, compiled where it lies.
UNBUILT = ("path", "git")
_IDENTITY = ("import json, sys; print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], "
             "'implementation': sys.implementation.name}))")


def uv_executable() -> str:
    """uv as set by ``uv run``/``uvx`` ($UV), else the one installed with pdevidence (a declared dependency, beside
    it in its environment: an installed tool's bin directory need not be on PATH), else on PATH."""
    found = settings.get("UV") or _installed_uv() or shutil.which("uv")
    if not found:
        raise HarnessError("uv is not installed", todo="install it: `python3 -m pip install uv`")
    return found


def _installed_uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def run(cmd: list[str], log: list[list[str]], *, env: dict | None = None, what: str,
        progress: bool = False) -> str:
    """Run a setup command, recording it; a failure says which step and why.

    With ``progress`` and a terminal on stderr, the command's own progress (uv's download
    bars) goes to the terminal instead of being captured.
    """
    log.append(cmd)
    live = progress and sys.stderr.isatty()
    done = children.run(cmd, stdout=subprocess.PIPE, stderr=None if live else subprocess.PIPE,
                        text=True, env={**{k: v for k, v in os.environ.items() if k not in _NOT_PASSED}, **UV_ENV,
                                        **(env or {})})
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-15:])
        raise HarnessError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{tail}".rstrip(),
                           todo="read uv's message above; it names the package or file at fault")
    return done.stdout


# --- the interpreter -------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: str  # e.g. 3.12.1, as the interpreter reports it
    implementation: str  # e.g. cpython

    def identity(self) -> str:
        """What enters the keys: what the interpreter is, not where it was found."""
        return f"{self.implementation}-{self.version}"


def _ask(candidate: str) -> Interpreter | None:
    """The interpreter's own answer, or None when it does not run (e.g. an inactive pyenv shim)."""
    try:
        done = children.run([candidate, "-c", _IDENTITY], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        info = json.loads(done.stdout)
    except ValueError:
        return None
    return Interpreter(str(Path(candidate).resolve()) if os.sep in candidate else candidate,
                       info["version"], info["implementation"])


def pyenv_root() -> str:
    return os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


def _pyenv_candidates(version: str, root: str) -> list[str]:
    """pyenv's installed interpreters, newest first, whether or not a shim is active."""
    found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))

    def newest_first(path: str):
        try:
            return Version(Path(path).parents[1].name)
        except ValueError:
            return Version("0")

    return sorted(found, key=newest_first, reverse=True)


def find_python(version: str) -> Interpreter:
    """The cells' interpreter: ``$PDEVIDENCE_PYTHON``, else ``python<version>`` on PATH, else pyenv's."""
    return _find_python(version, settings.get("PDEVIDENCE_PYTHON"), os.environ.get("PATH", ""), pyenv_root())


@functools.lru_cache(maxsize=8)
def _find_python(version: str, named: str | None, search_path: str, pyenv: str) -> Interpreter:
    def fits(found: Interpreter | None) -> bool:
        return found is not None and Version(found.version).release[:2] == Version(version).release[:2]

    todo = (f"install Python {version} (e.g. `pyenv install {version}`), then put its bin directory first "
            f"on PATH or set PDEVIDENCE_PYTHON=/path/to/python{version} (pyenv's versions/{version}.* are "
            "found without an active shim)")
    if named:
        found = _ask(named)
        if fits(found):
            return found
        what = f"is Python {found.version}" if found else "does not run"
        raise HarnessError(f"PDEVIDENCE_PYTHON={named} {what}; the cells need Python {version}", todo=todo)
    on_path = shutil.which(f"python{version}", path=search_path)
    tried = []
    for candidate in ([on_path] if on_path else []) + _pyenv_candidates(version, pyenv):
        found = _ask(candidate)
        if fits(found):
            return found
        tried.append(f"{candidate} {'is Python ' + found.version if found else 'does not run'}")
    pyenv_versions = os.path.join(pyenv, "versions", f"{version}.*")
    raise HarnessError(
        f"no Python {version} for the cells: none on PATH (python{version}), PDEVIDENCE_PYTHON is unset, "
        f"none under pyenv's {pyenv_versions}" + (f"; tried: {'; '.join(tried)}" if tried else ""),
        todo=todo,
    )


# --- the torch channel -----------------------------------------------------------------------


@dataclass
class TorchChoice:
    requested: str  # the PDEVIDENCE_TORCH override, or "registry"
    channel: TorchChannel
    note: str = ""

    @property
    def override(self) -> str | None:
        """The PDEVIDENCE_TORCH value this run used, or None when the registry chose the channel."""
        return None if self.requested == "registry" else self.requested


def choose_torch(declared: TorchChannel) -> TorchChoice:
    """The registry's channel (what the published run used) unless PDEVIDENCE_TORCH asks otherwise."""
    requested = settings.get("PDEVIDENCE_TORCH")  # checked there: one of TorchChannel's values
    if requested is None:
        return TorchChoice("registry", declared, f"the registry's torch_channel = {declared.value!r}")
    channel = TorchChannel(requested)
    note = f"PDEVIDENCE_TORCH={requested}"
    if channel is not declared:
        note += (f" overrides the registry's torch_channel = {declared.value!r} (the published run's): "
                 "compare will report the environment as different")
        _warn_once(note)
    return TorchChoice(requested, channel, note)


@functools.lru_cache(maxsize=None)
def _warn_once(note: str) -> None:
    """Every cell asks for the channel; the override is worth one warning per run, not one per ask."""
    print(f"warning: {note}", file=sys.stderr)


def closure_for(choice: TorchChoice, constraints: Path, constraints_cpu: Path | None) -> Path:
    """The hashed closure a channel installs; the CPU channel only ever from its own compiled file."""
    if choice.channel is TorchChannel.PYPI:
        return constraints
    if constraints_cpu is None or not constraints_cpu.exists():
        missing = f"{constraints_cpu} does not exist" if constraints_cpu else "the registry names no constraints_cpu"
        raise HarnessError(
            f"the CPU torch channel needs a hashed closure compiled against the PyTorch CPU index; {missing}",
            expected="constraints_cpu = \"constraints/cells-py312-cpu.txt\" in experiments.toml, committed",
            todo=f"where {TORCH_CPU_INDEX} is reachable, run `nox -s lock_cpu` and commit the file it writes "
            "(and its constraints_cpu line); or use the registry's channel (unset PDEVIDENCE_TORCH)",
        )
    return constraints_cpu


def compile_cpu_closure(source: Path, dest: Path, python: str) -> Path:
    """``uv pip compile --generate-hashes`` of the cell inputs against the PyTorch CPU index."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    run([uv_executable(), "pip", "compile", "--quiet", "--generate-hashes", "--torch-backend", "cpu",
         "--python-version", python, "--python-platform", "linux", str(source), "-o", str(dest)], [],
        what=f"compiling the CPU closure (needs {TORCH_CPU_INDEX})", progress=True)
    return dest


@dataclass
class CellEnvironment:
    path: Path
    python: str
    torch: TorchChoice
    commands: list[list[str]] = field(default_factory=list)
    reused: bool = False
    probe_env: dict[str, str] = field(default_factory=dict)  # what a probe run here needs: a path tree, stand-ins

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


def environment_key(interpreter: Interpreter, closure: Path, channel: TorchChannel, tree: Tree | None) -> str:
    if tree is None:  # a closure environment: the warm engine brings each tree itself
        identity = "no tree"
    elif tree.kind in UNBUILT:  # never installed (``unbuilt``): a work tree's changing HEAD must not force a rebuild
        identity = f"unbuilt {tree.install_target}"
    else:
        identity = f"{tree.resolved}:{tree.digest}"
    parts = [interpreter.identity(), sha256_file(closure), channel.value, tree.kind if tree else "", identity, BYTECODE]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def environment_path(home: Path, stem: str, key: str) -> Path:
    """Where the environment of ``key`` lives: its name ends with the key, so it holds every part of it, and an
    environment whose inputs change is a new one beside it, never a rebuild of one a run may be using."""
    return home / f"{stem}.{key[:12]}"


def ensure(home: Path, stem: str, python: str, closure: Path, tree: Tree | None, torch: TorchChoice, *,
           log: Callable[[str], None] | None = None, seed: CellEnvironment | None = None) -> CellEnvironment:
    """The cell's environment in ``home`` (``environment_path``), built or reused, and used by this run until it
    ends (``debris.use``: no run removes it meanwhile); ``log`` gets one line per step.

    ``closure`` is the hashed closure of ``torch``'s channel (``closure_for``). ``seed``, a built closure
    environment of that closure, is copied as hard links (its bytecode with it) instead of syncing and
    compiling the closure again.
    """
    say = log or (lambda msg: None)
    interpreter = find_python(python)
    key = environment_key(interpreter, closure, torch.channel, tree)
    path = environment_path(home, stem, key)
    env = CellEnvironment(path, python, torch)
    ready = functools.partial(_built, key=key)
    if not debris.use(path, ready):
        home.mkdir(parents=True, exist_ok=True)
        # Another run (another checkout, the installed tool, a second shell) may be building it: the loser
        # waits, then finds it built.
        with exclusive(home / f".{path.name}.lock", f"the environment {path.name}"):
            if not debris.use(path, ready):
                _build(env, interpreter, closure, tree, key, uv_executable(), say, seed)
                if not debris.use(path, ready):
                    raise HarnessError(f"the environment {path} was built but is not there to use",
                                       todo="run again; if it happens again, report it")
                return env
    env.reused = True
    return env


def _built(path: Path, key: str) -> bool:
    stored = files.read_marker(path / ENV_INFO, "key")  # missing or truncated: not built
    return stored is not None and stored["key"] == key


def _build(env: CellEnvironment, interpreter: Interpreter, closure: Path, tree: Tree | None, key: str, uv: str,
           say: Callable[[str], None], seed: CellEnvironment | None) -> None:
    path = env.path
    started = time.monotonic()
    debris.set_aside(path)  # a run may still be importing from what was here: removed once it is done
    if seed and _linked_copy(seed.path, path, say):
        env.commands.append(["cp", "--archive", "--link", str(seed.path), str(path)])  # what it amounts to
    else:
        _sync(env, interpreter, closure, uv, say)
    if tree is not None and tree.kind not in UNBUILT:
        _install_tree(uv, env, tree, say)
    seconds = round(time.monotonic() - started, 1)
    faults.point("environment")
    (path / debris.IN_USE).touch()
    files.write_marker(path / ENV_INFO, {"key": key, "build_seconds": seconds})
    say(f"built {path.name} in {seconds} s")


def _linked_copy(seed: Path, path: Path, say: Callable[[str], None]) -> bool:
    """``seed`` copied to ``path`` as hard links (installing never edits a file in place: uv and the bytecode
    compiler replace files); False where links cannot be made (another file system)."""
    say(f"copying the closure environment {seed.name} (hard links, with its bytecode) ...")
    try:
        # Its own lock and marker, not links to the seed's.
        shutil.copytree(seed, path, symlinks=True, copy_function=os.link,
                        ignore=lambda _d, names: [n for n in names if n in (ENV_INFO, debris.IN_USE)])
    except (OSError, shutil.Error):
        shutil.rmtree(path, ignore_errors=True)
        return False
    return True


def _sync(env: CellEnvironment, interpreter: Interpreter, closure: Path, uv: str, say: Callable[[str], None]) -> None:
    path = env.path
    say(f"creating the environment with {interpreter.path} ({interpreter.identity()}) (uv venv) ...")
    run([uv, "venv", "--quiet", "--no-python-downloads", "--python", interpreter.path, str(path)], env.commands,
        what=f"creating a Python {env.python} environment")
    channel = ["--torch-backend", "cpu"] if env.torch.channel is TorchChannel.CPU else []
    say(f"installing the pinned closure {closure.name} (uv pip sync, compiled to bytecode; about 6 GB on a cold "
        "uv cache) ...")
    run([uv, "pip", "sync", "--require-hashes", "--compile-bytecode", *channel, "--python", str(env.interpreter),
         str(closure)], env.commands, what="installing the pinned closure", progress=True)


def _install_tree(uv: str, env: CellEnvironment, tree: Tree, say: Callable[[str], None]) -> None:
    say(f"installing the SGLang tree {tree.label()} --no-deps (uv pip install) ...")
    # SGLang's setup.py otherwise looks for a Rust workspace that a CPU cell does not need.
    run([uv, "pip", "install", "--quiet", "--no-deps", "--compile-bytecode", "--python", str(env.interpreter),
         str(tree.install_target)], env.commands, env={"SGLANG_BUILD_RUST_EXTS": "none"},
        what=f"installing the SGLang tree {tree.label()}", progress=True)


def unbuilt(tree: Tree | None) -> dict[str, str]:
    """What puts a source tree (a work tree, an exported commit) on a process's path as it is (its ``python/``,
    as ``check --path`` does): never built (``UNBUILT``)."""
    return {"PYTHONPATH": str(tree.install_target)} if tree is not None and tree.kind in UNBUILT else {}


# --- the environment for a tree, as the registry declares it -----------------------------------


def torch_choice(registry: Registry) -> TorchChoice:
    """The registry's torch channel unless PDEVIDENCE_TORCH overrides it."""
    return choose_torch(registry.torch_channel)


def closure(registry: Registry, era: Era | None = None, *, torch: TorchChoice | None = None,
            override: Path | None = None) -> Path:
    """The hashed closure a tree installs: ``override`` (the drift lane's newer pins) when given, else its era's,
    else today's in the torch channel's flavour (``closure_for``: a CPU channel without its closure raises)."""
    if override is not None:
        return override
    if era is not None:
        return era.constraints
    return closure_for(torch or torch_choice(registry), registry.constraints, registry.constraints_cpu)


def cell_environment(registry: Registry, tree: Tree, slug: str,
                     constraints: Path | None = None, log=None) -> CellEnvironment:
    """The cell's uv environment, built or reused: the tree's era's closure (today's unless the registry
    declares an era for its version), or ``constraints`` (under ``.cells/envs/<slug>``).

    With its era's closure, the cell starts as a linked copy of the shared closure environment, and a
    release's (all it holds is named by its content) lives in the user's cache beside it, for every cell, lane
    and checkout that installs that release in that closure. A source tree (a work tree, an exported commit) is
    never installed: its cell runs in the closure environment itself, the tree on its path."""
    torch = torch_choice(registry)
    era = era_of(registry, tree)
    installs = closure(registry, era, torch=torch, override=constraints)
    seed = closure_environment(registry, era, log=log) if constraints is None else None
    if seed is not None and tree.kind in UNBUILT:  # never installed (``unbuilt``): the closure environment itself
        env = CellEnvironment(seed.path, seed.python, seed.torch, seed.commands, reused=seed.reused)
    elif seed is not None:
        env = ensure(seed.path.parent, f"tree.{tree.label()}.{seed.path.name}", registry.python, installs, tree,
                     torch, log=log, seed=seed)
    else:  # the drift lane's pins: this checkout's own
        env = ensure(work_dir(registry.root) / "envs", slug, registry.python, installs, tree, torch, log=log)
    if tree.kind == "git":  # exported into the cache: compiled where it lies, once, as the warm engine's trees are
        importable.importable_dir(tree, env.interpreter)
    env.probe_env = unbuilt(tree)
    if era is not None and constraints is None:  # the era's own closure: its stand-ins with it
        env.probe_env.update(stand_in_env(era))
    return env


def era_of(registry: Registry, tree: Tree | None) -> Era | None:
    """The era a tree runs in (None: today's closure): a release's or wheel's by its version, a source tree's by
    the version it tells or else by what it pins (``sources/era_choice.py``)."""
    return era_choice.choose(registry, tree).era if tree is not None else None


def stand_in_env(era: Era | None) -> dict[str, str]:
    """What tells the probe process which import stand-ins its era declares (nothing for today's closure)."""
    return {"PDEVIDENCE_STAND_INS": ",".join(era.stand_ins)} if era and era.stand_ins else {}


def closure_environment(registry: Registry, era: Era | None = None, log=None) -> CellEnvironment:
    """An era's closure (default: the registry's) without SGLang, in the user's cache
    (``closure_environment_path``): the warm engine's environment, and the seed of every cell's."""
    torch = torch_choice(registry)
    installs = closure(registry, era, torch=torch)
    return ensure(cache_dir() / "envs", _closure_stem(registry, installs), registry.python, installs, None, torch,
                  log=log)


def closure_environment_path(registry: Registry, installs: Path) -> Path:
    """Where the closure environment of ``installs`` lives: in the user's cache, one per closure file's content,
    interpreter and torch channel (its key), shared by the eras that declare the same closure, every checkout and
    the installed tool."""
    key = environment_key(find_python(registry.python), installs, torch_choice(registry).channel, None)
    return environment_path(cache_dir() / "envs", _closure_stem(registry, installs), key)


def _closure_stem(registry: Registry, installs: Path) -> str:
    return f"closure.{sha256_file(installs)[:12]}.{find_python(registry.python).identity()}"
