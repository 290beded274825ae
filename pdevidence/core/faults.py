"""Named crash points, for the tests only: ``PDEVIDENCE_FAULT=<point>`` kills the run there with SIGKILL.

Each point sits where a crash is the most harmful (a file half written, a directory
half made, a rename half done); the tests kill a run at each one and check that the
next run finishes with the right answer and trusts nothing the dead one left.

This module imports nothing of the harness: ``settings`` checks the variable against
``POINTS`` up front (``settings.check_all``), so here its value is only compared.
"""

from __future__ import annotations

import os
import signal

VARIABLE = "PDEVIDENCE_FAULT"

POINTS = {
    "download": "mid-transfer: part of a download is on disk",
    "unpack": "a wheel unpacked and compiled, not yet renamed into place",
    "environment": "an environment built, its marker not yet written",
    "probe": "the engine's children done, their outcomes not yet kept",
    "outcome": "an outcome staged, the entry it replaces moved aside",
    "write": "an atomic write's temporary file written, not yet renamed",
    "publish": "results/ moved aside, the staged directory not yet in its place",
    "prune": "cache entries renamed out of the way by a prune, not yet removed",
}


def point(name: str) -> None:
    """Die here, as ``kill -9`` would, when the tests asked for this point."""
    assert name in POINTS, name
    if os.environ.get(VARIABLE) == name:
        os.kill(os.getpid(), signal.SIGKILL)
