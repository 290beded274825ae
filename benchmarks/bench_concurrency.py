"""Issue 29's loop: the concurrency and crash tests, run N rounds, the passes counted.

    python benchmarks/bench_concurrency.py              # 20 rounds (about 30 minutes on 2 cores)
    python benchmarks/bench_concurrency.py --rounds 50 -k "cold_cache"

Each round is a fresh pytest process on fresh temporary directories: a race that loses once in a while shows
up as a failed round, with its output kept in the round's log.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Runs at once on one cache, killed ones among them (test_concurrency), what killed runs leave (test_debris), worker
# threads that start together (test_workers).
TESTS = [ROOT / "tests" / name for name in ("test_concurrency.py", "test_debris.py", "test_workers.py")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("-k", default="", help="only the tests pytest's -k selects")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
    passed = 0
    for n in range(1, args.rounds + 1):
        started = time.monotonic()
        log = logs / f"round-{n}.log"
        with open(log, "w") as out:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, TESTS),
                                   *(["-k", args.k] if args.k else [])], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT)
        passed += done.returncode == 0
        tail = log.read_text().strip().splitlines()[-1:] or [""]
        print(f"round {n}: {'pass' if done.returncode == 0 else 'FAIL'} in {time.monotonic() - started:.0f} s: "
              f"{tail[0]}" + ("" if done.returncode == 0 else f" ({log})"), flush=True)
    print(f"{passed}/{args.rounds} rounds passed (logs in {logs})")
    return 0 if passed == args.rounds else 1


if __name__ == "__main__":
    raise SystemExit(main())
