"""`check --image`: saved images read without a container runtime, on images the tests build.

A tiny stand-in SGLang package (tests/image_builder.py) is enough for the reader: the
formats, the whiteouts, several interpreters, editable installs, which copy the server imports
(the config's interpreter, PYTHONPATH, working directory and command), streaming, the cache, the
limits on what an image may make the harness write, and every malformed archive ending in a
clear error with its exit code. The real check of an
image built from release wheels is in test_images_real.py.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import image_builder as b
import pytest
from schemas import problems

from pdevidence import cli, registry
from pdevidence.core import archives, errors, settings
from pdevidence.core.paths import PROJECT
from pdevidence.lanes import check
from pdevidence.publish import openvex
from pdevidence.sources import images, layers

SITE = "usr/local/lib/python3.12/site-packages"
VENV = "opt/venv/lib/python3.12/site-packages"
DEBIAN = "usr/lib/python3/dist-packages"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def base_layer(site: str = SITE, version: str = "0.5.20", **extra) -> bytes:
    return b.layer(b.directory("usr"), *b.installed(site, b.sglang_files(version, **extra)),
                   b.file("etc/os-release", "ID=test\n"))


def upgrade_layer(site: str = SITE, *, marker_last: bool = False) -> bytes:
    """pip's upgrade to 0.5.21 as an overlay builder records it: the package directory opaque (recreated),
    the old dist-info whited out, the new one added."""
    new = b.installed(site, b.sglang_files("0.5.21"))
    marker = [b.opaque(f"{site}/sglang")]
    return b.layer(*([] if marker_last else marker), b.whiteout(f"{site}/sglang-0.5.20.dist-info"), *new,
                   *(marker if marker_last else []))


def files(tree: Path) -> dict[str, str]:
    return {p.relative_to(tree).as_posix(): p.read_text() for p in sorted(tree.rglob("*")) if p.is_file()}


def only(found: list[images.Found]) -> images.Found:
    assert len(found) == 1, [f.install.package for f in found]
    return found[0]


def scan(path: Path, log=None) -> list[images.Found]:
    return images.scan(path, log=log or (lambda msg: None))


# Formats

def formats(tmp_path: Path, layer_tars: list[bytes]) -> dict[str, Path]:
    """One image in every archive form the reader takes."""
    saved = b.docker_save(tmp_path / "saved.tar", layer_tars)
    gzipped = tmp_path / "saved.tar.gz"
    gzipped.write_bytes(gzip.compress(saved.read_bytes()))
    with tarfile.open(saved) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    return {"docker save": saved, "docker save | gzip": gzipped, "docker save, unpacked": tmp_path / "unpacked",
            "OCI directory": b.oci_layout(tmp_path / "oci", layer_tars, "gzip", ["v1"]),
            "OCI tar, uncompressed layers": b.oci_layout(tmp_path / "oci.tar", layer_tars, "none"),
            "OCI directory, zstd layers": b.oci_layout(tmp_path / "oci-zstd", layer_tars, "zstd"),
            "docker save of Docker 25 (OCI and manifest.json)": b.docker_save_oci(tmp_path / "docker25.tar", layer_tars,
                                                                             ["example/sglang:test"])}


def test_every_archive_form_gives_the_same_package(tmp_path, cache):
    pytest.importorskip("zstandard")
    layer_tars = [base_layer(), upgrade_layer()]
    found = {name: only(scan(path)) for name, path in formats(tmp_path, layer_tars).items()}
    assert {f.install.digest for f in found.values()} == {found["docker save"].install.digest}
    first = found["docker save"]
    assert (first.install.site, first.install.package) == (f"/{SITE}", f"/{SITE}/sglang")
    assert first.install.version.version == "0.5.21" and first.install.dist_info == f"/{SITE}/sglang-0.5.21.dist-info"
    assert first.image.tags == ("example/sglang:test",) and first.image.manifest_digest is None
    assert first.image.platform == "linux/amd64" and first.image.config_digest == b.sha256(b.config(layer_tars))
    assert found["OCI directory"].image.manifest_digest == b.manifest_digest(tmp_path / "oci")
    assert found["OCI directory"].image.tags == ("v1",)
    assert found["docker save of Docker 25 (OCI and manifest.json)"].image.tags == ("example/sglang:test",)
    assert not list((cache / "images").glob(".incoming.*")), "the decompressed copy is removed"


# Whiteouts

@pytest.mark.parametrize("marker_last", [False, True], ids=["opaque marker first", "opaque marker last"])
def test_an_upgrade_in_a_later_layer_behind_an_opaque_whiteout_replaces_the_package(tmp_path, marker_last):
    old = base_layer(extra={"sglang/srt/only_in_0_5_20.py": "GONE = True\n"})
    found = only(scan(b.docker_save(tmp_path / "image.tar", [old, upgrade_layer(marker_last=marker_last)])))
    tree = files(found.install.tree)
    assert "sglang/srt/only_in_0_5_20.py" not in tree  # the opaque directory hides what the layer below put there
    assert tree["sglang/version.py"] == '__version__ = "0.5.21"\n'
    assert [name for name in tree if ".dist-info/" in name] == ["sglang-0.5.21.dist-info/METADATA",
                                                              "sglang-0.5.21.dist-info/RECORD"]
    assert found.install.version.told == "0.5.21"


def test_a_file_deleted_in_a_later_layer_is_gone_and_a_whiteout_spares_its_own_layer(tmp_path):
    door = f"{SITE}/sglang/srt/door.py"
    deleted = b.layer(b.whiteout(door))
    same_layer = b.layer(b.file(f"{SITE}/sglang/srt/mine.py", "MINE = 1\n"), b.whiteout(f"{SITE}/sglang/srt/mine.py"))
    found = only(scan(b.docker_save(tmp_path / "image.tar", [base_layer(), deleted, same_layer])))
    tree = files(found.install.tree)
    assert "sglang/srt/door.py" not in tree and "sglang/srt/__init__.py" in tree
    assert tree["sglang/srt/mine.py"] == "MINE = 1\n"  # whiteouts apply only to the layers below


def test_a_whited_out_directory_or_one_replaced_by_a_file_takes_its_packages_with_it(tmp_path):
    venv = b.layer(*b.installed(VENV, b.sglang_files("0.5.10")), *b.installed(DEBIAN, b.sglang_files("0.4.10")))
    gone = b.layer(b.whiteout("opt/venv"), b.file("usr/lib/python3", "not a directory any more\n"))
    assert [f.install.package for f in scan(b.docker_save(tmp_path / "a.tar", [base_layer(), venv]))] == [
        f"/{VENV}/sglang", f"/{DEBIAN}/sglang", f"/{SITE}/sglang"]
    found = scan(b.docker_save(tmp_path / "b.tar", [base_layer(), venv, gone]))
    assert [f.install.package for f in found] == [f"/{SITE}/sglang"]


def test_two_interpreters_in_one_image_are_two_packages_each_with_its_version(tmp_path):
    other = b.layer(*b.installed(VENV, b.sglang_files("0.5.10")), *b.installed(DEBIAN, b.sglang_files("0.4.10")))
    found = scan(b.oci_layout(tmp_path / "oci", [base_layer(), other]))
    assert [(f.install.site, f.install.version.version) for f in found] == [
        (f"/{VENV}", "0.5.10"), (f"/{DEBIAN}", "0.4.10"), (f"/{SITE}", "0.5.20")]
    assert len({f.install.tree for f in found}) == 3 and len({f.install.digest for f in found}) == 3
    assert files(found[1].install.tree)["sglang/version.py"] == '__version__ = "0.4.10"\n'


def test_hard_links_take_the_content_of_their_target_in_the_same_layer_or_below(tmp_path):
    cache = "root/.cache/uv/sglang-door.py"
    same = b.layer(b.file(cache, "CACHED = True\n"), *b.installed(VENV, b.sglang_files("0.5.10")),
                   b.hardlink(f"{VENV}/sglang/srt/door.py", cache))
    below = b.layer(b.hardlink(f"{VENV}/sglang/srt/linked.py", cache))
    tree = files(only(scan(b.docker_save(tmp_path / "image.tar", [same, below]))).install.tree)
    assert tree["sglang/srt/door.py"] == tree["sglang/srt/linked.py"] == "CACHED = True\n"


def test_an_editable_install_is_checked_where_its_direct_url_points(tmp_path):
    """SGLang's own images install it editable from /sgl-workspace/sglang/python."""
    source = "sgl-workspace/sglang/python"
    files_ = b.sglang_files("0.5.21")
    package = {k: v for k, v in files_.items() if k.startswith("sglang/")}
    info = {k: v for k, v in files_.items() if k.startswith("sglang-")}
    info["sglang-0.5.21.dist-info/direct_url.json"] = json.dumps(
        {"url": "file:///workspace/sglang/python", "dir_info": {"editable": True}}).encode()
    layer = b.layer(*b.installed(source, package), b.symlink("workspace", "sgl-workspace"),
                    *b.installed(SITE, info), b.file(f"{SITE}/__editable__.sglang-0.5.21.pth", f"/{source}\n"))
    found = only(scan(b.docker_save(tmp_path / "image.tar", [layer])))
    assert found.install.editable and found.install.package == "/workspace/sglang/python/sglang"
    assert found.install.version.version == "0.5.21"
    assert files(found.install.tree)["sglang/srt/door.py"] == "OPEN = True\n"


def test_a_dist_info_without_its_package_is_named_and_not_checked(tmp_path):
    info = {k: v for k, v in b.sglang_files("0.5.21").items() if k.startswith("sglang-")}
    said = []
    found = scan(b.docker_save(tmp_path / "image.tar", [base_layer(), b.layer(*b.installed(VENV, info))]), said.append)
    assert [f.install.site for f in found] == [f"/{SITE}"]
    assert any(f"/{VENV}: sglang-0.5.21.dist-info without its package" in line for line in said)


def test_without_a_dist_info_the_version_py_tells_the_version(tmp_path):
    package = {k: v for k, v in b.sglang_files("0.4.9").items() if k.startswith("sglang/")}
    found = only(scan(b.docker_save(tmp_path / "image.tar", [b.layer(*b.installed(DEBIAN, package))])))
    assert found.install.dist_info is None
    assert found.install.version.to_json() == {"version": "0.4.9", "local": None, "told": "0.4.9",
                                               "source": f"/{DEBIAN}/sglang/version.py"}


# Which copy the server imports: the image config's interpreter, PYTHONPATH, working directory and command

PYTHON = [b.file("usr/bin/python3.12", b"\x7fELF"), b.symlink("usr/bin/python3", "python3.12")]
DEBIAN_LOCAL = "usr/local/lib/python3.12/dist-packages"


def package_only(version: str) -> dict[str, bytes]:
    return {k: v for k, v in b.sglang_files(version).items() if k.startswith("sglang/")}


def test_pythonpath_over_site_packages_is_what_the_server_imports_and_the_copy_answered(tmp_path):
    """The measured case: PYTHONPATH=/opt/override holds 0.5.12, site-packages 0.5.13: the server imports 0.5.12."""
    layer = b.layer(*PYTHON, *b.installed(DEBIAN_LOCAL, b.sglang_files("0.5.13")),
                    *b.installed("opt/override", package_only("0.5.12")))
    said = []
    found = only(scan(b.docker_save(tmp_path / "image.tar", [layer], settings={
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONPATH=/opt/override"],
        "Cmd": ["python3", "-m", "sglang.launch_server"]}), said.append))
    assert (found.install.package, found.install.version.version) == ("/opt/override/sglang", "0.5.12")
    assert found.install.choice is images.Choice.IMPORTED
    assert "the image's command runs python3: /usr/bin/python3 (/usr/bin/python3.12)" in found.install.why
    assert f"sys.path /, /opt/override, /root/.local/lib/python3.12/site-packages, /{DEBIAN_LOCAL}" \
        in found.install.why
    assert any(f"/{DEBIAN_LOCAL}/sglang: not what the server imports (after /opt/override/sglang on its path)" in line
               for line in said), said
    # No interpreter in the image at all: PYTHONPATH comes before any site directory all the same.
    bare = b.layer(*b.installed(SITE, b.sglang_files("0.5.13")), *b.installed("opt/override", package_only("0.5.12")))
    found = only(scan(b.docker_save(tmp_path / "bare.tar", [bare], settings={"Env": ["PYTHONPATH=/opt/override"]})))
    assert (found.install.package, found.install.choice) == ("/opt/override/sglang", images.Choice.IMPORTED)


def venv_image(tmp_path: Path, name: str, settings: dict, *extra: tuple) -> Path:
    """python3.12 with 0.5.13 in its dist-packages; a venv of it with 0.5.10; ``extra`` on top."""
    layer = b.layer(*PYTHON, *b.installed(DEBIAN_LOCAL, b.sglang_files("0.5.13")),
                    b.symlink("opt/venv/bin/python", "/usr/bin/python3"),
                    b.file("opt/venv/pyvenv.cfg", "home = /usr/bin\ninclude-system-site-packages = false\n"
                           "version = 3.12.3\n"),
                    *b.installed(VENV, b.sglang_files("0.5.10")), *extra)
    return b.docker_save(tmp_path / name, [layer], settings=settings)


@pytest.mark.parametrize("settings, extra, package", [
    ({"Cmd": ["python3", "-m", "sglang.launch_server"]}, (), f"/{DEBIAN_LOCAL}/sglang"),
    ({"Entrypoint": ["/opt/venv/bin/python", "-m", "sglang.launch_server"]}, (), f"/{VENV}/sglang"),
    ({"Env": ["PATH=/opt/venv/bin:/usr/bin"], "Cmd": ["python", "-m", "sglang.launch_server"]}, (), f"/{VENV}/sglang"),
    ({"Entrypoint": ["serve"], "Env": ["PATH=/usr/local/bin:/usr/bin"]},
     (b.file("usr/local/bin/serve", "#!/opt/venv/bin/python\nimport sglang\n", 0o755),), f"/{VENV}/sglang"),
    ({"Entrypoint": ["/usr/bin/python3", "-I", "app.py"], "Env": ["PYTHONPATH=/opt/override"]},
     tuple(b.installed("opt/override", package_only("0.5.12"))), f"/{DEBIAN_LOCAL}/sglang"),
    ({"Entrypoint": ["/usr/bin/env", "PYTHONUNBUFFERED=1", "/opt/venv/bin/python", "-u", "-m", "sglang"]}, (),
     f"/{VENV}/sglang"),
    ({"Cmd": ["/bin/sh", "-c", "exec /opt/venv/bin/python -m sglang.launch_server --port 30000"]}, (),
     f"/{VENV}/sglang"),
    ({"Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"], "Cmd": ["/opt/venv/bin/python", "-m", "sglang"]},
     (b.file("opt/nvidia/nvidia_entrypoint.sh", "#!/bin/bash\nexec \"$@\"\n", 0o755),), f"/{VENV}/sglang"),
], ids=["python3 on PATH", "the venv's python named", "python on the venv's PATH", "a script whose #! names the venv",
        "-I: PYTHONPATH ignored", "env NAME=value python", "a Dockerfile's shell form", "a wrapper, then Python"])
def test_the_interpreter_the_config_names_decides_between_two_site_directories(tmp_path, settings, extra, package):
    found = only(scan(venv_image(tmp_path, "image.tar", settings, *extra)))
    assert (found.install.package, found.install.choice) == (package, images.Choice.IMPORTED)


def test_a_checkout_in_the_working_directory_does_not_shadow_the_editable_install_it_holds(tmp_path):
    """SGLang's own images: WorkingDir /sgl-workspace, its checkout sglang/ (no __init__.py: a namespace portion,
    which a regular package anywhere on the path wins over) holding python/sglang, installed editable."""
    source = "sgl-workspace/sglang/python"
    info = {k: v for k, v in b.sglang_files("0.5.21").items() if k.startswith("sglang-")}
    info["sglang-0.5.21.dist-info/direct_url.json"] = json.dumps(
        {"url": f"file:///{source}", "dir_info": {"editable": True}}).encode()
    pth = f"{DEBIAN_LOCAL}/__editable__.sglang-0.5.21.pth"
    layer = b.layer(*PYTHON, *b.installed(source, package_only("0.5.21")), b.file("sgl-workspace/sglang/README", "x"),
                    *b.installed(DEBIAN_LOCAL, info),
                    b.file(pth, "import __editable___sglang_0_5_21_finder; __editable___sglang_0_5_21_finder.install()\n"))
    settings = {"WorkingDir": "/sgl-workspace", "Cmd": ["/bin/bash"]}
    found = only(scan(b.docker_save(tmp_path / "image.tar", [layer], settings=settings)))
    assert (found.install.package, found.install.editable) == (f"/{source}/sglang", True)
    assert found.install.choice is images.Choice.IMPORTED
    assert "names no Python: python3 on its PATH, run as `python3 -m` from its working directory" in found.install.why
    assert found.install.why.startswith(f"the editable install's import hook in /{DEBIAN_LOCAL}, after the whole path")
    assert f"sys.path /sgl-workspace, /root/.local/lib/python3.12/site-packages, /{DEBIAN_LOCAL}, " in found.install.why
    # The install's import hook comes after the whole path: a copy in a later site directory wins over it ...
    later = b.layer(*b.installed("usr/lib/python3/dist-packages", b.sglang_files("0.5.9")))
    found = only(scan(b.docker_save(tmp_path / "hook.tar", [layer, later], settings=settings)))
    assert found.install.package == "/usr/lib/python3/dist-packages/sglang"
    # ... but not over a .pth naming the source, which site.py puts right after its own site directory.
    path_pth = b.layer(b.file(pth, f"/{source}\n"))
    said = []
    found = only(scan(b.docker_save(tmp_path / "pth.tar", [layer, later, path_pth], settings=settings), said.append))
    assert (found.install.package, found.install.editable) == (f"/{source}/sglang", True)  # one copy, not two
    assert [line.split(": ", 1)[1] for line in said if "not what the server imports" in line] == [
        "/usr/lib/python3/dist-packages/sglang: not what the server imports (after "
        f"/{source}/sglang on its path)"]


def test_when_the_copy_the_server_imports_cannot_be_told_every_copy_is_answered_and_none_is_an_all_clear(tmp_path):
    other = b.layer(*b.installed(VENV, b.sglang_files("0.5.10")))
    found = scan(b.docker_save(tmp_path / "image.tar", [base_layer(), other], settings={"Cmd": ["/start.sh"]}))
    assert [(f.install.package, f.install.choice) for f in found] == [
        (f"/{VENV}/sglang", images.Choice.UNDECIDED), (f"/{SITE}/sglang", images.Choice.UNDECIDED)]
    assert "the image has no python3 there" in found[0].install.why
    # Shell code the image runs decides nothing: it may activate a venv, set PYTHONPATH, run anything.
    shell = {"Cmd": ["/bin/sh", "-c", ". /opt/venv/bin/activate; python -m sglang.launch_server"]}
    found = scan(venv_image(tmp_path, "shell.tar", shell))
    assert [(f.install.package, f.install.choice) for f in found] == [
        (f"/{VENV}/sglang", images.Choice.UNDECIDED), (f"/{DEBIAN_LOCAL}/sglang", images.Choice.UNDECIDED)]
    assert "the image's command is shell code ('. /opt/venv/bin/activate; python -m" in found[0].install.why
    # An interpreter whose path reaches neither copy decides nothing either.
    python = b.layer(*PYTHON)
    found = scan(b.docker_save(tmp_path / "python.tar", [base_layer(), other, python]))
    assert {f.install.choice for f in found} == {images.Choice.UNDECIDED} and len(found) == 2
    assert "cannot be told: its interpreter imports none of them, the image names no command" in found[0].install.why
    fixed = check.ExperimentCheck("admission", 38935, check.Status.FIXED, {}, ["A1"], "a" * 64)
    reg = registry.load(PROJECT)
    target = check.resolve_image(reg, found[0].image.archive, log=lambda msg: None)[0][0]
    result = check.CheckResult(target, [check._undecided(fixed)], "0.5.10")
    assert result.experiments[0].status is check.Status.UNKNOWN and result.exit_code == errors.BEHAVIOUR_DIFFERS
    assert "the server may import another copy" in result.experiments[0].error
    assert "not an all-clear: which of 2 copies" in check.table(result)


# Streams and the cache

class Unseekable(io.RawIOBase):
    """A pipe: bytes in order, no going back."""

    def __init__(self, data: bytes):
        self.data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data.read(min(len(buffer), 4096))
        buffer[:len(chunk)] = chunk
        return len(chunk)


def test_a_layer_is_read_as_a_stream_and_checked_against_both_digests(tmp_path):
    tar = base_layer()
    stored = b.compress(tar, "gzip")
    names = [m.name for _, m in layers.members(Unseekable(stored), "a layer", digest=b.sha256(stored),
                                                diff_id=b.sha256(tar))]
    assert f"{SITE}/sglang/srt/door.py" in names
    with pytest.raises(errors.HarnessError, match="does not match its diff_id") as info:
        list(layers.members(Unseekable(stored), "a layer", digest=b.sha256(stored), diff_id=b.sha256(b"other")))
    assert info.value.code == errors.INTEGRITY


def test_only_the_packages_are_extracted_and_an_image_read_once_is_not_read_again(tmp_path, cache):
    big = b.layer(b.file("opt/model/weights.bin", b"\0" * (4 << 20)))
    path = b.oci_layout(tmp_path / "oci", [base_layer(), big])
    first = only(scan(path))
    written = sorted(p.relative_to(cache / "images").as_posix() for p in (cache / "images").rglob("*") if p.is_file())
    entry = first.install.tree.parent.parent.name
    assert written == [f"{entry}/scan.json", *(f"{entry}/trees/0/{name}" for name in sorted(files(first.install.tree)))]
    for blob in (path / "blobs" / "sha256").iterdir():  # the layers are not read again
        if blob.stat().st_size > 10000:
            blob.write_bytes(b"")
    said = []
    again = only(scan(path, said.append))
    assert again.install == first.install and any("read before" in line for line in said)


def gzip_layer(layout: Path) -> Path:
    return next(p for p in (layout / "blobs" / "sha256").iterdir() if p.read_bytes()[:2] == b"\x1f\x8b")


def test_a_zstd_layer_without_zstandard_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails as when it is not installed
    path = b.oci_layout(tmp_path / "oci", [base_layer()], "gzip")
    layer = gzip_layer(path)
    zstd_frame = b"\x28\xb5\x2f\xfd" + b"\0" * 16  # its magic is all the reader looks at before it needs the module
    layer.write_bytes(zstd_frame)
    code, err = run_check(path, capsys)
    assert code == errors.ENVIRONMENT
    assert "zstd-compressed" in err and "pip install 'pdevidence[zstd]'" in err


# Bounded reads: what an image may make the harness write

def zeros_image(tmp_path: Path, size: int) -> Path:
    """An image whose SGLang package holds one file of ``size`` zero bytes, in a gzip layer made a block at a
    time: its blob is tiny whatever ``size`` is."""
    package = {name: data for name, data in b.sglang_files("0.5.20").items()}
    files_ = {f"{SITE}/{name}": data for name, data in package.items()}
    return b.oci_layout(tmp_path / "oci", [b.zeros_layer(files_, (f"{SITE}/sglang/zeros.bin", size))])


def left_in(cache: Path) -> list[str]:
    """What the image cache holds but its locks."""
    return sorted(p.name for p in (cache / "images").iterdir()) if (cache / "images").exists() else []


def test_a_file_over_the_limit_is_refused_by_name_and_nothing_is_left_in_the_cache(tmp_path, cache, monkeypatch,
                                                                                      capsys):
    monkeypatch.setenv("PDEVIDENCE_ARCHIVE_FILE_BYTES", "1M")
    code, err = run_check(zeros_image(tmp_path, (1 << 20) + 1), capsys)
    assert code == errors.INTEGRITY
    assert f"member '{SITE}/sglang/zeros.bin (layer 1)' holds 1048577 bytes uncompressed" in err
    assert "over the limit of 1048576 (PDEVIDENCE_ARCHIVE_FILE_BYTES)" in err
    assert left_in(cache) == []


def test_what_an_image_s_packages_hold_in_all_is_bounded_too(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_ARCHIVE_BYTES", "64K")
    with pytest.raises(errors.HarnessError, match=r"zeros.bin \(layer 1\)' takes what is extracted to [0-9]+ bytes, "
                       r"over the limit of 65536 \(PDEVIDENCE_ARCHIVE_BYTES\)") as info:
        scan(zeros_image(tmp_path, 100 << 10))
    assert info.value.code == errors.INTEGRITY and left_in(cache) == []


def test_a_layer_of_too_many_members_is_refused_while_its_names_are_read(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_ARCHIVE_MEMBERS", "5")
    with pytest.raises(errors.HarnessError, match=r"layer 1 of 1 .*is its member number 6, over the limit of 5 "
                       r"\(PDEVIDENCE_ARCHIVE_MEMBERS\)") as info:
        scan(b.oci_layout(tmp_path / "oci", [base_layer()]))
    assert info.value.code == errors.INTEGRITY and left_in(cache) == []


def test_a_file_just_over_the_default_limit_is_refused_without_being_written(tmp_path, cache):
    """The default (256 MiB), from a blob of about a MiB: the measured 6 GiB of zeros is refused alike."""
    limit = settings.get("PDEVIDENCE_ARCHIVE_FILE_BYTES")
    path = zeros_image(tmp_path, limit + 1)
    assert sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) < limit // 100
    with pytest.raises(errors.HarnessError, match=f"holds {limit + 1} bytes uncompressed, over the limit of {limit}"):
        scan(path)
    assert left_in(cache) == []


def gzipped_save(tmp_path: Path) -> Path:
    """A `docker save | gzip` of a small image, with a run of zeros after its tar (a tar reader stops at its end
    blocks): it decompresses to more than a MiB from a blob of a few KiB."""
    saved = b.docker_save(tmp_path / "saved.tar", [base_layer()])
    path = tmp_path / "saved.tar.gz"
    path.write_bytes(gzip.compress(saved.read_bytes() + bytes(2 << 20)))
    return path


def test_an_archive_compressed_whole_decompresses_within_its_limit(tmp_path, cache, monkeypatch, capsys):
    path = gzipped_save(tmp_path)
    only(scan(path))  # within the default: read as ever
    monkeypatch.setenv("PDEVIDENCE_IMAGE_TAR_BYTES", "1M")
    shutil.rmtree(cache / "images")
    code, err = run_check(path, capsys)
    assert code == errors.INTEGRITY
    assert f"{path} decompresses to more than 1048576 bytes, over the limit of PDEVIDENCE_IMAGE_TAR_BYTES" in err
    assert f"gunzip -c {path} > /somewhere/image.tar" in err and "raise PDEVIDENCE_IMAGE_TAR_BYTES" in err
    assert left_in(cache) == []


def test_an_archive_compressed_whole_never_fills_the_cache_s_disk(tmp_path, cache, monkeypatch, capsys):
    path = gzipped_save(tmp_path)
    real = shutil.disk_usage
    monkeypatch.setattr(images.shutil, "disk_usage",
                        lambda where: real(where)._replace(free=images.DISK_RESERVE + (1 << 20)))
    code, err = run_check(path, capsys)
    assert code == errors.ENVIRONMENT
    assert f"{path} decompresses to more than the 1048576 bytes the disk of {cache / 'images'} can spare" in err
    assert "set PDEVIDENCE_CACHE to a larger disk" in err and left_in(cache) == []


# Malformed archives: a clear error naming what is wrong, never a traceback

def run_check(path: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["--root", str(PROJECT), "check", "--image", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def _rewrite_tar(path: Path, out: str, change) -> Path:
    """The tar at ``path`` with ``change(name, data)`` applied to each member (None drops it), as ``out`` beside it."""
    with tarfile.open(path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    changed = {name: change(name, data) for name, data in members.items()}
    return b.tar_of(path.with_name(out), {name: data for name, data in changed.items() if data is not None})


def malformed(tmp_path: Path) -> dict[str, tuple[Path, int, str]]:
    saved = b.docker_save(tmp_path / "saved.tar", [base_layer(), upgrade_layer()])
    layer_name = json.loads(tarfile.open(saved).extractfile("manifest.json").read())[0]["Layers"][1]
    oci = b.oci_layout(tmp_path / "oci", [base_layer()], "gzip")
    blob = gzip_layer(oci)
    tampered = b.oci_layout(tmp_path / "tampered", [base_layer()], "gzip")
    tampered_blob = tampered / "blobs" / "sha256" / blob.name
    tampered_blob.write_bytes(gzip.compress(base_layer(version="0.5.99"), mtime=0))
    truncated_layer = b.oci_layout(tmp_path / "truncated-layer", [base_layer()], "gzip")
    (truncated_layer / "blobs" / "sha256" / blob.name).write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    (tmp_path / "not-an-image").mkdir()
    (tmp_path / "random.bin").write_bytes(b"\x00\x01garbage" * 300)
    escaping = b.docker_save(tmp_path / "escaping.tar", [b.layer(b.file("../../etc/evil", "x"))])
    no_sglang = b.docker_save(tmp_path / "no-sglang.tar", [b.layer(b.file("usr/bin/python3", "#!"))])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    return {
        "missing": (tmp_path / "nowhere.tar", errors.USAGE, "is not a saved image: a `docker save` tarball"),
        "an empty directory": (tmp_path / "not-an-image", errors.USAGE, "the directory holds neither index.json"),
        "not a tar": (tmp_path / "random.bin", errors.USAGE, "the file is neither a tar archive nor a compressed one"),
        "a tar of something else": (b.tar_of(tmp_path / "other.tar", {"README": b"hi"}), errors.USAGE,
                                    "holds neither index.json"),
        "no SGLang in it": (no_sglang, errors.USAGE, "holds no SGLang package"),
        "manifest not JSON": (_rewrite_tar(saved, "bad-json.tar", lambda n, d: b"{oops" if n == "manifest.json" else d),
                              errors.INTEGRITY, "manifest manifest.json is not valid JSON"),
        "a layer missing": (_rewrite_tar(saved, "missing-layer.tar", lambda n, d: None if n == layer_name else d),
                            errors.INTEGRITY, f"layer {layer_name} is missing"),
        "a layer not a tar": (_rewrite_tar(saved, "not-a-tar-layer.tar",
                                           lambda n, d: b"\x07" * 2048 if n == layer_name else d),
                              errors.INTEGRITY, "layer 2 of 2"),
        "a layer altered (diff_id)": (_rewrite_tar(saved, "altered.tar", lambda n, d: upgrade_layer(marker_last=True)
                                                   if n == layer_name else d), errors.INTEGRITY,
                                      "does not match its diff_id"),
        "a blob altered (digest)": (tampered, errors.INTEGRITY, "does not match its digest"),
        "a layer cut short": (truncated_layer, errors.INTEGRITY, "cannot be read"),
        "the archive cut short": (cut, errors.INTEGRITY, "cannot be read"),
        "a member climbing out": (escaping, errors.INTEGRITY, "climbs out of the image root"),
    }


def test_every_malformed_archive_is_one_clear_error_with_its_exit_code(tmp_path, capsys):
    for name, (path, code, message) in malformed(tmp_path).items():
        got, err = run_check(path, capsys)
        assert (got, message in err) == (code, True), f"{name}: exit {got}: {err}"
        assert str(path) in err or name == "a layer missing", f"{name}: the error names the archive: {err}"


# The check: targets, their eras, the answer and OpenVEX

@pytest.fixture
def two_interpreters(tmp_path) -> Path:
    other = b.layer(*b.installed(VENV, b.sglang_files("0.5.10")))
    return b.oci_layout(tmp_path / "oci", [base_layer(), upgrade_layer(), other], tags=["lmsysorg/sglang:v0.5.21"])


def test_each_package_of_an_image_is_a_target_in_the_era_its_version_names(two_interpreters):
    reg = registry.load(PROJECT)
    found = check.resolve_image(reg, two_interpreters, log=lambda msg: None)
    targets = [target for target, _ in found]
    assert [(t.kind, t.resolved, t.era) for t in targets] == [
        ("image", "0.5.10", reg.era_of("0.5.10").name), ("image", "0.5.21", None)]
    target, tree = found[0]
    assert tree.install_target == target.image.install.tree and (tree.install_target / "sglang").is_dir()
    assert tree.label() == f"image-{target.sha256[:12]}" and target.sha256 == target.image.install.digest
    doc = target.to_json()
    why = doc["image"].pop("why")
    assert doc["image"] == {"archive": str(two_interpreters), "tags": ["lmsysorg/sglang:v0.5.21"],
                            "config_digest": target.image.image.config_digest,
                            "manifest_digest": b.manifest_digest(two_interpreters), "platform": "linux/amd64",
                            "site": f"/{VENV}", "package": f"/{VENV}/sglang",
                            "dist_info": f"/{VENV}/sglang-0.5.10.dist-info", "editable": False,
                            "imported": "undecided"}  # the image has no interpreter: either may be the server's
    assert why.startswith(f"which of 2 copies (/{VENV}/sglang, /{SITE}/sglang) the server imports cannot be told")
    assert doc["source_version"]["source"] == f"/{VENV}/sglang-0.5.10.dist-info/METADATA"
    assert doc["era_chosen_by"]["basis"] == "version" and "0.5.10" in doc["era_chosen_by"]["evidence"]


def fake_result(target, tree) -> check.CheckResult:
    return check.CheckResult(target, [check.ExperimentCheck("admission", 38935, check.Status.AFFECTED, {}, ["A1"],
                                                            "a" * 64)], target.resolved)


def test_the_answer_and_openvex_name_the_image_and_the_package_in_it(two_interpreters):
    reg = registry.load(PROJECT)
    results = [fake_result(*pair) for pair in check.resolve_image(reg, two_interpreters, log=lambda msg: None)]
    line = check.table(results[1]).splitlines()[0]
    config = results[1].target.image.image.config_digest
    assert line == (f"sglang check: image lmsysorg/sglang:v0.5.21 (config {config[:19]}…) /{SITE}/sglang: "
                    "sglang 0.5.21 from sglang-0.5.21.dist-info/METADATA, run in today's closure")
    assert problems("check", results[1].to_json()) == []
    doc = openvex.document(reg, results, "2026-11-01T00:00:00Z")
    assert problems("openvex-0.2.0", doc) == []
    digest = b.manifest_digest(two_interpreters)
    products = [s["products"] for s in doc["statements"]]
    sglang = [f"pkg:pypi/sglang@{v}" for v in ("0.5.10", "0.5.21")]
    image_purl = (f"pkg:oci/sglang@sha256%3A{digest.split(':')[1]}?arch=amd64"
                  "&repository_url=docker.io/lmsysorg/sglang&tag=v0.5.21")
    assert products == [[{"@id": image_purl, "identifiers": {"purl": image_purl},
                          "hashes": {"sha-256": digest.split(":")[1]},
                          "subcomponents": [{"@id": purl, "identifiers": {"purl": purl}}]}] for purl in sglang]
    assert [s["status_notes"].split("; ")[1] for s in doc["statements"]] == [f"sglang at /{VENV}/sglang",
                                                                               f"sglang at /{SITE}/sglang"]


@pytest.mark.parametrize("tags, expected", [
    (["sglang:latest"], ("docker.io/library/sglang", "latest")),
    (["lmsysorg/sglang:v0.5.21-cu129"], ("docker.io/lmsysorg/sglang", "v0.5.21-cu129")),
    (["ghcr.io/org/sglang:1"], ("ghcr.io/org/sglang", "1")),
    (["localhost:5000/sglang"], ("localhost:5000/sglang", None)),
    (["v1"], (None, "v1")),
    ([], (None, None)),
])
def test_an_image_tag_names_its_repository_as_docker_normalizes_it(tags, expected):
    image = images.Image(Path("/x/image.tar"), tuple(tags), "sha256:" + "0" * 64, None, "linux", "amd64", ())
    assert image.repository() == expected


def test_an_untagged_legacy_image_is_named_by_its_archive_and_config_digest(tmp_path):
    found = only(scan(b.docker_save(tmp_path / "my-image.tar", [base_layer()], tags=[])))
    assert openvex.oci_purl(found.image) == (f"pkg:oci/my-image@sha256%3A{found.image.config_digest.split(':')[1]}"
                                             "?arch=amd64")


def test_a_multi_platform_index_gives_each_platform_and_skips_attestations(tmp_path):
    amd, arm = b.oci_blobs([base_layer()]), b.oci_blobs([base_layer(version="0.5.19")], architecture="arm64")
    manifests = [json.loads(blobs["index.json"])["manifests"][0] for blobs in (amd, arm)]
    manifests[1]["platform"] = {"os": "linux", "architecture": "arm64"}
    attestation = {"mediaType": b.OCI_MANIFEST, "digest": "sha256:" + "f" * 64, "size": 1,
                   "platform": {"os": "unknown", "architecture": "unknown"},
                   "annotations": {"vnd.docker.reference.type": "attestation-manifest"}}
    inner = json.dumps({"schemaVersion": 2, "mediaType": b.OCI_INDEX, "manifests": [*manifests, attestation]}).encode()
    named = {"io.containerd.image.name": "docker.io/x/sglang:multi"}
    outer = {"schemaVersion": 2, "manifests": [{"mediaType": b.OCI_INDEX, "digest": b.sha256(inner), "size": len(inner),
                                                "annotations": named}]}
    path = b.write_dir(tmp_path / "multi", {**amd, **arm, "index.json": json.dumps(outer).encode(),
                                            f"blobs/sha256/{b.sha256(inner).split(':')[1]}": inner})
    found = scan(path)
    assert [(f.image.platform, f.install.version.version) for f in found] == [("linux/amd64", "0.5.20"),
                                                                              ("linux/arm64", "0.5.19")]
    assert {f.image.tags for f in found} == {("docker.io/x/sglang:multi",)}


def test_an_archive_that_changes_between_the_two_passes_is_refused(tmp_path):
    before = base_layer()
    fs = layers.Filesystem()
    fs.apply(0, layers.members(io.BytesIO(before), "layer 1", digest=None, diff_id=None), "layer 1")
    plan = layers.Plan()
    plan.add(fs.find(tuple(f"{SITE}/sglang".split("/"))), tmp_path / "out" / "sglang", f"/{SITE}/sglang")
    shifted = b.layer(b.file("etc/hostname", "new\n"), b.directory("usr"), *b.installed(SITE, b.sglang_files("0.5.20")))
    for after, message in [(shifted, "is no longer"), (b.layer(), "ends before member")]:
        with pytest.raises(errors.HarnessError, match=message) as info:
            layers.extract(plan, lambda i: layers.members(io.BytesIO(after), "layer 1", digest=None, diff_id=None),
                           lambda i: "layer 1", archives.Budget("the image"))
        assert info.value.code == errors.INTEGRITY


def test_a_docker_save_of_two_images_sharing_a_layer_by_symbolic_link_gives_both(tmp_path):
    """`docker save a b` writes a layer both images have once; the other names it by a symbolic link."""
    base, upgrade = base_layer(), upgrade_layer()
    configs = {"a": b.config([base]), "b": b.config([base, upgrade])}
    path = tmp_path / "two.tar"
    with tarfile.open(path, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add("1/layer.tar", base)
        link = tarfile.TarInfo("2/layer.tar")
        link.type, link.linkname = tarfile.SYMTYPE, "../1/layer.tar"
        tar.addfile(link)
        add("3/layer.tar", upgrade)
        for data in configs.values():
            add(f"{b.sha256(data).split(':')[1]}.json", data)
        add("manifest.json", json.dumps([
            {"Config": f"{b.sha256(configs['a']).split(':')[1]}.json", "RepoTags": ["x/a:1"],
             "Layers": ["1/layer.tar"]},
            {"Config": f"{b.sha256(configs['b']).split(':')[1]}.json", "RepoTags": ["x/b:1"],
             "Layers": ["2/layer.tar", "3/layer.tar"]}]).encode())
    found = scan(path)
    assert [(f.image.tags, f.install.version.version) for f in found] == [(("x/a:1",), "0.5.20"),
                                                                          (("x/b:1",), "0.5.21")]


def test_two_dist_infos_in_one_site_leave_the_version_to_the_package_s_version_py(tmp_path):
    """An upgrade that did not remove the old dist-info (files copied over): the dist-infos disagree."""
    copied_over = b.layer(*b.installed(SITE, b.sglang_files("0.5.21")))
    said = []
    found = only(scan(b.docker_save(tmp_path / "image.tar", [base_layer(), copied_over]), said.append))
    assert (found.install.version.version, found.install.version.source) == ("0.5.21", f"/{SITE}/sglang/version.py")
    assert found.install.dist_info is None
    assert any("2 sglang dist-info directories (sglang-0.5.20.dist-info, sglang-0.5.21.dist-info)" in line
               for line in said)
