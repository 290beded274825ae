"""The operators' GitHub Action (action.yml): it lints, and its steps do what its docs say.

actionlint checks workflows, and of a local action only its metadata; so the action's own steps are
also linted as the one job of a reusable workflow made from them (the action's inputs as its
inputs, its outputs as its outputs), shellcheck reading their scripts. The `check` step is then run
in bash as a runner runs it (expressions evaluated first, then the script), with a stub
`pdevidence` that records its command line, which the real CLI must parse. The real test installs
the action from a copy of this repository and checks a release with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from real_runs import CHECKED
from test_docs import docs_parser

from pdevidence import cli, commands, environments
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed: python -m pip install -r requirements-dev.txt")

ACTION = PROJECT / "action.yml"
TARGET_INPUTS = {"release": "--release", "wheel": "--wheel", "path": "--path", "image": "--image", "python": "--python"}
EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def action() -> dict:
    return yaml.safe_load(ACTION.read_text(encoding="utf-8"))


def tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def actionlint(root: Path) -> subprocess.CompletedProcess:
    """actionlint, with shellcheck over the scripts (without it, actionlint would skip them silently)."""
    exe, shellcheck = tool("actionlint"), tool("shellcheck")
    if exe is None or shellcheck is None:
        pytest.skip("actionlint or shellcheck is not installed: python -m pip install -r requirements-dev.txt")
    args = [exe, "-no-color", "-shellcheck", shellcheck]
    return subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=120)


def lint_tree(tmp_path: Path, workflow: dict | str) -> Path:
    """A repository holding the action at its top and one workflow (actionlint finds a project by its .git)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ACTION, tmp_path / "action.yml")
    text = workflow if isinstance(workflow, str) else yaml.safe_dump(workflow, sort_keys=False)
    (tmp_path / ".github" / "workflows" / "lint.yml").write_text(text)
    return tmp_path


def test_actionlint_accepts_the_action_used_with_every_input(tmp_path):
    meta = action()
    uses = {"id": "pd", "uses": "./", "with": {name: "x" for name in meta["inputs"]}}
    show = {"run": " ".join(f"echo ${{{{ steps.pd.outputs.{name} }}}};" for name in meta["outputs"])}
    workflow = {"name": "use", "on": "push", "jobs": {"check": {"runs-on": "ubuntu-latest", "steps": [
        {"uses": "actions/checkout@v4"}, uses, show]}}}
    proc = actionlint(lint_tree(tmp_path, workflow))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_accepts_the_action_steps_as_a_workflow_job(tmp_path):
    meta = action()
    inputs = {name: {"type": "string", "required": False, "default": spec.get("default", "")}
              for name, spec in meta["inputs"].items()}
    outputs = {name: {"value": f"${{{{ jobs.action.outputs.{name} }}}}"} for name in meta["outputs"]}
    job = {"runs-on": "ubuntu-latest", "steps": meta["runs"]["steps"],
           "outputs": {name: spec["value"] for name, spec in meta["outputs"].items()}}
    workflow = {"name": "action-steps", "on": {"workflow_call": {"inputs": inputs, "outputs": outputs}},
                "jobs": {"action": job}}
    proc = actionlint(lint_tree(tmp_path, workflow))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_an_undefined_input(tmp_path):
    """The lint above can fail: an input the action does not declare is an error."""
    workflow = {"name": "use", "on": "push", "jobs": {"check": {"runs-on": "ubuntu-latest", "steps": [
        {"uses": "actions/checkout@v4"}, {"uses": "./", "with": {"release": "0.5.20", "version": "0.5.20"}}]}}}
    proc = actionlint(lint_tree(tmp_path, workflow))
    assert proc.returncode == 1 and 'input "version" is not defined' in proc.stdout


def test_the_action_declares_what_its_docs_promise():
    meta = action()
    assert meta["runs"]["using"] == "composite"
    assert set(TARGET_INPUTS) | {"server-args", "server-args-file", "server-env", "server-env-file", "references",
                                 "fail-on-affected", "openvex"} == set(meta["inputs"])
    assert meta["inputs"]["fail-on-affected"]["default"] == "true"  # affected fails the step unless told otherwise
    assert meta["inputs"]["references"]["default"] == "published"
    assert set(meta["outputs"]) == {"openvex", "exit-code"}
    install = step("Install pdevidence")
    assert '"${ACTION_PATH}[zstd]"' in install["run"] and "pip install" in install["run"]


def step(name: str) -> dict:
    return next(s for s in action()["runs"]["steps"] if s.get("name") == name or s.get("id") == name)


STUB = """#!/bin/sh
printf '%s\\0' "$@" > "$STUB_ARGS"
env > "$STUB_ENV"
while [ $# -gt 0 ]; do
    if [ "$1" = --openvex ] && [ "$STUB_WRITES" = yes ]; then echo '{}' > "$2"; fi
    shift
done
exit "${STUB_EXIT:-0}"
"""


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, tmp: Path):
        self.code = proc.returncode
        self.log = proc.stdout + proc.stderr
        out = tmp / "github_output"
        self.outputs = dict(line.split("=", 1) for line in out.read_text().splitlines()) if out.exists() else {}
        args = tmp / "args"
        self.argv = args.read_text().split("\0")[:-1] if args.exists() else None  # an argument may hold lines
        env = tmp / "env"
        self.env = dict(line.split("=", 1) for line in env.read_text().splitlines() if "=" in line) \
            if env.exists() else {}


def run_check_step(tmp_path: Path, inputs: dict[str, str], *, stub_exit: int = 0, writes: bool = True,
                   env: dict[str, str] | None = None) -> Run:
    """The `check` step as a runner runs it: inputs with the action's defaults, expressions evaluated."""
    meta = action()
    given = {name: inputs.get(name, spec.get("default", "")) for name, spec in meta["inputs"].items()}
    assert set(inputs) <= set(given), set(inputs) - set(given)
    temp = tmp_path / "runner-temp"
    venv_bin = temp / "pdevidence-venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "pdevidence").write_text(STUB)
    (venv_bin / "pdevidence").chmod(0o755)
    context = {"github.action_path": str(PROJECT), "runner.temp": str(temp),
               "steps.python.outputs.python-path": "/opt/python3.12/bin/python",
               **{f"inputs.{name}": value for name, value in given.items()}}

    def evaluate(text: str) -> str:
        return EXPRESSION.sub(lambda m: context[m.group(1)], text)

    check = step("check")
    step_env = {name: evaluate(str(value)) for name, value in check["env"].items()}
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GITHUB_OUTPUT": str(tmp_path / "github_output"),
            "STUB_ARGS": str(tmp_path / "args"), "STUB_ENV": str(tmp_path / "env"), "STUB_EXIT": str(stub_exit),
            "STUB_WRITES": "yes" if writes else "no"}
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    proc = subprocess.run(["bash", "-e", "-c", evaluate(check["run"])], cwd=workspace, capture_output=True,
                          text=True, timeout=60, env={**base, **(env or {}), **step_env})
    return Run(proc, tmp_path)


def test_every_step_expression_is_one_the_runner_gives():
    """run_check_step evaluates these only: anything else in the action would be untested."""
    known = {"github.action_path", "runner.temp", "steps.python.outputs.python-path"}
    for s in action()["runs"]["steps"]:
        for value in [*s.get("env", {}).values(), s.get("run", ""), *s.get("with", {}).values()]:
            for expr in EXPRESSION.findall(str(value)):
                assert expr in known or expr.startswith("inputs."), expr


def test_each_target_input_line_is_one_option_and_the_cli_parses_them(tmp_path):
    run = run_check_step(tmp_path, {"release": "0.5.19\n  0.5.20  \n\n", "wheel": "./a b.whl",
                                    "path": "src/sglang\n", "image": "sglang.tar", "python": "/opt/venv/bin/python"})
    assert run.code == 0, run.log
    vex = str(tmp_path / "runner-temp" / "pdevidence" / "openvex.json")
    assert run.argv == ["check", "--release", "0.5.19", "--release", "0.5.20",
                        "--wheel", "./a b.whl", "--path", "src/sglang", "--image", "sglang.tar",
                        "--python", "/opt/venv/bin/python",
                        "--references", "published", "--openvex", vex, "--verbose"]
    args = docs_parser().parse_args(run.argv)  # the paths need not exist here
    assert args.release == ["0.5.19", "0.5.20"] and args.openvex == Path(vex)
    assert run.outputs == {"exit-code": "0", "openvex": vex}
    # The installed tool keeps its state where it always does (the user's cache and state directories).
    assert run.env["PDEVIDENCE_PYTHON"] == "/opt/python3.12/bin/python"
    assert "PDEVIDENCE_WORK" not in run.env and "PDEVIDENCE_RUNS" not in run.env


def test_a_workflow_may_choose_the_openvex_file_references_and_runs(tmp_path):
    run = run_check_step(tmp_path, {"release": "0.5.20", "references": "fresh", "openvex": "out/vex.json"},
                         env={"PDEVIDENCE_RUNS": str(tmp_path / "my-runs")})
    assert run.code == 0, run.log
    assert run.argv[-5:] == ["--references", "fresh", "--openvex", "out/vex.json", "--verbose"]
    assert (tmp_path / "workspace" / "out" / "vex.json").is_file()
    assert run.outputs["openvex"] == "out/vex.json"
    assert run.env["PDEVIDENCE_RUNS"] == str(tmp_path / "my-runs")
    docs_parser().parse_args(run.argv)


def test_the_server_configuration_is_passed_whole_and_the_cli_splits_it(tmp_path):
    given = "--model-path '/models/my model' \\\n  --disaggregation-mode decode\n"
    run = run_check_step(tmp_path, {"release": "0.5.20", "server-args": given})
    assert run.code == 0, run.log
    assert run.argv[:5] == ["check", "--release", "0.5.20", "--server-args", given]
    args = docs_parser().parse_args(run.argv)
    assert args.server_args.args == ("--model-path", "/models/my model", "--disaggregation-mode", "decode")


def test_the_server_launch_command_may_be_a_file(tmp_path):
    launch = tmp_path / "decode.sh"
    launch.write_text("python -m sglang.launch_server --model-path /m --disaggregation-mode decode\n")
    run = run_check_step(tmp_path, {"release": "0.5.20", "server-args-file": str(launch), "server-args": " \n"})
    assert run.code == 0, run.log
    assert run.argv[3:5] == ["--server-args-file", str(launch)]
    assert docs_parser().parse_args(run.argv).server_args == launch
    run = run_check_step(tmp_path / "none", {"release": "0.5.20"})
    assert not any(arg.startswith("--server-args") for arg in run.argv)  # no configuration: answers about the code


def test_the_server_environment_is_passed_a_variable_a_line_after_its_files(tmp_path):
    env_file = tmp_path / "decode.env"
    env_file.write_text("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=false\n")
    lines = "  SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=true \n\nA=b c\n"  # blanks and padding dropped
    run = run_check_step(tmp_path, {"release": "0.5.20", "server-env-file": f"{env_file}\n", "server-env": lines})
    assert run.code == 0, run.log
    assert run.argv[3:9] == ["--server-env-file", str(env_file),
                             "--server-env", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=true",
                             "--server-env", "A=b c"]
    args = cli.parser().parse_args(run.argv)  # the real parser: it reads the file
    assert commands.check.server_environment(args).values() == {
        "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "true", "A": "b c"}  # the line given wins over the file
    run = run_check_step(tmp_path / "none", {"release": "0.5.20"})
    assert not any(arg.startswith("--server-env") for arg in run.argv)  # none given: every default


@pytest.mark.parametrize(("fail_on_affected", "stub_exit", "step_code"), [
    ("true", 0, 0),
    ("true", 1, 1),   # affected, partial or unknown fails the step by default
    ("false", 1, 0),  # ... unless told otherwise
    ("false", 3, 3),  # cannot run is never an answer about the fixes
    ("false", 8, 8),  # nor is stale evidence
    ("false", 2, 2),
])
def test_affected_fails_the_step_unless_told_otherwise(tmp_path, fail_on_affected, stub_exit, step_code):
    run = run_check_step(tmp_path, {"release": "0.5.20", "fail-on-affected": fail_on_affected}, stub_exit=stub_exit)
    assert run.code == step_code, run.log
    assert run.outputs["exit-code"] == str(stub_exit)
    assert ("::warning::" in run.log) == (stub_exit == 1 and fail_on_affected == "false")


def test_no_openvex_output_when_check_wrote_none(tmp_path):
    run = run_check_step(tmp_path, {"release": "0.5.20"}, stub_exit=errors.USAGE, writes=False)
    assert run.code == errors.USAGE
    assert run.outputs == {"exit-code": str(errors.USAGE)}


@pytest.mark.parametrize(("inputs", "message"), [
    ({}, "nothing to check: give at least one of the inputs release, wheel, path, image, python"),
    ({"release": " \n \n"}, "nothing to check"),
    ({"release": "0.5.20", "fail-on-affected": "yes"}, "fail-on-affected is 'yes': expected true or false"),
    ({"release": "0.5.20", "server-args": "--disaggregation-mode decode", "server-args-file": "launch.sh"},
     "give one of the inputs server-args and server-args-file, not both"),
])
def test_bad_inputs_are_usage_errors_before_anything_runs(tmp_path, inputs, message):
    run = run_check_step(tmp_path, inputs)
    assert run.code == errors.USAGE
    assert f"::error::{message}" in run.log
    assert run.argv is None  # pdevidence never ran


@pytest.mark.sglang
def test_the_action_installs_pdevidence_and_checks_a_release(tmp_path):
    """Alone proves: both steps of the GitHub Action for real, from a copy of this repository's tracked files (what
    a runner downloads): the wheel it installs answers with its own copy of the published evidence, and the step
    passes an affected release with fail-on-affected false, the exit code and the OpenVEX document as outputs."""
    python = environments.find_python("3.12").path  # what the action's setup-python step provides
    copy = tmp_path / "action"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (PROJECT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT / rel, copy / rel)
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    inputs = {name: spec.get("default", "") for name, spec in action()["inputs"].items()}
    inputs.update({"release": "0.5.20", "fail-on-affected": "false"})
    context = {"github.action_path": str(copy), "runner.temp": str(temp), "steps.python.outputs.python-path": python,
               **{f"inputs.{name}": value for name, value in inputs.items()}}
    output = tmp_path / "github_output"
    for name in ("Install pdevidence", "check"):
        s = step(name)
        env = {k: EXPRESSION.sub(lambda m: context[m.group(1)], str(v)) for k, v in s["env"].items()}
        proc = subprocess.run(["bash", "-e", "-c", s["run"]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=1800, env={**os.environ, "GITHUB_OUTPUT": str(output),
                                                 "PDEVIDENCE_RUNS": str(tmp_path / "runs"), **env})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    told = dict(re.findall(r"^  (\w+) +(affected|fixed|partial|deviates|unknown|not affected|cannot run) ",
                           proc.stdout, re.MULTILINE))
    assert told == CHECKED["0.5.20"], proc.stdout  # the action's platform is CUDA, as check's default
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert outputs["exit-code"] == "1"  # affected, and the step passed: fail-on-affected is false
    vex = json.loads(Path(outputs["openvex"]).read_text())
    status = {s["vulnerability"]["name"]: s["status"] for s in vex["statements"]}
    assert sorted(status.values()) == ["affected"] * 3 + ["fixed"] * 9, status  # one statement per experiment


def docs_workflows() -> list[tuple[str, dict | str]]:
    """Every YAML block of the pages that uses the action, as a workflow that uses this checkout's copy
    (a fragment of steps becomes a job of its own)."""
    from test_docs import PAGES, fences, rel

    found = []
    for page in PAGES:
        for lang, body in fences(page.read_text(encoding="utf-8")):
            if lang != "yaml" or "pdevidence@" not in body:
                continue
            text = re.sub(r"uses: \S+/pdevidence@\S+", "uses: ./", textwrap.dedent(body))
            steps = yaml.safe_load(text)
            if isinstance(steps, list):  # YAML reads a whole workflow's `on` as true: only fragments are rebuilt
                text = {"name": "example", "on": "push", "jobs": {"check": {"runs-on": "ubuntu-latest", "steps": [
                    {"uses": "actions/checkout@v4"}, *steps]}}}
            found.append((rel(page), text))
    return found


def test_the_docs_show_the_action_in_use():
    assert {page for page, _ in docs_workflows()} >= {"README.md", "docs/operators/github-action.md"}


@pytest.mark.parametrize(("page", "workflow"), docs_workflows(), ids=[p for p, _ in docs_workflows()])
def test_every_workflow_the_docs_show_lints_with_the_action(tmp_path, page, workflow):
    proc = actionlint(lint_tree(tmp_path, workflow))
    assert proc.returncode == 0, f"{page}: " + proc.stdout + proc.stderr


CONTAIN_STUBS = {  # what the containment step calls, each recording its command line
    "id": '#!/bin/sh\necho 1000\n',  # not root: through sudo
    "sudo": '#!/bin/sh\necho "sudo $*" >> "$CALLS"\n[ "$1" = -n ] && shift\nexec "$@"\n',
    "apt-get": '#!/bin/sh\necho "apt-get $*" >> "$CALLS"\n',
    "sysctl": '#!/bin/sh\necho "sysctl $*" >> "$CALLS"\n',
}


@pytest.mark.parametrize("installed", [True, False])
def test_the_containment_step_installs_bubblewrap_only_where_it_is_missing(tmp_path, installed):
    """The action's step runs .github/scripts/contain.sh, which the workflow's probe jobs run too."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    scripts = {**CONTAIN_STUBS, **({"bwrap": "#!/bin/sh\n"} if installed else {})}
    for name, text in scripts.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    for real in ("cat", "bash"):
        (stubs / real).symlink_to(shutil.which(real))
    calls = tmp_path / "calls"
    script = step("Contain the code checked")["run"].replace('"$ACTION_PATH', f'"{PROJECT}')
    proc = subprocess.run([shutil.which("bash"), "-e", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(stubs), "CALLS": str(calls)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = calls.read_text().splitlines() if calls.exists() else []
    restricted = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    lifted = ["sudo -n sysctl -q -w kernel.apparmor_restrict_unprivileged_userns=0",
              "sysctl -q -w kernel.apparmor_restrict_unprivileged_userns=0"] \
        if restricted.exists() and restricted.read_text().strip() == "1" else []
    installs = [] if installed else ["sudo -n apt-get update -qq", "apt-get update -qq",
                                     "sudo -n apt-get install -y -qq bubblewrap", "apt-get install -y -qq bubblewrap"]
    assert done == installs + lifted
