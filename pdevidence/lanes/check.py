"""Is my SGLang affected? Run every experiment's probe on one build and say, per fix.

The target is an environment you already have (``--python``: nothing is
installed into it or written inside it) or a tree the warm engine puts on a
probe process's path as it is (``--version``, ``--wheel``: the wheel unpacked;
``--path``, ``--git``: the source tree's directory holding ``sglang/``, nothing
built), in the closure of the tree's era. Every experiment runs in one probe
process. Each is judged on the scenarios that tell the published base and head
results apart and on the controls (every key they agree on): fixed, affected
(pre-fix), partial (some scenarios fixed, others pre-fix), deviates (fixed where
the scenarios tell, but a control departs from both sides: an over-broad fix, not
the fixed code), unknown (matches neither, a deciding key never recorded, or raised), or cannot run (the probe
could not import or set up). The table names, per answer, the scenarios that put
it there; a scenario matching neither side or a departing control gets one key
beside base's and head's, and ``verbose`` (as ``--json``) every key of every
scenario that kept the build from fixed.

Given the operator's server arguments (``--server-args``), each tree reads them in its probe
process, with its own parser and then its own resolution of the arguments that follow from
others (probes/_serverconfig.py); a fix whose code path the effective configuration is known
never to enter (the registry's ``needs``) is not affected, resting on that configuration
(``vulnerable_code_not_in_execute_path``), its code's own answer kept beside it (or, where its
probe could not run, that its code was not observed). An attribute whose effective value the
tree does not establish here never decides. A configuration that picks an implementation no experiment's
``needs`` name (a transfer backend the probes never looked at: ``IMPLEMENTATIONS``) is said to be outside what
the probes saw: a fix on another backend still reads not affected (its code is not in this server's path), but
nothing here answers for that backend's own code.

A fix that runs only behind an environment variable (the registry's ``gate``) is probed with it on. Each tree
reads the server environment given (``--server-env``, ``--server-env-file``; none: every variable at its
default) with its own ``Envs`` in its probe process (probes/_serverenv.py): a value it refuses is a usage error
naming it, a name it defines nowhere a warning. Where the code answers fixed (or partial) but the environment
leaves the gate off, the answer is affected: the fix is present but off, and the table, the document and
OpenVEX name the variable that turns it on. A gate may hold only off some platforms (its ``platforms``: where the
fix runs by default): given the server's platform (``--server-platform``, CUDA by default), on those the tree's
code decides; elsewhere the variable does, and a tree that defines no such variable runs the fix nowhere there
(present but off).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cells import allprobes, engine, warm
from ..core import children, sandbox, settings
from ..core.arguments import DEFAULT_PLATFORM, ServerArguments, ServerEnvironment
from ..core.errors import BEHAVIOUR_DIFFERS, CONFIRMED, ENVIRONMENT, HarnessError, usage, worst
from ..core.paths import results_dir, run_logs, runs_dir, tree_lock_file, work_dir
from ..documents.observations import Explained, explained_brief, explained_json, explained_text
from ..documents.references import references
from ..documents.vocabulary import Behaviour, Classification, GateState, RestsOn
from ..documents.vocabulary import CheckStatus as Status
from ..judge import classify
from ..registry import Experiment, Gate, Justification, Needs, Registry
from ..sources import era_choice, images, trees
from ..sources.era_choice import EraChoice
from ..sources.pins import TreePins
from ..sources.version import TreeVersion

SCHEMA = "pdevidence-check/3"
# SGLang itself requires Python >= 3.10; the tests parse the probes with that grammar.
MIN_PYTHON = (3, 10)
CHECK_SIDE = "check"
SOURCE_KINDS = ("path", "git")
IMAGE_KIND = images.KIND
CHOICE = {images.Choice.IMPORTED: "what the server imports", images.Choice.ONLY: "the image's only sglang",
          images.Choice.UNDECIDED: "not an all-clear"}


STATUS_OF = {Classification.FIXED: Status.FIXED, Classification.PRE_FIX: Status.AFFECTED,
             Classification.PARTIAL: Status.PARTIAL, Classification.NEITHER: Status.UNKNOWN,
             Classification.ERROR: Status.UNKNOWN, Classification.DEVIATES: Status.DEVIATES,
             Classification.NOT_AFFECTED: Status.NOT_AFFECTED}
EXIT_OF = {Status.FIXED: CONFIRMED, Status.AFFECTED: BEHAVIOUR_DIFFERS, Status.PARTIAL: BEHAVIOUR_DIFFERS,
           Status.UNKNOWN: BEHAVIOUR_DIFFERS, Status.CANNOT_RUN: ENVIRONMENT, Status.NOT_AFFECTED: CONFIRMED,
           Status.DEVIATES: BEHAVIOUR_DIFFERS}
# Which scenarios decide each status: those that put it there.
DECIDING = {Status.FIXED: (Behaviour.FIXED,), Status.AFFECTED: (Behaviour.PRE_FIX,),
            Status.PARTIAL: (Behaviour.PRE_FIX,), Status.UNKNOWN: (Behaviour.NEITHER, Behaviour.ERROR),
            Status.DEVIATES: (Behaviour.DEVIATES,)}


@dataclass
class Target:
    kind: str  # python | release | wheel | path | git
    ref: str  # as asked: an interpreter, a version, a file, a directory or a commit
    resolved: str | None = None  # version or commit; for an interpreter, the SGLang version it imports
    sha256: str | None = None  # of the wheel or archive, where there is one
    version: TreeVersion | None = None  # a source tree's version, read from its commit; None: not told
    era: str | None = None  # the era whose closure the tree runs in; None: today's closure
    era_choice: EraChoice | None = None  # what chose the era; None for an interpreter
    pins: TreePins | None = None  # a source tree's pins of torch, transformers and the kernel; None: none read
    image: images.Found | None = None  # an image's package: which image, and where in it

    def label(self) -> str:
        if self.kind == "python":
            return f"python-{hashlib.sha256(self.ref.encode()).hexdigest()[:12]}"
        return trees.tree_label(self.kind, self.resolved or self.ref, self.sha256)

    def to_json(self) -> dict:
        found = {"kind": self.kind, "ref": self.ref, "resolved": self.resolved, "sha256": self.sha256}
        if self.kind != "python":
            found["era"] = self.era
            found["era_chosen_by"] = self.era_choice.to_json() if self.era_choice else None
        if self.kind in SOURCE_KINDS:
            found["source_version"] = self.version.to_json() if self.version else None
            found["source_pins"] = self.pins.to_json() if self.pins else None
        if self.image is not None:
            found["source_version"] = self.version.to_json() if self.version else None
            found["image"] = self.image.to_json()
        return found


# The ServerArgs attributes whose value picks one implementation among several: a value that no experiment's
# needs name runs code that no probe looked at (which values are covered is the registry's, not a list here).
IMPLEMENTATIONS = ("disaggregation_transfer_backend",)


@dataclass(frozen=True)
class Outside:
    """An implementation the configuration runs that no experiment's probed code covers: the fixes on the ones
    covered are off this server's path, and nothing the probes observed answers for this one's own code."""

    attribute: str
    value: Any  # the effective value, as the tree established it
    covered: tuple  # the values the registry's needs name for the attribute: what the probes looked at
    experiments: tuple[str, ...]  # the experiments whose needs name the attribute

    def describe(self) -> str:
        covered = " or ".join(map(_shown, self.covered))
        return (f"{self.attribute} = {_shown(self.value)} is outside what the probes saw: they looked only at "
                f"{covered} ({', '.join(self.experiments)}); a fix there reads not affected because its code is "
                f"not in this server's path, which says nothing of whether {_shown(self.value)}'s own code has the "
                "same bug class: no probe observed it")

    def to_json(self) -> dict:
        return {"attribute": self.attribute, "value": self.value, "covered": list(self.covered),
                "experiments": list(self.experiments)}


def outside_probes(exps: list[Experiment], values: dict[str, Any]) -> list[Outside]:
    """Each implementation attribute whose established value none of the experiments' needs name; an attribute
    no experiment's needs name is not judged (no probe covers any of its values), nor one not established."""
    found = []
    for attr in IMPLEMENTATIONS:
        naming = [exp for exp in exps if exp.needs and attr in exp.needs.server_args]
        if not naming or attr not in values:
            continue
        covered = tuple(dict.fromkeys(v for exp in naming for v in exp.needs.server_args[attr]))
        if Needs({attr: covered}, "").unmet({attr: values[attr]}):  # the registry's comparison, by value
            found.append(Outside(attr, values[attr], covered, tuple(exp.name for exp in naming)))
    return found


@dataclass
class Configuration:
    """The server arguments given, as one tree reads them (its parser, then its own resolution of the arguments
    that follow from others): the effective values of the attributes the registry's ``needs`` name that it
    establishes, and why the others are not established (one its parser does not define is in neither)."""

    given: ServerArguments
    values: dict[str, Any]
    unestablished: dict[str, str] = field(default_factory=dict)  # attribute -> why its value is not known
    resolution: dict | None = None  # how the tree's resolution ran (probes/_serverconfig.py); None: not run
    outside: list[Outside] = field(default_factory=list)  # implementations it runs that no probe covers

    def describe(self) -> str:
        args = " ".join(self.given.args) or "(no arguments: every option at its default)"
        where = "" if self.given.source == "--server-args" else f" from {self.given.source}"
        read = ", ".join(f"{attr} = {_shown(value)}" for attr, value in sorted(self.values.items()))
        found = f"{args}{where}; this tree reads {read or 'none of the options the fixes need'}"
        resolution = self.resolution or {}
        if resolution.get("completed"):
            found += " (after its own resolution"
            stand_ins = ", ".join(f"{k} {v}" for k, v in (resolution.get("stand_ins") or {}).items())
            found += f", with {stand_ins} standing in)" if stand_ins else ")"
        unknown = "; ".join(f"{attr}: {why}" for attr, why in sorted(self.unestablished.items()))
        return found + (f"; not established: {unknown}" if unknown else "")

    def to_json(self) -> dict:
        return {**self.given.to_json(), "values": self.values, "unestablished": self.unestablished,
                "resolution": self.resolution, "outside_probes": [o.to_json() for o in self.outside]}


def _shown(value: Any) -> str:
    return json.dumps(value)


def _split_needed(values: list) -> tuple[list, list]:
    """A ``needs`` entry (``Needs.wanted``): the values that enter the path, and those after "not" that keep it off."""
    if "not" not in values:
        return values, []
    cut = values.index("not")
    return values[:cut], values[cut + 1:]


def _needed(values: list) -> str:
    entering, excluded = _split_needed(values)
    words = [" or ".join(map(_shown, entering))] if entering else []
    words += [f"any but {' or '.join(map(_shown, excluded))}"] if excluded else []
    return ", ".join(words)


def _needs_shown(attr: str, values: list) -> str:
    entering, excluded = _split_needed(values)
    words = [f"{attr} in {_shown(entering)}"] if entering else []
    words += [f"{attr} not in {_shown(excluded)}"] if excluded else []
    return "; ".join(words)


@dataclass
class Environment:
    """The server environment given (None: none, every variable at the tree's default), as one tree reads it
    with its own ``Envs``: the values it takes, the names it reads elsewhere, those it defines nowhere, and each
    gate's state (probes/_serverenv.py's record)."""

    given: ServerEnvironment | None
    values: dict[str, Any] = field(default_factory=dict)  # variable -> the value the tree's Envs field takes
    named: list[str] = field(default_factory=list)  # not its Envs' fields, but read elsewhere in the tree
    undefined: list[str] = field(default_factory=list)  # named nowhere in the tree: a typo, or not this tree's
    gates: dict[str, dict] = field(default_factory=dict)  # variable -> the record's reading of it
    envs_error: str | None = None  # why the tree's Envs does not import here (nothing given is read); None: it does

    def warnings(self) -> list[str]:
        return [f"WARNING: --server-env {name}: this tree defines no such variable (not in its Envs, named in none "
                "of its source files): a typo, or a variable of another version" for name in self.undefined]

    def describe(self) -> str:
        if self.given is None:
            return "none given: every variable at this tree's default"
        if self.envs_error:
            return f"{len(self.given.variables)} variable(s) from {self.given.source}; none read: this tree's Envs " \
                f"does not import here ({self.envs_error})"
        read = ", ".join(f"{name} = {_shown(value)}" for name, value in sorted(self.values.items()))
        found = f"{len(self.given.variables)} variable(s) from {self.given.source}; this tree's Envs reads " \
                f"{read or 'none of them'}"
        return found + (f"; read outside its Envs: {', '.join(self.named)}" if self.named else "")

    def to_json(self) -> dict:
        given = self.given.to_json() if self.given else {"variables": {}, "source": None}
        return {**given, "values": self.values, "named": self.named, "undefined": self.undefined,
                "envs_error": self.envs_error}


@dataclass
class GateAnswer:
    """Whether the server environment turns an experiment's gated fix on, as the tree reads its variable."""

    gate: Gate
    state: GateState
    given: bool  # the variable was given (False: the tree's default, or none given at all)
    assumed_defaults: bool  # no environment was given: the answer rests on every default
    value: Any  # the value the tree takes (None where it is not established)
    code_status: Status  # the answer about the code alone (the probe runs it with the gate on)
    why: str  # how the value was read, or why it was not
    platform: str = DEFAULT_PLATFORM  # the server's platform (check --server-platform)

    @property
    def turns_on(self) -> str:
        return f"{self.gate.variable}={self.gate.on}"

    @property
    def decides(self) -> bool:
        """Whether the variable decides on the server's platform (not: the fix runs there by default)."""
        return self.gate.decides_on(self.platform)

    @property
    def off(self) -> bool:
        """The environment leaves the fix off: the variable off, or, off the platforms where the fix runs by
        default, not defined by the tree (nothing turns it on there)."""
        return self.decides and (self.state is GateState.OFF or
                                 (self.state is GateState.UNDEFINED and bool(self.gate.platforms)))

    def describe(self) -> str:
        if not self.decides:
            return f"on {self.platform} the fix runs without {self.gate.variable}: this tree's default there decides"
        where = "its default (no --server-env given: the defaults assumed)" if self.assumed_defaults else \
            "as given" if self.given else "its default (not given)"
        on = f"on {self.platform} (the fix runs by default only on {', '.join(self.gate.platforms)}): " \
            if self.gate.platforms else ""
        if self.state is GateState.UNDEFINED and self.gate.platforms:
            found = f"{on}gate {self.gate.variable}: not defined by this tree"
            return found + ("; the fix is present but off: this tree has no variable to turn it on there (a tree "
                            f"that defines {self.gate.variable} runs it with {self.turns_on})"
                            if self.code_status in GATED else ": answered by its code alone")
        if self.state is GateState.UNDEFINED:
            return f"gate {self.gate.variable}: not defined by this tree: answered by its code alone"
        if self.state is GateState.UNREAD:
            found = f"gate {self.gate.variable}: how this tree reads it is not established here ({self.why})"
            return found + (f"; the fix is present, but whether the server runs it is not known: set "
                            f"{self.turns_on} and check again" if self.code_status in GATED else "")
        found = f"{on}gate {self.gate.variable} = {_shown(self.value)}, {where}: {self.state.value}"
        if self.state is GateState.OFF and self.code_status in GATED:
            found += f"; the fix is present but off: set {self.turns_on} in the server's environment to turn it on"
        return found

    def to_json(self) -> dict:
        return {"variable": self.gate.variable, "on": self.gate.on, "state": self.state.value, "given": self.given,
                "assumed_defaults": self.assumed_defaults, "value": self.value,
                "code_status": self.code_status.value, "why": self.why, "gate_why": self.gate.why} | (
                    {"platform": self.platform, "platforms": list(self.gate.platforms), "decides": self.decides}
                    if self.gate.platforms else {})


# The code's answers that rest on the gated code running: with the gate off it does not.
GATED = (Status.FIXED, Status.PARTIAL)


@dataclass
class ConfigAnswer:
    """Whether the configuration given enters a fix's code path: True, False (an attribute whose effective value
    is established holds none of the values the path needs), or None (an attribute the path needs has no
    established value, or the tree's parser defines no such option: it cannot tell, and the answer is about the
    code)."""

    enters_path: bool | None
    needs: dict[str, list]  # the registry's: attribute -> the values that enter the path
    unmet: dict[str, Any]  # the attributes (and their effective values) that keep it off the path
    undefined: list[str]  # the attributes the tree's parser does not define
    code_status: Status  # the answer about the code alone
    why: str
    unestablished: dict[str, str] = field(default_factory=dict)  # attributes whose effective value is not known
    assumes: str = ""  # what the path needs that the server arguments do not say, assumed (the model's layers)

    def describe(self) -> str:
        assumed = f"; assumed, as no server argument says it: {self.assumes}" if self.assumes else ""
        if self.enters_path is None:
            unknown = [f"this tree's parser defines no {', '.join(self.undefined)}"] if self.undefined else []
            unknown += [f"{attr} has no established value: {why}" for attr, why in self.unestablished.items()]
            return f"the configuration given cannot tell: {'; '.join(unknown)}; answered about the code{assumed}"
        if self.enters_path:
            needs = "; ".join(_needs_shown(attr, values) for attr, values in self.needs.items())
            return f"the configuration given enters its path ({needs or 'every configuration does'}){assumed}"
        if self.code_status is Status.CANNOT_RUN:
            return "its code was not observed: its probe could not run"
        return f"its code alone: {self.code_status.value}"

    def to_json(self) -> dict:
        found = {"enters_path": self.enters_path, "needs": self.needs, "unmet": self.unmet,
                 "undefined": self.undefined, "unestablished": self.unestablished,
                 "code_status": self.code_status.value, "why": self.why}
        if self.assumes:  # absent where nothing is assumed: today's documents keep their bytes
            found["assumes"] = self.assumes
        return found


@dataclass
class ExperimentCheck:
    experiment: str
    pr: int
    status: Status
    scenarios: dict[str, Behaviour] = field(default_factory=dict)
    deciding: list[str] = field(default_factory=list)
    result_sha256: str | None = None
    error: str | None = None
    evidence: list[str] = field(default_factory=list)  # not affected: the observations that show it
    justification: str | None = None  # not affected: OpenVEX's justification
    not_deciding: list[str] = field(default_factory=list)  # the registry rules that set keys aside on this build
    # Per scenario that kept the build from fixed (pre-fix, neither, a departing control): its keys, the
    # build's value beside base's and head's.
    explain: Explained = field(default_factory=dict)
    config: ConfigAnswer | None = None  # given server arguments: whether they enter this fix's code path
    gate: GateAnswer | None = None  # a gated fix: whether the server environment turns it on
    unobserved: list[str] = field(default_factory=list)  # deciding keys the build never recorded: ``sid.key``

    @property
    def rests_on_configuration(self) -> bool:
        """Not affected because the configuration given never enters the code path (not because of the code)."""
        return self.config is not None and self.config.enters_path is False

    @property
    def gated_off(self) -> bool:
        """The code answers fixed (or partial) with its gate on, but the server environment does not turn it on."""
        return self.gate is not None and self.gate.code_status in GATED and \
            (self.gate.off or (self.gate.decides and self.gate.state is GateState.UNREAD))

    @property
    def deviations(self) -> Explained:
        """The controls the build departs from both sides on, with their keys."""
        return {sid: keys for sid, keys in self.explain.items() if self.scenarios.get(sid) is Behaviour.DEVIATES}

    def to_json(self) -> dict:
        found = {"experiment": self.experiment, "pr": self.pr, "status": self.status.value,
                 "scenarios": {sid: b.value for sid, b in self.scenarios.items()}, "deciding": self.deciding,
                 "result_sha256": self.result_sha256, "error": self.error, "explain": explained_json(self.explain)}
        if self.status is Status.NOT_AFFECTED:
            found.update(evidence=self.evidence, justification=self.justification)
        if self.not_deciding:
            found["not_deciding"] = self.not_deciding
        if self.unobserved:
            found["unobserved"] = self.unobserved
        if self.config is not None:
            found["configuration"] = self.config.to_json()
            found["rests_on"] = (RestsOn.CONFIGURATION if self.rests_on_configuration else RestsOn.CODE).value
        if self.gate is not None:
            found["gate"] = self.gate.to_json()
        return found


@dataclass
class CheckResult:
    target: Target
    experiments: list[ExperimentCheck]
    sglang_version: str | None = None  # what the build says it is: `sglang.__version__`
    containment: dict | None = None  # how its probe process ran (sandbox.Containment.record); None: unknown
    configuration: Configuration | None = None  # the server arguments given, as this tree's parser read them
    environment: Environment | None = None  # the server environment (given or default), as this tree read it
    platform: str = DEFAULT_PLATFORM  # the server's platform (check --server-platform)

    @property
    def exit_code(self) -> int:
        return worst(EXIT_OF[e.status] for e in self.experiments)

    def outside_of(self, experiment: str) -> list[Outside]:
        """The implementations the configuration runs, outside what the probes saw, that this experiment's needs
        name (its answer is about the covered ones only)."""
        outside = self.configuration.outside if self.configuration is not None else []
        return [o for o in outside if experiment in o.experiments]

    def to_json(self) -> dict:
        found = {"schema": SCHEMA, "target": {**self.target.to_json(), "sglang_version": self.sglang_version},
                 "exit_code": self.exit_code, "containment": self.containment, "server_platform": self.platform,
                 "experiments": [e.to_json() for e in self.experiments]}
        if self.configuration is not None:
            found["configuration"] = self.configuration.to_json()
        if self.environment is not None:
            found["environment"] = self.environment.to_json()
        return found


def judge(exp: Experiment, outcome: allprobes.Outcome, base: dict, head: dict,
          configuration: Configuration | None = None, environment: Environment | None = None,
          platform: str = DEFAULT_PLATFORM) -> ExperimentCheck:
    """One experiment's status from its result and the published base and head results; a gated fix the server
    environment leaves off (on the server's ``platform``) is affected; given the server configuration, not
    affected where it never enters the fix's code path (the code's own answer kept beside)."""
    found = _judge_code(exp, outcome, base, head)
    if exp.gate is not None and environment is not None:
        found = _gated(exp.gate, found, environment, platform)
    if configuration is None:
        return found
    needs = exp.needs
    wanted = needs.wanted() if needs else {}
    unknown = {attr: configuration.unestablished[attr] for attr in wanted if attr in configuration.unestablished}
    undefined = [attr for attr in needs.undefined(configuration.values) if attr not in unknown] if needs else []
    unmet = {attr: configuration.values[attr] for attr in needs.unmet(configuration.values)} if needs else {}
    # One established value off the path keeps it off (the path needs every attribute); otherwise every one
    # must be known.
    enters = False if unmet else None if undefined or unknown else True
    found.config = ConfigAnswer(enters, wanted, unmet, undefined, found.status, needs.why if needs else "", unknown,
                                needs.assumes if needs else "")
    if enters is not False or found.status is Status.NOT_AFFECTED:  # the code's own absence says more
        return found
    off = "; ".join(f"{attr} = {_shown(value)} (the path needs {_needed(wanted[attr])})"
                    for attr, value in unmet.items())
    evidence = f"the server configuration given ({configuration.given.source}) never enters it: {off}: {needs.why}"
    if found.status is Status.CANNOT_RUN:  # the configuration alone decides: say what was not seen
        evidence += f"; its code was not observed (its probe could not run: {found.error})"
    return ExperimentCheck(exp.name, exp.pr, Status.NOT_AFFECTED, found.scenarios, [], found.result_sha256,
                           found.error, [evidence], Justification.NOT_IN_EXECUTE_PATH.value,
                           found.not_deciding, {}, found.config)


def _gated(gate: Gate, found: ExperimentCheck, environment: Environment, platform: str) -> ExperimentCheck:
    """The code's answer under the server environment: the probe ran the fix with its gate on, so where the
    environment leaves it off the fix never runs (affected); where the tree's reading is not established, it is
    not an all-clear (unknown); a tree that does not define the variable answers by its code alone, except off
    the platforms where the fix runs by default (nothing turns it on there: affected). On those platforms the
    code's answer stands."""
    read = environment.gates.get(gate.variable) or {"state": GateState.UNREAD.value,
                                                     "why": "the probe process did not read it"}
    state = GateState(read["state"])
    answer = GateAnswer(gate, state, bool(read.get("given")), environment.given is None, read.get("value"),
                        found.status, read.get("why") or "", platform)
    found.gate = answer
    if found.status not in GATED or not found.gated_off:
        return found
    # The scenarios say what the code does with the gate on: none decides what the server runs.
    return dataclasses.replace(found, status=Status.AFFECTED if answer.off else Status.UNKNOWN, deciding=[])


def _judge_code(exp: Experiment, outcome: allprobes.Outcome, base: dict, head: dict) -> ExperimentCheck:
    """One experiment's status from its code alone: the sweep's judge (``classify.judge``), in check's words."""
    if outcome.doc is None:
        return ExperimentCheck(exp.name, exp.pr, Status.CANNOT_RUN, error=outcome.error)
    judged = classify.judge(outcome.doc, base, head, exp)
    status = STATUS_OF[judged.classification]
    deciding = judged.shown_by if status is Status.NOT_AFFECTED else \
        [sid for sid, b in judged.scenarios.items() if b in DECIDING[status]]
    return ExperimentCheck(exp.name, exp.pr, status, judged.scenarios, deciding, outcome.result_sha256, judged.raised,
                           judged.evidence, judged.justification.value if judged.justification else None,
                           judged.not_deciding, judged.explain, unobserved=judged.unobserved)


def interpreter_version(interpreter: Path) -> tuple[int, int]:
    """The interpreter's version, asked without site-packages (-I -S), contained like any process of the
    environment checked: it writes nothing."""
    command = [str(interpreter), "-I", "-S", "-c", "import sys; print(*sys.version_info[:2])"]
    try:
        with sandbox.launch(command, sandbox.View(), dict(os.environ), trusted=False,
                            what=f"the interpreter {interpreter}") as launch:
            done = children.run(launch.argv, env=launch.env, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=60)
    except OSError as exc:
        raise usage(f"cannot run {interpreter}: {exc}", todo="pass the python of the environment to check") from None
    try:
        major, minor = (int(part) for part in done.stdout.split())
    except ValueError:
        raise usage(f"{interpreter} is not a working Python interpreter: "
                    f"{(done.stderr or done.stdout).strip()[-300:]}") from None
    return major, minor


def check_interpreter(interpreter: Path) -> None:
    if not interpreter.exists():
        raise usage(f"no interpreter at {interpreter}",
                    todo="pass the python of the environment to check, e.g. /opt/venv/bin/python")
    found = interpreter_version(interpreter)
    if found < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        raise usage(f"{interpreter} is Python {found[0]}.{found[1]}; the probes need Python {need} or newer",
                    expected=f"the interpreter of an SGLang environment (SGLang itself needs Python >= {need})",
                    todo="check the environment SGLang runs in, or use --version/--wheel to check a build here")


def resolve(reg: Registry, *, python: Path | None = None, release: str | None = None, wheel: Path | None = None,
            path: Path | None = None, git: str | None = None) -> tuple[Target, trees.Tree | None]:
    """The target asked for, and the tree to install for it (None for an existing interpreter)."""
    if python is not None:
        python = Path(os.path.abspath(python))  # not resolve(): a venv's python is a link to its base
        check_interpreter(python)
        return Target("python", str(python)), None
    lock = trees.LockFile(tree_lock_file(reg.root))
    if release is not None:
        tree = trees.release_tree(release, reg.python, lock)
    elif wheel is not None:
        tree = trees.wheel_tree(wheel, reg.python)
    elif path is not None:
        tree = trees.path_tree(path)
    elif git is not None:
        tree = trees.git_tree(git, lock, clone=settings.get("SGLANG_REPO"))
    else:
        raise usage("check needs a target", expected="one of --python, --release, --wheel, --path, --git")
    return target_of(reg, tree), tree


def target_of(reg: Registry, tree: trees.Tree) -> Target:
    """A tree's target: run in the era its version, else its pins, choose."""
    ref = tree.origin if tree.kind == "path" else tree.ref
    choice = era_choice.choose(reg, tree)
    return Target(tree.kind, ref, tree.resolved, tree.digest, tree.version, choice.name, choice, tree.pins)


def resolve_image(reg: Registry, path: Path, *, log=print) -> list[tuple[Target, trees.Tree]]:
    """Every SGLang package in a saved image, each a target run in the era its dist-info's version names."""
    found = images.scan(path, log=log)
    if not found:
        raise usage(f"{path} holds no SGLang package",
                    expected="sglang/ and its sglang-<version>.dist-info in a site-packages or dist-packages "
                    "directory of the image, or the source an editable install of it names",
                    todo="check SGLang inside a running container with --python, or copy its tree out and use --path")
    targets = []
    for package in found:
        tree = package.tree()
        choice = era_choice.choose(reg, tree)
        targets.append((Target(IMAGE_KIND, str(package.image.archive), tree.version.told if tree.version else None,
                               tree.digest, tree.version, choice.name, choice, image=package), tree))
    return targets


def run(reg: Registry, target: Target, tree: trees.Tree | None, *, fresh_references: bool = False,
        log=print) -> CheckResult:
    return run_all(reg, [(target, tree)], fresh_references=fresh_references, log=log)[0]


def run_all(reg: Registry, targets: list[tuple[Target, trees.Tree | None]], *, fresh_references: bool = False,
            force: bool = False, log=print, server_args: ServerArguments | None = None,
            server_env: ServerEnvironment | None = None, engines: engine.Engines | None = None,
            server_platform: str = DEFAULT_PLATFORM) -> list[CheckResult]:
    """Every target, each judged on its own against the published base and head results (verified first), or
    with ``fresh_references`` against the fresh ones in runs/ (while republishing); every tree shares one warm
    engine per era (an unpacked wheel is what installing it gives; a source tree's Python code is all the probes
    load, so nothing is built), with their outcomes cached by what made them. Given ``server_args``, each tree's
    own parser reads them in its probe process, and they are part of what its outcome is cached by; so is the
    server environment (``server_env``) and, where a fix is gated, its variable, each read by the tree's own
    ``Envs``; a gate that holds only off some platforms is read for the server's platform (``server_platform``).
    ``engines``: engines kept across calls (a bisection's rounds), for the trees they see."""
    exps = list(reg.experiments.values())
    config_args = {**_config_args(exps, server_args), **_environment_args(exps, server_env)}
    for target, tree in targets:  # refused before anything is fetched, built or run
        if tree is None:
            sandbox.admit(False, f"the interpreter {target.ref}")
    directory = runs_dir(reg.root) if fresh_references else results_dir(reg.root)
    refs = {exp.name: references(reg, exp, directory, fresh=fresh_references) for exp in exps}
    names = [exp.name for exp in exps]
    out = runs_dir(reg.root) / "check"
    # One probe per tree: an image's package may be named twice (two platforms, or the image passed twice).
    warm_trees = list({tree.label(): tree for _, tree in targets if tree is not None}.values())
    engine_outcomes = warm.probe_trees(reg, warm_trees, names, {t.label(): {**_tree_args(t), **config_args} for t in warm_trees},
                                       out_dir=out, force=force, log=log, engines=engines) if warm_trees else {}
    moved = _in_own_eras(reg, warm_trees, engine_outcomes, log)
    if moved:
        engine_outcomes.update(warm.probe_trees(reg, list(moved.values()), names, {
            label: {**_tree_args(t), **config_args} for label, t in moved.items()}, out_dir=out, force=force, log=log,
            engines=engines))
        targets = [(_in_era_of(reg, target, moved[tree.label()]), tree) if tree and tree.label() in moved
                   else (target, tree) for target, tree in targets]
    own: dict[str, dict[str, allprobes.Outcome]] = {}  # interpreters, by label
    found = []
    for target, tree in targets:
        if tree is not None:
            outcomes = engine_outcomes[tree.label()]
        else:
            if target.label() not in own:
                own[target.label()] = _in_own_process(reg, names, target, out / target.label(), log, config_args)
            outcomes = own[target.label()]
        configuration = _configuration(exps, server_args, out / (tree.label() if tree else target.label()), target)
        environment = _environment(exps, server_env, out / (tree.label() if tree else target.label()), target)
        versions = {o.doc.get("sglang_version") for o in outcomes.values() if o.doc}
        version = versions.pop() if len(versions) == 1 else None
        if target.kind == "python":
            target.resolved = version
        judged = [judge(exp, outcomes[exp.name], refs[exp.name].base, refs[exp.name].head, configuration,
                        environment, server_platform) for exp in exps]
        if target.image is not None and target.image.install.choice is images.Choice.UNDECIDED:
            judged = [_undecided(e) for e in judged]
        found.append(CheckResult(target, judged, version, next(iter(outcomes.values())).containment, configuration,
                                 environment, server_platform))
    return found


def _undecided(found: ExperimentCheck) -> ExperimentCheck:
    """One of several copies in an image, when which one the server imports cannot be told: never an all-clear."""
    if found.status not in (Status.FIXED, Status.NOT_AFFECTED):
        return found
    return dataclasses.replace(found, status=Status.UNKNOWN, justification=None,
                               error=f"this copy reads {found.status.value}, but the server may import another copy "
                               "in the image (see the image's why)")


def _in_own_eras(reg: Registry, probed: list[trees.Tree], outcomes: dict[str, dict[str, allprobes.Outcome]],
                 log) -> dict[str, trees.Tree]:
    """By label, each source tree to probe again in the era its own ``sglang.__version__`` names: one whose
    probes could not run (not for want of memory) in the era chosen (``era_choice.in_own_era``)."""
    moved = {}
    for tree in probed:
        found = outcomes[tree.label()].values()
        said = {o.doc.get("sglang_version") for o in found if o.doc} - {None}
        if len(said) == 1 and any(o.doc is None and not o.out_of_memory for o in found):
            again = era_choice.in_own_era(reg, tree, said.pop())
            if again is not None:
                moved[tree.label()] = again
                log(f"check: {tree.label()}: {again.version.told} from {again.version.source}: probing it again "
                    f"in {era_choice.choose(reg, again).describe()}")
    return moved


def _in_era_of(reg: Registry, target: Target, tree: trees.Tree) -> Target:
    choice = era_choice.choose(reg, tree)
    return dataclasses.replace(target, version=tree.version, era=choice.name, era_choice=choice)


def _config_args(exps: list[Experiment], server_args: ServerArguments | None) -> dict[str, str]:
    """The probe driver's arguments for the server arguments given: them, and the attributes the fixes need."""
    if server_args is None:
        return {}
    attrs = sorted({attr for exp in exps if exp.needs for attr in exp.needs.attributes})
    return {warm.SERVER_ARGS: json.dumps(list(server_args.args)), "server_attrs": ",".join(attrs)}


def _configuration(exps: list[Experiment], server_args: ServerArguments | None, out: Path,
                   target: Target) -> Configuration | None:
    """The server arguments as the tree read them in its probe process, with the implementations they run that no
    experiment covers; an argument its parser or its resolution refused is a usage error naming it. A tree whose
    parser cannot be built here establishes no value."""
    if server_args is None:
        return None
    read = allprobes.read_config(out)
    which = f"{target.kind} {target.resolved or target.ref}"
    if read is None:
        raise HarnessError(f"the probe process of {which} did not read the server arguments ({server_args.source})",
                           todo=f"see the log under .cells/logs/; rerun with --force")
    error = read.get("error")
    if error and error.get("kind") == "arguments":
        named = f"{error['option']}: " if error.get("option") else ""
        raise usage(f"--server-args ({server_args.source}): {named}{error['message']}",
                    expected=f"the options the server of {which} defines (its ServerArgs.add_cli_args), with values "
                    "its ServerArgs accepts",
                    todo=f"fix or drop {error['option'] or 'that argument'}; the arguments as given: "
                    f"{' '.join(server_args.args)}")
    values = dict(read.get("values") or {})
    return Configuration(server_args, values, dict(read.get("unestablished") or {}), read.get("resolution"),
                         outside_probes(exps, values))


def _environment_args(exps: list[Experiment], server_env: ServerEnvironment | None) -> dict[str, str]:
    """The probe driver's arguments for the server environment given and the gates' variables: none where
    neither is (an ungated registry's outcomes are kept by what they always were)."""
    gates = {exp.gate.variable: exp.gate.on for exp in exps if exp.gate}
    found = {warm.SERVER_ENV: json.dumps(server_env.values(), sort_keys=True)} if server_env is not None else {}
    return found | ({warm.SERVER_GATES: json.dumps(gates, sort_keys=True)} if gates else {})


def _environment(exps: list[Experiment], server_env: ServerEnvironment | None, out: Path,
                 target: Target) -> Environment | None:
    """The server environment as the tree read it (its own Envs); a value it refuses is a usage error naming the
    variable, a name it defines nowhere a warning. None: neither an environment nor a gate to read."""
    if server_env is None and not any(exp.gate for exp in exps):
        return None
    read = allprobes.read_environment(out)
    which = f"{target.kind} {target.resolved or target.ref}"
    if read is None:
        if server_env is not None:
            raise HarnessError(f"the probe process of {which} did not read the server environment "
                               f"({server_env.source})", todo="see the log under .cells/logs/; rerun with --force")
        return Environment(None)  # each gate unread: never an all-clear
    error = read.get("error")
    if error and error.get("kind") == "environment":  # only a variable given is refused: a gate's default never is
        named = error.get("variable")
        raise usage(f"--server-env ({server_env.source if server_env else 'none given'}): {error['message']}",
                    expected=f"values the server of {which} accepts for its variables (its sglang.srt.environ Envs)",
                    todo=f"fix or drop {named or 'that variable'} in the server's environment")
    failed = read.get("envs_error")
    return Environment(server_env, dict(read.get("values") or {}), list(read.get("named") or []),
                       list(read.get("undefined") or []), dict(read.get("gates") or {}),
                       f"{failed['type']}: {failed['message']}" if failed else None)


def _tree_args(tree: trees.Tree | None, kind: str = "") -> dict[str, str]:
    return {"side": CHECK_SIDE, "tree_kind": tree.kind if tree else kind, "tree_ref": tree.ref if tree else "",
            "tree_resolved": tree.resolved if tree else ""}


def _in_own_process(reg: Registry, names: list[str], target: Target, out: Path, log,
                    config_args: dict[str, str]) -> dict[str, allprobes.Outcome]:
    """An interpreter as it is."""
    logfile = run_logs(work_dir(reg.root) / "logs" / "check") / f"{target.label()}.log"
    log(f"check: running every probe with {target.ref}")
    # Nothing may be written inside the environment checked: no bytecode caches, not even the probes'.
    return allprobes.run(reg, target.ref, names, {**_tree_args(None, target.kind), **config_args}, out_dir=out,
                         log=logfile,
                         env={"PYTHONDONTWRITEBYTECODE": "1"})


def describe(result: CheckResult) -> str:
    target = result.target
    if target.image is not None:
        version = target.version
        told = f"sglang {version.told} from {version.source.removeprefix(target.image.install.site + '/')}" \
            if version else "version not told (no dist-info, no version.py literal)"
        era = f"era {target.era}" if target.era else "today's closure"
        return f"image {target.image.describe()}: {told}, run in {era}"
    if target.kind in ("release", "wheel"):
        return f"{target.kind} {target.resolved}"
    commit = ""
    if target.kind == "path" and target.resolved:
        commit = f" at {target.resolved}" if trees.commit_of(target.resolved) else \
            f" (outside git, content {target.resolved.partition('-')[2]})"
    found = f" (sglang {result.sglang_version})" if result.sglang_version else ""
    if target.kind == "python":
        return f"{target.kind} {target.ref}{found}"
    # A source tree's own __version__ is often a build's fallback (0.0.0.dev0): the commit's version decides.
    told = f"version {target.version.describe()}" if target.version else \
        "version not told (no version.py or _version.py literal, static pyproject version or version tag)"
    era = f"era {target.era}" if target.era else "today's closure"
    same = target.version and result.sglang_version in (target.version.version, target.version.told)
    said = f"; sglang.__version__ says {result.sglang_version}" if result.sglang_version and not same else ""
    return f"{target.kind} {target.ref}{commit}: {told}, run in {era}{said}"


# What the table names after each status: the scenarios that put it there (then any departing control).
SHOWN = {Status.FIXED: (Behaviour.FIXED,), Status.AFFECTED: (Behaviour.PRE_FIX,),
         Status.PARTIAL: (Behaviour.PRE_FIX, Behaviour.FIXED, Behaviour.NEITHER), Status.UNKNOWN: (Behaviour.NEITHER,),
         Status.DEVIATES: (Behaviour.FIXED, Behaviour.DEVIATES)}
LABEL = {Behaviour.PRE_FIX: "pre-fix", Behaviour.FIXED: "fixed", Behaviour.NEITHER: "matches neither side",
         Behaviour.DEVIATES: "departs from both sides on the controls"}


def table(result: CheckResult, *, verbose: bool = False) -> str:
    """One line per experiment: status, the scenarios that decided it, and whatever raised whatever the status.
    Below it, each scenario matching neither side and each departing control with one key beside base's and
    head's; ``verbose``: every scenario that kept the build from fixed, with all its keys."""
    lines = [f"sglang check: {describe(result)}"]
    if result.target.kind in SOURCE_KINDS and result.target.era_choice:
        lines.append(f"  era: {result.target.era_choice.describe()}")
    if result.target.image is not None:
        lines.append(f"  {CHOICE[result.target.image.install.choice]}: {result.target.image.install.why}")
    if result.configuration is not None:
        lines.append(f"  server configuration: {result.configuration.describe()}")
        lines += [f"  OUTSIDE THE PROBES: {outside.describe()}" for outside in result.configuration.outside]
    if result.environment is not None:
        lines.append(f"  server environment: {result.environment.describe()}")
        lines += [f"  {warning}" for warning in result.environment.warnings()]
    if any(e.gate is not None and e.gate.gate.platforms for e in result.experiments):
        lines.append(f"  server platform: {result.platform}")
    width = max((len(e.experiment) for e in result.experiments), default=0)  # the fixes' column
    for e in result.experiments:
        by = {b: [sid for sid, got in e.scenarios.items() if got is b] for b in Behaviour}
        if e.status is Status.CANNOT_RUN:
            parts = [f"could not run: {e.error}"]
        elif e.rests_on_configuration:
            parts = ["not in the execute path of the configuration given: " + "; ".join(e.evidence)]
        elif e.status is Status.NOT_AFFECTED:
            parts = ["the vulnerable path is not in this build: " + "; ".join(e.evidence)]
        elif e.gated_off:
            parts = [e.gate.describe()]
        else:
            parts = [f"{LABEL[b]}: {', '.join(by[b])}" for b in dict.fromkeys([*SHOWN[e.status], Behaviour.DEVIATES])
                     if by[b]] + ([f"raised: {e.error}"] if e.error else []) \
                + ([f"not observed: {', '.join(e.unobserved)}"] if e.unobserved else [])
        lines.append(f"  {e.experiment:<{width}} {e.status.value:<12} PR #{e.pr}  {'; '.join(parts)}")
        if verbose:
            detail = explained_text(e.explain)
        else:  # a pre-fix scenario's name says it all (it behaves as base); the others are surprises to read
            detail = explained_brief({sid: keys for sid, keys in e.explain.items()
                                      if e.scenarios.get(sid) is not Behaviour.PRE_FIX})
        lines += [f"  {'':<{width}} {line}" for line in detail]
        lines += [f"  {'':<{width}} judged without {rule}" for rule in e.not_deciding]
        if e.config is not None:
            lines.append(f"  {'':<{width}} {e.config.describe()}")
        lines += [f"  {'':<{width}} no answer for {o.attribute} = {_shown(o.value)}: outside what the probes saw"
                  for o in result.outside_of(e.experiment)]
        if e.gate is not None and not e.gated_off:
            lines.append(f"  {'':<{width}} {e.gate.describe()}")
    lines.append(f"  ran {sandbox.describe(result.containment)}")  # how the tree's code ran on this machine
    return "\n".join(lines)
