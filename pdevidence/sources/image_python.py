"""Which ``sglang`` an image's server imports: its interpreter's ``sys.path``, modelled from the image config.

The config's entrypoint and command name the interpreter (``python3 -m …``, a script whose ``#!`` names
one), else it is ``python3`` on the image's ``PATH``. Its path is what Python builds: the script's
directory, or the working directory for ``-m``, ``-c`` and a command that names no Python; then
``PYTHONPATH``; then the interpreter's site directories (a venv's by its ``pyvenv.cfg``, the user's,
the system's as Debian and python.org builds lay them out), each followed by the directories its
``.pth`` files add; an editable install's import hook comes after all of them. The first regular
package (``sglang/__init__.py``) on that path is the one imported.
"""

from __future__ import annotations

import enum
import posixpath
import re
import shlex
from dataclasses import dataclass

from . import layers

PACKAGE = "sglang"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Docker's, when the config sets none
_PYTHON = re.compile(r"python(?P<version>3(?:\.[0-9]+)?)?")
_VERSIONED = re.compile(r"python(?P<version>3\.[0-9]+)")
_WITH_VALUE = set("WXQ")  # options whose value is the next argument when not joined
_SHELLS = ("sh", "bash", "dash")
_SHELL_SYNTAX = re.compile(r"[;&|<>$`()\n]")  # more than one simple command: what it runs is not read here


class Choice(enum.Enum):
    IMPORTED = "imported"  # the first on the server's path
    ONLY = "only"  # the image's only copy; which interpreter runs the server is not told
    UNDECIDED = "undecided"  # several copies, and which one the server imports cannot be told


@dataclass(frozen=True)
class Runtime:
    """What the image config says the server runs with."""
    env: tuple[tuple[str, str], ...]  # Env, in order (a later one of a name wins)
    working_dir: str
    argv: tuple[str, ...]  # Entrypoint then Cmd

    @classmethod
    def from_config(cls, config: dict) -> Runtime:
        settings = config.get("config") if isinstance(config.get("config"), dict) else {}
        env = {}
        for item in settings.get("Env") or []:
            if isinstance(item, str) and "=" in item:
                key, _, value = item.partition("=")
                env[key] = value
        argv = [a for key in ("Entrypoint", "Cmd") if isinstance(settings.get(key), list)
                for a in settings[key] if isinstance(a, str)]
        working_dir = settings.get("WorkingDir") if isinstance(settings.get("WorkingDir"), str) else ""
        return cls(tuple(env.items()), posixpath.normpath("/" + working_dir.lstrip("/")), tuple(argv))

    def var(self, name: str, default: str = "") -> str:
        return dict(self.env).get(name, default)


@dataclass(frozen=True)
class SearchPath:
    """The server's ``sys.path`` as far as the image tells it."""
    entries: tuple[str, ...]  # directories, in order
    complete: bool  # False: only the entries before the site directories are known
    sites: tuple[str, ...]  # the interpreter's site directories (those of its editable installs' hooks)
    why: str  # how the interpreter and the first entry were told, or why they cannot be

    def describe(self) -> str:
        return f"{self.why}; sys.path {', '.join(self.entries) or '(none known)'}{'' if self.complete else ' …'}"


def _parts(path: str) -> layers.Parts:
    return tuple(p for p in path.split("/") if p not in ("", "."))


def _joined(base: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(base, path))


def _which(fs: layers.Filesystem, name: str, runtime: Runtime) -> str | None:
    """Where the image's shell would find the program ``name``: a path, or a name on its ``PATH``."""
    if "/" in name:
        candidates = [_joined(runtime.working_dir, name)]
    else:
        candidates = [_joined(d or runtime.working_dir, name)
                      for d in runtime.var("PATH", DEFAULT_PATH).split(":")]
    for candidate in candidates:
        node = fs.find(_parts(candidate), follow=True)
        if node is not None and node.kind is layers.Kind.FILE:
            return candidate
    return None


def _shebang(fs: layers.Filesystem, path: str) -> list[str] | None:
    """The program and arguments a script's ``#!`` line names; None when it is no script or was not kept."""
    node = fs.find(_parts(path), follow=True)
    data = node.data if node is not None else None
    if not data or not data.startswith(b"#!"):
        return None
    return data[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()


def _python_args(args: tuple[str, ...], runtime: Runtime) -> tuple[str, set[str]]:
    """The first ``sys.path`` entry Python's own arguments give, and the flags that change the path."""
    flags: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-" or not arg.startswith("-"):
            first = runtime.working_dir if arg == "-" else posixpath.dirname(_joined(runtime.working_dir, arg))
            return first, flags
        if arg == "--":
            i += 1
            continue
        if arg.startswith("--"):  # --version, --help: no server runs
            i += 1
            continue
        letters = arg[1:]
        for at, letter in enumerate(letters):
            if letter in "mc":
                return runtime.working_dir, flags
            if letter in _WITH_VALUE:
                i += 0 if letters[at + 1:] else 1
                break
            flags.add(letter)
        i += 1
    return runtime.working_dir, flags  # the REPL


def _command(fs: layers.Filesystem, runtime: Runtime) -> tuple[str | None, str, set[str], str]:
    """The interpreter (as named; None: the command is shell code not read here), the first path entry, the
    flags, and how they were told."""
    argv = list(runtime.argv)
    if len(argv) >= 3 and posixpath.basename(argv[0]) in _SHELLS and argv[1] == "-c":
        if _SHELL_SYNTAX.search(argv[2]):  # it may set PYTHONPATH, activate a venv, run anything
            return None, runtime.working_dir, set(), f"the image's command is shell code ({argv[2]!r}), not read here"
        argv = shlex.split(argv[2])  # a Dockerfile's shell form: `CMD python3 -m …`
        argv = argv[1:] if argv[:1] == ["exec"] else argv
    if argv and posixpath.basename(argv[0]) == "env":  # `env [NAME=value …] python3 …`
        argv = argv[1:]
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            argv = argv[1:]
    script = _which(fs, argv[0], runtime) if argv else None
    shebang = _shebang(fs, script) if script else None
    if shebang:
        program, rest = shebang[0], shebang[1:]
        if posixpath.basename(program) == "env" and rest:
            program, rest = rest[0], rest[1:]
        if _PYTHON.fullmatch(posixpath.basename(program)):
            flags = {letter for arg in rest if arg.startswith("-") for letter in arg[1:]}
            return program, posixpath.dirname(script), flags, f"the image's command {script} is a script of {program}"
    # Python itself, or after a wrapper that runs its arguments (`nvidia_entrypoint.sh python3 -m …`).
    at = next((i for i, arg in enumerate(argv) if _PYTHON.fullmatch(posixpath.basename(arg))), None)
    if at is not None:
        first, flags = _python_args(tuple(argv[at + 1:]), runtime)
        return argv[at], first, flags, f"the image's command runs {argv[at]}"
    told = f"the image's command ({shlex.join(argv)}) names no Python" if argv else "the image names no command"
    return "python3", runtime.working_dir, set(), f"{told}: python3 on its PATH, run as `python3 -m` from its " \
        "working directory"


def _config_lines(data: bytes | None) -> dict[str, str]:
    found = {}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip().lower()] = value.strip()
    return found


def _version(fs: layers.Filesystem, real: str, prefix: str, told: str | None) -> str | None:
    """The interpreter's X.Y: what its pyvenv.cfg or its file's name says, else its prefix's only lib/pythonX.Y."""
    if told and (found := re.match(r"(3\.[0-9]+)", told)):
        return found[1]
    if found := _VERSIONED.fullmatch(posixpath.basename(real)):
        return found["version"]
    lib = fs.find(_parts(f"{prefix}/lib"), follow=True)
    names = [n for n in (lib.children if lib is not None and lib.kind is layers.Kind.DIR else {})
             if _VERSIONED.fullmatch(n)]
    return _VERSIONED.fullmatch(names[0])["version"] if len(names) == 1 else None


def _system_sites(prefix: str, version: str) -> list[str]:
    """An interpreter's own site directories: python.org's and conda's, and Debian's for /usr."""
    found = [f"{prefix}/lib/python{version}/site-packages"]
    if prefix == "/usr":
        found = [f"/usr/local/lib/python{version}/dist-packages", "/usr/lib/python3/dist-packages",
                 f"/usr/lib/python{version}/dist-packages", *found]
    return found


def _sites(fs: layers.Filesystem, named: str, runtime: Runtime, flags: set[str]) -> tuple[list[str], str] | None:
    """The interpreter's site directories, in order, and what was found; None when its version cannot be told."""
    located = fs.locate(_parts(named), follow=True)
    real = "/" + "/".join(located[0]) if located else named
    bin_dir = posixpath.dirname(named)
    cfg = next((node for d in (bin_dir, posixpath.dirname(bin_dir))
                if (node := fs.find(_parts(f"{d}/pyvenv.cfg"), follow=True)) is not None), None)
    if cfg is not None:  # a venv: its own site-packages, and its base's when it says so
        venv = _config_lines(cfg.data)
        prefix = posixpath.dirname(bin_dir)
        version = _version(fs, real, prefix, venv.get("version_info") or venv.get("version"))
        if version is None:
            return None
        sites = [f"{prefix}/lib/python{version}/site-packages"]
        if venv.get("include-system-site-packages", "false").lower() == "true":
            base = posixpath.dirname(venv["home"]) if venv.get("home") else posixpath.dirname(posixpath.dirname(real))
            sites += _system_sites(base, version)
        return sites, f"{named} (a venv, {real})"
    prefix = posixpath.dirname(posixpath.dirname(real))
    version = _version(fs, real, prefix, None)
    if version is None:
        return None
    user = [] if flags & {"s", "I"} or runtime.var("PYTHONNOUSERSITE") else \
        [f"{runtime.var('HOME') or '/root'}/.local/lib/python{version}/site-packages"]
    return user + _system_sites(prefix, version), f"{named} ({real})"


def _pth_entries(fs: layers.Filesystem, site: str) -> list[str]:
    """The directories the site directory's .pth files add, in the order site.py reads them."""
    node = fs.find(_parts(site), follow=True)
    if node is None or node.kind is not layers.Kind.DIR:
        return []
    found = []
    for name in sorted(n for n in node.children if n.endswith(".pth") and not n.startswith(".")):
        for line in (node.children[name].data or b"").decode("utf-8", "replace").splitlines():
            line = line.rstrip()
            if line and not line.startswith(("#", "import ", "import\t")):
                entry = _joined(site, line)
                target = fs.find(_parts(entry), follow=True)
                if target is not None and target.kind is layers.Kind.DIR:
                    found.append(entry)
    return found


def keep(path: layers.Parts, runtime: Runtime) -> bool:
    """Whether the names pass keeps a file's content: what the path is built from, and the command's script."""
    name = path[-1]
    if name.endswith(".pth") or name == "pyvenv.cfg" or name == "direct_url.json":
        return True
    program = runtime.argv[0] if runtime.argv else None
    return program is not None and name == posixpath.basename(program)


def search_path(fs: layers.Filesystem, runtime: Runtime) -> SearchPath:
    named, first, flags, why = _command(fs, runtime)
    isolated = "I" in flags
    entries = [] if isolated or "P" in flags or runtime.var("PYTHONSAFEPATH") else [first]
    if not (isolated or "E" in flags):
        entries += [_joined(runtime.working_dir, e) for e in runtime.var("PYTHONPATH").split(":") if e]
    interpreter = _which(fs, named, runtime) if named else None
    if named is None:
        return SearchPath(tuple(entries), False, (), why)
    if interpreter is None:
        return SearchPath(tuple(entries), False, (), f"{why}; the image has no {named} there")
    found = _sites(fs, interpreter, runtime, flags)
    if found is None:
        return SearchPath(tuple(entries), False, (), f"{why}; the Python version of {interpreter} "
                          "cannot be told")
    sites, described = found
    if "S" in flags:  # no site module: no site directories at all
        sites = []
    for site in sites:
        entries += [site, *_pth_entries(fs, site)]
    return SearchPath(tuple(dict.fromkeys(entries)), True, tuple(sites), f"{why}: {described}")


def regular_package(fs: layers.Filesystem, entry: str) -> layers.Node | None:
    """The regular ``sglang`` package (with its ``__init__.py``) in a path entry; a directory without one is a
    namespace portion, which any regular package later on the path wins over."""
    node = fs.find((*_parts(entry), PACKAGE), follow=True)
    if node is None or node.kind is not layers.Kind.DIR:
        return None
    init = node.children.get("__init__.py")
    return node if init is not None and init.kind in (layers.Kind.FILE, layers.Kind.SYMLINK) else None
