"""The declarative registry: experiments, pins, brackets, expected differentials, mutants.

Everything the harness knows about an experiment comes from ``experiments.toml``;
this module only reads and validates it. Validation is strict: every table, key
and type is checked, and an unknown key is named with its path and the nearest
valid name, so a typo fails loudly instead of changing what runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .core.arguments import SERVER_PLATFORMS
from .core.errors import usage

SIDES = ("base", "head")
REGISTRY_FILE = "experiments.toml"
SCHEMA = 1
_SHA = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SCENARIO = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
Scalar = (bool, int, str)


class TorchChannel(str, enum.Enum):
    """Where a cell's torch comes from: PyPI's (CUDA) build, or the PyTorch CPU index."""

    PYPI = "pypi"
    CPU = "cpu"


class MutantKind(str, enum.Enum):
    REMOVES_FIX = "removes-fix"  # the probe must then report pre-fix behaviour
    OVER_BROAD = "over-broad"  # a control must catch it
    LEAKS = "leaks"  # right on the keys that change, wrong on one base and head agree on: that key must catch it


class Operator(str, enum.Enum):
    CONSTANT = "constant"  # the target returns ``value``
    NOOP = "noop"  # the target does nothing and returns None
    SWAP = "swap"  # the target is replaced by ``replacement``
    EDIT = "edit"  # ``old`` -> ``new`` in the target function's source


@dataclass(frozen=True)
class Beside:
    """Keys a control's scenario observes beside what it controls, which base and head see differently by design
    (the fix's own change in a room next to the controlled one; a fact of the tree, such as whether it defines a
    variable), and why. The narrative then tells the control as held, and these keys as declared."""

    keys: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Expectation:
    """What one scenario must show: a change from base to head, or a control."""

    scenario: str
    changes: bool
    base: dict[str, Any]
    head: dict[str, Any]
    beside: Beside | None = None  # a control only


@dataclass(frozen=True)
class Mutant:
    """One deliberate break of a fix, applied in the probe process on the installed tree."""

    id: str
    title: str
    kind: MutantKind
    target: str  # "sglang.module:Qualname.attr"
    operator: Operator
    value: Any = None  # constant
    replacement: str | None = None  # swap: "module:qualname"
    old: str | None = None  # edit
    new: str | None = None  # edit
    count: int = 1  # edit: how many occurrences of ``old`` to replace

    def spec(self) -> dict[str, Any]:
        """The JSON a probe process gets: plain values only."""
        return {"id": self.id, "title": self.title, "kind": self.kind.value, "target": self.target,
                "operator": self.operator.value, "value": self.value, "replacement": self.replacement,
                "old": self.old, "new": self.new, "count": self.count}


class Justification(str, enum.Enum):
    """Why a tree is not affected, in OpenVEX's words (v0.2.0 status justifications)."""

    CODE_NOT_PRESENT = "vulnerable_code_not_present"
    NOT_IN_EXECUTE_PATH = "vulnerable_code_not_in_execute_path"


@dataclass(frozen=True)
class Reading:
    """A rule read on one result document: ``matched`` when what it reads was observed as it wants; ``raised``,
    the scenarios it rests on that raised. An observation from a scenario that did not run to its end is no
    evidence: a rule matched there is refused (it holds nowhere, and the answer cannot be an all-clear)."""

    matched: bool
    raised: tuple[str, ...] = ()

    @property
    def holds(self) -> bool:
        return self.matched and not self.raised

    @property
    def refused(self) -> bool:
        return self.matched and bool(self.raised)


def _scenario(doc: dict, sid: str) -> dict | None:
    return (doc.get("scenarios") or {}).get(sid)


def _raised(doc: dict, sids) -> tuple[str, ...]:
    return tuple(sid for sid in dict.fromkeys(sids) if (_scenario(doc, sid) or {}).get("error") is not None)


def _observed_as(doc: dict, sid: str, key: str, wanted: Any) -> bool:
    """``sid`` recorded ``key`` as ``wanted``: a key it never recorded is no value at all, never null."""
    observed = (_scenario(doc, sid) or {}).get("observed") or {}
    return key in observed and _same(observed[key], wanted)


@dataclass(frozen=True)
class NotAffected:
    """An observation that shows the vulnerable path does not exist on a tree.

    It holds when scenario ``scenario`` ran to its end without error and observed ``key`` = ``value`` (e.g.
    ``"absent"``: the function the fix guards is not in the tree). ``why`` is what a reader is told.
    """

    id: str
    scenario: str
    key: str
    value: Any
    justification: Justification
    why: str

    def read(self, doc: dict) -> Reading:
        return Reading(_observed_as(doc, self.scenario, self.key, self.value), _raised(doc, [self.scenario]))

    def holds(self, doc: dict) -> bool:
        return self.read(doc).holds


def _same(value: Any, wanted: Any) -> bool:
    # Typed: True is not 1, as everywhere observations are compared.
    return type(value) is type(wanted) and value == wanted


@dataclass(frozen=True)
class NotDeciding:
    """Keys that do not decide on a tree where ``when`` holds: telling keys that do not tell base
    from head there, or control keys whose departure from both does not show an over-broad fix.

    They differ there for a reason the fix does not decide (how the tree's intake marks a
    rejection, a path or a flag it does not have). ``when`` maps ``"adaptation"`` to an adaptation
    the probe ran, or ``"<scenario>.<key>"`` to an observed value; empty, it holds on every tree.
    ``keys`` maps a scenario (changing or control) to the keys that do not decide there, or to
    None: none do.

    It rests on the scenarios ``when`` reads, and for an adaptation (the result names it for the whole
    run, not per scenario) on the scenarios whose keys it sets aside: it holds only where those ran clean.
    """

    id: str
    when: dict[str, Any]
    keys: dict[str, tuple[str, ...] | None]
    why: str

    def rests_on(self) -> tuple[str, ...]:
        sids = [name.split(".", 1)[0] for name in self.when if name != "adaptation"]
        if "adaptation" in self.when:
            sids += list(self.keys)
        return tuple(dict.fromkeys(sids))

    def read(self, doc: dict) -> Reading:
        for name, wanted in self.when.items():
            if name == "adaptation":
                matched = wanted in (doc.get("adaptations") or ())
            else:
                sid, key = name.split(".", 1)
                matched = _observed_as(doc, sid, key, wanted)
            if not matched:
                return Reading(False)
        return Reading(True, _raised(doc, self.rests_on()))

    def holds(self, doc: dict) -> bool:
        return self.read(doc).holds


@dataclass(frozen=True)
class Needs:
    """The server configuration a fix's code path needs: the attributes of the tree's own ``ServerArgs`` (as its
    parser and then its own resolution set them) and, per attribute, the values that enter the path, or
    (``excludes``) the values that keep it off, where any other value enters it (a grammar backend other than
    ``none``: a plugin may register more). A configuration meets them when every attribute holds one of its values
    and none holds an excluded one; one that does not never runs the code the fix changes."""

    server_args: dict[str, tuple[Any, ...]]
    why: str
    excludes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # Integer attributes whose value must exceed a bound to enter the path (``page_size`` above 1): no list of
    # values could name every page size a server takes.
    above: dict[str, int] = field(default_factory=dict)
    # What the path needs that no server argument says (the model's layers), assumed where the path is entered.
    assumes: str = ""

    @property
    def attributes(self) -> list[str]:
        return list(dict.fromkeys([*self.server_args, *self.above, *self.excludes]))

    def undefined(self, values: dict[str, Any]) -> list[str]:
        """The attributes missing from ``values`` (the tree's parser does not define them, or their effective value
        is not established): the configuration cannot be read against them."""
        return [attr for attr in self.attributes if attr not in values]

    def unmet(self, values: dict[str, Any]) -> list[str]:
        """The attributes whose value keeps the configuration off the path, in the declared order."""
        return [attr for attr in self.attributes if attr in values and not self._enters(attr, values[attr])]

    def _enters(self, attr: str, value: Any) -> bool:
        if attr in self.server_args and not any(_same(value, w) for w in self.server_args[attr]):
            return False
        if attr in self.above and not (type(value) is int and value > self.above[attr]):
            return False
        return not any(_same(value, w) for w in self.excludes.get(attr, ()))

    def wanted(self) -> dict[str, list]:
        """Per attribute, the values that enter the path as said to an operator (a bound as ``"> 1"``), or
        ``["not", <excluded>...]`` where any other value does."""
        shown: dict[str, list] = {attr: list(values) for attr, values in self.server_args.items()}
        for attr, bound in self.above.items():
            shown.setdefault(attr, []).append(f"> {bound}")
        for attr, values in self.excludes.items():
            shown.setdefault(attr, []).extend(["not", *values])
        return shown


@dataclass(frozen=True)
class Gate:
    """A runtime switch the fix's code runs behind: an environment variable of the server (read by the tree's own
    ``Envs``) that must hold ``on``. The probe observes the code with it on; a server whose environment leaves
    it off runs the code as before the fix."""

    variable: str
    on: str  # the value that turns the fix on, as an operator writes it in the server's environment
    why: str
    # The server platforms on which the fix runs without the variable (the tree's default there decides);
    # empty: the variable decides on every platform.
    platforms: tuple[str, ...] = ()

    def decides_on(self, platform: str) -> bool:
        """Whether the variable decides if the fix runs on a server on ``platform``."""
        return platform not in self.platforms


@dataclass(frozen=True)
class Experiment:
    name: str
    pr: int
    title: str
    probe: Path
    upstream_tests: tuple[str, ...]
    git: dict[str, str]
    releases: dict[str, str | None]
    expect: dict[str, Expectation] = field(default_factory=dict)
    mutants: dict[str, Mutant] = field(default_factory=dict)
    not_affected: dict[str, NotAffected] = field(default_factory=dict)
    not_deciding: dict[str, NotDeciding] = field(default_factory=dict)
    needs: Needs | None = None  # the server configuration its code path needs; None: every configuration enters it
    gate: Gate | None = None  # the environment variable the fix runs behind; None: it always runs
    # Kernels on the probed path that cannot run on a CPU, each answered by its own module's CPU implementation
    # of the same computation: "module:kernel" -> (that implementation's name, why it computes the same).
    cpu_kernels: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The SGLang files (repository paths) its probe loads: `bisect --every` probes each commit changing one.
    loads: tuple[str, ...] = ()
    # The oldest release its sweep probes, where older than the registry's ``release_floor`` (None: that floor):
    # an experiment whose code path is older than PD (a scheduler loop) reads back to a release without it, so the
    # sweep finds the release that brought it in.
    release_floor: str | None = None

    def pin(self, kind: str, side: str) -> str:
        """What a registry cell of tree ``kind`` probes on ``side``: the pinned commit (``git``) or release."""
        pin = PINS[kind]
        value = getattr(self, pin.table).get(side)
        if not value:
            raise usage(f"experiment {self.name!r} has no {pin.missing.format(side=side)}",
                        expected=f"[experiments.{self.name}.{pin.table}] {side} = \"<{pin.value}>\" in {REGISTRY_FILE}",
                        todo=pin.todo.format(name=self.name))
        return value


@dataclass(frozen=True)
class Pin:
    """Where an experiment pins the tree of one registry tree kind, and what to do while it does not."""

    table: str  # the experiment's table (and attribute) that maps each side to it
    missing: str
    value: str
    todo: str


PINS = {
    "git": Pin("git", "pinned {side} commit", "40-hex sha",
               "run its release-backed cells (`cell release`), or record the PR's commits once known"),
    "release": Pin("releases", "release-backed {side} yet", "version",
                   "run `nox -s sweep -- --experiment {name}` to find the bracketing releases, then record them"),
}


@dataclass(frozen=True)
class Era:
    """SGLang releases that run in one closure: the torch, transformers and the rest they were built for.

    A release outside every declared era runs in the registry's own closure (``constraints``).
    ``stand_ins`` are import stand-ins for compiled GPU-only packages that the era's releases
    import at top level but the probed code never calls (declared in ``[stand_ins]``).
    ``kernel``: the versions of SGLang's kernel package (sgl-kernel, later sglang-kernel) the era's
    releases pin; it tells a fork's era by its pins where eras share one closure.
    ``releases`` None: an era of source trees only (main-line commits between two releases whose pins no
    release's era has), which no release runs in: only a tree's pins choose it (``era_choice.py``).
    """

    name: str
    releases: SpecifierSet | None
    constraints: Path
    constraints_input: Path | None
    stand_ins: tuple[str, ...]
    note: str
    kernel: SpecifierSet | None = None

    def holds(self, version: str) -> bool:
        return self.releases is not None and self.releases.contains(Version(version), prereleases=True)


@dataclass(frozen=True)
class CannotProbe:
    """A release whose probe cannot run on a CPU, with its one cause (``[cannot_probe."<version>"]``): a fact of
    the release, not a harness bug. The sweep still probes it: where it fails as declared (it raised, and every
    error it raised holds ``raises``) it reads "cannot run" with ``why`` and the release watch sets it aside;
    where it answers, the declaration has become wrong and the watch flags it (stale: remove it)."""

    version: str
    why: str
    raises: str  # text every error the release raises holds (a part of the message, as the probe reports it)
    experiments: tuple[str, ...] | None = None  # the experiments it concerns; None: every one probed on it

    def concerns(self, name: str) -> bool:
        return self.experiments is None or name in self.experiments


@dataclass(frozen=True)
class Registry:
    root: Path
    python: str
    torch_channel: TorchChannel
    constraints: Path
    constraints_cpu: Path | None
    constraints_input: Path | None
    release_floor: str
    experiments: dict[str, Experiment]
    # The first release with PD disaggregation (None: not declared): no older release has a PD handoff.
    pd_first_release: str | None = None
    # The release whose `check --openvex` document is published as the OpenVEX example (None: none is).
    openvex_example: str | None = None
    eras: dict[str, Era] = field(default_factory=dict)
    stand_ins: dict[str, str] = field(default_factory=dict)  # module -> why it may be a stand-in
    # Releases whose probe cannot run on a CPU, by version: the cause declared (``CannotProbe``).
    cannot_probe: dict[str, CannotProbe] = field(default_factory=dict)
    # The SHA-256 of the bytes this registry was parsed from (None: not read from a file): a run compares it
    # with the file's digest it records, so a registry edited meanwhile never labels what the old one made.
    digest: str | None = None

    def era_of(self, version: str | None) -> Era | None:
        """The declared era that holds ``version``; None: the registry's own closure."""
        if version is None:
            return None
        try:
            Version(version)
        except InvalidVersion:
            return None
        holders = [era for era in self.eras.values() if era.holds(version)]
        if len(holders) > 1:
            raise usage(f"eras {', '.join(e.name for e in holders)} all hold {version}",
                        expected="each release in at most one era", todo=f"fix their releases in {REGISTRY_FILE}")
        return holders[0] if holders else None

    def floor(self, name: str) -> str:
        """The oldest release the sweep probes for experiment ``name``: its own floor, else the registry's."""
        return self.experiment(name).release_floor or self.release_floor

    def declared(self, version: str, name: str) -> CannotProbe | None:
        """The declaration that ``version`` cannot be probed on a CPU for experiment ``name``; None: none."""
        try:
            wanted = Version(version)
        except InvalidVersion:
            return None
        return next((d for d in self.cannot_probe.values() if Version(d.version) == wanted and d.concerns(name)),
                    None)

    def experiment(self, name: str) -> Experiment:
        try:
            return self.experiments[name]
        except KeyError:
            raise usage(
                f"unknown experiment {name!r}",
                expected=f"one of: {', '.join(sorted(self.experiments))}",
                todo="check the spelling, or add the experiment to experiments.toml",
            ) from None


def check_side(side: str) -> str:
    if side not in SIDES:
        raise usage(f"unknown side {side!r}", expected=f"one of: {', '.join(SIDES)}")
    return side


class RegistryError(ValueError):
    """A registry problem at a key path, e.g. ``experiments.<name>.releases.bsae``."""


def load(root: Path, filename: str = REGISTRY_FILE) -> Registry:
    path = root / filename
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise usage(f"no registry at {path}", todo="run from the project's top directory") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise usage(f"{path} is not valid TOML: {exc}", todo="fix the file; `git diff` shows what changed") from None
    try:
        # Provenance records experiments.toml: only its digest is the one a run compares.
        digest = hashlib.sha256(raw).hexdigest() if filename == REGISTRY_FILE else None
        return dataclasses.replace(_parse(root, data), digest=digest)
    except RegistryError as exc:
        raise usage(f"{path}: {exc}", todo="fix the registry entry named above") from None


# --- a small schema checker: known keys, required keys, types -------------------------------


def _table(value: Any, where: str, *, required: dict[str, type | tuple], optional: dict[str, type | tuple]) -> dict:
    """``value`` as a table whose keys are all known and whose values have the declared types."""
    if not isinstance(value, dict):
        raise RegistryError(f"{where}: expected a table, got {_type_name(value)}")
    known = {**required, **optional}
    for key in value:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(sorted(known))}"
            raise RegistryError(f"unknown key {where}.{key}{hint}")
    for key in required:
        if key not in value:
            raise RegistryError(f"{where}: missing key {key!r}")
    for key, kind in known.items():
        if key in value and not _is(value[key], kind):
            raise RegistryError(f"{where}.{key}: expected {_kind_name(kind)}, got {_type_name(value[key])}")
    return value


def _is(value: Any, kind: type | tuple) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # TOML booleans are ints to Python; an int field must not accept true/false.
    if isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


def _kind_name(kind: type | tuple) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({dict: "table", list: "array", str: "string", int: "integer", bool: "boolean"}.get(k, k.__name__)
                       for k in kinds)


def _type_name(value: Any) -> str:
    return _kind_name(type(value))


def _enum(cls: type[enum.Enum], value: str, where: str):
    try:
        return cls(value)
    except ValueError:
        raise RegistryError(f"{where}: {value!r} is not one of: {', '.join(m.value for m in cls)}") from None


def _strings(value: list, where: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in value):
        raise RegistryError(f"{where}: expected an array of strings")
    return tuple(value)


def _repository_paths(value: list, where: str) -> tuple[str, ...]:
    """Paths inside a repository, as git names them (``python/sglang/...``)."""
    paths = _strings(value, where)
    for path in paths:
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise RegistryError(f"{where}: {path!r} is not a path inside the repository (e.g. \"python/sglang/...\")")
    return paths


def _version(value: str, where: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise RegistryError(f"{where}: {value!r} is not a PEP 440 version (e.g. \"0.5.21\")") from None
    return value


# --- the registry's tables -------------------------------------------------------------------


def _parse(root: Path, data: dict) -> Registry:
    _table(data, "registry", required={"schema": int, "python": str, "constraints": str, "release_floor": str,
                                       "experiments": dict, "torch_channel": str},
           optional={"constraints_input": str, "constraints_cpu": str, "openvex_example": str, "eras": dict,
                     "stand_ins": dict, "pd_first_release": str, "cannot_probe": dict})
    if data["schema"] != SCHEMA:
        raise RegistryError(f"registry.schema: {data['schema']} is not a schema this harness reads ({SCHEMA})")
    experiments = {}
    for name, table in data["experiments"].items():
        if not _NAME.match(name):
            raise RegistryError(f"experiments.{name}: the name must be lowercase letters, digits and _")
        experiments[name] = _parse_experiment(root, name, table)
    if not experiments:
        raise RegistryError("registry declares no experiments")
    channel = _enum(TorchChannel, data["torch_channel"], "registry.torch_channel")
    stand_ins = {name: _table(spec, f"stand_ins.{name}", required={"why": str}, optional={})["why"]
                 for name, spec in data.get("stand_ins", {}).items()}
    eras = {name: _parse_era(root, name, table, stand_ins) for name, table in data.get("eras", {}).items()}
    _disjoint(eras)
    floor = _version(data["release_floor"], "registry.release_floor")
    for name, exp in experiments.items():
        _below_floor(f"experiments.{name}", exp, floor)
    cannot_probe = _parse_cannot_probe(data.get("cannot_probe", {}), experiments, floor)
    return Registry(
        root=root,
        python=data["python"],
        torch_channel=channel,
        constraints=root / data["constraints"],
        constraints_cpu=root / data["constraints_cpu"] if "constraints_cpu" in data else None,
        constraints_input=root / data["constraints_input"] if "constraints_input" in data else None,
        release_floor=floor,
        experiments=experiments,
        pd_first_release=_version(data["pd_first_release"], "registry.pd_first_release")
        if "pd_first_release" in data else None,
        eras=eras,
        stand_ins=stand_ins,
        openvex_example=_version(data["openvex_example"], "registry.openvex_example")
        if "openvex_example" in data else None,
        cannot_probe=cannot_probe,
    )


def _parse_cannot_probe(tables: dict, experiments: dict[str, Experiment], floor: str) -> dict[str, CannotProbe]:
    """``[cannot_probe."<version>"]``: a release that cannot be probed on a CPU, its cause (``why``), what every
    error it raises holds (``raises``) and, where not every experiment, those it concerns. Each must be a
    release the sweep probes for an experiment it concerns (at or above that experiment's floor): a declaration
    never probed could never be found wrong."""
    found: dict[str, CannotProbe] = {}
    seen: dict[Version, str] = {}
    for version, spec in tables.items():
        where = f'cannot_probe."{version}"'
        _version(version, where)
        if Version(version) in seen:
            raise RegistryError(f"{where}: the release {seen[Version(version)]!r} is declared already (one cause a "
                                "release)")
        seen[Version(version)] = version
        _table(spec, where, required={"why": str, "raises": str}, optional={"experiments": list})
        for key in ("why", "raises"):
            if not spec[key].strip():
                raise RegistryError(f"{where}.{key}: empty: " + ("say in one sentence why the release cannot be probed "
                                    "on a CPU" if key == "why" else "give the text every error it raises holds (e.g. "
                                    "the exception's message)"))
        names = _strings(spec["experiments"], f"{where}.experiments") if "experiments" in spec else None
        if names is not None and not names:
            raise RegistryError(f"{where}.experiments: empty (leave it out: every experiment probed on it)")
        unknown = [name for name in names or () if name not in experiments]
        if unknown:
            raise RegistryError(f"{where}.experiments: {', '.join(unknown)} is not an experiment (one of: "
                                f"{', '.join(sorted(experiments))})")
        below = [name for name in names or () if Version(version) < Version(experiments[name].release_floor or floor)]
        if below:
            raise RegistryError(f"{where}.experiments: {', '.join(below)} is not swept on {version} (below its "
                                "release floor): the declaration could never be checked")
        if names is None and all(Version(version) < Version(exp.release_floor or floor)
                                 for exp in experiments.values()):
            raise RegistryError(f"{where}: {version} is below every experiment's release floor: no sweep probes it, "
                                "so the declaration could never be checked")
        found[version] = CannotProbe(version, spec["why"], spec["raises"], names)
    return found


def _below_floor(where: str, exp: Experiment, floor: str) -> None:
    """An experiment's own floor only reaches further back than the registry's (a higher one would leave it
    releases unread that every other experiment reads), and stays below its own pre-fix release."""
    if exp.release_floor is None:
        return
    if Version(exp.release_floor) >= Version(floor):
        raise RegistryError(f"{where}.release_floor: {exp.release_floor!r} is not older than the registry's "
                            f"release_floor {floor!r} (leave it out: the registry's floor applies)")
    base = exp.releases.get("base")
    if base is not None and Version(exp.release_floor) > Version(base):
        raise RegistryError(f"{where}.release_floor: {exp.release_floor!r} is newer than its pre-fix release "
                            f"{base!r}")


def _parse_era(root: Path, name: str, table: Any, stand_ins: dict[str, str]) -> Era:
    where = f"eras.{name}"
    if not _NAME.match(name.replace("-", "_").replace(".", "_")):
        raise RegistryError(f"{where}: the name must be lowercase letters, digits, '-', '.' and _")
    _table(table, where, required={"constraints": str},
           optional={"releases": str, "constraints_input": str, "stand_ins": list, "note": str, "kernel": str})
    releases, kernel = (_specifier(table[key], f"{where}.{key}") if key in table else None
                        for key in ("releases", "kernel"))
    names = _strings(table.get("stand_ins", []), f"{where}.stand_ins")
    for module in names:
        if module not in stand_ins:
            raise RegistryError(f"{where}.stand_ins: {module!r} is not declared in [stand_ins] (with why it may be)")
    return Era(name, releases, root / table["constraints"],
               root / table["constraints_input"] if "constraints_input" in table else None, names,
               table.get("note", ""), kernel)


def _disjoint(eras: dict[str, Era]) -> None:
    """No release in two eras. Two version ranges overlap where one holds a bound of the other or the release
    just after one (a range's edges are the versions it names), so those are the releases tried."""
    bounds = {Version(spec.version) for era in eras.values() for spec in era.releases or ()}
    tried = sorted(bounds | {Version(f"{v.base_version}.0.0.1") for v in bounds} | {Version("0"), Version("9999")})
    names = list(eras)
    for i, name in enumerate(names):
        for other in names[:i]:
            both = next((v for v in tried if eras[name].holds(str(v)) and eras[other].holds(str(v))), None)
            if both is not None:
                raise RegistryError(f"eras.{name}.releases: {str(eras[name].releases)!r} overlaps eras.{other} "
                                    f"({str(eras[other].releases)!r}): both hold {both}; a release runs in one era")


def _specifier(text: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise RegistryError(f"{where}: {text!r} is not a version specifier (e.g. \">=0.5.11,<0.5.17\")") from None


def _parse_experiment(root: Path, name: str, table: dict) -> Experiment:
    where = f"experiments.{name}"
    # ``git`` may be left out where the PR's commits are not known yet: release-backed cells only.
    _table(table, where, required={"pr": int, "title": str, "probe": str},
           optional={"git": dict, "upstream_tests": list, "releases": dict, "expect": dict, "mutants": dict,
                     "not_affected": dict, "not_deciding": dict, "needs": dict, "gate": dict,
                     "loads": list, "cpu_kernels": dict, "release_floor": str})
    git = _table(table.get("git", {}), f"{where}.git", required={side: str for side in SIDES} if "git" in table
                 else {}, optional={})
    for side in git:
        if not _SHA.match(git[side]):
            raise RegistryError(f"{where}.git.{side}: {git[side]!r} is not a full 40-hex commit SHA")
    releases = _table(table.get("releases", {}), f"{where}.releases", required={}, optional={s: str for s in SIDES})
    expect = {sid: _parse_expectation(f"{where}.expect.{sid}", sid, spec)
              for sid, spec in table.get("expect", {}).items()}
    mutants = {mid: _parse_mutant(f"{where}.mutants.{mid}", mid, spec)
               for mid, spec in table.get("mutants", {}).items()}
    not_affected = {rid: _parse_not_affected(f"{where}.not_affected.{rid}", rid, spec, expect)
                    for rid, spec in table.get("not_affected", {}).items()}
    not_deciding = {rid: _parse_not_deciding(f"{where}.not_deciding.{rid}", rid, spec, expect)
                    for rid, spec in table.get("not_deciding", {}).items()}
    return Experiment(
        name=name,
        pr=table["pr"],
        title=table["title"],
        probe=root / table["probe"],
        upstream_tests=_strings(table.get("upstream_tests", []), f"{where}.upstream_tests"),
        git={side: git[side] for side in SIDES if side in git},
        releases={side: _version(releases[side], f"{where}.releases.{side}") if releases.get(side) else None
                  for side in SIDES},
        expect=expect,
        mutants=mutants,
        not_affected=not_affected,
        not_deciding=not_deciding,
        needs=_parse_needs(f"{where}.needs", table["needs"]) if "needs" in table else None,
        gate=_parse_gate(f"{where}.gate", table["gate"]) if "gate" in table else None,
        loads=_repository_paths(table.get("loads", []), f"{where}.loads"),
        cpu_kernels={kernel: _parse_cpu_kernel(f"{where}.cpu_kernels.{kernel}", kernel, spec)
                     for kernel, spec in table.get("cpu_kernels", {}).items()},
        release_floor=_version(table["release_floor"], f"{where}.release_floor") if "release_floor" in table
        else None,
    )


def _parse_cpu_kernel(where: str, kernel: str, spec: Any) -> tuple[str, str]:
    """A kernel's CPU stand-in may only be its own module's implementation: named, not a module of our own."""
    if not _TARGET.match(kernel):
        raise RegistryError(f"{where}: {kernel!r} is not \"sglang.module:kernel\"")
    _table(spec, where, required={"cpu": str, "why": str}, optional={})
    if not _ATTRIBUTE.match(spec["cpu"]):
        raise RegistryError(f"{where}.cpu: {spec['cpu']!r} is not a name in the kernel's own module")
    return spec["cpu"], spec["why"]


_ATTRIBUTE = re.compile(r"^[a-z_][a-z0-9_]*$")


def _parse_needs(where: str, spec: Any) -> Needs:
    _table(spec, where, required={"server_args": dict, "why": str},
           optional={"excludes": dict, "above": dict, "assumes": str})
    if not spec["server_args"] and not spec.get("above"):
        raise RegistryError(f"{where}.server_args: names no attribute (leave [needs] out: every configuration)")
    above = {}
    for attr, bound in spec.get("above", {}).items():
        if not _ATTRIBUTE.match(attr) or type(bound) is not int:
            raise RegistryError(f"{where}.above.{attr}: expected a ServerArgs attribute name and an integer bound")
        if attr in spec["server_args"]:
            raise RegistryError(f"{where}.above.{attr}: also in server_args: name it in one of them")
        above[attr] = bound
    found = _needed_values(f"{where}.server_args", spec["server_args"], "enter")
    excludes = _needed_values(f"{where}.excludes", spec.get("excludes", {}), "keep off")
    return Needs(found, spec["why"], excludes, above, spec.get("assumes", ""))


def _needed_values(where: str, spec: dict, role: str) -> dict[str, tuple[Any, ...]]:
    found = {}
    for attr, values in spec.items():
        if not _ATTRIBUTE.match(attr):
            raise RegistryError(f"{where}.{attr}: not a ServerArgs attribute name (lowercase, digits, _)")
        if not isinstance(values, list) or not values or not all(isinstance(v, Scalar) for v in values):
            raise RegistryError(f"{where}.{attr}: expected a non-empty array of the values that {role} "
                                "the path (booleans, integers or strings)")
        found[attr] = tuple(values)
    return found


# An environment variable's name as a shell (and `docker run --env-file`) accepts it.
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parse_gate(where: str, spec: Any) -> Gate:
    _table(spec, where, required={"variable": str, "on": str, "why": str}, optional={"platforms": list})
    if not _VARIABLE.match(spec["variable"]):
        raise RegistryError(f"{where}.variable: {spec['variable']!r} is not an environment variable name "
                            "(letters, digits, _; not starting with a digit)")
    if not spec["on"]:
        raise RegistryError(f"{where}.on: empty: give the value that turns the fix on (e.g. \"true\")")
    platforms = spec.get("platforms", [])
    unknown = [p for p in platforms if p not in SERVER_PLATFORMS]
    if unknown or not all(isinstance(p, str) for p in platforms):
        raise RegistryError(f"{where}.platforms: {unknown or platforms!r} not server platforms: each one of "
                            f"{', '.join(SERVER_PLATFORMS)}")
    return Gate(spec["variable"], spec["on"], spec["why"], tuple(platforms))


def _parse_not_affected(where: str, rid: str, spec: Any, expect: dict[str, Expectation]) -> NotAffected:
    if not _SCENARIO.match(rid):
        raise RegistryError(f"{where}: {rid!r} is not an id (letters, digits, _)")
    _table(spec, where, required={"scenario": str, "key": str, "value": (bool, int, str), "justification": str,
                                  "why": str}, optional={})
    # A rule on a scenario no run has could never hold; one misspelt would silently never apply.
    if spec["scenario"] not in expect:
        raise RegistryError(f"{where}.scenario: {spec['scenario']!r} is not a scenario this experiment expects "
                            f"(expect: {', '.join(expect) or 'none declared'})")
    return NotAffected(rid, spec["scenario"], spec["key"], spec["value"],
                       _enum(Justification, spec["justification"], f"{where}.justification"), spec["why"])


def _parse_not_deciding(where: str, rid: str, spec: Any, expect: dict[str, Expectation]) -> NotDeciding:
    if not _SCENARIO.match(rid):
        raise RegistryError(f"{where}: {rid!r} is not an id (letters, digits, _)")
    _table(spec, where, required={"keys": dict, "why": str}, optional={"when": dict})
    when = _values(spec.get("when", {}), f"{where}.when")
    for name in when:
        sid, dot, key = name.partition(".")
        if name != "adaptation" and not (dot and key and sid in expect):
            raise RegistryError(f"{where}.when: {name!r} is neither \"adaptation\" nor \"<scenario>.<key>\" "
                                "of a scenario this experiment expects")
    keys: dict[str, tuple[str, ...] | None] = {}
    for sid, names in spec["keys"].items():
        telling = expect.get(sid)
        if telling is None:
            raise RegistryError(f"{where}.keys: {sid!r} is not a scenario this experiment expects")
        if names == "all":
            keys[sid] = None
            continue
        if not isinstance(names, list):
            raise RegistryError(f"{where}.keys.{sid}: expected an array of keys, or \"all\" (none decides)")
        names = _strings(names, f"{where}.keys.{sid}")
        unknown = sorted(set(names) - set(telling.base) - set(telling.head))
        if unknown:
            raise RegistryError(f"{where}.keys.{sid}: {', '.join(unknown)} is not a key {sid} expects")
        keys[sid] = names
    return NotDeciding(rid, when, keys, spec["why"])


def _values(values: dict, where: str) -> dict:
    for key, value in values.items():
        if not isinstance(value, Scalar):
            raise RegistryError(f"{where}.{key}: expected a boolean, integer or string, got {_type_name(value)}")
    return values


def _with_nulls(values: dict, spec: dict, key: str, where: str) -> dict:
    """TOML has no null: keys expected to be null are listed in ``<side>_null_keys``."""
    nulls = _strings(spec.get(key, []), f"{where}.{key}")
    both = set(values) & set(nulls)
    if both:
        raise RegistryError(f"{where}.{key}: {', '.join(sorted(both))} also has a value")
    return {**_values(values, where), **{name: None for name in nulls}}


def _parse_expectation(where: str, sid: str, spec: Any) -> Expectation:
    if not _SCENARIO.match(sid):
        raise RegistryError(f"{where}: {sid!r} is not a scenario id (letters, digits, _)")
    if not isinstance(spec, dict) or not isinstance(spec.get("changes"), bool):
        raise RegistryError(f"{where}: expected a table with changes = true (a differential) or false (a control)")
    if spec["changes"]:
        _table(spec, where, required={"changes": bool, "base": dict, "head": dict},
               optional={"base_null_keys": list, "head_null_keys": list})
        base = _with_nulls(spec["base"], spec, "base_null_keys", f"{where}.base")
        head = _with_nulls(spec["head"], spec, "head_null_keys", f"{where}.head")
        if base == head:
            raise RegistryError(f"{where}: changes = true but base and head expect the same values")
    else:
        _table(spec, where, required={"changes": bool, "keys": dict}, optional={"null_keys": list, "beside": dict})
        base = head = _with_nulls(spec["keys"], spec, "null_keys", f"{where}.keys")
    beside = _parse_beside(f"{where}.beside", spec["beside"], base) if "beside" in spec else None
    return Expectation(sid, spec["changes"], base, head, beside)


def _parse_beside(where: str, spec: dict, controlled: dict[str, Any]) -> Beside:
    _table(spec, where, required={"keys": list, "why": str}, optional={})
    keys = _strings(spec["keys"], f"{where}.keys")
    if not keys or not spec["why"].strip():
        raise RegistryError(f"{where}: name the keys that differ beside the control, and why")
    both = sorted(set(keys) & set(controlled))
    if both:
        raise RegistryError(f"{where}.keys: {', '.join(both)} is what the control holds; it cannot also differ")
    return Beside(keys, spec["why"])


_OPERATOR_FIELDS = {
    Operator.CONSTANT: ({"value": (bool, int, str)}, {}),
    Operator.NOOP: ({}, {}),
    Operator.SWAP: ({"replacement": str}, {}),
    Operator.EDIT: ({"old": str, "new": str}, {"count": int}),
}


def _parse_mutant(where: str, mid: str, spec: Any) -> Mutant:
    if not _SCENARIO.match(mid):
        raise RegistryError(f"{where}: {mid!r} is not a mutant id (letters, digits, _)")
    common = {"title": str, "kind": str, "target": str, "operator": str}
    _table(spec, where, required=common, optional={"value": (bool, int, str), "replacement": str, "old": str,
                                                   "new": str, "count": int})
    operator = _enum(Operator, spec["operator"], f"{where}.operator")
    required, optional = _OPERATOR_FIELDS[operator]
    _table(spec, where, required={**common, **required}, optional=optional)
    for key in ("target", "replacement"):
        if key in spec and not _TARGET.match(spec[key]):
            raise RegistryError(f"{where}.{key}: {spec[key]!r} is not \"module.path:Qualified.name\"")
    if operator is Operator.EDIT and spec["old"] == spec["new"]:
        raise RegistryError(f"{where}: an edit whose old and new are equal changes nothing")
    return Mutant(id=mid, title=spec["title"], kind=_enum(MutantKind, spec["kind"], f"{where}.kind"),
                  target=spec["target"], operator=operator, value=spec.get("value"),
                  replacement=spec.get("replacement"), old=spec.get("old"), new=spec.get("new"),
                  count=spec.get("count", 1))
