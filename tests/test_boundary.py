"""One error boundary: a crash is exit 7 with its traceback, never a verdict; a bad setting is a usage error."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from synthetic import make_project

from pdevidence import cli, registry
from pdevidence.commands import matrix
from pdevidence.cells import cells
from pdevidence.core import errors, settings
from pdevidence.core.paths import PROJECT
from pdevidence.lanes import check
from pdevidence.registry import TorchChannel

BUG = "this is a bug in pdevidence"


def test_a_bad_probe_timeout_is_a_usage_error_naming_the_variable_not_a_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pdevidence", "check", "--version", "0.5.20"], cwd=PROJECT,
                          env={**os.environ, "PDEVIDENCE_PROBE_TIMEOUT": "abc", "PDEVIDENCE_CACHE": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == errors.USAGE, done.stderr
    assert "PDEVIDENCE_PROBE_TIMEOUT='abc'" in done.stderr and "positive number of seconds" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("name", "value"), [
    ("PDEVIDENCE_PROBE_TIMEOUT", "abc"), ("PDEVIDENCE_PROBE_TIMEOUT", "-5"), ("PDEVIDENCE_PROBE_TIMEOUT", "inf"),
    ("PDEVIDENCE_TORCH", "cuda"), ("PDEVIDENCE_UPSTREAM_KIND", "wheel"),
    ("PDEVIDENCE_INDEX_URL", "pypi.org/simple"), ("PDEVIDENCE_GIT_ARCHIVE_URL", "https://example.org/{commit}"),
    ("PDEVIDENCE_GIT_ARCHIVE_URL", "https://example.org/archive.tar.gz"),
])
def test_every_setting_is_checked_before_any_command_runs(name, value, monkeypatch, capsys):
    monkeypatch.setenv(name, value)
    assert cli.main(["verify"]) == errors.USAGE
    err = capsys.readouterr().err
    assert f"{name}={value!r}" in err and settings.SETTINGS[name].accepted in err


def test_the_torch_setting_accepts_exactly_the_registrys_channels():
    assert settings.TORCH_CHANNELS == tuple(c.value for c in TorchChannel)


def test_an_unexpected_exception_in_check_is_an_internal_error_never_affected(monkeypatch, capsys):
    def crash(*args, **kw):
        raise ValueError("something the harness did not expect")

    monkeypatch.setattr(check, "resolve", crash)
    assert cli.main(["check", "--version", "0.5.20"]) == errors.INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: something the harness did not expect" in err and BUG in err


def test_an_unexpected_exception_in_a_worker_fails_its_cell_as_a_bug_and_the_others_still_run(tmp_path, monkeypatch,
                                                                                              capsys):
    reg = registry.load(make_project(tmp_path))
    ran = []

    def run_cell(reg_, cell, **kw):
        ran.append(cell.side)
        if cell.side == "base":
            raise KeyError("no such thing")

    monkeypatch.setattr(cells, "run_cell", run_cell)
    assert matrix.run_cells(reg, cells.matrix(reg, "release"), jobs=2) == errors.INTERNAL
    assert sorted(ran) == ["base", "head"]
    err = capsys.readouterr().err
    assert "internal error in cell release(demo, base)" in err and "KeyError" in err and "Traceback" in err


def test_the_internal_error_outranks_every_other_code():
    assert errors.worst([errors.USAGE, errors.INTERNAL, errors.CONFIRMED]) == errors.INTERNAL
    assert errors.INTERNAL not in (errors.CONFIRMED, errors.BEHAVIOUR_DIFFERS) and errors.INTERNAL in errors.EXIT_CODES


def test_a_nox_session_turns_a_crash_into_the_internal_error(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("pdevidence_noxfile", PROJECT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)

    def crash(argv):
        raise RuntimeError("boom")

    monkeypatch.setattr(noxfile.cli, "main", crash)
    monkeypatch.setattr(sys, "argv", ["nox", "-s", "verify"])  # alone: the harness's code is nox's
    session = SimpleNamespace(name="verify")
    with pytest.raises(SystemExit) as caught:
        noxfile._run(session, "verify")
    assert caught.value.code == errors.INTERNAL
    assert BUG in capsys.readouterr().err


DEMO_PROBE = '''
from _probekit import ScenarioSet

demo = ScenarioSet("demo")


def prepare():
    return "1.0"


@demo.scenario("D1", "one")
def d1(obs):
    obs["x"] = 1
'''


@pytest.mark.parametrize("driver", ["probe_all", "probe_mutants"])
def test_a_driver_that_fails_outside_a_scenario_could_not_run_and_prints_its_traceback(driver, tmp_path):
    probe = tmp_path / "probe_demo_differential.py"
    probe.write_text(DEMO_PROBE)
    (tmp_path / "specs.json").write_text("[]")
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # nothing can be written beneath a file: the driver's own write fails
    args = ([str(probe), "--out-dir", str(blocked / "out")] if driver == "probe_all"
            else ["--probe", str(probe), "--mutants", str(tmp_path / "specs.json"), "--out", str(blocked / "out.json")])
    done = subprocess.run([sys.executable, str(PROJECT / "probes" / f"{driver}.py"), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 3, done.stderr
    assert "Traceback" in done.stderr and "bug in pdevidence's probes" in done.stderr


def test_a_probe_result_is_written_0644(tmp_path):
    probe = tmp_path / "probe_demo_differential.py"
    probe.write_text(DEMO_PROBE + "\n\nif __name__ == '__main__':\n    import sys\n    from _probekit import main\n"
                     "    sys.exit(main(demo, prepare))\n")
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "probes")}
    subprocess.run([sys.executable, str(probe), "--out", str(out)], check=True, env=env, timeout=120)
    assert Path(out).stat().st_mode & 0o777 == 0o644


def test_the_docs_document_every_exit_code():
    page = (PROJECT / "docs" / "operators" / "exit-codes.md").read_text()
    section = page[page.index("| code | meaning |"):page.index("## `check`")]
    documented = {int(code) for line in section.splitlines() if line.startswith("| ")
                  for code in line.split("|")[1].split("/") if code.strip().isdigit()}
    assert set(errors.EXIT_CODES) <= documented
