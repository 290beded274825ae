"""The full-era sweep, era by era: its time and its disk cost (uv cache growth), in one run.

    python benchmarks/bench_eras.py                          # every era: `current`, then [eras.*] newest first
    python benchmarks/bench_eras.py --era torch2.6-tf4       # only this era (repeatable)
    python benchmarks/bench_eras.py --references fresh       # while the published evidence is stale (exit 8)

Per era, in registry order (`current`, today's closure, first; then the declared eras, newest to
oldest), a whole CLI run in a child process: `sweep --era <era> --force`, every release of that era,
both experiments, through the warm engine. The era's closure environment is built (or reused)
beforehand and that time shown apart, so the sweep figure is probing, not installing.

Disk cost: each era's environment under `<cache>/envs/closure.<digest>.<python>` is hard links into the uv
cache, so `du` over the environments in registry order counts each file once, where it is first
seen; what it reports for an era's directory is what that era added beyond the eras before it,
i.e. its uv cache growth (eras declaring the same closure share one environment: the later one adds
nothing). With `--era`, the growth is still counted beyond every earlier era whose environment exists.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdevidence import environments, registry  # noqa: E402
from pdevidence.lanes import sweep, sweep_parts  # noqa: E402

GB = 1e9


def seconds(*argv: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(ROOT), *argv], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        hint = "\n(stale published evidence: pass --references fresh after `nox -s matrix`)" \
            if done.returncode == 8 else ""
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}{hint}")
    return time.perf_counter() - start


def growth(directories: list[Path]) -> dict[Path, int]:
    """Bytes on disk each directory adds beyond those before it: GNU du counts a hard-linked file once."""
    if not directories:
        return {}
    done = subprocess.run(["du", "-s", "--block-size=1", *map(str, directories)], capture_output=True, text=True,
                          check=True)
    found = {}
    for line in done.stdout.splitlines():
        size, path = line.split("\t", 1)
        found[Path(path)] = int(size)
    return {d: found.get(d, 0) for d in directories}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--era", action="append", help="only this era (repeatable; default: every era)")
    parser.add_argument("--references", choices=("published", "fresh"), default="published",
                        help="what the sweep judges against (fresh: runs/, after `nox -s matrix`)")
    args = parser.parse_args()
    reg = registry.load(ROOT)
    names = sweep_parts.era_names(reg)
    chosen = args.era or names
    for name in chosen:
        if name not in names:
            parser.error(f"unknown era {name!r}; one of: {', '.join(names)}")
    everything = sweep.default_releases(reg)
    homes = {name: environments.closure_environment_path(
        reg, environments.closure(reg, reg.eras.get(name))) for name in names}
    rows = []
    for name in chosen:
        releases = sweep_parts.in_era(reg, name, everything)
        start = time.perf_counter()
        environments.closure_environment(reg, reg.eras.get(name))
        built = time.perf_counter() - start
        took = seconds("sweep", "--era", name, "--force", "--references", args.references) if releases else 0.0
        rows.append((name, releases, built, took))
    # Registry order, each environment once: a later era declaring the same closure adds nothing.
    ordered = list(dict.fromkeys(home for home in homes.values() if home.exists()))
    added = growth(ordered)
    first = {}
    for name in names:
        first.setdefault(homes[name], name)
    print(f"{'era':<26} {'releases':<18} {'env s':>6} {'sweep s':>8} {'uv cache growth':>16}")
    total_s = total_b = 0.0
    for name, releases, built, took in rows:
        span = "none" if not releases else releases[0] if len(releases) == 1 else \
            f"{releases[0]}-{releases[-1]} ({len(releases)})"
        home = homes[name]
        if first[home] != name:
            disk, size = f"shares {first[home]}", 0
        else:
            size = added.get(home, 0)
            disk = f"+{size / GB:.1f} GB"
        total_s += took
        total_b += size
        print(f"{name:<26} {span:<18} {built:>6.1f} {took:>8.1f} {disk:>16}")
    print(f"{'total':<26} {sum(len(r[1]) for r in rows):<18} {'':>6} {total_s:>8.1f} {f'{total_b / GB:.1f} GB':>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
