"""One pdevidence command in a process of its own, as the concurrency and crash tests start many of them.

The cells' Python is this interpreter (whatever version it is), and ``UV`` is the tests' fake uv: an
environment it builds is a venv of this interpreter's base, the standard library and the SGLang wheel a cell
installs only (all the warm engine and a cell need). Usage: ``python concurrent_run.py <pdevidence arguments>``.
"""

from __future__ import annotations

import os
import sys

from pdevidence import cli, environments


def main() -> int:
    here = environments.Interpreter(os.path.realpath(sys.executable), "3.12.1", "cpython")
    environments.find_python = lambda version: here
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
