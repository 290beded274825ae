"""Worker threads that ask the interpreter's build variables at once each get them whole."""

from __future__ import annotations

import os
import subprocess
import sys

from pdevidence.core.paths import PROJECT

FIRST_ASKS = """
import sys, sysconfig, threading
from pdevidence.core import children

seen = set()
for _ in range(10):
    sysconfig._CONFIG_VARS = None  # as before anything asked: the table is filled on first use
    sys.modules.pop(sysconfig._get_sysconfigdata_name(), None)
    together = threading.Barrier(8)

    def ask(_):
        together.wait()
        return sysconfig.get_config_var("EXE")  # what uv's own lookup of itself asks first

    with children.workers(8, "asker") as pool:
        seen.update(repr(value) for value in pool.map(ask, range(8)))
print(sorted(seen))
"""


def test_workers_asking_sysconfig_at_once_never_see_it_half_filled():
    done = subprocess.run([sys.executable, "-c", FIRST_ASKS], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert done.stdout.strip() == "[\"''\"]"
