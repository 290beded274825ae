"""`pdevidence cache`: what the caches hold, and getting the space back (`info`, `prune`, `clean`).

Two roots: the user's cache (``paths.cache_dir``: environments, wheels, trees, images) and the work directory
(``paths.work_dir``: a checkout's ``.cells/``, the installed tool's ``work/`` in the cache; drift environments,
kept outcomes, logs). Each root holds entries of known kinds; whatever else is there (locks, the tree lock's first
sightings, the directories themselves) is counted as ``other`` and never removed: a run waiting on a lock keeps it.

Sizes are disk usage, as ``du`` counts it: each inode once (a cell's environment is a hard-linked copy of its era's
closure environment: those bytes count with the era's), the era environments counted first.

Removal is safe beside running runs: an entry a run uses is held (an environment's ``IN_USE`` lock, core/debris.py;
any other's marker, core/inuse.py) and stays; one that is not
is renamed out of the way under its lock, then removed: a run sees it whole or not at all, and what a prune killed
half-way leaves carries its run's token (``core/debris.py``), so the next run removes it. A kind no run marks
(logs, the corpus's trees) goes only while no other run is in its root.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import environments
from ..core import debris, faults, inuse, paths, settings
from ..core.errors import CONFIRMED
from ..core.files import dumps
from ..core.locking import try_lock
from ..core.files import sha256_file
from ..registry import Registry

# What killed runs may leave under a name of their own, in every directory of the roots: core/debris removes
# these when no other run is in the root (what carries a run's token goes as soon as its run is dead);
# .probing-*: as runs named them before tokens.
LEFTOVERS = (".*.tmp", ".*.part", ".*.unpack", ".*.extract", ".*.export", ".*.partial", ".*.old", ".probing.*",
             ".probing-*", ".*.scan", ".incoming.*", ".*.incoming", ".*.pruned")
OLD_BYTECODE = "pycache"  # where an installed copy kept its bytecode (PYTHONPYCACHEPREFIX) before it moved beside
PRUNED = "pruned"
# An environment's name ends with its key's first 12 hex digits (environments.environment_path); one without was
# named by a pdevidence before that, and no run looks for it.
KEYED = re.compile(r".*\.[0-9a-f]{12}")
UNKEYED = "named without its key, as an older pdevidence named it: no run uses it"


class Verb(str, enum.Enum):
    INFO = "info"
    PRUNE = "prune"
    CLEAN = "clean"


class Kind(str, enum.Enum):
    ERA_ENVIRONMENT = "era environment"
    TREE_ENVIRONMENT = "tree environment"
    WHEEL = "wheel"
    ARCHIVE = "source archive"
    UNPACKED = "unpacked tree"
    EXPORTED = "exported commit"
    IMAGE = "image packages"
    OUTCOME = "kept outcome"
    CORPUS = "corpus tree"
    LOG = "log"
    OLD_BYTECODE = "old bytecode"
    OTHER = "other"


# What each kind is for, in the words `cache info` prints.
PURPOSE = {
    Kind.ERA_ENVIRONMENT: "an era's closure (torch and the rest) without SGLang: the warm engine's, and every "
                          "cell's seed (hard links)",
    Kind.TREE_ENVIRONMENT: "a release installed in its era's closure (a cell's, an upstream or drift lane's)",
    Kind.WHEEL: "downloaded SGLang wheels, by SHA-256",
    Kind.ARCHIVE: "downloaded GitHub archives of pinned commits, by SHA-256",
    Kind.UNPACKED: "wheels unpacked and compiled, for the warm engine",
    Kind.EXPORTED: "commits exported from a clone (what the probes read: commit-<sha>, files shared with "
                   "neighbours as hard links) or an archive (git-<sha>), compiled in place",
    Kind.IMAGE: "the SGLang packages read out of container images",
    Kind.OUTCOME: "probe outcomes kept by what made them (a rerun with the same inputs reuses them)",
    Kind.CORPUS: "releases with a backport applied (the corpus lane)",
    Kind.LOG: "logs of cells, engines and lanes",
    Kind.OLD_BYTECODE: "bytecode an older pdevidence kept apart from its sources: nothing reads it",
    Kind.OTHER: "locks, first sightings of unpinned trees, the directories themselves: kept",
}
# Kinds a run holds as it uses them: removable beside running runs. An environment holds its own lock (core/debris
# ``use``, which also records its last use); the others a marker each (core/inuse.py).
ENVIRONMENTS = {Kind.ERA_ENVIRONMENT, Kind.TREE_ENVIRONMENT}
MARKED = {Kind.WHEEL, Kind.ARCHIVE, Kind.UNPACKED, Kind.EXPORTED, Kind.IMAGE, Kind.OUTCOME}
# Over a size, what is cheapest to make again goes first (each kind least recently used first): a commit's export
# (a second, from the clone), an unpacked wheel, a corpus tree, a log (small), an image's packages, a download, a kept
# outcome (a probe run), then the environments (minutes each), an era's last: every cell's is seeded from it.
REMAKE_ORDER = (Kind.OLD_BYTECODE, Kind.EXPORTED, Kind.UNPACKED, Kind.CORPUS, Kind.LOG, Kind.IMAGE, Kind.ARCHIVE,
                Kind.WHEEL, Kind.OUTCOME, Kind.TREE_ENVIRONMENT, Kind.ERA_ENVIRONMENT)
BUDGET = "PDEVIDENCE_CACHE_BUDGET"
# What a run needs here, as `cache info` counts it (the environments' files linked from uv's cache included), from
# the measurements in docs/operators/cache.md: said beside the budget, so that one can be set to hold them.
NEEDS = (
    ("a full release sweep", "about 44 GB: every era's environment (eight closures) and its releases' trees"),
    ("a bisection", "about 6 GB for each era its commits run in, about 90 MB for its first exported commit and about "
                    "10 MB for each further one (unchanged files are linked from the exports before it)"),
    ("the tests (--sglang)", "about 15 GB: the bracket releases' three eras (two closures, torch 2.11 and 2.14 "
                             "with their CUDA libraries, about 11 GB) and their trees"),
    ("the scheduled tests (--scheduled)", "about 39 GB: every era the real tests run"),
)


@dataclass
class Entry:
    kind: Kind
    path: Path
    root: Path
    bytes: int = 0
    last_used: float | None = None
    usable: bool = True  # False: nothing the current registry declares can use it
    note: str = ""
    companions: tuple[Path, ...] = ()  # files that go with it (an era environment's preload list)

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "path": str(self.path), "bytes": self.bytes,
                "last_used": _iso(self.last_used), "usable": self.usable, "note": self.note}


@dataclass
class Inventory:
    roots: list[Path]
    entries: list[Entry] = field(default_factory=list)
    other: int = 0  # bytes of what no entry holds

    @property
    def total(self) -> int:
        return self.other + sum(e.bytes for e in self.entries)

    def by_kind(self) -> dict[Kind, list[Entry]]:
        found: dict[Kind, list[Entry]] = {}
        for entry in self.entries:
            found.setdefault(entry.kind, []).append(entry)
        return found


def roots(reg: Registry) -> list[Path]:
    """The user's cache, and the work directory where it is not inside it."""
    cache, work = paths.cache_dir(), paths.work_dir(reg.root)
    inside = os.path.commonpath([os.path.abspath(cache), os.path.abspath(work)]) == os.path.abspath(cache)
    return [cache] if inside else [cache, work]


def places(cache: Path, work: Path) -> dict[Path, list[debris.Place]]:
    """Where killed runs may leave something, per scratch root (core/debris sweeps them as a run enters)."""
    return {
        cache: [*(debris.Place(cache / d, LEFTOVERS)
                  for d in ("", "wheels", "archives", "unpacked", "trees", "images")),
                debris.Place(cache / "envs", LEFTOVERS, environments.ENV_INFO)],  # an environment is built in place
        work: [*(debris.Place(work / d, LEFTOVERS) for d in ("", "outcomes", "corpus")),
               debris.Place(work / "envs", LEFTOVERS, environments.ENV_INFO)],
    }


def remove_old_bytecode(cache: Path) -> None:
    """The bytecode directory an older installed copy kept in the cache: nothing reads it since its bytecode went
    beside the sources. Renamed away first, so that a run killed while removing it leaves debris, not a tree."""
    old = cache / OLD_BYTECODE
    if old.is_dir():
        _remove(old, cache)


# --- what is there -----------------------------------------------------------------------------


def inventory(reg: Registry) -> Inventory:
    """Every entry of both roots with its size (each inode once, era environments first) and last use."""
    found = Inventory(roots(reg))
    cache, work = paths.cache_dir(), paths.work_dir(reg.root)
    eras = _closures(reg)
    found.entries = [*_cache_entries(cache, eras), *_work_entries(work)]
    seen: set[tuple[int, int]] = set()
    for entry in found.entries:
        entry.bytes = sum(_usage(p, seen) for p in (entry.path, *entry.companions))
        entry.last_used = _last_used(entry)
    found.other = sum(_usage(root, seen) for root in found.roots)
    return found


def _last_used(entry: Entry) -> float | None:
    """When a run last used ``entry``: an environment's ``IN_USE`` file's time, any other's marker's."""
    if entry.kind in ENVIRONMENTS:
        for path in (entry.path / debris.IN_USE, entry.path):
            with contextlib.suppress(OSError):
                return path.stat().st_mtime
    return inuse.last_used(entry.path)


def _closures(reg: Registry) -> dict[str, str]:
    """The first 12 hex digits of each closure the registry declares (its name in an environment's), and which
    eras it is."""
    named: dict[str, list[str]] = {}
    today = [reg.constraints, *([reg.constraints_cpu] if reg.constraints_cpu else [])]
    for path, name in [*((p, "today's") for p in today), *((e.constraints, e.name) for e in reg.eras.values())]:
        if path.is_file():
            named.setdefault(sha256_file(path)[:12], []).append(f"{name} ({_relative(path, reg.root)})")
    return {digest: ", ".join(names) for digest, names in named.items()}


def _notes(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def _cache_entries(cache: Path, eras: dict[str, str]) -> Iterator[Entry]:
    envs = cache / "envs"
    for env in _children(envs, directories=True):  # era environments first: their hard links count with them
        if env.name.startswith("closure."):
            closure = env.name.split(".")[1]
            preload = env.with_name(f"{env.name}.preload.json")
            keyed = bool(KEYED.fullmatch(env.name))
            yield Entry(Kind.ERA_ENVIRONMENT, env, cache, usable=closure in eras and keyed,
                        note=_notes(f"closure {closure}: " + eras.get(closure, "no era of the registry declares it"),
                                    "" if keyed else UNKEYED),
                        companions=(preload,) if preload.exists() else ())
    for env in _children(envs, directories=True):
        if env.name.startswith("tree."):
            closure = env.name.split(".closure.", 1)[-1].split(".")[0]
            release = env.name.startswith("tree.release-")  # a source tree is never installed (UNBUILT)
            keyed = bool(KEYED.fullmatch(env.name))
            yield Entry(Kind.TREE_ENVIRONMENT, env, cache, usable=release and closure in eras and keyed,
                        note=_notes("" if release else "a source tree's: source trees are no longer installed",
                                    "" if keyed else UNKEYED))
    kinds = ((Kind.WHEEL, "wheels"), (Kind.ARCHIVE, "archives"), (Kind.UNPACKED, "unpacked"),
             (Kind.EXPORTED, "trees"), (Kind.IMAGE, "images"))
    for kind, directory in kinds:
        for path in _children(cache / directory):
            yield Entry(kind, path, cache)
    if (cache / OLD_BYTECODE).is_dir():
        yield Entry(Kind.OLD_BYTECODE, cache / OLD_BYTECODE, cache, usable=False)


def _work_entries(work: Path) -> Iterator[Entry]:
    for env in _children(work / "envs", directories=True):
        yield Entry(Kind.TREE_ENVIRONMENT, env, work, note="this checkout's own pins (the drift lane)")
    for path in _children(work / "outcomes"):
        yield Entry(Kind.OUTCOME, path, work)
    for path in _children(work / "corpus"):
        yield Entry(Kind.CORPUS, path, work)
    for path in _children(work / "logs"):
        # A kind of run's log directories (logs/check/<run>), or one log file.
        runs = path.is_dir() and all(p.is_dir() for p in _children(path))
        for log in (_children(path) if runs else [path]):
            yield Entry(Kind.LOG, log, work)


def _children(directory: Path, *, directories: bool = False) -> list[Path]:
    """What ``directory`` holds but hidden names (locks, markers, a run's temporaries), in name order."""
    try:
        found = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    except OSError:
        return []
    return [p for p in found if p.is_dir() and not p.is_symlink()] if directories else found


def _usage(top: Path, seen: set[tuple[int, int]]) -> int:
    """Disk usage of ``top`` and all under it, as ``du`` counts it: each inode once (``seen``), symlinks not
    followed."""
    total = 0
    stack = [str(top)]
    while stack:
        path = stack.pop()
        try:
            found = os.lstat(path)
        except OSError:  # gone meanwhile (a run's temporary)
            continue
        if (found.st_dev, found.st_ino) not in seen:
            seen.add((found.st_dev, found.st_ino))
            total += found.st_blocks * 512
        if os.path.isdir(path) and not os.path.islink(path):
            try:
                stack.extend(os.path.join(path, name) for name in os.listdir(path))
            except OSError:
                continue
    return total


# --- getting space back ------------------------------------------------------------------------


@dataclass
class Pruned:
    removed: list[Entry] = field(default_factory=list)
    in_use: list[Entry] = field(default_factory=list)  # would have gone, but a run uses it
    before: int = 0
    after: int = 0

    @property
    def freed(self) -> int:
        return sum(e.bytes for e in self.removed)


def prune(reg: Registry, *, older_than: float | None = None, max_size: int | None = None,
          everything: bool = False, unusable: bool = True) -> Pruned:
    """Remove what nothing the registry declares can use (unless not ``unusable``); with ``older_than`` (seconds),
    what no run used for that long; with ``max_size`` (bytes), what is cheapest to remake until both roots fit
    (``REMAKE_ORDER``, least recently used first within a kind); ``everything``: every entry. What a running run
    uses stays (``Pruned.in_use``)."""
    found = inventory(reg)
    now = time.time()
    candidates = [e for e in found.entries if e.kind is not Kind.OTHER]
    chosen = [e for e in candidates if everything or (unusable and not e.usable)
              or (older_than is not None and (e.last_used or 0) < now - older_than)]
    result = Pruned(before=found.total)
    for entry in chosen:
        _prune_one(entry, result)
    if max_size is not None:
        size = found.total - result.freed
        for entry in sorted((e for e in candidates if e not in chosen),
                            key=lambda e: (REMAKE_ORDER.index(e.kind), e.last_used or 0)):
            if size <= max_size:
                break
            if _prune_one(entry, result):
                size -= entry.bytes
    result.after = found.total - result.freed
    for root in found.roots:
        _forget_gone(root)
    return result


def growth(root: Path) -> dict[str, int | None]:
    """When each directory that large entries are added to last changed (its entries' names, not their contents):
    the same at a run's end as at its start, the run added none, and measuring the cache (a walk of every file of
    every environment, seconds to a minute) is not needed."""
    cache, work = paths.cache_dir(), paths.work_dir(root)
    found = {}
    for directory in [*(cache / d for d in ("envs", "wheels", "archives", "unpacked", "trees", "images")),
                      work / "envs", work / "corpus"]:
        try:
            found[str(directory)] = directory.stat().st_mtime_ns
        except OSError:
            found[str(directory)] = None
    return found


def keep_within_budget(reg: Registry, log, since: dict[str, int | None] | None = None) -> Pruned | None:
    """At the end of a run that filled the cache: over ``PDEVIDENCE_CACHE_BUDGET``, what is cheapest to remake goes
    until it fits (what this or another running run holds stays). Nothing else goes: an entry another checkout's
    registry uses is not this run's to call unusable. ``since``: ``growth`` at the run's start (unchanged: not
    measured). None when there is no budget, nothing was added, or the cache is within it."""
    budget = settings.get(BUDGET)
    if budget is None or (since is not None and growth(reg.root) == since):
        return None
    result = prune(reg, max_size=budget, unusable=False)
    if not result.removed and result.after <= budget:
        return None
    log(f"the cache was over its budget of {size(budget)} ({BUDGET}): {summary(result)}")
    if result.after > budget:
        log(f"still {size(result.after)}: what is over the budget is held by running runs, or is what no prune "
            f"removes (locks); raise {BUDGET} if a run needs more (`pdevidence cache info` says what each needs)")
    return result


def drop_exports(shas: list[str]) -> Pruned:
    """Remove the exports of these commits (slim and whole), as a prune would: what a running run holds stays. For
    measuring a bisection whose commits are exported afresh (benchmarks/bench_bisect.py)."""
    cache = paths.cache_dir()
    result = Pruned()
    for sha in shas:
        for name in (f"commit-{sha}", f"git-{sha}"):
            if (cache / "trees" / name).exists():
                _prune_one(Entry(Kind.EXPORTED, cache / "trees" / name, cache), result)
    return result


def _forget_gone(root: Path) -> None:
    """The use markers of entries that are gone (removed by a run: a download that failed its check, say)."""
    for marker in (root / inuse.MARKERS).glob("*/*"):
        entry = root / marker.parent.name / marker.name
        if not os.path.lexists(entry):
            with inuse.unused(entry):  # a free marker of a missing entry goes with the block
                pass


def _prune_one(entry: Entry, result: Pruned) -> bool:
    with _unused(entry) as free:
        aside = _aside(entry.path, entry.root, *entry.companions) if free else []
    _delete(aside)  # out of its name: no run can find it, whoever holds what
    (result.removed if free else result.in_use).append(entry)
    return free


@contextlib.contextmanager
def _unused(entry: Entry) -> Iterator[bool]:
    """Whether no run uses ``entry``; while True, none can start to, until it is renamed away in the block."""
    if entry.kind in ENVIRONMENTS:
        with _not_building(entry.path) as idle, debris.unused(entry.path) as unused:
            yield idle and unused
    elif entry.kind in MARKED:
        with inuse.unused(entry.path) as free:
            yield free
    else:  # no run marks it: no run but this one may be in its root, nor enter it before it is gone
        with debris.alone(entry.root) as free:
            yield free


@contextlib.contextmanager
def _not_building(env: Path) -> Iterator[bool]:
    """Whether no run is building ``env``; while True, none can start to (its build lock held, as ``ensure`` takes
    it)."""
    fd = os.open(env.parent / f".{env.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        yield try_lock(fd)
    finally:
        os.close(fd)


def _remove(path: Path, root: Path, *companions: Path) -> None:
    _delete(_aside(path, root, *companions))


def _aside(path: Path, root: Path, *companions: Path) -> list[Path]:
    """Renamed to names of this run's (core/debris) at the top of its root: a run looking for it finds it whole or
    missing; what a prune killed after this leaves, the next run's sweep removes. Where each went."""
    aside = []
    for each in (path, *companions):
        name = f"{debris.prefix(root, each.name)}{os.getpid()}.{PRUNED}"
        try:
            os.rename(each, root / name)
        except FileNotFoundError:
            continue
        aside.append(root / name)
    return aside


def _delete(aside: list[Path]) -> None:
    faults.point("prune")
    for each in aside:
        if each.is_dir() and not each.is_symlink():
            shutil.rmtree(each, ignore_errors=True)
        else:
            each.unlink(missing_ok=True)


# --- in words ----------------------------------------------------------------------------------


def size(value: int) -> str:
    """A size as ``du -h`` writes it (binary units)."""
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError(value)


def _iso(when: float | None) -> str | None:
    return None if when is None else datetime.datetime.fromtimestamp(when).isoformat(timespec="seconds")


def _when(when: float | None) -> str:
    return "-" if when is None else datetime.datetime.fromtimestamp(when).strftime("%Y-%m-%d %H:%M")


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def budget_text(found: Inventory) -> list[str]:
    """The budget, how full it is, and what each kind of run needs."""
    budget = settings.get(BUDGET)
    said = (f"budget: none ({BUDGET}=off)" if budget is None else
            f"budget: {size(budget)} ({BUDGET}; {size(found.total)} used, {found.total * 100 // budget}%): at the "
            "end of a run that fills the cache, what is cheapest to remake goes first until it fits")
    return [said, *(f"  {run} needs {need}" for run, need in NEEDS)]


def describe(found: Inventory) -> str:
    """`cache info`: where each root is, the budget and what runs need, every kind with its size and last use, then
    every entry."""
    lines = [f"{root}: {'the user cache' if i == 0 else 'the work directory'}" for i, root in enumerate(found.roots)]
    lines += ["", *budget_text(found)]
    kinds = found.by_kind()
    lines += ["", f"{'kind':<18} {'entries':>7} {'size':>10}  last used"]
    for kind, entries in kinds.items():
        newest = max((e.last_used for e in entries if e.last_used), default=None)
        lines.append(f"{kind.value:<18} {len(entries):>7} {size(sum(e.bytes for e in entries)):>10}  {_when(newest)}")
    lines.append(f"{Kind.OTHER.value:<18} {'':>7} {size(found.other):>10}")
    lines.append(f"{'total':<18} {'':>7} {size(found.total):>10}  (hard-linked bytes once, as du counts them)")
    for kind, entries in kinds.items():
        lines += ["", f"{kind.value} ({len(entries)}): {PURPOSE[kind]}"]  # a kind's name, not a plural of it
        for entry in entries:
            flag = "" if entry.usable else "  [unusable: `cache prune` removes it]"
            note = f"  {entry.note}" if entry.note else ""
            lines.append(f"  {size(entry.bytes):>10}  {_when(entry.last_used)}  {entry.path}{note}{flag}")
    lines += ["", "shrink it: `pdevidence cache prune --older-than 30d` (or `--max-size 20G`); `pdevidence cache "
              "clean` removes every entry; uv's own cache (`uv cache dir`) shrinks with `uv cache prune`"]
    return "\n".join(lines)


def document(found: Inventory) -> dict:
    """`cache info --json`."""
    return {"roots": [str(r) for r in found.roots], "total_bytes": found.total, "other_bytes": found.other,
            "budget_bytes": settings.get(BUDGET), "needs": dict(NEEDS),
            "kinds": {k.value: {"entries": len(v), "bytes": sum(e.bytes for e in v), "purpose": PURPOSE[k]}
                      for k, v in found.by_kind().items()},
            "entries": [e.to_json() for e in found.entries]}


def summary(result: Pruned) -> str:
    lines = [f"removed {len(result.removed)} entr{'y' if len(result.removed) == 1 else 'ies'}, "
             f"{size(result.freed)} freed: {size(result.before)} -> {size(result.after)}"]
    if result.in_use:
        lines.append(f"kept {len(result.in_use)} in use by a running run (they go once it ends): "
                     + ", ".join(str(e.path) for e in result.in_use))
    return "\n".join(lines)


def command(reg: Registry, verb: Verb, *, as_json: bool = False, older_than: float | None = None,
            max_size: int | None = None) -> int:
    """`pdevidence cache info|prune|clean`; exit 0 (what a running run keeps is said, not an error)."""
    if verb is Verb.INFO:
        found = inventory(reg)
        print(dumps(document(found)), end="") if as_json else print(describe(found))
    else:
        print(summary(prune(reg, older_than=older_than, max_size=max_size, everything=verb is Verb.CLEAN)))
    return CONFIRMED
