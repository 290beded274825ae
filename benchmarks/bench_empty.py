"""CI from empty caches (issue 45: under 20 minutes and 20 GB): `.ci/run` on a fresh clone with a home of its own.

    python benchmarks/bench_empty.py                 # the default lane, as CI runs it
    python benchmarks/bench_empty.py --keep /big/dir # keep the clone and its caches there to look at afterwards

The clone is made from this checkout's HEAD (committed work only, as CI's clean clone); its HOME is an empty
directory, so uv's cache, pdevidence's cache and every environment are made from nothing, downloads included.
Only the machine's Python 3.12 is reused (PYENV_ROOT, PDEVIDENCE_PYTHON, PATH): CI's runner provides one.
`.ci/run` says last what it took (time, and disk on the filesystem of its caches); this adds what the new home holds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pdevidence.environments import pyenv_root  # noqa: E402

TARGET_MINUTES, TARGET_GB = 20, 20


def size_gb(path: Path) -> float:
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0]) / 1024 ** 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="a directory to work in and leave behind (default: a temporary "
                                                  "one, removed after)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-empty-", dir=args.keep))
    try:
        clone, home = work / "clone", work / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        env = {**os.environ, "HOME": str(home), "PYENV_ROOT": pyenv_root(), "CI": "true"}
        for name in ("XDG_CACHE_HOME", "UV_CACHE_DIR", "PDEVIDENCE_CACHE", "PDEVIDENCE_RUNS"):
            env.pop(name, None)
        start = time.perf_counter()
        done = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True)
        minutes = (time.perf_counter() - start) / 60
        said = done.stdout.strip().splitlines()[-1:] or ["(.ci/run said nothing)"]
        caches = size_gb(home)
        print(f".ci/run from empty caches: exit {done.returncode}; {said[0]}")
        print(f"{minutes:.1f} min (target < {TARGET_MINUTES}); the new home's caches: {caches:.1f} GB "
              f"(target < {TARGET_GB})")
        if done.returncode != 0:
            print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        return 0 if done.returncode == 0 and minutes < TARGET_MINUTES and caches < TARGET_GB else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
