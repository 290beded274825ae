"""Which era (closure and stand-ins) a tree runs in, and from what evidence.

A release or wheel runs in the era that holds its version. A source tree (``--path``,
``--git``) runs in the era of the version it tells (``version.py``) when that version is
its own: a literal in its files, or a tag it is at or near that names an SGLang release.
A tag far behind (SGLang's main is thousands of commits past its last tag on main), or one
that names no release the harness knows (a vendor's ``v1.2.0``, an old component tag), is set
aside, as is a tree that tells no version: its era is then chosen from what its
``pyproject.toml`` pins, matched against each era's compiled closure (``pins.py``):

1. torch: a closure of the same torch minor release; else the nearest newer one (newer
   torch runs older Python code), else the newest;
2. transformers among those: the same major version, then the nearest at or above it;
   where a package is not pinned, or closures are still tied, the newest closure;
3. eras sharing that closure: the one whose declared ``kernel`` range holds the tree's kernel
   pin; without one, the era with the most stand-ins (a tree that never imports them never touches
   them), then the one of the newest releases.

A tree with neither a trusted version nor pins runs in today's closure.

A version it tells is set aside for its pins, too, where its era's closure has another transformers
(major.minor) than the tree pins and the closure its pins choose has its torch and fits its transformers
better: exactly it, where the version's closure is newer; at or above it in the same major, where older.
SGLang's version file keeps the last release's number until the next bump, while a main-line commit's pins
move: a newer transformers may ship a model the tree still registers itself (Qwen2.5-VL, from 4.49, which
0.4.4.post1 and the main line after it registered), an older one may lack what the tree's pins moved for
(the main line after f8f9244a61, 0.4.4.post1 by its version file, pins transformers 4.50).

Once probed, a source tree whose probes could not run in the era chosen, while its running
``sglang.__version__`` names a release of another era, runs again in that era (``in_own_era``):
what its files told was missing or set aside, and the code itself says which release it is.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..core.paths import tree_lock_file
from ..registry import Era, Registry
from .pins import TORCH, TRANSFORMERS, TreePins, closure_pins, release
from .trees import LockFile, Tree
from .version import TreeVersion, lenient

# A fork's own work on a release is rarely a hundred commits; SGLang's main gains several hundred
# between releases, and its last tag on main (v0.5.6.post2) is thousands of commits behind it.
FAR_TAG_COMMITS = 100
TODAY = "today's closure"


class Basis(str, enum.Enum):
    VERSION = "version"  # the version the tree is, or tells of itself
    PINS = "pins"  # what its pyproject.toml pins, matched against the eras' closures
    NONE = "none"  # nothing tells it: today's closure


@dataclass(frozen=True)
class EraChoice:
    era: Era | None  # None: today's closure
    basis: Basis
    evidence: str  # what chose it, in words
    set_aside: str | None = None  # why the version the tree tells did not choose it

    @property
    def name(self) -> str | None:
        return self.era.name if self.era else None

    def to_json(self) -> dict:
        return {"basis": self.basis.value, "evidence": self.evidence, "version_set_aside": self.set_aside}

    def describe(self) -> str:
        where = self.era.name if self.era else TODAY
        how = "" if self.basis is Basis.NONE else f", chosen by its {self.basis.value}"
        aside = f"; version set aside: {self.set_aside}" if self.set_aside else ""
        return f"{where}{how}: {self.evidence}{aside}"


def choose(reg: Registry, tree: Tree) -> EraChoice:
    if tree.kind in ("release", "wheel"):
        era = reg.era_of(tree.resolved)
        return EraChoice(era, Basis.VERSION, _held(f"{tree.kind} {tree.resolved}", era))
    by_pins = match_pins(reg, tree.pins) if tree.pins else None
    told = tree.version
    aside = set_aside(reg, told) if told else None
    if told and aside is None:
        era = reg.era_of(told.version)
        behind = _pins_behind(reg, era, tree.pins, by_pins)
        if by_pins and behind:
            return EraChoice(by_pins[0], Basis.PINS, by_pins[1], f"{_held(f'version {told.version}', era)} "
                             f"({told.source}), but {behind}")
        evidence = f"{_held(f'version {told.version}', era)} ({told.source})"
        if by_pins:
            evidence += "; its pins agree" if _name(by_pins[0]) == _name(era) else \
                f"; its pins would choose {_where(by_pins[0])} ({by_pins[1]})"
        return EraChoice(era, Basis.VERSION, evidence)
    if by_pins:
        return EraChoice(by_pins[0], Basis.PINS, by_pins[1], aside)
    missing = "no pyproject.toml pin of torch, transformers or the kernel" if tree.pins is None else \
        f"its pins ({tree.pins.describe()}) match no era's closure"
    told_none = "" if told else "no version told and "
    return EraChoice(None, Basis.NONE, f"{told_none}{missing}: {TODAY}", aside)


def _pins_behind(reg: Registry, era: Era | None, pinned: TreePins | None,
                 by_pins: tuple[Era | None, str] | None) -> str | None:
    """Why the version's era does not fit ``pinned`` (the module's rule), in words; None when it may run there:
    its closure's transformers is the pin's, or no closure fits the pins better."""
    if not (pinned and by_pins and pinned.torch and pinned.transformers):
        return None
    has = closure_pins(era.constraints if era else reg.constraints)
    theirs, wanted = _minor(has.get(TRANSFORMERS)), _minor(pinned.transformers)
    chosen = closure_pins(by_pins[0].constraints if by_pins[0] else reg.constraints)
    if theirs is None or wanted is None or theirs == wanted or _minor(chosen.get(TORCH)) != _minor(pinned.torch):
        return None
    if theirs > wanted and _minor(chosen.get(TRANSFORMERS)) == wanted:
        return (f"its closure has transformers {has[TRANSFORMERS]}, newer than the tree's pin {pinned.transformers}, "
                f"and {_where(by_pins[0])} has its torch and transformers")
    # Only within a major: across one (a 0.5.8 tree pinning transformers 5) the version keeps choosing.
    if theirs < wanted <= (_minor(chosen.get(TRANSFORMERS)) or ()) and theirs[0] == wanted[0]:
        return (f"its closure has transformers {has[TRANSFORMERS]}, older than the tree's pin {pinned.transformers}, "
                f"and {_where(by_pins[0])} has its torch and a transformers at or above it")
    return None


def _minor(version: str | None) -> tuple[int, ...] | None:
    found = release(version)
    return found.release[:2] if found else None


def in_own_era(reg: Registry, tree: Tree, said: str | None) -> Tree | None:
    """``tree`` as its own ``sglang.__version__`` (``said``) tells it, when that is a release (not a build's
    ``0.0.0.dev0`` fallback) of another era than the one chosen for it; None otherwise. Only for a source tree
    whose probes could not run in the era chosen (the caller's to know): the version then chooses."""
    if tree.kind not in ("path", "git") or not said:
        return None
    found = lenient(said)
    if found is None or Version(found[0]).is_devrelease or not _known_release(reg, found[0]):
        return None
    chosen = choose(reg, tree)
    if _name(reg.era_of(found[0])) == chosen.name:
        return None
    source = f"sglang.__version__, as the probes could not run in {_where(chosen.era)}"
    return dataclasses.replace(tree, version=TreeVersion(found[0], found[1], source, said))


def set_aside(reg: Registry, told: TreeVersion) -> str | None:
    """Why a version read from a tag does not choose the era; None when it does (a version a tree states in
    its files always does)."""
    commits = told.commits_past_tag
    if commits is None:
        return None
    if commits > FAR_TAG_COMMITS:
        return (f"its nearest version tag {told.tag} is {commits} commits behind (over {FAR_TAG_COMMITS}): "
                "the code has moved on from that release")
    if not _known_release(reg, told.version):
        return (f"its tag {told.tag} names no SGLang release the harness knows ({told.version} is in no era "
                f"and not pinned in {tree_lock_file(reg.root).relative_to(reg.root)})")
    return None


def _known_release(reg: Registry, version: str) -> bool:
    if reg.era_of(version) is not None:
        return True
    try:
        wanted = Version(version)
    except InvalidVersion:
        return False
    return any(Version(key.partition("==")[2]) == wanted
               for key in LockFile(tree_lock_file(reg.root)).pinned_keys("sglang"))


def match_pins(reg: Registry, pins: TreePins) -> tuple[Era | None, str] | None:
    """The era whose closure fits ``pins`` best (the module's rules), and why; None when no closure can tell."""
    holders: dict[Path, list[Era | None]] = {}
    for era in [*reg.eras.values(), None]:
        holders.setdefault(era.constraints if era else reg.constraints, []).append(era)
    closures = {path: closure_pins(path) for path in holders}
    closures = {path: found for path, found in closures.items() if found.get(TORCH) or found.get(TRANSFORMERS)}
    if not closures or not (pins.torch or pins.transformers):
        return None
    candidates, why_torch = _nearest(closures, TORCH, pins.torch, same_major_only=False)
    candidates, why_tf = _nearest(candidates, TRANSFORMERS, pins.transformers, same_major_only=True)
    path = max(candidates, key=lambda p: (release(candidates[p].get(TORCH)) or Version("0"),
                                          release(candidates[p].get(TRANSFORMERS)) or Version("0")))
    def rank(p: Path) -> tuple[Version, Version]:
        found = candidates[p]
        return release(found.get(TORCH)) or Version("0"), release(found.get(TRANSFORMERS)) or Version("0")

    tied = sum(rank(p) == rank(path) for p in candidates) > 1  # max() kept the first: the registry's order
    why_newest = ("the first declared of the closures left, which have the same torch and transformers" if tied
                  else "the newest of the closures left" if len(candidates) > 1 else "")
    era, why_kernel = _by_kernel(holders[path], pins)
    found = closures[path]
    has = ", ".join(f"{name} {found[name]}" for name in (TORCH, TRANSFORMERS) if found.get(name))
    reasons = "; ".join(why for why in (why_torch, why_tf, why_newest, why_kernel) if why)
    return era, f"{pins.source} pins {pins.describe()}; {_where(era)} has {has} ({reasons})"


def _nearest(closures: dict[Path, dict[str, str]], package: str, pinned: str | None, *,
             same_major_only: bool) -> tuple[dict[Path, dict[str, str]], str]:
    """The closures nearest to ``pinned`` for ``package``: the same minor release, else (keeping the same major
    where ``same_major_only``) the nearest newer, else the newest. All of them when nothing tells them apart
    (no pin): the newest of those is taken last (``match_pins``)."""
    have = {path: release(found.get(package)) for path, found in closures.items()}
    have = {path: version for path, version in have.items() if version is not None}
    wanted = release(pinned)
    if len(closures) == 1 or not have:
        return closures, ""
    if wanted is None:
        return closures, f"no {package} pin"
    minor = wanted.release[:2]
    same = {p for p, v in have.items() if v.release[:2] == minor}
    if same:  # in the registry's order (not the set's, which varies by process): ties go to the first declared
        return {p: found for p, found in closures.items() if p in same}, \
            f"the same {package} {'.'.join(map(str, minor))}"
    pool = {p: v for p, v in have.items() if v.major == wanted.major} if same_major_only else have
    pool = pool or have
    newer = {p: v for p, v in pool.items() if v > wanted}
    pick = min(newer.values()) if newer else max(pool.values())
    how = "the nearest newer" if newer else "the newest"
    return ({p: closures[p] for p, v in pool.items() if v == pick},
            f"no closure has {package} {minor[0]}.{minor[1]}: {how}, {pick}")


def _by_kernel(eras: list[Era | None], pins: TreePins) -> tuple[Era | None, str]:
    """One of the eras sharing a closure: the one whose kernel range holds the kernel pin, else one with stand-ins."""
    if len(eras) == 1:
        return eras[0], ""
    kernel = release(pins.kernel)

    def holds(era: Era | None) -> bool:
        return bool(era and era.kernel and kernel and era.kernel.contains(kernel, prereleases=True))

    pick = max(eras, key=lambda e: (holds(e), len(e.stand_ins) if e else 0, _newest(e), _name(e) or ""))
    names = ", ".join(_where(e) for e in eras)
    if holds(pick):
        return pick, (f"{names} share it; {pins.kernel_package} {pins.kernel} is in {pick.name}'s kernel range "
                      f"{pick.kernel}")
    return pick, f"{names} share it and no kernel range holds the kernel pin: the one with the most stand-ins, " \
                 "then of the newest releases"


def _newest(era: Era | None) -> tuple[int, Version]:
    """How new an era's releases reach: its upper bound (today's closure and an open range reach furthest)."""
    if era and era.releases is None:
        return (0, Version("0"))
    bounds = [Version(s.version) for s in era.releases if s.operator in ("<", "<=")] if era else []
    return (0, max(bounds)) if bounds else (1, Version("0"))


def _name(era: Era | None) -> str | None:
    return era.name if era else None


def _where(era: Era | None) -> str:
    return f"era {era.name}'s closure" if era else TODAY


def _held(what: str, era: Era | None) -> str:
    return f"{what} is in era {era.name} ({era.releases})" if era else f"{what} is in no era: {TODAY}"
