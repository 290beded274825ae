"""`.ci/run` from a fresh clone, with every tool it calls replaced by a stub that records the call."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from pdevidence.core.paths import PROJECT

RECORD = '#!/bin/sh\necho "{name} $*" >> "$CALLS"\n'
STUBS = {
    # The venv's python records what it is asked to run.
    "python3": RECORD.format(name="python3") + 'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; '
               'printf \'#!/bin/sh\\necho "venv-python $*" >> "$CALLS"\\n\' > "$3/bin/python"; '
               'chmod +x "$3/bin/python"; fi\n',
    "ldconfig": RECORD.format(name="ldconfig") + 'echo "\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6"\n'
                '[ "$HAS_CAIRO" = yes ] && echo "\tlibcairo.so.2 (libc6,x86-64) => /lib/libcairo.so.2"\nexit 0\n',
    "apt-get": RECORD.format(name="apt-get"),
    "sha256sum": RECORD.format(name="sha256sum") + 'exit "${SUMS_EXIT:-0}"\n',
    "id": '#!/bin/sh\necho 0\n',  # root: apt-get without sudo
}


def ci_run(tmp_path, **env):
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(PROJECT / ".ci" / "run", clone / ".ci" / "run")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    path = f"{stubs}:/usr/bin:/bin"
    if env.pop("HAS_BWRAP", "yes") == "no":  # only the tools the script needs besides the stubs: no bwrap
        tools = tmp_path / "tools"
        tools.mkdir()
        for name in ("grep", "dirname", "cat", "mkdir", "chmod", "date", "df", "tail"):
            (tools / name).symlink_to(shutil.which(name))
        path = f"{stubs}:{tools}"
    else:
        (stubs / "bwrap").write_text("#!/bin/sh\n")
        (stubs / "bwrap").chmod(0o755)
    done = subprocess.run([shutil.which("bash"), ".ci/run"], cwd=clone, capture_output=True, text=True, timeout=60,
                          env={"PATH": path, "CI": "true", "CALLS": str(calls), "HOME": str(tmp_path), **env})
    return done, calls.read_text().splitlines() if calls.exists() else []


SETUP_AND_TESTS = [
    "python3 -m venv .ci-venv",
    "venv-python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt",
    "sha256sum -c --quiet SHA256SUMS.txt",
    "venv-python -m pytest --sglang",
]


def test_with_libcairo_present_it_installs_the_tools_checks_the_sums_and_runs_the_readme_tests(tmp_path):
    done, calls = ci_run(tmp_path, HAS_CAIRO="yes")
    assert done.returncode == 0, done.stderr
    assert calls == ["ldconfig -p", *SETUP_AND_TESTS]


def test_without_libcairo_it_installs_it_first(tmp_path):
    done, calls = ci_run(tmp_path, HAS_CAIRO="no")
    assert done.returncode == 0, done.stderr
    assert calls == ["ldconfig -p", "apt-get update", "apt-get install -y libcairo2", *SETUP_AND_TESTS]


def test_without_bubblewrap_it_installs_it_with_what_else_is_missing(tmp_path):
    done, calls = ci_run(tmp_path, HAS_CAIRO="no", HAS_BWRAP="no")
    assert done.returncode == 0, done.stderr
    assert calls == ["ldconfig -p", "apt-get update", "apt-get install -y libcairo2 bubblewrap", *SETUP_AND_TESTS]
    done, calls = ci_run(tmp_path / "again", HAS_CAIRO="yes", HAS_BWRAP="no")
    assert calls == ["ldconfig -p", "apt-get update", "apt-get install -y bubblewrap", *SETUP_AND_TESTS]


def test_sums_that_do_not_match_stop_it_before_the_tests(tmp_path):
    done, calls = ci_run(tmp_path, HAS_CAIRO="yes", SUMS_EXIT="1")
    assert done.returncode == 1
    assert calls[-1] == "sha256sum -c --quiet SHA256SUMS.txt"


@pytest.mark.parametrize(("sums_exit", "rc"), [("0", 0), ("1", 1)])
def test_it_says_last_what_the_run_took_in_time_and_disk_however_it_ends(tmp_path, sums_exit, rc):
    done, _ = ci_run(tmp_path, HAS_CAIRO="yes", SUMS_EXIT=sums_exit)
    assert done.returncode == rc
    last = done.stdout.splitlines()[-1]
    assert re.fullmatch(rf"ci: \d+ min \d+ s; disk: -?\d+\.\d GB more used on the filesystem of {tmp_path}/\.cache "
                        rf"\(exit {rc}\)", last), last
