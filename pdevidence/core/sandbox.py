"""How a process that imports an SGLang tree is contained: bubblewrap, else ``unshare``, else not at all.

Checking a tree runs its code: importing ``sglang`` runs whatever the tree's author wrote.
Every process that imports a tree (a probe, the warm engine and its children, a mutant
driver, the upstream tests) therefore starts inside a sandbox built here:

- no network: its own network namespace, with nothing in it but a loopback of its own;
- its own PID, IPC and UTS namespaces; no capabilities; it dies with the harness;
- a file system of its own: the system directories (``/usr``, ``/etc``, ...; nothing in them that others
  may not read) and what the run needs (the interpreter, the tree, the probes) read-only, the run's output directories
  writable, a private ``/tmp`` and an empty private ``$HOME``; nothing else of the machine
  (the rest of the home directory, other checkouts, ``/run`` and its sockets) is there;
- an environment cleared to what a probe needs (no tokens or keys of the operator's);
- limits: private memory per process (``PDEVIDENCE_PROBE_MEMORY``), processes and threads
  (``PDEVIDENCE_PROBE_PROCESSES``; the kernel exempts root from that rlimit, so as root a
  pids cgroup does it where one is writable), the size of any file it writes, and the
  harness's time limit (``PDEVIDENCE_PROBE_TIMEOUT``).

Bubblewrap (``bwrap``, what Flatpak and build sandboxes use) builds it where it is
installed and works; else util-linux's ``unshare`` builds the same view with user namespaces
(``unshare_sandbox.sh``). ``PDEVIDENCE_SANDBOX`` picks one (or ``none``). Where neither
works, a tree that is not pinned with a verified hash runs only when the operator asks
(``--allow-uncontained``); every receipt and every check says how its tree ran.

Containment protects the machine, not the verdict: the probes run inside the tree's
process, so a tree written to fool them can.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import settings
from .errors import ENVIRONMENT, HarnessError

# The machine's own software, visible read-only: what an interpreter links and reads.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/nix/store", "/gnu/store")
SCRATCH_BYTES = 512 << 20  # each private tmpfs (/tmp, $HOME): its pages are memory
MASK_BYTES = 1 << 20  # each read-only tmpfs hiding a system directory's private entries: mount points, links
FILE_BYTES = 4 << 30  # the largest file a contained process may write (its log too)
UNSHARE_SCRIPT = Path(__file__).with_name("unshare_sandbox.sh")
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
                "bubblewrap`; Arch: `sudo pacman -S bubblewrap`); where it is installed but cannot create user "
                "namespaces (Ubuntu 24.04's AppArmor restriction), `sudo sysctl -w "
                "kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap allows it")
# What a contained process keeps of its environment (everything else is dropped: tokens, keys, proxies, an
# index URL with its credentials): the in-cell files' own variables (the era's stand-ins, the upstream tests'
# record) among them; PDEVIDENCE_PROBE_PASS_ENV names more.
PASSED_NAMES = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE", "PDEVIDENCE_STAND_INS", "PDEVIDENCE_UPSTREAM_RECORD")
PASSED_PREFIXES = ("LC_", "PYTHON", "SGLANG_", "OMP_", "MKL_", "OPENBLAS_", "TORCH_")


class Tool(str, enum.Enum):
    BUBBLEWRAP = "bubblewrap"
    UNSHARE = "unshare"
    NONE = "none"


class Allowed(str, enum.Enum):
    """Why a tree ran although nothing could contain it."""

    PINNED = "pinned"  # its digest is pinned in the tracked tree lock
    OPERATOR = "--allow-uncontained"  # the operator asked


@dataclass(frozen=True)
class Limits:
    memory_bytes: int  # private memory per process (RLIMIT_DATA); the whole sandbox's too with a memory cgroup
    processes: int  # processes and threads
    processes_by: str | None  # rlimit | cgroup | None (not limited: see why_unlimited)
    memory_by: str  # rlimit | rlimit+cgroup
    file_bytes: int
    seconds: float
    why_unlimited: str | None = None

    def to_json(self) -> dict:
        return {"memory_bytes": self.memory_bytes, "memory_by": self.memory_by, "processes": self.processes,
                "processes_by": self.processes_by, "file_bytes": self.file_bytes, "seconds": self.seconds,
                "why_unlimited": self.why_unlimited}


@dataclass(frozen=True)
class Containment:
    """What contains a probe process on this machine (or why nothing does)."""

    tool: Tool
    version: str | None  # e.g. "bubblewrap 0.8.0"
    why_not: str | None  # tool NONE: why
    limits: Limits
    executable: str | None = None
    prlimit: str | None = None
    cgroups: tuple[tuple[str, str], ...] = ()  # (controller, parent directory) writable for our sub-cgroups

    @property
    def contained(self) -> bool:
        return self.tool is not Tool.NONE

    def record(self, allowed: Allowed | None = None) -> dict:
        """How a tree ran, for receipts and check documents."""
        return {"tool": self.tool.value, "version": self.version, "why_not": self.why_not,
                "allowed_by": allowed.value if allowed and not self.contained else None,
                "limits": self.limits.to_json()}


_LIMIT_FIELDS = {"memory_bytes": int, "memory_by": str, "processes": int, "processes_by": (str, type(None)),
                 "file_bytes": int, "seconds": (int, float), "why_unlimited": (str, type(None))}


def record_problem(doc: object) -> str | None:
    """What is wrong with a containment record (``Containment.record``), or None."""
    if not isinstance(doc, dict):
        return "must be an object"
    if set(doc) != {"tool", "version", "why_not", "allowed_by", "limits"}:
        return f"has keys {sorted(doc)}, expected allowed_by, limits, tool, version and why_not"
    if doc["tool"] not in {t.value for t in Tool}:
        return f"tool {doc['tool']!r} is not one of {', '.join(t.value for t in Tool)}"
    contained = doc["tool"] != Tool.NONE.value
    if not isinstance(doc["version"] if contained else doc["why_not"], str):
        return "a contained run names its tool's version, an uncontained one why_not"
    if doc["allowed_by"] not in (None, *(a.value for a in Allowed)) or (contained and doc["allowed_by"]):
        return f"allowed_by {doc['allowed_by']!r} is not null or one of {', '.join(a.value for a in Allowed)}"
    limits = doc["limits"]
    if not isinstance(limits, dict) or set(limits) != set(_LIMIT_FIELDS):
        return f"limits must have {', '.join(sorted(_LIMIT_FIELDS))}"
    for key, kind in _LIMIT_FIELDS.items():
        if not isinstance(limits[key], kind) or isinstance(limits[key], bool):
            return f"limits.{key} has the wrong type ({type(limits[key]).__name__})"
    return None


def describe(record: dict | None) -> str:
    """One line an operator reads: contained by what, with which limits; or not, and why."""
    if record is None:
        return "containment not recorded (a run older than containment)"
    limits = record["limits"]
    if record["tool"] == Tool.NONE.value:
        because = {Allowed.PINNED.value: "a pinned release with a verified hash",
                   Allowed.OPERATOR.value: "the operator passed --allow-uncontained"}.get(record["allowed_by"], "")
        return f"NOT contained ({record['why_not']}); ran because {because}" if because else \
            f"NOT contained ({record['why_not']})"
    processes = f"{limits['processes']} processes" if limits["processes_by"] else \
        f"processes not limited ({limits['why_unlimited']})"
    return (f"contained by {record['version']}: no network, read-only file system but its outputs, private /tmp, "
            f"home hidden, own PID namespace; {_size(limits['memory_bytes'])} memory, {processes}, "
            f"{limits['seconds']:g} s")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class View:
    """What a contained process sees besides the system: paths it reads, paths it writes, where it starts."""

    read: tuple[Path, ...] = ()
    write: tuple[Path, ...] = ()
    cwd: Path | None = None


# --- detection -------------------------------------------------------------------------------

_allowed_uncontained = False


@contextlib.contextmanager
def uncontained_allowed(allowed: bool = True) -> Iterator[None]:
    """While inside, the operator's ``--allow-uncontained`` holds: trees run even where nothing can contain
    them."""
    global _allowed_uncontained
    before, _allowed_uncontained = _allowed_uncontained, allowed
    try:
        yield
    finally:
        _allowed_uncontained = before


def detect() -> Containment:
    """This machine's containment, under the current settings (probed once per process and settings)."""
    return _detect(settings.get("PDEVIDENCE_SANDBOX"), settings.get("PDEVIDENCE_PROBE_MEMORY"),
                   settings.get("PDEVIDENCE_PROBE_PROCESSES"), settings.get("PDEVIDENCE_PROBE_TIMEOUT"),
                   os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=8)
def _detect(wanted: str, memory: int, processes: int, seconds: float, search_path: str) -> Containment:
    prlimit = _system_tool("prlimit", search_path)
    cgroups = _writable_cgroups() if os.geteuid() == 0 else ()
    limits = _limits(memory, processes, seconds, prlimit, cgroups)
    failures = []
    for tool in (Tool.BUBBLEWRAP, Tool.UNSHARE):
        if wanted not in ("auto", tool.value):
            continue
        found = _try(tool, search_path, limits, prlimit, cgroups)
        if isinstance(found, Containment):
            return found
        failures.append(found)
        if wanted == tool.value:
            raise HarnessError(f"PDEVIDENCE_SANDBOX={wanted}, but {found}",
                               todo=f"{INSTALL_HINT}; or unset PDEVIDENCE_SANDBOX to use what works here",
                               code=ENVIRONMENT)
    why = "PDEVIDENCE_SANDBOX=none" if wanted == Tool.NONE.value else "; ".join(failures)
    return Containment(Tool.NONE, None, why, limits, prlimit=prlimit, cgroups=cgroups)


def _system_tool(name: str, search_path: str) -> str | None:
    """A tool the sandbox runs inside itself: it must live in a system directory, which it sees."""
    found = shutil.which(name, path=search_path)
    if found and any(Path(found).resolve().is_relative_to(top) for top in SYSTEM):
        return found
    return None


def _limits(memory: int, processes: int, seconds: float, prlimit: str | None,
            cgroups: tuple[tuple[str, str], ...]) -> Limits:
    controllers = {name for name, _ in cgroups}
    if os.geteuid() == 0:  # RLIMIT_NPROC does not bind root
        by = "cgroup" if "pids" in controllers else None
        why = None if by else "running as root, which the process rlimit does not bind, and no writable pids cgroup"
    else:
        by, why = ("rlimit", None) if prlimit else (None, "no prlimit (util-linux) in a system directory")
    memory_by = "rlimit+cgroup" if "memory" in controllers else "rlimit"
    return Limits(memory, processes, by, memory_by, FILE_BYTES, seconds, why)


def _try(tool: Tool, search_path: str, limits: Limits, prlimit: str | None,
         cgroups: tuple[tuple[str, str], ...]) -> Containment | str:
    """The tool, once it contained a trivial process here; else why not."""
    name = "bwrap" if tool is Tool.BUBBLEWRAP else "unshare"
    found = shutil.which(name, path=search_path)
    if not found:
        return f"no {name} on PATH"
    if not prlimit:
        return "no prlimit (util-linux) in a system directory on PATH"
    done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
    version = (done.stdout.strip().splitlines() or [name])[0]
    candidate = Containment(tool, version, None, limits, found, prlimit, cgroups)
    try:
        with _mountpoint(candidate) as mountpoint:
            smoke = subprocess.run(_argv(candidate, ["/bin/true"], _Resolved([], [], Path("/")), cgroup_procs=[],
                                         mountpoint=mountpoint),
                                   capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{version} could not start a sandbox ({exc})"
    if smoke.returncode != 0:
        said = (smoke.stderr.strip().splitlines() or [f"exit status {smoke.returncode}"])[-1]
        return f"{version} could not start a sandbox: {said}"
    return candidate


# --- cgroups (root only: the process rlimit does not bind root) --------------------------------

def _writable_cgroups() -> tuple[tuple[str, str], ...]:
    """(controller, directory) for pids and memory, where we may create a sub-cgroup of our own cgroup."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ()
    v1 = {}
    v2 = None
    for line in own:
        hierarchy, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if hierarchy == "0" and not names:
            v2 = path
        for name in names.split(","):
            v1[name] = path
    found = {}
    for line in mounts:
        before, _, after = line.partition(" - ")
        fstype, _, options = (after.split(" ") + ["", "", ""])[:3]
        point = _unescape(before.split(" ")[4])
        if fstype == "cgroup":
            for name in ("pids", "memory"):
                if name in options.split(",") and name in v1 and name not in found:
                    found[name] = str(Path(point) / v1[name].lstrip("/"))
        elif fstype == "cgroup2" and v2 is not None:
            parent = Path(point) / v2.lstrip("/")
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            for name in ("pids", "memory"):
                if name in enabled and name not in found:
                    found[name] = str(parent)
    return tuple((name, parent) for name, parent in sorted(found.items()) if os.access(parent, os.W_OK))


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


_counter = itertools.count()


@dataclass(frozen=True)
class _Groups:
    procs: list[str]  # each sub-cgroup's cgroup.procs, for the sandbox to enter
    memory: Path | None  # the memory one, whose OOM kills are read


@contextlib.contextmanager
def _cgroups(containment: Containment) -> Iterator[_Groups]:
    """Fresh sub-cgroups for one sandbox (limits written); on the way out, whatever is still in them is killed
    and they are removed."""
    made, memory = [], None
    try:
        for name, parent in containment.cgroups:
            group = Path(parent) / f"pdevidence-sandbox-{os.getpid()}-{next(_counter)}"
            group.mkdir()
            made.append(group)
            if name == "pids":
                (group / "pids.max").write_text(str(containment.limits.processes))
            else:
                limit = "memory.max" if (group / "memory.max").exists() else "memory.limit_in_bytes"
                (group / limit).write_text(str(containment.limits.memory_bytes))
                memory = group
        yield _Groups([str(group / "cgroup.procs") for group in made], memory)
    finally:
        for group in made:
            _remove_cgroup(group)


def oom_kills(group: Path | None) -> int:
    """How many processes the kernel's OOM killer has killed in a memory cgroup (``oom_kill`` of v2's
    ``memory.events``, of v1's ``memory.oom_control``); 0 without one or where the kernel does not count them."""
    if group is None:
        return 0
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError, ValueError):
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def memory_peak(group: Path | None) -> int | None:
    """The most a memory cgroup has held (v2's ``memory.peak``, v1's ``memory.max_usage_in_bytes``), or None."""
    if group is None:
        return None
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            return int((group / name).read_text().split()[0])
    return None


LIMIT_REACHED = 0.95  # a cgroup that held this share of its limit was killed at it; less: the machine ran out first


def out_of_memory(record: dict | None, *, killed: bool, peak: int | None = None) -> str:
    """What a probe process that ran out of memory ran into, said after "the probe process" in a ``cannot run``,
    with what to do: ``killed``, by the kernel at its sandbox's memory cgroup limit (or, when the sandbox's
    ``peak`` stayed below it, because the machine ran out first); else (a ``MemoryError``) at the limit per
    process, or at the machine's own memory where nothing limited it (``record``: how it ran,
    ``Containment.record``)."""
    limits = (record or {}).get("limits") or {}
    size = _size(limits["memory_bytes"]) if isinstance(limits.get("memory_bytes"), int) else "?"
    if not record or record.get("tool") == Tool.NONE.value:
        return ("ran out of memory: the machine's own, since nothing limits an uncontained process (free memory, "
                "or check fewer trees at a time)")
    advice = "raise it, e.g. PDEVIDENCE_PROBE_MEMORY=16G, where the machine has that much free"
    if killed and peak is not None and isinstance(limits.get("memory_bytes"), int) and \
            peak < LIMIT_REACHED * limits["memory_bytes"]:
        return (f"was killed by the kernel when the machine ran out of memory, its sandbox holding {peak >> 20} MiB "
                f"at most, under its limit of {size} (PDEVIDENCE_PROBE_MEMORY): free memory, or lower the limit "
                "below what the machine has so that the sandbox meets it first")
    if killed:
        return (f"was killed by the kernel at the memory limit of {size} (PDEVIDENCE_PROBE_MEMORY) of its sandbox's "
                f"memory cgroup, which all of the sandbox's processes share ({advice}; or probe one tree at a time: "
                "`sweep --jobs 1`)")
    return f"hit the memory limit of {size} per process (PDEVIDENCE_PROBE_MEMORY; {advice})"


def _remove_cgroup(group: Path) -> None:
    for _ in range(50):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


# --- the view and the command ----------------------------------------------------------------

@dataclass(frozen=True)
class _Resolved:
    read: list[Path]
    write: list[Path]
    cwd: Path


def interpreter_paths(interpreter: Path) -> list[Path]:
    """What an interpreter needs to see, read without running it: its environment (a venv), its base
    installation, the directories its ``.pth`` files name, and its user site-packages."""
    interpreter = Path(os.path.abspath(interpreter))
    found = [*_link_dirs(interpreter)]
    env = interpreter.parent.parent
    real = interpreter.resolve()
    found.append(real.parent.parent)  # <prefix>/bin/python3.X
    cfg = env / "pyvenv.cfg"
    if cfg.is_file():
        found.append(env)
        for line in cfg.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                found.append(Path(value.strip()).resolve().parent)
    for prefix in list(found):
        for site in prefix.glob("lib/python3*/site-packages"):
            found += _pth_dirs(site)
            user = Path.home() / ".local" / "lib" / site.parent.name / "site-packages"
            if user.is_dir():
                found.append(user)
    return found


def _link_dirs(path: Path) -> list[Path]:
    """The directory of ``path`` and of every symbolic link it goes through to its file."""
    found = [path.parent]
    for _ in range(40):  # the kernel's own limit on a chain of links
        if not path.is_symlink():
            break
        path = Path(os.path.abspath(path.parent / os.readlink(path)))
        found.append(path.parent)
    return found


def _pth_dirs(site: Path) -> list[Path]:
    """The directories ``.pth`` files add to the path (their import lines are not read)."""
    found = []
    for pth in sorted(site.glob("*.pth")):
        try:
            lines = pth.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = Path(line) if os.path.isabs(line) else site / line
            if path.is_dir():
                found.append(path)
    return found


def environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` cleared to what a probe process may have: the names and prefixes above, those
    PDEVIDENCE_PROBE_PASS_ENV names, and ``TMPDIR`` pointing at the private /tmp."""
    extra = set(settings.get("PDEVIDENCE_PROBE_PASS_ENV"))
    kept = {k: v for k, v in env.items() if k in PASSED_NAMES or k in extra or k.startswith(PASSED_PREFIXES)}
    kept["TMPDIR"] = "/tmp"
    return kept


def _resolve(command: list[str], view: View, env: dict[str, str]) -> _Resolved:
    read = [*interpreter_paths(Path(command[0])), *view.read]
    read += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    absolute = [Path(os.path.abspath(p)) for p in read if os.path.exists(p)]
    write = [Path(os.path.abspath(p)) for p in view.write]
    cwd = Path(os.path.abspath(view.cwd)) if view.cwd else (write[0] if write else Path("/"))
    return _Resolved(_unique(absolute), _unique(write), cwd)


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _mounts(resolved: _Resolved) -> list[tuple[str, str, str]]:
    """The file system as (operation, path, symlink target) in mount order: parents before what goes inside.
    ``mask`` is an empty tmpfs, made read-only once what goes inside is there."""
    ops = [("tmpfs", "/tmp", "-"), ("symlink", "/var/tmp", "/tmp"), *_system_view(SYSTEM)]
    home = os.path.abspath(os.path.expanduser("~"))
    if home != "/" and not any(Path(home).is_relative_to(top) for top in SYSTEM):
        ops.append(("tmpfs", home, "-"))  # the operator's home: an empty private one
    ops += [("ro", str(p), "-") for p in resolved.read]
    ops += [("rw", str(p), "-") for p in resolved.write]
    order = {"symlink": 0, "tmpfs": 0, "mask": 0, "ro": 1, "rw": 2}
    return sorted(ops, key=lambda op: (len(Path(op[1]).parts), order[op[0]]))


@functools.lru_cache(maxsize=8)
def _system_view(tops: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """The system directories, read once per process: each bound whole, but nothing others may not read.
    Run as root, a root-only file (``/etc/shadow``, ``/etc/ssl/private``) would be readable inside: the
    sandbox's root is the file's owner. So a directory that holds such an entry is shown as an empty
    read-only tmpfs with only its other entries bound back, each shown the same way."""
    ops: list[tuple[str, str, str]] = []
    for top in tops:
        if os.path.islink(top):
            ops.append(("symlink", top, os.readlink(top)))
        elif os.path.isdir(top) and _public(os.stat(top, follow_symlinks=False)):
            below = _masked(top)
            ops += below if below[:1] == [("mask", top, "-")] else [("ro", top, "-"), *below]
    return tuple(ops)


def _public(st: os.stat_result) -> bool:
    """Whether others may read it (a directory: list and enter it); a link always (its target is shown or
    not by its own mode). Sockets, pipes and devices: never."""
    if stat.S_ISDIR(st.st_mode):
        return st.st_mode & 0o005 == 0o005
    return stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o004))


def _masked(directory: str) -> list[tuple[str, str, str]]:
    """Below ``directory`` (shown whole): a mask on every directory holding an entry others may not read,
    and its other entries shown again inside it."""
    try:
        entries = sorted((e.path, e.stat(follow_symlinks=False)) for e in os.scandir(directory))
    except OSError:  # gone meanwhile, or unreadable even to us: show nothing of it
        return [("mask", directory, "-")]
    public = [(path, st) for path, st in entries if _public(st)]
    below = {path: _masked(path) for path, st in public if stat.S_ISDIR(st.st_mode)}
    ops = []
    if len(public) < len(entries):
        ops.append(("mask", directory, "-"))
        for path, st in public:
            if stat.S_ISLNK(st.st_mode):
                ops.append(("symlink", path, os.readlink(path)))
            elif below.get(path, [])[:1] != [("mask", path, "-")]:  # else that mask makes it
                ops.append(("ro", path, "-"))
    for more in below.values():
        ops += more
    return ops


def _bwrap(containment: Containment, resolved: _Resolved) -> list[str]:
    argv = [containment.executable, "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
            "--ro-bind-try", "/sys", "/sys"]
    masks = []
    for op, path, target in _mounts(resolved):
        if op == "symlink":
            argv += ["--symlink", target, path]
        elif op == "tmpfs":
            argv += ["--perms", "1777", "--size", str(SCRATCH_BYTES), "--tmpfs", path]
        elif op == "mask":
            argv += ["--perms", "0755", "--size", str(MASK_BYTES), "--tmpfs", path]
            masks += ["--remount-ro", path]
        else:
            argv += ["--bind" if op == "rw" else "--ro-bind", path, path]
    return [*argv, *masks, "--remount-ro", "/", "--chdir", str(resolved.cwd), "--"]


def _unshare(containment: Containment, resolved: _Resolved, mountpoint: Path) -> list[str]:
    ops = [part for op in _mounts(resolved) for part in (op[0], op[2], op[1])]
    return [containment.executable, "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork",
            "--kill-child", "--ipc", "--uts", "--", "/bin/sh", str(UNSHARE_SCRIPT), str(mountpoint),
            str(SCRATCH_BYTES), str(MASK_BYTES), str(resolved.cwd), *ops, "--"]


def _argv(containment: Containment, command: list[str], resolved: _Resolved, *, cgroup_procs: list[str],
          mountpoint: Path | None) -> list[str]:
    limits = containment.limits
    inside = [containment.prlimit, f"--data={limits.memory_bytes}", f"--fsize={limits.file_bytes}", "--core=0",
              *([f"--nproc={limits.processes}"] if limits.processes_by == "rlimit" else []), "--", *command]
    sandbox = _bwrap(containment, resolved) if containment.tool is Tool.BUBBLEWRAP else \
        _unshare(containment, resolved, mountpoint)
    if not cgroup_procs:
        return [*sandbox, *inside]
    # Enter the cgroups before the sandbox starts, so everything it runs is counted.
    enter = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", enter, "pdevidence-cgroups", *cgroup_procs, "--", *sandbox, *inside]


@contextlib.contextmanager
def _mountpoint(containment: Containment) -> Iterator[Path | None]:
    """The empty directory ``unshare_sandbox.sh`` builds its root on (bubblewrap needs none)."""
    if containment.tool is not Tool.UNSHARE:
        yield None
        return
    made = Path(tempfile.mkdtemp(prefix="pdevidence-sandbox-root-"))
    try:
        yield made
    finally:
        with contextlib.suppress(OSError):
            made.rmdir()


def admit(trusted: bool, what: str) -> Allowed | None:
    """Whether ``what`` may run here: contained, or (when nothing contains it) a pinned tree or the
    operator's ``--allow-uncontained``; else a HarnessError saying how to install bubblewrap."""
    found = detect()
    if found.contained:
        return None
    if trusted:
        return Allowed.PINNED
    if _allowed_uncontained:
        return Allowed.OPERATOR
    raise HarnessError(
        f"refusing to run {what} uncontained: nothing can contain it on this machine ({found.why_not}); "
        "its code would run with your privileges, your files and your network",
        expected="bubblewrap, or util-linux's unshare with user namespaces, to run trees that are not pinned "
        "releases with verified hashes", todo=f"{INSTALL_HINT}; or pass --allow-uncontained to run it anyway",
        code=ENVIRONMENT)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    record: dict  # how it runs, for receipts and check documents
    memory_cgroup: Path | None = None  # the sandbox's own memory cgroup, while the ``with`` lasts

    def oom_kills(self) -> int:
        """The processes of this sandbox the kernel's OOM killer killed so far (read inside the ``with``)."""
        return oom_kills(self.memory_cgroup)

    def killed_at_memory_limit(self, signal_number: int | None) -> bool:
        """Whether a process of the sandbox that died of ``signal_number`` was the kernel's, at the memory limit:
        SIGKILL, with an OOM kill counted in the sandbox's memory cgroup."""
        return signal_number == signal.SIGKILL and self.oom_kills() > 0

    def out_of_memory(self) -> str:
        """What a process of this sandbox that the kernel killed for memory ran into (``sandbox.out_of_memory``)."""
        return out_of_memory(self.record, killed=True, peak=memory_peak(self.memory_cgroup))

    def exited_at_memory_limit(self, returncode: int) -> bool:
        """The same, for the sandbox's own process that failed with ``returncode``: any failure, since the tool
        does not always pass its command's SIGKILL on (bubblewrap exits 137; util-linux's ``unshare`` fails to
        re-raise it and exits 1), with an OOM kill counted in the sandbox."""
        return returncode != 0 and self.oom_kills() > 0


@contextlib.contextmanager
def launch(command: list[str], view: View, env: dict[str, str], *, trusted: bool, what: str) -> Iterator[Launch]:
    """``command`` contained (or, where nothing contains it and ``admit`` lets it, as it is), for
    ``children.popen``; the sandbox's cgroups live as long as the ``with``."""
    allowed = admit(trusted, what)
    found = detect()
    env = environment(env)
    if not found.contained:
        yield Launch(command, env, found.record(allowed))
        return
    resolved = _resolve(command, view, env)
    for path in resolved.write:  # writable directories: each bound where it is
        path.mkdir(parents=True, exist_ok=True)
    with _cgroups(found) as groups, _mountpoint(found) as mountpoint:
        yield Launch(_argv(found, command, resolved, cgroup_procs=groups.procs, mountpoint=mountpoint), env,
                     found.record(), groups.memory)
