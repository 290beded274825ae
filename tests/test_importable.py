"""A tree as a directory the engine puts on a child's path: unpacked once, compiled before anyone imports it."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
from synthetic import wheel_bytes

from pdevidence.core.errors import HarnessError
from pdevidence.sources import importable, trees

TAG = sys.implementation.cache_tag  # the probes' interpreter here is this one


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_CACHE", str(tmp_path / "cache"))


def wheel_tree(tmp_path: Path, source: str = "VALUE = 1\n") -> trees.Tree:
    wheel = tmp_path / "sglang-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes("1.0", source))
    return tree_of(wheel)


def tree_of(wheel: Path) -> trees.Tree:
    return trees.Tree("release", "1.0", "1.0", wheel, "a" * 64, "pypi", wheel.name)


def test_an_unpacked_wheel_holds_current_bytecode_for_the_probes_interpreter(tmp_path):
    tree = importable.importable_dir(wheel_tree(tmp_path), sys.executable)

    source = tree / "sglang" / "__init__.py"
    compiled = Path(importlib.util.cache_from_source(str(source)))
    assert compiled.name == f"__init__.{TAG}.pyc"
    # What the import system checks before it uses a pyc: the source's mtime and size, in the header.
    header = compiled.read_bytes()[:16]
    assert int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime) & 0xFFFFFFFF
    assert int.from_bytes(header[12:16], "little") == source.stat().st_size


def test_a_module_that_does_not_compile_is_left_to_fail_where_it_is_imported(tmp_path):
    tree = importable.importable_dir(wheel_tree(tmp_path, "def broken(:\n"), sys.executable)

    assert (tree / "sglang" / "__init__.py").exists()
    assert not list((tree / "sglang").glob("__pycache__/*.pyc"))


def test_an_interpreter_that_cannot_compile_is_an_error_and_leaves_no_tree(tmp_path):
    with pytest.raises(HarnessError, match="compiling .* to bytecode"):
        importable.importable_dir(wheel_tree(tmp_path), "/bin/false")

    assert not list((tmp_path / "cache" / "unpacked").glob("release-1.0*"))


def _unpack(args: tuple[str, str]) -> str:
    wheel, cache = args
    os.environ["PDEVIDENCE_CACHE"] = cache
    return str(importable.importable_dir(tree_of(Path(wheel)), sys.executable))


def test_runs_unpacking_one_wheel_at_once_all_get_the_one_tree(tmp_path):
    """Issue 29's case: two checks unpacking the same wheel; the second rename found the first one's tree."""
    wheel = wheel_tree(tmp_path).install_target
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        found = pool.map(_unpack, [(str(wheel), str(tmp_path / "cache"))] * 4)

    assert len(set(found)) == 1
    assert sorted(p.name for p in (tmp_path / "cache" / "unpacked").iterdir() if not p.name.endswith(".lock")) == \
        [Path(found[0]).name]


def test_only_the_package_and_its_metadata_are_unpacked_and_a_member_over_the_limit_is_refused(tmp_path, monkeypatch):
    import zipfile
    wheel = tmp_path / "sglang-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes("1.0", "VALUE = 1\n"))
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("tools/huge.bin", b"\0" * (2 << 20), compress_type=zipfile.ZIP_DEFLATED)
    tree = importable.importable_dir(tree_of(wheel), sys.executable)
    assert (tree / "sglang" / "__init__.py").is_file() and not (tree / "tools").exists()

    monkeypatch.setenv("PDEVIDENCE_ARCHIVE_FILE_BYTES", "1M")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("sglang/huge.bin", b"\0" * (2 << 20), compress_type=zipfile.ZIP_DEFLATED)
    refused = trees.Tree("release", "1.0", "1.0", wheel, "b" * 64, "pypi", wheel.name)
    with pytest.raises(HarnessError, match=r"the wheel sglang-1.0-py3-none-any.whl: member 'sglang/huge.bin' holds "
                       r"2097152 bytes uncompressed, over the limit of 1048576 \(PDEVIDENCE_ARCHIVE_FILE_BYTES\)"):
        importable.importable_dir(refused, sys.executable)
    assert [p.name for p in (tmp_path / "cache" / "unpacked").iterdir() if "bbbbbb" in p.name and p.suffix != ".lock"] == []
