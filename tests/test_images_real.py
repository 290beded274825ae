"""`check --image` on an image built here from SGLang release wheels: every answer read from what the run wrote.

The image (an OCI layout, gzip layers) is what an operator's would be: SGLang 0.5.20 installed,
then upgraded to 0.5.21 in a later layer (its package directory opaque, the old dist-info whited
out), a second interpreter (a venv) with 0.5.13, and a file of 0.5.21 deleted in the last layer;
no interpreter, so which copy the server imports cannot be told and both are answered. A second
image puts 0.5.12 on its PYTHONPATH over 0.5.13 in site-packages: the 0.5.12 copy is the answer.
Slow (each package is probed in its era's engine, in the user cache's environments): runs with ``--sglang``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import image_builder as b
import pytest
from schemas import problems

from pdevidence import cli
from pdevidence.core import archives, errors, settings
from pdevidence.core.paths import PROJECT, cache_dir, results_dir, tree_lock_file
from pdevidence.documents.vocabulary import Classification
from pdevidence.lanes import check
from pdevidence.sources import trees

pytestmark = pytest.mark.sglang

SITE = "usr/local/lib/python3.12/site-packages"
VENV = "opt/venv/lib/python3.12/site-packages"
DELETED = "sglang/bench_serving.py"  # in 0.5.21's wheel; no probe imports it
VERSIONS = ("0.5.12", "0.5.13", "0.5.20", "0.5.21")  # in the bracket releases' eras: no other is built
TAG = "example/sglang:upgraded"


@pytest.fixture(scope="module")
def wheels(project_reg) -> dict[str, Path]:
    """The release wheels, from PyPI through the tree lock (hash-pinned), as `pip download --no-deps` gives them."""
    lock = trees.LockFile(tree_lock_file(project_reg.root))
    return {v: trees.release_tree(v, project_reg.python, lock).install_target for v in VERSIONS}


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {name for name in zf.namelist() if not name.endswith("/")}


def write_layer(dest: Path, site: str | None, wheel: Path | None, *entries: tuple) -> Path:
    """A layer tar on disk: ``entries`` (whiteouts) first, then the wheel's files installed in ``site``."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry[1])
            info.size = len(entry[2])
            tar.addfile(info, io.BytesIO(entry[2]))
        if wheel is not None:
            with zipfile.ZipFile(wheel) as zf:
                for item in zf.infolist():
                    if item.is_dir():
                        continue
                    info = tarfile.TarInfo(f"{site}/{item.filename}")
                    info.size, info.mode = item.file_size, 0o755 if (item.external_attr >> 16) & 0o111 else 0o644
                    with zf.open(item) as data:
                        tar.addfile(info, data)
    return dest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def oci_layout(root: Path, layer_tars: list[Path], tag: str, settings: dict | None = None) -> Path:
    """An OCI image layout of the layer tars, each stored gzip-compressed; ``settings`` the config's Env, Cmd…"""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def store(path: Path) -> tuple[str, int]:
        digest = sha256_of(path)
        shutil.move(path, blobs / digest.split(":")[1])
        return digest, (blobs / digest.split(":")[1]).stat().st_size

    def store_bytes(data: bytes) -> tuple[str, int]:
        tmp = root / "blob.tmp"
        tmp.write_bytes(data)
        return store(tmp)

    layers = []
    for tar in layer_tars:
        compressed = tar.with_suffix(".tar.gz")
        with open(tar, "rb") as src, gzip.open(compressed, "wb", compresslevel=1) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        layers.append(store(compressed))
    config = store_bytes(json.dumps({"architecture": "amd64", "os": "linux", "config": settings or {},
                                     "rootfs": {"type": "layers", "diff_ids": [sha256_of(t) for t in layer_tars]}
                                     }).encode())
    manifest = json.dumps({"schemaVersion": 2, "mediaType": b.OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config[0],
                                      "size": config[1]},
                           "layers": [{"mediaType": b.LAYER_TYPES["gzip"], "digest": d, "size": s}
                                      for d, s in layers]}).encode()
    digest, size = store_bytes(manifest)
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": b.OCI_MANIFEST, "digest": digest, "size": size,
         "annotations": {"io.containerd.image.name": f"docker.io/{tag}"}}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


@pytest.fixture(scope="module")
def image(tmp_path_factory, wheels) -> Path:
    work = tmp_path_factory.mktemp("layers")
    layer_tars = [
        write_layer(work / "1.tar", SITE, wheels["0.5.20"]),
        write_layer(work / "2.tar", SITE, wheels["0.5.21"], b.opaque(f"{SITE}/sglang"),
                    b.whiteout(f"{SITE}/sglang-0.5.20.dist-info")),
        write_layer(work / "3.tar", VENV, wheels["0.5.13"]),
        write_layer(work / "4.tar", None, None, b.whiteout(f"{SITE}/{DELETED}")),
    ]
    return oci_layout(tmp_path_factory.mktemp("image") / "oci", layer_tars, TAG)


def scan_entry(image: Path) -> Path:
    """Where the user's cache keeps the image's scan: by its config's digest (its layers' content, not when they
    were compressed), so every run of this module builds the same image and finds the same entry."""
    index = json.loads((image / "index.json").read_text())
    manifest = json.loads((image / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text())
    return cache_dir() / "images" / manifest["config"]["digest"].replace(":", "-", 1)


@pytest.fixture(scope="module")
def checked(image, project_reg, tmp_path_factory):
    """One check of the image, as an operator runs it: its exit code, JSON and OpenVEX, and the scan it made. The
    environments are the user cache's (shared); the image's scan is removed from it first, so this run makes it."""
    out, vex = io.StringIO(), tmp_path_factory.mktemp("vex") / "image.vex.json"
    entry = scan_entry(image)
    shutil.rmtree(entry, ignore_errors=True)  # this module's own image: nothing else makes it
    # A user cache over its budget (a machine that ran every era) drops the scan, cheapest to remake, as the check
    # ends: what the tests read of it is not about the budget (tests/test_cache.py is).
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_CACHE_BUDGET", "off")
        code = cli.main(["--root", str(PROJECT), "check", "--image", str(image), "--json", "--openvex", str(vex)])
    assert entry.is_dir(), f"the scan is not where it was looked for: {entry}"
    return code, json.loads(out.getvalue()), json.loads(vex.read_text()), entry


def swept(experiment: str, version: str) -> dict:
    table = json.loads((results_dir(PROJECT) / f"sweep-{experiment}.json").read_text())
    return next(row for row in table["releases"] if row["version"] == version)


def test_each_interpreter_of_the_image_is_checked_in_the_era_of_its_version(project_reg, checked, image):
    """Alone proves: `check --image` finds each interpreter's SGLang in a real image, reads its version from the
    upgrade's dist-info, checks each in its version's era and names the image (tags, manifest digest)."""
    code, docs, _, _ = checked
    assert [d["target"]["image"]["site"] for d in docs] == [f"/{VENV}", f"/{SITE}"]
    assert [d["target"]["resolved"] for d in docs] == ["0.5.13", "0.5.21"]  # the upgrade's dist-info, not 0.5.20's
    assert [d["target"]["era"] for d in docs] == [project_reg.era_of("0.5.13").name, None]
    assert [d["target"]["sglang_version"] for d in docs] == ["0.5.13", "0.5.21"]  # what the probed code says
    for doc in docs:
        assert problems("check", doc) == []
        assert doc["target"]["image"]["tags"] == [f"docker.io/{TAG}"]
        assert doc["target"]["image"]["manifest_digest"] == json.loads(
            (image / "index.json").read_text())["manifests"][0]["digest"]
    assert code == errors.worst(d["exit_code"] for d in docs) == errors.BEHAVIOUR_DIFFERS  # 0.5.13 is pre-fix


def test_each_answer_is_the_published_sweep_s_for_that_release(checked):
    """Alone proves: an image's SGLang is answered, scenario by scenario, as the published sweep answers its
    release (0.5.13 and 0.5.21); the image names no interpreter, so which of the two the server imports cannot be
    told, and a fixed answer of either is not an all-clear (unknown, saying so)."""
    _, docs, _, _ = checked
    for doc in docs:
        assert doc["target"]["image"]["imported"] == "undecided"
        for entry in doc["experiments"]:
            row = swept(entry["experiment"], doc["target"]["resolved"])
            # check assumes the defaults: a fix present but off is affected
            status = {**check.STATUS_OF, Classification.PRESENT_OFF: check.Status.AFFECTED}[
                Classification(row["classification"])]
            if status in (check.Status.FIXED, check.Status.NOT_AFFECTED):
                assert entry["status"] == check.Status.UNKNOWN.value, entry
                assert entry["error"].startswith(f"this copy reads {status.value}, but the server may import another")
            else:
                assert entry["status"] == status.value, entry
            assert entry["scenarios"] == row["scenarios"]


def test_the_checked_tree_is_the_upgrade_less_the_deleted_file(checked, wheels):
    """Alone proves: the tree an image's layers make (an upgrade over an earlier install, whiteouts, an opaque
    directory) is what is checked: the upgrade's files less the deleted one, nothing of the earlier release."""
    entry = checked[3]
    scan = json.loads((entry / "scan.json").read_text())
    site = next(entry / i["tree"] for i in scan["installs"] if i["site"] == f"/{SITE}")
    found = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert found == wheel_names(wheels["0.5.21"]) - {DELETED}  # nothing of 0.5.20 is left, the deleted file is gone


def test_openvex_names_the_image_with_each_sglang_as_a_subcomponent(checked, image):
    """Alone proves: the OpenVEX document of an image check names the image (its purl) as the product and each
    SGLang in it as a subcomponent, one statement per fix and SGLang."""
    _, docs, vex, _ = checked
    assert problems("openvex-0.2.0", vex) == []
    digest = json.loads((image / "index.json").read_text())["manifests"][0]["digest"]
    image_purl = f"pkg:oci/sglang@sha256%3A{digest.split(':')[1]}?arch=amd64&repository_url=docker.io/example/sglang" \
                 "&tag=upgraded"
    products = {(s["products"][0]["@id"], s["products"][0]["subcomponents"][0]["@id"], s["status"])
                for s in vex["statements"]}
    assert {p[:2] for p in products} == {(image_purl, "pkg:pypi/sglang@0.5.13"), (image_purl, "pkg:pypi/sglang@0.5.21")}
    assert ("pkg:pypi/sglang@0.5.21", "affected") not in {p[1:] for p in products}
    assert len(vex["statements"]) == sum(len(d["experiments"]) for d in docs)


def test_the_default_archive_limits_hold_every_real_wheel_member_with_room(wheels):
    """Alone proves: the defaults of PDEVIDENCE_ARCHIVE_* take every member of the real wheels (0.5.20's largest,
    a 15.9 MB extension module) with room to spare, so no genuine SGLang build is refused."""
    limits = {name: settings.get(name) for name in (archives.MEMBER_BYTES, archives.ARCHIVE_BYTES, archives.MEMBERS)}
    for version, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as zf:
            members = zf.infolist()
        assert max(m.file_size for m in members) * 8 < limits[archives.MEMBER_BYTES], version
        assert sum(m.file_size for m in members) * 8 < limits[archives.ARCHIVE_BYTES], version
        assert len(members) * 100 < limits[archives.MEMBERS], version


def test_an_image_whose_pythonpath_holds_another_sglang_is_answered_for_that_one(tmp_path, wheels):
    """Alone proves: the measured case of the issue. PYTHONPATH=/opt/override holds 0.5.12 (pre-fix for
    offload_slots) over a site-packages holding 0.5.13 (fixed): the server imports 0.5.12, and that is the answer."""
    debian = "usr/local/lib/python3.12/dist-packages"
    layer_tars = [write_layer(tmp_path / "1.tar", debian, wheels["0.5.13"], b.file("usr/bin/python3.12", b"\x7fELF")),
                  write_layer(tmp_path / "2.tar", "opt/override", wheels["0.5.12"])]
    image = oci_layout(tmp_path / "oci", layer_tars, "example/sglang:override", {
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONPATH=/opt/override"],
        "Cmd": ["python3.12", "-m", "sglang.launch_server"]})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--root", str(PROJECT), "check", "--image", str(image), "--json"])
    doc = json.loads(out.getvalue())
    assert (doc["target"]["image"]["package"], doc["target"]["image"]["imported"]) == ("/opt/override/sglang",
                                                                                        "imported")
    assert doc["target"]["resolved"] == doc["target"]["sglang_version"] == "0.5.12"
    statuses = {e["experiment"]: e["status"] for e in doc["experiments"]}
    assert statuses["offload_slots"] == check.Status.AFFECTED.value and code == errors.BEHAVIOUR_DIFFERS
