"""`pdevidence cache info|prune|clean` on a synthetic cache; debris and the old bytecode gone after a run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic import make_project, serve_index, wheel_bytes

from pdevidence import cli, commands, environments, registry
from pdevidence.cells import cells
from pdevidence.commands.scratch import enter_scratch
from pdevidence.core import arguments, debris, errors, inuse, locking
from pdevidence.core.files import sha256_file
from pdevidence.core.paths import tree_lock_file
from pdevidence.lanes import cache
from pdevidence.sources import trees

HERE = Path(__file__).resolve().parent
DAY = 86400
IDENTITY = "cpython-3.12.1"


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A project, and its cache and work directory moved under ``tmp_path``."""
    root = make_project(tmp_path / "project")
    for name, where in (("PDEVIDENCE_CACHE", "cache"), ("PDEVIDENCE_WORK", "work"), ("PDEVIDENCE_RUNS", "runs")):
        monkeypatch.setenv(name, str(tmp_path / where))
    return root, tmp_path / "cache", tmp_path / "work"


def closure_hash(root: Path) -> str:
    return sha256_file(root / "constraints" / "cells.txt")[:12]


def fill(directory: Path, size: int, *, name: str = "data", marker: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(os.urandom(size))
    if marker:  # a finished environment: a run's sweep removes one without it as an unfinished build
        (directory / environments.ENV_INFO).write_text('{"key": "k"}')
        (directory / debris.IN_USE).touch()
    return directory


def aged(entry: Path, days: float) -> Path:
    """Last used ``days`` ago (the time of its use marker, as a run leaves it: an environment's is inside it)."""
    marker = entry / debris.IN_USE if entry.parent.name == "envs" else inuse.marker(entry)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    when = time.time() - days * DAY
    os.utime(marker, (when, when))
    return entry


def populated(root: Path, cache_dir: Path, work: Path) -> dict[str, Path]:
    """One entry of each kind: an era environment, a cell's hard-linked copy of it, a wheel, a tree, an outcome,
    a log; and the old bytecode directory."""
    era = fill(cache_dir / "envs" / f"closure.{closure_hash(root)}.{IDENTITY}.{'1' * 12}", 300_000, marker=True)
    tree_env = fill(cache_dir / "envs" / f"tree.release-1.0.0.{era.name}.{'2' * 12}", 20_000, marker=True)
    os.link(era / "data", tree_env / "linked")
    return {
        "era": era, "tree_env": tree_env,
        "wheel": fill(cache_dir / "wheels" / ("a" * 64), 50_000, name="sglang-1.0.0-py3-none-any.whl"),
        "unpacked": fill(cache_dir / "unpacked" / "release-1.0.0.aaaaaaaaaaaa", 40_000),
        "outcome": fill(work / "outcomes" / ("b" * 64), 5_000),
        "log": fill(work / "logs" / "check" / "20261201-101010.000000-run-0123456789abcdef-x", 3_000),
        "pycache": fill(cache_dir / "pycache" / "usr", 60_000),
    }


def du(*paths: Path) -> int:
    done = subprocess.run(["du", "-s", "-B1", "-c", *map(str, paths)], capture_output=True, text=True, check=True)
    return int(done.stdout.splitlines()[-1].split()[0])


def run(root: Path, *argv: str) -> int:
    return cli.main(["--root", str(root), *argv])


def test_info_lists_every_part_with_sizes_that_add_up_to_du_counting_hard_links_once(world, capsys):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    found = cache.inventory(registry.load(root))
    assert found.total == du(cache_dir, work)
    by_path = {e.path: e for e in found.entries}
    assert by_path[parts["era"]].bytes >= 300_000
    # The cell's environment is a hard-linked copy: the linked bytes count once, with the era's environment.
    assert 20_000 <= by_path[parts["tree_env"]].bytes < 300_000
    assert {e.kind for e in found.entries} >= {cache.Kind.ERA_ENVIRONMENT, cache.Kind.TREE_ENVIRONMENT,
                                                 cache.Kind.WHEEL, cache.Kind.UNPACKED, cache.Kind.OUTCOME,
                                                 cache.Kind.LOG, cache.Kind.OLD_BYTECODE}
    assert "today's (constraints/cells.txt)" in by_path[parts["era"]].note

    assert run(root, "cache", "info", "--json") == errors.CONFIRMED
    doc = json.loads(capsys.readouterr().out)
    # The run itself removed the old bytecode as it entered the cache; what is left still adds up.
    assert doc["total_bytes"] == du(cache_dir, work) and not parts["pycache"].exists()
    assert doc["total_bytes"] == doc["other_bytes"] + sum(e["bytes"] for e in doc["entries"])
    assert run(root, "cache", "info") == errors.CONFIRMED
    text = capsys.readouterr().out
    assert str(parts["era"]) in text and "era environment" in text and "cache prune" in text
    # Each kind's entries under its name as the table spells it ("image packages", not "image packagess").
    assert all(f"\n{kind} ({part['entries']}): {part['purpose']}\n" in text for kind, part in doc["kinds"].items())


def test_prune_by_age_removes_only_what_no_run_used_for_that_long(world, capsys):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    for name in ("wheel", "outcome", "log"):
        aged(parts[name], 40)
    for name in ("era", "tree_env", "unpacked"):
        aged(parts[name], 2)
    assert run(root, "cache", "prune", "--older-than", "30d") == errors.CONFIRMED
    assert "removed 3 entries" in capsys.readouterr().out
    assert not any(parts[n].exists() for n in ("wheel", "outcome", "log"))
    assert all(parts[n].exists() for n in ("era", "tree_env", "unpacked"))
    assert not inuse.marker(parts["wheel"]).exists()  # its marker went with it


def test_prune_forgets_the_use_of_an_entry_a_run_removed_itself(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    aged(parts["wheel"], 1)
    shutil.rmtree(parts["wheel"])  # as a run does with a download that fails its check
    cache.prune(registry.load(root))
    assert not inuse.marker(parts["wheel"]).exists()
    assert inuse.marker(parts["wheel"]).parent.is_dir()  # the directory of the markers stays


def test_prune_to_a_budget_removes_what_is_cheapest_to_remake_first_then_the_least_recently_used(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    shutil.rmtree(parts.pop("pycache").parent)  # unusable: it would go first, whatever the budget
    parts["old_export"] = fill(cache_dir / "trees" / f"commit-{'d' * 40}", 30_000)
    parts["export"] = fill(cache_dir / "trees" / f"commit-{'e' * 40}", 30_000)
    for days, name in enumerate(("era", "tree_env", "wheel", "outcome", "log", "old_export", "unpacked", "export"),
                                start=1):
        aged(parts[name], 10 - days)  # the era environment is the least recently used, an export the most
    reg = registry.load(root)
    budget = cache.inventory(reg).total - 90_000  # both exports (60 kB) are not enough, the unpacked tree is
    result = cache.prune(reg, max_size=budget)
    assert [e.path for e in result.removed] == [parts["old_export"], parts["export"], parts["unpacked"]]
    assert result.after <= budget and cache.inventory(reg).total <= budget
    assert all(parts[n].exists() for n in ("era", "tree_env", "wheel", "outcome", "log"))


def test_prune_removes_what_no_current_registry_or_era_can_use(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    old_era = fill(cache_dir / "envs" / f"closure.0123456789ab.{IDENTITY}.{'3' * 12}", 1_000, marker=True)
    (cache_dir / "envs" / f"{old_era.name}.preload.json").write_text("{}")
    git_env = fill(cache_dir / "envs" / f"tree.git-{'c' * 12}.{parts['era'].name}.{'4' * 12}", 1_000, marker=True)
    # Of the registry's closure, but named as before environments were named by their key: no run finds them.
    unkeyed = [fill(cache_dir / "envs" / name, 1_000, marker=True)
               for name in (f"closure.{closure_hash(root)}.{IDENTITY}",
                            f"tree.release-1.0.0.{'5' * 12}.closure.{closure_hash(root)}.{IDENTITY}")]
    result = cache.prune(registry.load(root))
    assert {e.path for e in result.removed} == {old_era, git_env, *unkeyed, parts["pycache"].parent}
    assert not (cache_dir / "envs" / f"{old_era.name}.preload.json").exists()  # it went with its environment
    assert all(parts[n].exists() for n in ("era", "tree_env", "wheel", "unpacked", "outcome", "log"))


# A run using an entry as runs do: an environment through core/debris, anything else through core/inuse.
HOLD = """
import sys
from pathlib import Path
from pdevidence.core import debris, inuse
entry = Path(sys.argv[1])
assert debris.use(entry, lambda _: True) if entry.parent.name == "envs" else inuse.use(entry) is None
print("using", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("held", ["era", "tree_env", "wheel", "unpacked", "outcome"])
def test_an_entry_a_running_run_uses_stays_and_goes_once_that_run_has_ended(world, held):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(parts[held])], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    try:
        assert holder.stdout.readline().strip() == "using"
        reg = registry.load(root)
        result = cache.prune(reg, everything=True)
        assert [e.path for e in result.in_use] == [parts[held]] and parts[held].exists()
        assert len(list(parts[held].iterdir())) >= 1  # whole: nothing under it was touched
        assert not any(parts[n].exists() for n in parts if n != held)
    finally:
        holder.kill()
        holder.wait()
    assert [e.path for e in cache.prune(reg, everything=True).removed] == [parts[held]]
    assert not parts[held].exists()


def test_an_environment_being_built_stays(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    with locking.exclusive(parts["era"].parent / f".{parts['era'].name}.lock", "the build"):
        assert parts["era"] in [e.path for e in cache.prune(registry.load(root), everything=True).in_use]
    assert parts["era"] in [e.path for e in cache.prune(registry.load(root), everything=True).removed]


def test_a_run_that_used_an_entry_lets_go_when_it_ends(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    with cli.debris.run():
        inuse.use(parts["wheel"])
        assert cache.prune(registry.load(root), everything=True).in_use[0].path == parts["wheel"]
    assert not cache.prune(registry.load(root), everything=True).in_use


def test_a_prune_killed_half_way_leaves_nothing_a_later_run_trusts(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    shutil.rmtree(parts.pop("pycache").parent)  # a run removes it as it starts, the same way: killed there too
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "PDEVIDENCE_FAULT": "prune"}
    done = subprocess.run([sys.executable, "-m", "pdevidence", "--root", str(root), "cache", "clean"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    # Killed with the first entry renamed away: it is not where a run looks for it, and what is left carries
    # the dead run's token.
    assert not parts["era"].exists() and parts["wheel"].exists()
    left = [p for p in cache_dir.iterdir() if p.name.endswith(".pruned")]
    assert left and all(".run-" in p.name for p in left)
    assert run(root, "cache", "info") == errors.CONFIRMED  # any later run
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".pruned")]


def pruned_after_each_download(monkeypatch, reg) -> list[cache.Pruned]:
    """A prune to a budget of nothing the moment each download is on disk, before the run names it by its digest
    (where, beside the concurrency loop's prunes, a check once exited 7); what each prune did."""
    pruned, download = [], trees.fetch.download

    def then_prune(*args, **kw):
        digest = download(*args, **kw)
        pruned.append(cache.prune(reg, max_size=0))
        return digest
    monkeypatch.setattr(trees.fetch, "download", then_prune)
    return pruned


def test_a_prune_between_a_wheels_download_and_its_naming_leaves_the_run_its_wheel(world, http_server, monkeypatch):
    root, cache_dir, _ = world
    wheel = wheel_bytes("1.0.0", "")
    monkeypatch.setenv("PDEVIDENCE_INDEX_URL", serve_index(http_server, {"sglang-1.0.0-py3-none-any.whl": wheel}))
    reg = registry.load(root)
    pruned = pruned_after_each_download(monkeypatch, reg)
    with debris.run():
        enter_scratch(root)
        tree = trees.release_tree("1.0.0", reg.python, trees.LockFile(tree_lock_file(root)))
        assert tree.install_target.read_bytes() == wheel
    assert len(pruned) == 1 and pruned[0].removed == []  # the download in flight is no entry of the cache


def test_a_prune_between_an_archives_download_and_its_naming_leaves_the_run_its_tree(world, http_server,
                                                                                     make_tarball, monkeypatch):
    root, cache_dir, _ = world
    sha = "0123456789abcdef0123456789abcdef01234567"
    http_server.serve(f"/tar.gz/{sha}", make_tarball({f"sglang-{sha}/python/sglang/__init__.py": b"GUARD = 1\n"}))
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", http_server.url("/tar.gz/{sha}"))
    reg = registry.load(root)
    pruned = pruned_after_each_download(monkeypatch, reg)
    with debris.run():
        enter_scratch(root)
        tree = trees.git_tree(sha, trees.LockFile(tree_lock_file(root)))
        assert (tree.install_target / "sglang" / "__init__.py").read_text() == "GUARD = 1\n"
    assert len(pruned) == 1 and pruned[0].removed == []


ENTER = "import sys; from pathlib import Path; from pdevidence.core import debris; debris.enter(Path(sys.argv[1]))"


def test_no_run_enters_the_work_directory_between_a_prunes_look_and_its_taking_a_log(world, monkeypatch):
    """A log or a corpus tree, which no run marks, goes only while no other run is in its root: one that entered
    after the prune looked could have begun to use it."""
    root, cache_dir, work = world
    log = populated(root, cache_dir, work)["log"]
    entering, aside = [], cache._aside

    def a_run_enters_first(path: Path, *rest: Path) -> list[Path]:
        if path == log:
            entering.append(subprocess.run([sys.executable, "-c", ENTER, str(work)], capture_output=True, text=True,
                                           env={**os.environ, "PYTHONPATH": str(HERE.parent),
                                                "PDEVIDENCE_LOCK_TIMEOUT": "1"}))
        return aside(path, *rest)
    monkeypatch.setattr(cache, "_aside", a_run_enters_first)
    removed = cache.prune(registry.load(root), everything=True).removed
    assert log in [e.path for e in removed] and not log.exists()
    assert len(entering) == 1 and entering[0].returncode != 0, entering
    assert "gave up after 1 s waiting for" in entering[0].stderr, entering[0].stderr


def test_clean_removes_every_entry_and_keeps_the_locks(world, capsys):
    root, cache_dir, work = world
    populated(root, cache_dir, work)
    (cache_dir / "locks").mkdir()
    (cache_dir / "locks" / "sglang==1.0.0.lock").touch()
    assert run(root, "cache", "clean") == errors.CONFIRMED
    assert "freed" in capsys.readouterr().out
    assert cache.inventory(registry.load(root)).entries == []
    assert (cache_dir / "locks" / "sglang==1.0.0.lock").exists()


def test_a_run_removes_the_old_bytecode_directory_and_what_dead_runs_left(world):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    dead = "fedcba9876543210"  # no token file: its run is gone
    leftovers = [cache_dir / "trees" / f".git-{'e' * 40}.run-{dead}.x1.export",
                 cache_dir / "archives" / f".incoming-{'e' * 40}.tar.gz.run-{dead}.x2.part",
                 cache_dir / "images" / ".incoming.abc",
                 cache_dir / "images" / f".sha256-{'f' * 64}.x3.scan",
                 work / f".probing.run-{dead}.x4",
                 work.parent / "runs" / "check" / ".probing-x5"]  # as runs named it before tokens
    for path in leftovers:
        fill(path, 10)
    assert run(root, "cache", "info") == errors.CONFIRMED
    assert not parts["pycache"].exists()
    assert [p for p in leftovers if p.exists()] == []


def test_a_release_cell_after_clean_builds_again_and_answers_the_same(demo_project, capsys):
    reg = registry.load(demo_project)
    first = cells.run_cell(reg, cells.Cell("demo", "base", "release"), log=lambda msg: None)
    assert run(demo_project, "cache", "info", "--json") == errors.CONFIRMED
    kinds = {e["kind"] for e in json.loads(capsys.readouterr().out)["entries"]}
    assert {"era environment", "tree environment", "wheel"} <= kinds
    assert run(demo_project, "cache", "clean") == errors.CONFIRMED
    again = cells.run_cell(reg, cells.Cell("demo", "base", "release"), log=lambda msg: None, force=True)
    assert again.result.read_bytes() == first.result.read_bytes()


@pytest.mark.parametrize(("value", "seconds"), [("30d", 30 * DAY), ("12h", 12 * 3600), ("2w", 14 * DAY),
                                                ("90m", 5400), ("45s", 45)])
def test_a_duration_is_read_with_its_unit(value, seconds):
    assert arguments.duration(value) == seconds


@pytest.mark.parametrize(("value", "size"), [("20G", 20 << 30), ("500M", 500 << 20), ("1T", 1 << 40),
                                             ("20GiB", 20 << 30), ("4096", 4096), ("0", 0)])
def test_a_size_is_read_in_binary_units(value, size):
    assert arguments.size(value) == size


@pytest.mark.parametrize("argv", [["--older-than", "30"], ["--older-than", "0d"], ["--older-than", "1y"],
                                  ["--max-size", "20X"], ["--max-size", "1.5G"]])
def test_a_malformed_age_or_size_is_a_usage_error(world, argv, capsys):
    root, _, _ = world
    assert run(root, "cache", "prune", *argv) == errors.USAGE
    assert argv[1] in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["list", "rm -rf", ""])
def test_an_unknown_verb_is_a_usage_error_naming_the_verbs(world, verb, capsys):
    root, _, _ = world
    assert run(root, "cache", verb) == errors.USAGE
    assert "info" in capsys.readouterr().err


# --- the budget a run keeps the cache within -----------------------------------------------------------------------


def a_run_that_adds(cache_dir: Path, monkeypatch, size: int) -> Path:
    """`check` stood in by a run that exports one commit of ``size`` bytes (a new entry: the cache grew)."""
    made = cache_dir / "trees" / f"commit-{'f' * 40}"

    def check(args) -> int:
        if size:
            fill(made, size)
        return errors.CONFIRMED
    monkeypatch.setattr(commands.check, "cmd_check", check)
    return made


def test_a_run_that_fills_the_cache_past_its_budget_drops_the_exports_first_and_keeps_the_rest(
        world, monkeypatch, capsys):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    shutil.rmtree(parts.pop("pycache").parent)
    old_era = fill(cache_dir / "envs" / f"closure.0123456789ab.{IDENTITY}.{'3' * 12}", 1_000, marker=True)
    old_export = aged(fill(cache_dir / "trees" / f"commit-{'d' * 40}", 100_000), 1)
    made = a_run_that_adds(cache_dir, monkeypatch, 100_000)
    before = cache.inventory(registry.load(root)).total
    monkeypatch.setenv(cache.BUDGET, str(before))  # the run's export puts it over; the older export is enough

    assert run(root, "check", "--release", "1.0.0") == errors.CONFIRMED

    assert not old_export.exists() and made.exists()
    assert all(p.exists() for p in parts.values()) and old_era.exists()  # another registry's era is not this run's
    assert cache.inventory(registry.load(root)).total <= before
    assert f"over its budget of {cache.size(before)} ({cache.BUDGET})" in capsys.readouterr().err


def test_what_a_running_run_holds_stays_over_the_budget_and_the_run_says_so(world, monkeypatch, capsys):
    root, cache_dir, work = world
    populated(root, cache_dir, work)
    held = fill(cache_dir / "trees" / f"commit-{'d' * 40}", 100_000)
    a_run_that_adds(cache_dir, monkeypatch, 10_000)
    monkeypatch.setenv(cache.BUDGET, "1K")
    inuse.use(held)
    try:
        assert run(root, "check", "--release", "1.0.0") == errors.CONFIRMED
    finally:
        inuse.release()
    err = capsys.readouterr().err
    assert held.exists() and "in use by a running run" in err and f"raise {cache.BUDGET}" in err


@pytest.mark.parametrize("budget", ["off", None])
def test_a_run_that_adds_nothing_or_has_no_budget_removes_nothing(world, monkeypatch, capsys, budget):
    root, cache_dir, work = world
    parts = populated(root, cache_dir, work)
    parts.pop("pycache")  # every run removes the old bytecode as it enters the cache
    a_run_that_adds(cache_dir, monkeypatch, 0 if budget is None else 10_000)
    monkeypatch.setenv(cache.BUDGET, budget or "1K")
    assert run(root, "check", "--release", "1.0.0") == errors.CONFIRMED
    assert all(p.exists() for p in parts.values()) and "budget" not in capsys.readouterr().err


def test_info_says_the_budget_and_what_each_kind_of_run_needs(world, monkeypatch, capsys):
    root, cache_dir, work = world
    populated(root, cache_dir, work)
    monkeypatch.setenv(cache.BUDGET, "30G")
    assert run(root, "cache", "info") == errors.CONFIRMED
    text = capsys.readouterr().out
    assert f"budget: 30.0 GiB ({cache.BUDGET};" in text
    assert all(f"  {what} needs {need}" in text for what, need in cache.NEEDS)
    assert run(root, "cache", "info", "--json") == errors.CONFIRMED
    doc = json.loads(capsys.readouterr().out)
    assert doc["budget_bytes"] == 30 << 30 and doc["needs"] == dict(cache.NEEDS)
    monkeypatch.setenv(cache.BUDGET, "30 GB")
    assert run(root, "cache", "info") == errors.USAGE
    assert cache.BUDGET in capsys.readouterr().err


def test_dropping_a_lines_exports_leaves_what_a_running_run_holds(world):
    root, cache_dir, work = world
    slim, whole, held, other = (fill(cache_dir / "trees" / name, 1_000) for name in (
        f"commit-{'1' * 40}", f"git-{'2' * 40}", f"commit-{'3' * 40}", f"commit-{'4' * 40}"))
    inuse.use(held)
    try:
        result = cache.drop_exports(["1" * 40, "2" * 40, "3" * 40, "5" * 40])
    finally:
        inuse.release()
    assert [e.path for e in result.removed] == [slim, whole] and [e.path for e in result.in_use] == [held]
    assert held.exists() and other.exists() and not slim.exists() and not whole.exists()
