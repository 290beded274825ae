"""Peak memory of a run's whole process tree, against the 7 GB of a 2-core runner (issue 29).

    python benchmarks/bench_memory.py check          # `check --references fresh --force` of the 27 newest releases
                                                      # (--trees N), from a fresh work directory
    python benchmarks/bench_memory.py sweep          # the full-era sweep: `sweep --references fresh --force`
    python benchmarks/bench_memory.py sweep --era torch2.9-tf4    # one era's sweep
    python benchmarks/bench_memory.py tests          # the fast tests: `python -m pytest -q`
    python benchmarks/bench_memory.py check tests --log /tmp/mem   # several, one after the other; their output
                                                      # in /tmp/mem.check, /tmp/mem.tests
    python benchmarks/bench_memory.py -- python -m pdevidence check --version 0.5.21   # any command

Each run's command starts as a child of this script; every ``--interval`` seconds the script finds every
process descended from it (by walking each process's parent in ``/proc/<pid>/stat``: the sandboxes' processes,
in PID namespaces of their own, are there under their outer pids) and sums two figures over them:

  RSS  ``VmRSS`` of ``/proc/<pid>/status``: each process's resident pages, a page shared by several processes
       (the warm engine's forked children share the closure's pages with it) counted once per process: an
       upper bound
  PSS  ``Pss`` of ``/proc/<pid>/smaps_rollup``: each shared page divided among the processes that map it, so
       the sum counts it once: what the tree really holds

Every run starts in the checkout. While the published evidence is stale and the fresh references in
``$PDEVIDENCE_RUNS`` are too (made by another checkout, awaiting a republish), ``--ignore-stale`` runs check and
sweep with every receipt taken as this checkout's: what they answer then means nothing, but what they probe, and
so their memory, is the same.

It prints each figure's peak (and when it came, and how many processes were alive then), the largest single
process, the run's time and exit status, and whether the peak PSS is within the target (``--target``, default
7 GB = 7.0e9 bytes: ``met`` or ``MISSED``). A peak that comes and goes between two samples is missed: a
shorter interval sees more and costs more (reading ``smaps_rollup`` walks a process's page tables). Page cache
and the sandboxes' tmpfs (``/tmp``, ``$HOME``) are memory too but belong to no process: neither figure counts
them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET_BYTES = 7_000_000_000  # 7 GB: a 2-core GitHub-hosted runner's memory
RUNS = ("check", "sweep", "tests")
RUN_CLI = "import sys; from pdevidence.cli import main; sys.exit(main())"  # python -m pdevidence, spelt out
# --ignore-stale: the same, with every receipt taken as made by this checkout (a benchmark's measure, never an answer)
IGNORING_STALE = ("import sys; from pdevidence.documents import receipts; receipts.Receipt.stale = lambda self, root: "
                  "[]; from pdevidence.cli import main; sys.exit(main())")


@dataclass
class Peak:
    rss: int = 0  # bytes
    rss_at: float = 0.0
    rss_processes: int = 0
    pss: int = 0
    pss_at: float = 0.0
    pss_processes: int = 0
    largest: int = 0  # one process's largest RSS
    largest_name: str = ""
    samples: int = 0
    most_processes: int = 0
    at_peak: list[tuple[int, int, str]] = field(default_factory=list)  # (PSS, RSS, what) per process at the PSS peak


def _parents() -> dict[int, int]:
    """Every process's parent, from ``/proc/<pid>/stat`` (the field after the parenthesised command name)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        found[int(entry.name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
    return found


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    below: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        below.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += below.get(pid, [])
    return found


def _bytes(path: str, key: bytes) -> int:
    """The ``key`` line's kB of a /proc file, in bytes; 0 when the process is gone (or a zombie: no such line)."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def what(pid: int) -> str:
    """A process in a few words: its program and the script or module it runs (``python engine.py``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    words = [Path(argv[0]).name]
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m" and i + 1 < len(argv):
            words.append(f"-m {argv[i + 1]}")
            break
        if arg == "-c":
            words.append("-c ...")
            break
        if arg.endswith(".py"):
            words.append(Path(arg).name)
            break
    return " ".join(words)


def sample(pid: int) -> tuple[int, int, str]:
    """(RSS bytes, PSS bytes, what it is) of one process."""
    name = what(pid)
    return _bytes(f"/proc/{pid}/status", b"VmRSS:"), _bytes(f"/proc/{pid}/smaps_rollup", b"Pss:"), name


def measure(command: list[str], *, interval: float, env: dict[str, str] | None = None,
            log: Path | None = None) -> tuple[Peak, int, float]:
    """Run ``command`` (its output to ours, or into ``log``), sampling its tree; its peaks, exit status and
    seconds."""
    peak = Peak()
    out = open(log, "wb") if log else None  # noqa: SIM115 - closed below, whatever happens
    started = time.monotonic()
    try:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                stdin=subprocess.DEVNULL, cwd=ROOT)
    finally:
        if out:
            out.close()  # the child holds its own copy
    try:
        while True:
            ended = proc.poll() is not None
            now = time.monotonic() - started
            rss_sum = pss_sum = 0
            each: list[tuple[int, int, str]] = []
            pids = descendants(proc.pid) if not ended else []
            for pid in pids:
                rss, pss, name = sample(pid)
                rss_sum += rss
                pss_sum += pss
                each.append((pss, rss, name))
                if rss > peak.largest:
                    peak.largest, peak.largest_name = rss, name
            peak.samples += 1
            peak.most_processes = max(peak.most_processes, len(pids))
            if rss_sum > peak.rss:
                peak.rss, peak.rss_at, peak.rss_processes = rss_sum, now, len(pids)
            if pss_sum > peak.pss:
                peak.pss, peak.pss_at, peak.pss_processes, peak.at_peak = pss_sum, now, len(pids), each
            if ended:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    return peak, proc.returncode, time.monotonic() - started


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def report(label: str, command: list[str], peak: Peak, status: int, seconds: float, target: int) -> str:
    top = sorted(peak.at_peak, reverse=True)[:4]
    return "\n".join([
        f"{label}: {' '.join(command)}",
        f"  exit status {status}, {seconds:.0f} s, {peak.samples} samples, up to {peak.most_processes} processes",
        f"  peak RSS sum {gb(peak.rss):>10} at {peak.rss_at:.0f} s ({peak.rss_processes} processes)",
        f"  peak PSS sum {gb(peak.pss):>10} at {peak.pss_at:.0f} s ({peak.pss_processes} processes; the largest, "
        "PSS/RSS: " + ", ".join(f"{name} {gb(pss)}/{gb(rss)}" for pss, rss, name in top) + ")",
        f"  largest one process: {gb(peak.largest)} RSS ({peak.largest_name})",
        f"  target: peak PSS <= {gb(target)}: {'met' if peak.pss <= target else 'MISSED'}"
        f" (RSS sum {'within' if peak.rss <= target else 'beyond'} it)",
    ])


def many_check_argv(count: int) -> list[str]:
    """The ``count`` newest releases of the published sweep, as ``--version`` arguments."""
    sys.path.insert(0, str(ROOT))
    from pdevidence import registry  # noqa: PLC0415 - the registry is read only when a check is asked for
    from pdevidence.core import files  # noqa: PLC0415

    reg = registry.load(ROOT)
    table = files.read_json(ROOT / "results" / f"sweep-{next(iter(reg.experiments))}.json", "sweep table", todo="")
    releases = [row["version"] for row in reversed(table["releases"])][:count]
    return [a for v in releases for a in ("--version", v)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="{check,sweep,tests}",
                        help="which runs, in this order (default: check); or `-- COMMAND...`")
    parser.add_argument("--era", help="sweep: this era only (`sweep --era ERA`)")
    parser.add_argument("--trees", type=int, default=27, help="check: this many releases, newest first (default 27)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--target", type=float, default=TARGET_BYTES / 1e9, help="GB (default 7)")
    parser.add_argument("--log", type=Path, help="each run's own output into LOG.<run> instead of ours")
    parser.add_argument("--ignore-stale", action="store_true",
                        help="check and sweep: judge against the fresh references ($PDEVIDENCE_RUNS) even when they "
                        "are stale, so the probing's memory can be measured while the evidence awaits a republish; "
                        "the answers then mean nothing")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    unknown = sorted(set(args.runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    python = [sys.executable, "-c", IGNORING_STALE if args.ignore_stale else RUN_CLI, "--root", str(ROOT)]
    references = ["--references", "fresh"]
    target = int(args.target * 1e9)
    runs: list[tuple[str, str, list[str], dict[str, str] | None]] = []  # name, label, command, environment
    made: list[str] = []  # fresh work directories, removed at the end
    if command:
        runs.append(("command", "command", command, None))
    for run in args.runs or ([] if command else ["check"]):
        if run == "check":
            work = tempfile.mkdtemp(prefix="bench-memory-work-")
            versions = many_check_argv(args.trees)
            runs.append((run, f"check of {len(versions) // 2} releases (PDEVIDENCE_WORK={work})",
                         [*python, "check", *references, "--force", *versions],
                         {**os.environ, "PDEVIDENCE_WORK": work}))
        elif run == "sweep":
            era = ["--era", args.era] if args.era else []
            runs.append((run, f"sweep {args.era or 'of every era'}",
                         [*python, "sweep", *references, "--force", *era], None))
        else:
            runs.append((run, "fast tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], None))
    worst = 0
    for name, label, cmd, env in runs:
        if env and "PDEVIDENCE_WORK" in env:
            made.append(env["PDEVIDENCE_WORK"])
        log = args.log.with_name(f"{args.log.name}.{name}") if args.log else None
        peak, status, seconds = measure(cmd, interval=args.interval, env=env, log=log)
        label += f" (output: {log})" if log else ""
        print(report(label, cmd, peak, status, seconds, target), flush=True)
        worst = max(worst, peak.pss)
    for work in made:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if worst <= target else 1


if __name__ == "__main__":
    sys.exit(main())
