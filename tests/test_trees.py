"""Tree sources: GitHub archives and PyPI wheels are pinned by the lock file; clones and paths are local."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdevidence.core import errors
from pdevidence.core.errors import HarnessError
from pdevidence.sources import importable, trees
from pdevidence.sources.trees import LockFile

SHA = "0123456789abcdef0123456789abcdef01234567"
ARCHIVE_PATH = f"/sgl-project/sglang/tar.gz/{SHA}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch, unreachable_url) -> Path:
    """A private cache; GitHub and PyPI point at a closed port unless a test serves them."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PDEVIDENCE_CACHE", str(root))
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/sgl-project/sglang/tar.gz/{sha}")
    monkeypatch.setenv("PDEVIDENCE_INDEX_URL", unreachable_url + "/simple")
    return root


@pytest.fixture
def lock(tmp_path) -> LockFile:
    return LockFile(tmp_path / "constraints" / "trees.lock.json")


def pin(lock: LockFile, section: str, key: str, entry: dict) -> None:
    """What a maintainer committed to the tracked lock file."""
    data = json.loads(lock.path.read_text()) if lock.path.exists() else {
        "schema": trees.LOCK_SCHEMA, "git": {}, "release": {}}
    data[section][key] = entry
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    lock.path.write_text(json.dumps(data))


def stray_files(*roots: Path) -> list[str]:
    """Half-written downloads, extraction staging dirs and lock-file temporaries."""
    found = []
    for root in roots:
        for p in root.rglob("*") if root.exists() else []:
            if p.name.endswith((".part", ".extract", ".tmp", ".incoming")):
                found.append(str(p.relative_to(root)))
    return found


# --- git_tree from GitHub ---------------------------------------------------------------------


def sglang_archive(make_tarball, sha: str = SHA, version: str = "1") -> bytes:
    """What codeload.github.com serves: everything under one ``sglang-<sha>/`` directory."""
    return make_tarball({
        f"sglang-{sha}/python/pyproject.toml": b"[project]\nname = \"sglang\"\n",
        f"sglang-{sha}/python/sglang/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"sglang-{sha}/test/srt/test_x.py": b"def test_x(): pass\n",
    })


@pytest.fixture
def github(http_server, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", http_server.url("/sgl-project/sglang/tar.gz/{sha}"))
    return http_server


def test_first_fetch_extracts_the_tree_and_records_the_archive_hash(github, make_tarball, cache, lock):
    archive = sglang_archive(make_tarball)
    url = github.serve(ARCHIVE_PATH, archive)

    tree = trees.git_tree(SHA, lock)

    assert tree.kind == "git" and tree.resolved == SHA and tree.source == "github"
    assert tree.origin == url
    assert tree.digest == sha256(archive)
    assert tree.install_target == cache / "trees" / f"git-{SHA}" / "python"
    assert (tree.install_target / "sglang" / "__init__.py").read_text() == "__version__ = '1'\n"
    assert (tree.repo_root / "test" / "srt" / "test_x.py").exists()
    assert lock.first_seen("git", SHA) == {"sha256": sha256(archive), "url": url}
    assert not lock.path.exists()  # the tracked file is never written by a run
    assert (cache / "archives" / f"{sha256(archive)}.tar.gz").read_bytes() == archive
    assert stray_files(cache, lock.path.parent) == []


def test_second_fetch_reuses_the_cache_without_asking_the_server(github, make_tarball, lock):
    github.serve(ARCHIVE_PATH, sglang_archive(make_tarball))
    first = trees.git_tree(SHA, lock)

    second = trees.git_tree(SHA, lock)

    assert second == first
    assert github.hits() == 1


def test_download_not_matching_the_lock_file_is_refused_and_deleted(github, make_tarball, cache, lock):
    archive = sglang_archive(make_tarball)
    github.serve(ARCHIVE_PATH, archive)
    pinned = "f" * 64
    pin(lock, "git", SHA, {"sha256": pinned, "url": "https://example.invalid"})

    with pytest.raises(HarnessError) as caught:
        trees.git_tree(SHA, lock)

    assert caught.value.code == errors.INTEGRITY
    assert pinned in str(caught.value) and sha256(archive) in str(caught.value)
    assert list((cache / "archives").iterdir()) == []  # the download was deleted
    assert not (cache / "trees" / f"git-{SHA}").exists()
    assert lock.pinned("git", SHA)["sha256"] == pinned  # the lock is not rewritten
    assert lock.first_seen("git", SHA) is None


def test_archive_tampered_on_the_server_after_it_was_first_seen_is_refused(github, make_tarball, cache, lock):
    github.serve(ARCHIVE_PATH, sglang_archive(make_tarball))
    trees.git_tree(SHA, lock)
    recorded = lock.first_seen("git", SHA)
    for evicted in ("archives", "trees"):  # the cached copies are gone, what was seen is not
        shutil.rmtree(cache / evicted)
    tampered = sglang_archive(make_tarball, version="evil")
    github.serve(ARCHIVE_PATH, tampered)

    with pytest.raises(HarnessError) as caught:
        trees.git_tree(SHA, lock)

    assert caught.value.code == errors.INTEGRITY
    assert recorded["sha256"] in str(caught.value) and sha256(tampered) in str(caught.value)
    assert list((cache / "archives").iterdir()) == []
    assert not (cache / "trees" / f"git-{SHA}").exists()
    assert lock.first_seen("git", SHA) == recorded


def test_a_pinned_archive_tampered_on_the_server_is_refused_on_another_machine(github, make_tarball, cache, lock):
    pin(lock, "git", SHA, {"sha256": sha256(sglang_archive(make_tarball)), "url": "https://example.invalid"})
    tampered = sglang_archive(make_tarball, version="evil")
    github.serve(ARCHIVE_PATH, tampered)

    with pytest.raises(HarnessError) as caught:
        trees.git_tree(SHA, lock)

    assert caught.value.code == errors.INTEGRITY and sha256(tampered) in str(caught.value)
    assert lock.first_seen("git", SHA) is None


def test_cached_archive_corrupted_on_disk_is_deleted_then_refetched(github, make_tarball, cache, lock):
    archive = sglang_archive(make_tarball)
    github.serve(ARCHIVE_PATH, archive)
    trees.git_tree(SHA, lock)
    cached = cache / "archives" / f"{sha256(archive)}.tar.gz"
    cached.write_bytes(b"bit rot")

    with pytest.raises(HarnessError) as caught:
        trees.git_tree(SHA, lock)
    assert caught.value.code == errors.INTEGRITY
    assert not cached.exists()

    tree = trees.git_tree(SHA, lock)  # "run again to refetch"
    assert tree.digest == sha256(archive)
    assert cached.read_bytes() == archive
    assert github.hits() == 2


def test_unreachable_github_points_at_a_local_clone_and_the_release_cells(cache, lock):
    with pytest.raises(HarnessError) as caught:
        trees.git_tree(SHA, lock)

    message = str(caught.value)
    assert caught.value.code == errors.ENVIRONMENT
    assert "SGLANG_REPO" in message
    assert "release" in message and "nox -s matrix" in message
    assert lock.first_seen("git", SHA) is None
    assert stray_files(cache) == []


def test_archive_without_a_python_package_is_refused(github, make_tarball, lock):
    github.serve(ARCHIVE_PATH, make_tarball({f"sglang-{SHA}/README.md": b"not sglang\n",
                                             f"sglang-{SHA}/python/pyproject.toml": b"[project]\n"}))

    with pytest.raises(HarnessError, match="no python/sglang/ package directory"):
        trees.git_tree(SHA, lock)


def twice_at_once(fetch) -> tuple[list, list]:
    """Call ``fetch`` from two threads released together: (results, exceptions)."""
    start = threading.Barrier(2)
    got, failures = [], []

    def call():
        start.wait()
        try:
            got.append(fetch())
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            failures.append(exc)

    workers = [threading.Thread(target=call) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=20)
    return got, failures


def test_concurrent_fetches_of_one_commit_download_it_once(github, make_tarball, cache, lock, capfd):
    archive = sglang_archive(make_tarball)
    # Slow enough that the second caller arrives while the first holds the lock.
    github.serve(ARCHIVE_PATH, archive, delay=0.3)
    results, failures = twice_at_once(lambda: trees.git_tree(SHA, LockFile(lock.path)))

    assert failures == []
    assert "waiting: another process is using the cached tree" in capfd.readouterr().err  # they overlapped
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0].install_target / "pyproject.toml").exists()
    assert github.hits(ARCHIVE_PATH) == 1
    assert lock.first_seen("git", SHA)["sha256"] == sha256(archive)
    assert os.listdir(cache / "trees") == [f"git-{SHA}"]
    assert os.listdir(cache / "archives") == [f"{sha256(archive)}.tar.gz"]
    assert stray_files(cache, lock.path.parent) == []


# --- git_tree from a local clone --------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "init.defaultBranch=main", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def clone(tmp_path, monkeypatch) -> SimpleNamespace:
    """A repository with two commits: the second changes the package and adds a module."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "sglang"
    package = repo / "python" / "sglang"
    package.mkdir(parents=True)
    (repo / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\n')
    (package / "__init__.py").write_text("__version__ = 'one'\n")
    (package / "unchanged.py").write_text("KEPT = 1\n")
    (repo / "test").mkdir()
    (repo / "test" / "test_x.py").write_text("def test_x(): pass\n")  # no probe reads it
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD")
    (package / "__init__.py").write_text("__version__ = 'two'\n")
    (package / "only_in_two.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two")
    return SimpleNamespace(path=repo, first=first, second=git(repo, "rev-parse", "HEAD"))


def test_clone_materializes_the_requested_commit_not_the_checkout(clone, cache, lock):
    tree = trees.git_tree(clone.first, lock, clone=clone.path)

    assert tree.source == "clone" and tree.origin == str(clone.path) and tree.digest is None
    assert tree.install_target == cache / "trees" / f"commit-{clone.first}" / "python"
    assert (tree.install_target / "sglang" / "__init__.py").read_text() == "__version__ = 'one'\n"
    assert (tree.install_target / "pyproject.toml").is_file()  # the era is chosen by its pins
    assert not (tree.install_target / "sglang" / "only_in_two.py").exists()
    assert not (tree.repo_root / "test").exists()  # only what the probes read
    info = json.loads((tree.repo_root / trees.TREE_INFO).read_text())
    assert info["git_tree"] == git(clone.path, "rev-parse", f"{clone.first}^{{tree}}")
    assert not lock.path.exists()  # a clone is trusted as is; nothing to pin
    assert os.listdir(cache / "trees") == [f"commit-{clone.first}"]  # no temporary export left


def test_a_whole_export_holds_the_test_files_and_a_later_slim_request_reuses_it(clone, cache, lock):
    whole = trees.git_tree(clone.first, lock, clone=clone.path, whole=True)
    assert whole.repo_root == cache / "trees" / f"git-{clone.first}"
    assert (whole.repo_root / "test" / "test_x.py").is_file()

    again = trees.git_tree(clone.first, lock, clone=clone.path)

    assert again.install_target == whole.install_target
    assert os.listdir(cache / "trees") == [f"git-{clone.first}"]


def test_a_neighbour_commit_links_its_unchanged_files_and_their_bytecode_and_writes_the_changed_ones(
        clone, cache, lock):
    first = trees.git_tree(clone.first, lock, clone=clone.path)
    bytecode = first.install_target / "sglang" / "__pycache__"
    bytecode.mkdir()
    (bytecode / "unchanged.cpython-312.pyc").write_bytes(b"compiled")
    (bytecode / "__init__.cpython-312.pyc").write_bytes(b"compiled one")

    second = trees.git_tree(clone.second, lock, clone=clone.path)

    def same(name: str) -> bool:
        return os.path.samefile(first.install_target / name, second.install_target / name)
    assert same("sglang/unchanged.py") and same("sglang/__pycache__/unchanged.cpython-312.pyc")
    assert same("pyproject.toml")
    assert not same("sglang/__init__.py")
    assert (second.install_target / "sglang" / "__init__.py").read_text() == "__version__ = 'two'\n"
    assert not (second.install_target / "sglang" / "__pycache__" / "__init__.cpython-312.pyc").exists()
    assert (second.install_target / "sglang" / "only_in_two.py").is_file()


def test_a_neighbour_of_a_compiled_export_compiles_only_the_modules_it_wrote_and_is_marked_compiled(
        clone, cache, lock, monkeypatch):
    python = sys.executable
    first = trees.git_tree(clone.first, lock, clone=clone.path)
    importable.importable_dir(first, python)  # the warm engine's first use: the whole tree compiled

    second = trees.git_tree(clone.second, lock, clone=clone.path)

    package = second.install_target / "sglang"
    tag = sys.implementation.cache_tag
    assert os.path.samefile(first.install_target / "sglang" / "__pycache__" / f"unchanged.{tag}.pyc",
                            package / "__pycache__" / f"unchanged.{tag}.pyc")
    written = [package / "__pycache__" / f"{name}.{tag}.pyc" for name in ("__init__", "only_in_two")]
    assert all(path.is_file() for path in written)
    assert json.loads((second.install_target / importable.COMPILED).read_text()) == {"interpreters": [python]}
    monkeypatch.setattr(importable, "compile_bytecode", lambda *a: pytest.fail("compiled the whole tree again"))
    assert importable.importable_dir(second, python) == second.install_target


def test_a_neighbour_of_an_export_never_compiled_leaves_the_whole_compile_to_its_first_use(clone, cache, lock):
    trees.git_tree(clone.first, lock, clone=clone.path)

    second = trees.git_tree(clone.second, lock, clone=clone.path)

    assert not (second.install_target / importable.COMPILED).exists()
    assert not (second.install_target / "sglang" / "__pycache__").exists()
    importable.importable_dir(second, sys.executable)
    assert (second.install_target / "sglang" / "__pycache__").is_dir()


def cached_release(cache: Path, where: str, files: dict[str, str]) -> Path:
    """A release's ``sglang/`` package as the cache holds one (``where``: an unpacked tree or a cell environment's
    site-packages), each module with bytecode beside it."""
    package = cache / where / "sglang"
    (package / "__pycache__").mkdir(parents=True)
    for name, text in files.items():
        (package / name).write_text(text)
        (package / "__pycache__" / f"{name[:-3]}.cpython-312.pyc").write_bytes(b"compiled " + text.encode())
    return package


@pytest.mark.parametrize("where", ["unpacked/release-0.5.1.0123456789ab",
                                   "envs/tree.release-0.5.1.closure.abc/lib/python3.12/site-packages"])
def test_the_first_export_into_an_empty_trees_cache_links_what_a_cached_release_shares_with_its_bytecode(
        clone, cache, lock, where):
    package = cached_release(cache, where, {"unchanged.py": "KEPT = 1\n", "__init__.py": "__version__ = 'old'\n"})

    tree = trees.git_tree(clone.first, lock, clone=clone.path)

    exported = tree.install_target / "sglang"
    assert os.path.samefile(package / "unchanged.py", exported / "unchanged.py")
    assert os.path.samefile(package / "__pycache__" / "unchanged.cpython-312.pyc",
                            exported / "__pycache__" / "unchanged.cpython-312.pyc")
    assert (exported / "__init__.py").read_text() == "__version__ = 'one'\n"  # another blob: from the clone
    assert not (exported / "__pycache__" / "__init__.cpython-312.pyc").exists()
    # For which interpreter the release's bytecode is current is not known: its first use compiles what is not.
    assert not (tree.install_target / importable.COMPILED).exists()


@pytest.mark.parametrize("far", [False, True])
def test_an_export_looks_in_the_releases_only_for_what_is_far_from_every_export(clone, cache, lock, monkeypatch,
                                                                                 far):
    first = trees.git_tree(clone.first, lock, clone=clone.path)
    package = cached_release(cache, "unpacked/release-0.5.1.0123456789ab",
                             {"unchanged.py": "KEPT = 1\n", "only_in_two.py": ""})
    monkeypatch.setattr(trees, "FAR", 1 if far else 2)  # the second commit writes two files no export holds

    second = trees.git_tree(clone.second, lock, clone=clone.path)

    exported = second.install_target / "sglang"
    assert os.path.samefile(first.install_target / "sglang" / "unchanged.py", exported / "unchanged.py")
    assert os.path.samefile(package / "only_in_two.py", exported / "only_in_two.py") is far


def test_an_export_whose_donor_vanished_writes_every_file_from_the_clone(clone, cache, lock, monkeypatch):
    first = trees.git_tree(clone.first, lock, clone=clone.path)
    monkeypatch.setattr(trees.os, "link", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError(a[0])))

    second = trees.git_tree(clone.second, lock, clone=clone.path)

    assert (second.install_target / "sglang" / "unchanged.py").read_text() == "KEPT = 1\n"
    assert not os.path.samefile(first.install_target / "sglang" / "unchanged.py",
                                second.install_target / "sglang" / "unchanged.py")


def test_a_link_leading_out_of_the_commit_is_refused_and_leaves_no_tree(clone, cache, lock):
    os.symlink("../../../../outside", clone.path / "python" / "sglang" / "escape")
    git(clone.path, "add", "-A")
    git(clone.path, "commit", "-q", "-m", "escape")

    with pytest.raises(HarnessError, match="leading out of its tree"):
        trees.git_tree("HEAD", lock, clone=clone.path)

    assert [p for p in os.listdir(cache / "trees") if not p.startswith(".")] == []


def test_a_tree_exported_from_a_clone_is_reused_without_it_and_keeps_its_provenance(
        clone, cache, lock, monkeypatch, unreachable_url):
    trees.git_tree(clone.first, lock, clone=clone.path)
    monkeypatch.setenv("PDEVIDENCE_GIT_ARCHIVE_URL", unreachable_url + "/{sha}.tar.gz")
    again = trees.git_tree(clone.first, lock)
    assert (again.source, again.origin) == ("clone", str(clone.path))


def test_clone_without_the_commit_says_to_git_fetch_it(clone, lock):
    missing = "f" * 40

    with pytest.raises(HarnessError) as caught:
        trees.git_tree(missing, lock, clone=clone.path)

    assert caught.value.code == errors.ENVIRONMENT
    assert missing in str(caught.value)
    assert "git fetch" in str(caught.value)


def test_clone_that_is_not_a_git_checkout_is_a_usage_error(clone, tmp_path, lock):
    plain = tmp_path / "not-a-repo"
    plain.mkdir()

    with pytest.raises(HarnessError) as caught:
        trees.git_tree(clone.first, lock, clone=plain)

    assert caught.value.code == errors.USAGE
    assert "SGLANG_REPO" in str(caught.value)


# --- release_tree from a package index --------------------------------------------------------

WHEEL_NAME = "sglang-0.0.1-py3-none-any.whl"


def build_wheel(version: str = "0.0.1", marker: str = "") -> bytes:
    dist = f"sglang-{version}.dist-info"
    files = {
        "sglang/__init__.py": f"__version__ = {version!r}\n{marker}",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: pdevidence-tests\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, text in files.items():
            whl.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), text)
    return buf.getvalue()


WHEEL = build_wheel()


@pytest.fixture
def index(http_server, monkeypatch):
    """A PEP 691 JSON simple index; ``publish`` lists one wheel in it."""
    monkeypatch.setenv("PDEVIDENCE_INDEX_URL", http_server.url("/simple"))

    def publish(wheel: bytes = WHEEL, *, listed_sha256: str | None = None, relative: bool = False):
        http_server.serve(f"/files/{WHEEL_NAME}", wheel)
        page = {
            "meta": {"api-version": "1.0"},
            "name": "sglang",
            "files": [{
                "filename": WHEEL_NAME,
                "url": f"../../files/{WHEEL_NAME}" if relative else http_server.url(f"/files/{WHEEL_NAME}"),
                "hashes": {"sha256": listed_sha256 or sha256(wheel)},
            }],
        }
        http_server.serve("/simple/sglang/", json.dumps(page).encode(),
                          content_type="application/vnd.pypi.simple.v1+json")

    http_server.publish = publish
    return http_server


def test_release_downloads_the_wheel_caches_it_and_records_its_hash(index, cache, lock):
    index.publish()

    tree = trees.release_tree("0.0.1", "3.11", lock)

    assert tree.kind == "release" and tree.resolved == "0.0.1" and tree.source == "pypi"
    assert tree.install_target == cache / "wheels" / sha256(WHEEL) / WHEEL_NAME
    assert tree.install_target.read_bytes() == WHEEL
    assert tree.digest == sha256(WHEEL)
    with zipfile.ZipFile(tree.install_target) as whl:
        assert "__version__ = '0.0.1'" in whl.read("sglang/__init__.py").decode()
    assert lock.first_seen("release", "sglang==0.0.1") == {"files": {WHEEL_NAME: sha256(WHEEL)}}
    assert stray_files(cache, lock.path.parent) == []


def test_release_already_cached_does_not_ask_the_index(index, lock):
    index.publish()
    first = trees.release_tree("0.0.1", "3.11", lock)

    assert trees.release_tree("0.0.1", "3.11", lock) == first
    assert index.hits() == 2  # one index page, one wheel: from the first call only


def test_release_index_with_a_relative_file_url_is_followed(index, cache, lock):
    index.publish(relative=True)  # PEP 691 allows urls relative to the project page

    tree = trees.release_tree("0.0.1", "3.11", lock)

    assert tree.install_target.read_bytes() == WHEEL


def test_release_wheel_not_matching_the_index_hash_is_refused(index, cache, lock):
    listed = "e" * 64
    index.publish(listed_sha256=listed)

    with pytest.raises(HarnessError) as caught:
        trees.release_tree("0.0.1", "3.11", lock)

    assert caught.value.code == errors.INTEGRITY
    assert listed in str(caught.value) and sha256(WHEEL) in str(caught.value)
    assert lock.first_seen("release", "sglang==0.0.1") is None
    assert [p for p in (cache / "wheels").rglob("*") if p.is_file()] == []


def test_release_index_hash_differing_from_the_lock_is_refused_before_download(index, cache, lock):
    pinned = "d" * 64
    pin(lock, "release", "sglang==0.0.1", {"files": {WHEEL_NAME: pinned}})
    index.publish()

    with pytest.raises(HarnessError) as caught:
        trees.release_tree("0.0.1", "3.11", lock)

    assert caught.value.code == errors.INTEGRITY
    assert pinned in str(caught.value) and sha256(WHEEL) in str(caught.value)
    assert index.hits(f"/files/{WHEEL_NAME}") == 0
    assert lock.pinned("release", "sglang==0.0.1") == {"files": {WHEEL_NAME: pinned}}


def test_release_version_not_in_the_index_is_a_usage_error(index, lock):
    index.publish()

    with pytest.raises(HarnessError) as caught:
        trees.release_tree("9.9.9", "3.11", lock)

    assert caught.value.code == errors.USAGE
    assert "sglang==9.9.9" in str(caught.value)


def test_release_with_the_index_unreachable_is_an_environment_error(lock):
    with pytest.raises(HarnessError) as caught:
        trees.release_tree("0.0.1", "3.11", lock)

    assert caught.value.code == errors.ENVIRONMENT
    assert "PDEVIDENCE_INDEX_URL" in str(caught.value)


# --- path_tree --------------------------------------------------------------------------------


def test_path_tree_of_a_checkout_root_installs_its_python_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "work"
    (root / "python" / "sglang").mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\n')

    tree = trees.path_tree(root)

    assert tree.kind == "path" and tree.source == "path"
    assert tree.install_target == root.resolve() / "python"
    assert tree.repo_root == root.resolve()
    # Not a git work tree: named by the content of its package directory.
    assert tree.digest == trees.content_digest(root / "python")
    assert tree.resolved == f"local-{tree.digest[:12]}" and tree.label() == f"path-local-{tree.digest[:12]}"


def test_path_tree_of_a_git_work_tree_is_labelled_by_head_and_dirtiness(clone):
    assert trees.path_tree(clone.path).resolved == clone.second

    (clone.path / "python" / "sglang" / "__init__.py").write_text("# work in progress\n")

    dirty = trees.path_tree(clone.path)
    assert dirty.resolved == f"{clone.second}-dirty-{dirty.digest[:12]}"
    assert trees.commit_of(dirty.resolved) == clone.second


def failing(command: str, monkeypatch) -> None:
    """git fails ``command`` (as a damaged repository or a lock git left behind makes it), and only it."""
    real = trees._git

    def git_with_one_failure(clone, *args, **kw):
        if args[0] == command:
            return subprocess.CompletedProcess(["git", *args], 128, b"", b"fatal: index file corrupt")
        return real(clone, *args, **kw)

    monkeypatch.setattr(trees, "_git", git_with_one_failure)


@pytest.mark.parametrize("command", ["diff", "ls-files"])
def test_a_work_tree_git_cannot_read_is_an_error_never_a_clean_tree(clone, monkeypatch, command):
    (clone.path / "python" / "sglang" / "__init__.py").write_text("# work in progress\n")
    failing(command, monkeypatch)

    with pytest.raises(HarnessError) as caught:
        trees.path_tree(clone.path)

    assert f"git -C {clone.path} {command}" in str(caught.value) and "index file corrupt" in str(caught.value)


@pytest.mark.parametrize(("command", "whole"), [("^{tree}", True), ("^{tree}", False), ("ls-tree", False),
                                                ("cat-file", False)])
def test_a_clone_git_cannot_read_the_tree_of_is_an_error_and_leaves_no_tree(clone, cache, lock, monkeypatch, command,
                                                                             whole):
    real = trees._git
    monkeypatch.setattr(trees, "_git", lambda clone_, *args, **kw: subprocess.CompletedProcess(
        args, 128, "", "fatal: bad object") if command in args or args[-1].endswith(command)
        else real(clone_, *args, **kw))

    with pytest.raises(HarnessError, match="bad object"):
        trees.git_tree(clone.first, lock, clone=clone.path, whole=whole)

    assert not (cache / "trees" / f"git-{clone.first}").exists()
    assert not (cache / "trees" / f"commit-{clone.first}").exists()


def test_files_are_hashed_a_chunk_at_a_time_never_read_whole(clone, tmp_path, monkeypatch):
    big = b"x" * (3 * (1 << 20) + 5)
    (clone.path / "python" / "sglang" / "untracked.bin").write_bytes(big)
    outside = tmp_path / "outside" / "sglang"
    outside.mkdir(parents=True)
    (outside / "data.bin").write_bytes(big)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read whole"))

    dirty = trees.path_tree(clone.path)
    digest = trees.content_digest(outside)

    # The names the chunked hashing gives are those whole reads gave: cached names do not change.
    expected = hashlib.sha256(clone.second.encode() + b"\0python/sglang/untracked.bin\0" + big).hexdigest()
    assert dirty.digest == expected
    assert digest == hashlib.sha256(b"data.bin\0" + hashlib.sha256(big).digest()).hexdigest()


def test_a_tree_outside_git_is_named_by_every_file_the_probes_can_load_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "work"
    package = root / "python" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "srt" / "scheduler.py").write_text("RETIRE = True\n")
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\n')
    first = trees.path_tree(root)

    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")
    (root / "docs.md").write_text("outside the package directory\n")  # not on the probes' path
    assert trees.path_tree(root).resolved == first.resolved

    names = {first.resolved}
    for change in (lambda: (package / "srt" / "scheduler.py").write_text("RETIRE = False\n"),  # bytes
                   lambda: (package / "srt" / "scheduler.py").rename(package / "srt" / "moved.py"),  # a name
                   lambda: (package / "vendor.py").write_text(""),  # a new, empty file
                   lambda: (root / "python" / "pyproject.toml").write_text("")):  # what chooses the era
        change()
        names.add(trees.path_tree(root).resolved)
    assert len(names) == 5

    (package / "loop").symlink_to(package)  # a link loop is read once, not forever
    (root / "elsewhere.py").write_text("X = 1\n")
    (package / "linked.py").symlink_to(root / "elsewhere.py")  # an import reads through the link
    linked = trees.path_tree(root)
    (root / "elsewhere.py").write_text("X = 2\n")
    assert trees.path_tree(root).resolved != linked.resolved


def test_path_tree_of_a_directory_without_a_python_package_is_a_usage_error(tmp_path):
    (tmp_path / "python").mkdir()  # python/ with setup files but no sglang/ in it
    (tmp_path / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\n')

    with pytest.raises(HarnessError) as caught:
        trees.path_tree(tmp_path)

    assert caught.value.code == errors.USAGE
    assert "python/ holds sglang/, or a directory holding sglang/" in str(caught.value)


def test_concurrent_fetches_of_one_release_download_it_once_and_record_it_once(index, cache, lock, http_server):
    index.publish()
    http_server.routes[f"/files/{WHEEL_NAME}"].delay = 0.3  # the second caller arrives mid-download
    got, failures = twice_at_once(lambda: trees.release_tree("0.0.1", "3.11", LockFile(lock.path)))

    assert failures == [] and len(got) == 2 and got[0] == got[1]
    assert http_server.hits(f"/files/{WHEEL_NAME}") == 1
    assert lock.first_seen("release", "sglang==0.0.1") == {"files": {WHEEL_NAME: sha256(WHEEL)}}
    assert stray_files(cache, lock.path.parent) == []


# --- wheel tags (packaging) -------------------------------------------------------------------


def this_platform() -> str:
    return next(t.platform for t in trees.supported_tags("3.12") if t.platform != "any")


def index_entry(filename: str, **extra) -> dict:
    return {"filename": filename, "url": f"https://files.example/{filename}", **extra}


def test_a_wheel_for_another_os_on_the_same_machine_is_never_picked():
    mac = "sglang-0.5.21-cp312-cp312-macosx_11_0_x86_64.whl"  # same machine name, other OS
    here = f"sglang-0.5.21-cp312-cp312-{this_platform()}.whl"
    files = [index_entry(mac), index_entry(here), index_entry("sglang-0.5.21.tar.gz")]

    assert trees.pick_wheel(files, "sglang", "0.5.21", "3.12")["filename"] == here
    with pytest.raises(HarnessError) as caught:
        trees.pick_wheel([index_entry(mac)], "sglang", "0.5.21", "3.12")
    assert caught.value.code == errors.USAGE and "sglang==0.5.21" in str(caught.value)


def test_the_most_specific_wheel_wins_and_other_pythons_versions_and_yanked_files_do_not_count():
    here = this_platform()
    files = [
        index_entry("sglang-0.5.21-py3-none-any.whl"),
        index_entry(f"sglang-0.5.21-cp312-cp312-{here}.whl"),
        index_entry(f"sglang-0.5.21-cp311-cp311-{here}.whl"),
        index_entry(f"sglang-0.5.210-cp312-cp312-{here}.whl"),
        index_entry(f"sglang_router-0.5.21-cp312-cp312-{here}.whl"),
        index_entry(f"sglang-0.5.21.post1-cp312-cp312-{here}.whl"),
    ]
    assert trees.pick_wheel(files, "sglang", "0.5.21", "3.12")["filename"] == f"sglang-0.5.21-cp312-cp312-{here}.whl"
    assert trees.pick_wheel(files[:1] + files[2:], "sglang", "0.5.21", "3.12")["filename"] == files[0]["filename"]
    yanked = [index_entry(f"sglang-0.5.21-cp312-cp312-{here}.whl", yanked=True)]
    with pytest.raises(HarnessError):
        trees.pick_wheel(yanked, "sglang", "0.5.21", "3.12")


def test_wheel_fits_reads_the_name_version_and_tags_with_packaging():
    supported = trees.supported_tags("3.12")
    assert str(trees.wheel_fits(f"sglang-0.5.17-cp312-cp312-{this_platform()}.whl", "sglang", supported)) == "0.5.17"
    assert trees.wheel_fits("sglang-0.5.17-cp312-cp312-win_amd64.whl", "sglang", supported) is None
    assert trees.wheel_fits("not a wheel.whl", "sglang", supported) is None


# --- refs and path labels ---------------------------------------------------------------------


def test_a_full_sha_stands_as_given_and_a_ref_is_resolved_by_the_clone(clone):
    assert trees.resolve_ref(clone.first.upper(), None) == clone.first
    assert trees.resolve_ref("HEAD", clone.path) == clone.second
    assert trees.resolve_ref("HEAD~1", clone.path) == clone.first
    assert trees.resolve_ref(clone.first[:10], clone.path) == clone.first


@pytest.mark.parametrize("ref", ["HEAD", "0123456789ab", "no-such-branch"])
def test_a_ref_that_cannot_be_resolved_is_a_usage_error(clone, ref):
    with pytest.raises(HarnessError) as caught:
        trees.resolve_ref(ref, None)
    assert caught.value.code == errors.USAGE and "SGLANG_REPO" in str(caught.value)
    if ref == "no-such-branch":
        with pytest.raises(HarnessError) as caught:
            trees.resolve_ref(ref, clone.path)
        assert caught.value.code == errors.USAGE and "does not name a commit" in str(caught.value)


def test_a_git_tree_asked_by_ref_is_cached_under_its_sha(clone, cache, lock):
    tree = trees.git_tree("HEAD", lock, clone=clone.path)
    assert tree.resolved == clone.second and tree.label() == f"git-{clone.second[:12]}"
    assert os.listdir(cache / "trees") == [f"commit-{clone.second}"]


def test_a_dirty_path_tree_names_its_head_and_its_changes(clone):
    clean = trees.path_tree(clone.path)
    assert clean.label() == f"path-{clone.second[:12]}"
    init = clone.path / "python" / "sglang" / "__init__.py"

    init.write_text("__version__ = 'edit one'\n")
    one = trees.path_tree(clone.path)
    init.write_text("__version__ = 'edit two'\n")
    two = trees.path_tree(clone.path)

    # Two edits on one HEAD: two names, two keys (two work trees of one commit must not swap answers).
    assert one.label() == f"path-{clone.second[:12]}-dirty-{one.digest[:12]}"
    assert len({clean.label(), one.label(), two.label()}) == len({clean.digest, one.digest, two.digest}) == 3
    (clone.path / "python" / "sglang" / "new.py").write_text("a = 1\n")
    untracked = trees.path_tree(clone.path)
    (clone.path / "python" / "sglang" / "new.py").write_text("a = 2\n")
    assert len({two.digest, untracked.digest, trees.path_tree(clone.path).digest}) == 3


def test_a_clean_path_tree_has_a_stable_digest_and_ignored_files_do_not_count(clone):
    (clone.path / ".gitignore").write_text("build/\n")
    git(clone.path, "add", ".gitignore")
    git(clone.path, "commit", "-q", "-m", "ignore")
    before = trees.path_tree(clone.path)
    (clone.path / "build").mkdir()
    (clone.path / "build" / "artifact.o").write_bytes(b"\0")
    after = trees.path_tree(clone.path)
    assert before.digest == after.digest and after.resolved == before.resolved == git(clone.path, "rev-parse", "HEAD")


# --- the tree lock: pinned in the tracked file, first seen in the user cache -------------------

OTHER_MACHINE_WHEEL = "sglang-0.0.1-cp311-cp311-manylinux_2_34_aarch64.whl"


def test_a_pinned_release_verifies_whichever_of_its_wheels_this_machine_picks(index, cache, lock):
    """The lock was made where the aarch64 wheel was picked; this machine picks the pure one."""
    pin(lock, "release", "sglang==0.0.1", {"files": {OTHER_MACHINE_WHEEL: "a" * 64, WHEEL_NAME: sha256(WHEEL)}})
    pinned = lock.path.read_bytes()
    index.publish()

    tree = trees.release_tree("0.0.1", "3.11", lock)

    assert tree.digest == sha256(WHEEL)
    assert lock.path.read_bytes() == pinned and lock.first_seen("release", "sglang==0.0.1") is None


def test_a_file_the_pinned_release_does_not_list_is_an_integrity_failure(index, cache, lock):
    pin(lock, "release", "sglang==0.0.1", {"files": {OTHER_MACHINE_WHEEL: "a" * 64}})
    index.publish()

    with pytest.raises(HarnessError) as caught:
        trees.release_tree("0.0.1", "3.11", lock)

    assert caught.value.code == errors.INTEGRITY and WHEEL_NAME in str(caught.value)
    assert index.hits(f"/files/{WHEEL_NAME}") == 0


def test_an_unpinned_release_is_recorded_in_the_user_cache_never_in_the_tracked_file(index, cache, lock):
    pin(lock, "release", "sglang==9.9.9", {"files": {"sglang-9.9.9-py3-none-any.whl": "b" * 64}})
    pinned = lock.path.read_bytes()
    index.publish()

    trees.release_tree("0.0.1", "3.11", lock)

    assert lock.path.read_bytes() == pinned
    assert lock.seen == cache / "trees.seen.json"
    assert lock.first_seen("release", "sglang==0.0.1") == {"files": {WHEEL_NAME: sha256(WHEEL)}}
    assert lock.seen.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("which", ["tracked", "seen"])
def test_a_corrupt_lock_file_is_an_integrity_failure_naming_it(index, cache, lock, which):
    path = lock.path if which == "tracked" else lock.seen
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"release": {"sglang==0.0.1": {"filename": "x.whl", "sha256": "')  # truncated
    index.publish()

    with pytest.raises(HarnessError) as caught:
        trees.release_tree("0.0.1", "3.11", lock)

    assert caught.value.code == errors.INTEGRITY and str(path) in str(caught.value)


def test_a_truncated_tree_marker_means_rebuild(github, make_tarball, cache, lock):
    github.serve(ARCHIVE_PATH, sglang_archive(make_tarball))
    first = trees.git_tree(SHA, lock)
    marker = first.repo_root / trees.TREE_INFO
    assert marker.stat().st_mode & 0o777 == 0o644
    marker.write_text('{"source": "git')

    again = trees.git_tree(SHA, lock)

    assert again == first and json.loads(marker.read_text())["source"] == "github"


def test_the_committed_lock_pins_every_wheel_of_each_release_the_published_results_use():
    """The brackets and every release of the published sweep tables; each with all its files."""
    from pdevidence import registry
    from pdevidence.core.paths import PROJECT, tree_lock_file

    reg = registry.load(PROJECT)
    lock = LockFile(tree_lock_file(PROJECT))
    used = {v for exp in reg.experiments.values() for v in exp.releases.values() if v}
    for sweep in (PROJECT / "results").glob("sweep-*.json"):
        used |= {r["version"] for r in json.loads(sweep.read_text())["releases"]}
    assert used
    for version in used:
        files = lock.pinned("release", f"sglang=={version}")["files"]
        assert files and all(name.startswith(f"sglang-{version}-") for name in files)
        if any(name.endswith("-none-any.whl") for name in files):  # up to 0.5.10: one pure wheel serves every machine
            continue
        assert any(name.endswith("_x86_64.whl") for name in files), version
        assert any(name.endswith("_aarch64.whl") for name in files), version  # not one machine's wheel only


def test_lock_trees_pins_every_wheel_of_the_brackets_with_the_index_hashes(tmp_path, http_server, monkeypatch):
    from synthetic import make_project, serve_index, wheel_bytes

    from pdevidence import cli

    root = make_project(tmp_path / "project")
    wheels = {f"sglang-{v}-{tag}.whl": wheel_bytes(v, "") for v in ("1.0.0", "1.1.0")
              for tag in ("py3-none-any", "cp312-cp312-manylinux_2_34_aarch64")}
    monkeypatch.setenv("PDEVIDENCE_INDEX_URL", serve_index(http_server, wheels))

    assert cli.main(["--root", str(root), "lock-trees"]) == errors.CONFIRMED

    lock = LockFile(root / "constraints" / "trees.lock.json")
    for version in ("1.0.0", "1.1.0"):
        assert lock.pinned("release", f"sglang=={version}") == {"files": {
            name: sha256(data) for name, data in wheels.items() if name.startswith(f"sglang-{version}-")}}
    assert lock.path.stat().st_mode & 0o777 == 0o644


def test_the_package_index_is_asked_again_after_a_server_error(http_server, monkeypatch):
    monkeypatch.setattr(trees.fetch.children, "sleep", lambda seconds: None)
    page = json.dumps({"files": [{"filename": "sglang-1.0-py3-none-any.whl", "url": "f.whl"}]}).encode()
    http_server.serve("/simple/sglang/", page, content_type="application/vnd.pypi.simple.v1+json", fail_first=1)

    files = trees.index_files("sglang", http_server.url("/simple"))

    assert [f["url"] for f in files] == [http_server.url("/simple/sglang/f.whl")]
    assert http_server.hits("/simple/sglang/") == 2
