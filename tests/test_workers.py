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


def test_python_sources_parsed_by_threads_at_once_are_parsed_one_at_a_time(monkeypatch):
    """A matrix's two cells record their probes' imports at once (provenance.probe_files): CPython before 3.13
    shares ast.parse's recursion depth between threads, and one such pair failed a CI run with "SystemError: AST
    constructor recursion depth mismatch". Parses at once must not overlap."""
    import ast
    import threading
    import time

    from pdevidence.core import children
    from pdevidence.documents import provenance

    inside, most, guard = [0], [0], threading.Lock()
    real = ast.parse

    def parse(*args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # long enough for another thread to come in, were it let
        try:
            return real(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", parse)
    probe = PROJECT / "probes" / "probe_offload_slots_differential.py"
    together = threading.Barrier(4)

    def record(_):
        together.wait()
        return provenance.probe_files(probe)

    with children.workers(4, "recorder") as pool:
        found = list(pool.map(record, range(4)))
    assert found[0] and all(f == found[0] for f in found)
    assert most[0] == 1
