"""The SGLang packages inside a saved container image, read without a container runtime.

A ``docker save`` tarball (``manifest.json``, a config and one tar per layer) or an OCI image
layout (``oci-layout``, ``index.json``, ``blobs/<algorithm>/<hex>``), a directory or a tar, is
read in place; an archive compressed whole (``docker save | gzip``) is first decompressed to a
temporary file, no larger than ``PDEVIDENCE_IMAGE_TAR_BYTES`` and the room on the cache's disk. Every image in it is read in two passes over its layers (``layers``): names
only, each layer streamed once and checked against its digest and diff_id, which gives the
image's final filesystem; then only the SGLang package the server imports is extracted, from the
layers that hold its files (``image_python`` models its ``sys.path`` from the image config; every
copy, undecided, when that cannot be told). A copy is ``sglang/`` with its
``sglang-<version>.dist-info`` in any ``site-packages`` or ``dist-packages`` directory (each
interpreter, each venv), the source directory an editable install's ``direct_url.json`` names
(SGLang's own images install it so), or an ``sglang/`` package on the server's path. What is
extracted is bounded (``core.archives.Budget``). What one image holds is kept in the cache under
its config digest: an image read once is not read again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from ..core import archives, debris, inuse, settings
from ..core.errors import HarnessError, integrity, usage
from ..core.files import write_atomic
from ..core.locking import exclusive
from ..core.paths import cache_dir
from . import image_python, layers
from .image_python import Choice
from .trees import Tree
from .version import TreeVersion, lenient, metadata_version
from .version import read as read_version

KIND = "image"
SCAN_SCHEMA = "pdevidence-image-scan/2"
MANIFEST, INDEX = "manifest.json", "index.json"
SITE_DIRS = ("site-packages", "dist-packages")
PACKAGE = "sglang"
_DIST_INFO = re.compile(r"^sglang-[^-]+\.dist-info$", re.IGNORECASE)
_DIGEST = re.compile(r"^(?P<algorithm>sha256|sha512):(?P<hex>[0-9a-f]{64}|[0-9a-f]{128})$")
_HEX_NAME = re.compile(r"(?:^|/)(?:sha256/)?(?P<hex>[0-9a-f]{64})(?:\.json)?$")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
JSON_LIMIT = 16 << 20  # a manifest, index or config is small; a larger one is not one
SAVE_TODO = ("save the image with `docker save IMAGE -o image.tar` (or `skopeo copy docker://IMAGE "
             "oci-archive:image.tar`) and pass that file")


def not_an_image(path: Path, why: str) -> HarnessError:
    return usage(f"{path} is not a saved container image: {why}",
                 expected="a `docker save` tarball, or an OCI image layout (a directory or a tar holding "
                 "oci-layout, index.json and blobs/)", todo=SAVE_TODO)


def damaged(path: Path, why: str) -> HarnessError:
    return integrity(f"{path} is a damaged image archive: {why}",
                     todo="save the image again; if it still fails, the image itself is broken")


@dataclass(frozen=True)
class Layer:
    member: str  # where its blob is in the archive
    digest: str | None  # of the blob as stored; None where the archive names none (a `docker save` layer.tar)
    diff_id: str  # of its uncompressed tar, from the config


@dataclass(frozen=True)
class Image:
    archive: Path
    tags: tuple[str, ...]  # as the manifest or index names it: `lmsysorg/sglang:v0.5.21`, or a bare tag
    config_digest: str
    manifest_digest: str | None  # None in a `docker save` tarball of the legacy format
    os: str | None
    architecture: str | None
    layers: tuple[Layer, ...]
    runtime: image_python.Runtime = image_python.Runtime((), "/", ())  # what the config says the server runs with

    @property
    def platform(self) -> str | None:
        return "/".join(p for p in (self.os, self.architecture) if p) or None

    def describe(self) -> str:
        name = self.tags[0] if self.tags else self.archive.name
        return f"{name} (config {self.config_digest[:19]}…)"

    def repository(self) -> tuple[str | None, str | None]:
        """``(repository, tag)`` of the first tag, the repository as Docker normalizes it
        (``docker.io/library/debian``); ``(None, tag)`` for a bare tag, ``(None, None)`` when untagged."""
        if not self.tags:
            return None, None
        ref = self.tags[0].split("@", 1)[0]
        if ":" not in ref and "/" not in ref:  # an OCI layout's ref.name: a tag alone
            return None, ref or None
        repository, _, tag = ref.rpartition(":") if ref.rfind(":") > ref.rfind("/") else (ref, "", "")
        if "/" not in repository:
            repository = f"library/{repository}"
        first = repository.split("/", 1)[0]
        if not ("." in first or ":" in first or first == "localhost"):
            repository = f"docker.io/{repository}"
        return repository, tag or None


@dataclass(frozen=True)
class Install:
    """One SGLang package in an image's final filesystem, extracted."""
    site: str  # the site-packages (dist-packages) directory it is installed in, as the image names it
    package: str  # the directory of its sglang/ package: in ``site``, or an editable install's source
    dist_info: str | None  # its dist-info directory; None when the package has none
    editable: bool
    version: TreeVersion | None  # what its dist-info (else its version.py) says; None: nothing tells it
    tree: Path  # the extracted directory holding sglang/ (and the dist-info)
    digest: str  # SHA-256 of that directory (``layers.tree_digest``)
    choice: Choice  # whether it is the one the server imports, or which one that is cannot be told
    why: str  # how that was told: the interpreter, its path, the other copies


@dataclass(frozen=True)
class Found:
    """An SGLang package and the image it was found in: what a check of an image answers for."""
    image: Image
    install: Install

    def tree(self) -> Tree:
        """What the warm engine probes: the extracted package, named by its content."""
        return Tree(KIND, self.install.package, self.install.digest, self.install.tree, self.install.digest, KIND,
                    str(self.image.archive), version=self.install.version)

    def describe(self) -> str:
        return f"{self.image.describe()} {self.install.package}"

    def to_json(self) -> dict:
        image = self.image
        return {"archive": str(image.archive), "tags": list(image.tags), "config_digest": image.config_digest,
                "manifest_digest": image.manifest_digest, "platform": image.platform,
                "site": self.install.site, "package": self.install.package, "dist_info": self.install.dist_info,
                "editable": self.install.editable, "imported": self.install.choice.value, "why": self.install.why}


# The archive: a directory or an (uncompressed) tar, read by member name.

class _Archive:
    def __init__(self, path: Path):
        self.path = path

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def open(self, name: str) -> BinaryIO:
        raise NotImplementedError

    def read(self, name: str, what: str) -> bytes:
        """A small file (a manifest, an index, a config) whole."""
        if not self.has(name):
            raise damaged(self.path, f"{what} {name} is missing")
        with self.open(name) as fh, layers.reading(f"{what} {name} in {self.path}"):
            data = fh.read(JSON_LIMIT + 1)
        if len(data) > JSON_LIMIT:
            raise damaged(self.path, f"{what} {name} is larger than {JSON_LIMIT >> 20} MiB")
        return data

    def read_json(self, name: str, what: str) -> Any:
        return _parsed(self.read(name, what), f"{what} {name}", self.path)

    def close(self) -> None:
        pass


def _member_name(name: str, path: Path) -> str:
    """A name the manifest gives, as a path inside the archive; one that climbs out is refused."""
    if not isinstance(name, str) or not name or name.startswith("/"):
        raise damaged(path, f"it names {name!r} as a file of the archive")
    found = layers.parts(name, str(path))
    return "/".join(found)


class _Directory(_Archive):
    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def open(self, name: str) -> BinaryIO:
        try:
            return open(self.path / name, "rb")
        except OSError as exc:
            raise damaged(self.path, f"cannot open {name}: {exc}") from None


class _Tar(_Archive):
    def __init__(self, path: Path, shown: Path):
        super().__init__(shown)
        with open(path, "rb") as fh:
            if not archives.is_tar(fh.read(archives.HEAD)):
                raise not_an_image(shown, "it is neither a directory nor a tar archive")
        with layers.reading(str(shown)):
            self.tar = tarfile.open(path, "r:")
            self.members = {"/".join(p for p in m.name.split("/") if p not in ("", ".")): m
                            for m in self.tar.getmembers()}

    def has(self, name: str) -> bool:
        member = self.members.get(name)
        return member is not None and (member.isfile() or member.issym() or member.islnk())

    def open(self, name: str) -> BinaryIO:
        with layers.reading(f"{name} in {self.path}"):
            try:
                found = self.tar.extractfile(self.members[name])
            except KeyError:  # a link whose target is not in the archive
                found = None
        if found is None:
            raise damaged(self.path, f"{name} is not a file of the archive")
        return found

    def close(self) -> None:
        self.tar.close()


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[_Archive]:
    if not path.exists():
        raise usage(f"no image at {path}", todo=SAVE_TODO)
    if path.is_dir():
        if not ((path / INDEX).is_file() or (path / MANIFEST).is_file()):
            raise not_an_image(path, f"the directory holds neither {INDEX} (an OCI image layout) nor {MANIFEST} "
                               "(an unpacked `docker save`)")
        yield _Directory(path)
        return
    with tempfile.TemporaryDirectory(dir=_images_dir(), prefix=debris.prefix(_images_dir(), "incoming")) as tmp:
        archive = _Tar(_uncompressed(path, Path(tmp)), path)
        try:
            yield archive
        finally:
            archive.close()


IMAGE_TAR_BYTES = "PDEVIDENCE_IMAGE_TAR_BYTES"
DISK_RESERVE = 1 << 30  # what decompressing leaves free on the cache's disk: a full disk fails every other run


def _uncompressed(path: Path, tmp: Path) -> Path:
    """The archive as a plain tar: itself, or decompressed into ``tmp`` (a tar is read by seeking), within
    ``PDEVIDENCE_IMAGE_TAR_BYTES`` and the room on the cache's disk (a gzip of zeros is tiny)."""
    try:
        with open(path, "rb") as raw:
            stream = io.BufferedReader(raw, layers.CHUNK)
            data = layers.decompressed(stream, str(path))
            if data is stream:
                return path
            out = tmp / "image.tar"
            setting = settings.get(IMAGE_TAR_BYTES)
            room = shutil.disk_usage(tmp).free - DISK_RESERVE
            written = 0
            with layers.reading(str(path)), open(out, "wb") as fh:
                while chunk := data.read(layers.CHUNK):
                    written += len(chunk)
                    if written > min(setting, room):
                        raise _too_large(path, tmp, setting, room)
                    fh.write(chunk)
            return out
    except OSError as exc:
        raise usage(f"cannot read {path}: {exc}", todo=SAVE_TODO) from None


def _too_large(path: Path, tmp: Path, setting: int, room: int) -> HarnessError:
    yourself = (f"decompress it where there is room (`gunzip -c {path} > /somewhere/image.tar`) and pass the .tar, "
                "which is read in place")
    if setting <= room:
        return integrity(f"{path} decompresses to more than {setting} bytes, over the limit of {IMAGE_TAR_BYTES}",
                         expected="a `docker save` archive compressed whole",
                         todo=f"do not trust the archive; if it is a genuine image, {yourself}, or raise "
                              f"{IMAGE_TAR_BYTES}")
    return HarnessError(f"{path} decompresses to more than the {max(room, 0)} bytes the disk of {tmp.parent} can "
                        f"spare (keeping {DISK_RESERVE} free)", expected="room for the decompressed copy",
                        todo=f"{yourself}, or free space there (`pdevidence cache prune`), or set PDEVIDENCE_CACHE "
                             "to a larger disk")


def _images_dir() -> Path:
    found = cache_dir() / "images"
    found.mkdir(parents=True, exist_ok=True)
    return found


# The manifests: which images the archive holds, and their layers.

def _need(doc: Any, key: str, kind: type, what: str, path: Path) -> Any:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, kind):
        raise damaged(path, f"{what} has no {key} ({kind.__name__})")
    return value


def _digest(value: Any, what: str, path: Path) -> str:
    if not isinstance(value, str) or not _DIGEST.match(value):
        raise damaged(path, f"{what} {value!r} is not a sha256 or sha512 digest")
    return value


def _blob(digest: str) -> str:
    algorithm, hex_ = digest.split(":", 1)
    return f"blobs/{algorithm}/{hex_}"


def _parsed(data: bytes, what: str, path: Path) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise damaged(path, f"{what} is not valid JSON: {exc}") from None


def _checked(archive: _Archive, name: str, digest: str | None, what: str) -> tuple[Any, str]:
    """A JSON blob and its sha256 digest, checked against ``digest`` where the archive names one."""
    data = archive.read(name, what)
    if digest is not None:
        algorithm = digest.split(":", 1)[0]
        found = f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"
        if found != digest:
            raise damaged(archive.path, f"{what} {name} does not match its digest {digest} (read {found})")
    return _parsed(data, f"{what} {name}", archive.path), f"sha256:{hashlib.sha256(data).hexdigest()}"


def _config(archive: _Archive, name: str, digest: str | None, n_layers: int) -> tuple[dict, str, list[str]]:
    config, found = _checked(archive, name, digest, "the image config")
    rootfs = _need(config, "rootfs", dict, f"the image config {name}", archive.path)
    diff_ids = [_digest(d, "a diff_id", archive.path)
                for d in _need(rootfs, "diff_ids", list, f"the image config {name}", archive.path)]
    if len(diff_ids) != n_layers:
        raise damaged(archive.path, f"the image config {name} lists {len(diff_ids)} layer diff_ids, "
                      f"its manifest {n_layers} layers")
    return config, digest or found, diff_ids


def _image(archive: _Archive, tags: list[str], config_name: str, config_digest: str | None,
           layer_refs: list[tuple[str, str | None]], manifest_digest: str | None) -> Image:
    """An image whose config and layers are in the archive; its layers' digests (blob and diff_id) to check."""
    config, config_digest, diff_ids = _config(archive, config_name, config_digest, len(layer_refs))
    for member, _ in layer_refs:
        if not archive.has(member):
            raise damaged(archive.path, f"layer {member} is missing")
    return Image(archive.path, tuple(dict.fromkeys(tags)), config_digest, manifest_digest,
                 config.get("os") if isinstance(config.get("os"), str) else None,
                 config.get("architecture") if isinstance(config.get("architecture"), str) else None,
                 tuple(Layer(member, digest, diff_id) for (member, digest), diff_id in zip(layer_refs, diff_ids)),
                 image_python.Runtime.from_config(config))


def _docker_images(archive: _Archive) -> list[Image]:
    """The images of a `docker save` manifest.json."""
    entries = archive.read_json(MANIFEST, "the manifest")
    if not isinstance(entries, list):
        raise damaged(archive.path, f"{MANIFEST} is not a list of images")
    found = []
    for entry in entries:
        config = _member_name(_need(entry, "Config", str, f"an image of {MANIFEST}", archive.path), archive.path)
        names = _need(entry, "Layers", list, f"an image of {MANIFEST}", archive.path)
        layer_refs = []
        for name in names:
            member = _member_name(name, archive.path)
            named = _HEX_NAME.search(member) if member.startswith("blobs/sha256/") else None
            layer_refs.append((member, f"sha256:{named['hex']}" if named else None))
        named = _HEX_NAME.search(config)
        tags = entry.get("RepoTags") or []
        found.append(_image(archive, [t for t in tags if isinstance(t, str)], config,
                            f"sha256:{named['hex']}" if named else None, layer_refs, None))
    return found


def _oci_tags(annotations: Any) -> list[str]:
    if not isinstance(annotations, dict):
        return []
    full = annotations.get("io.containerd.image.name")
    short = annotations.get("org.opencontainers.image.ref.name")
    return [t for t in (full, short if not full else None) if isinstance(t, str) and t]


def _attestation(descriptor: dict) -> bool:
    """BuildKit's provenance and SBOM manifests: no filesystem of the image."""
    platform = descriptor.get("platform") or {}
    annotations = descriptor.get("annotations") or {}
    return (isinstance(annotations, dict) and annotations.get("vnd.docker.reference.type") == "attestation-manifest") \
        or (isinstance(platform, dict) and platform.get("os") == "unknown")


def _oci_images(archive: _Archive, descriptors: list, tags: list[str], depth: int = 0) -> list[Image]:
    """The images an OCI index's descriptors name (a nested index, e.g. a multi-platform one, followed)."""
    if depth > 4:
        raise damaged(archive.path, "its indexes nest deeper than 4")
    found = []
    for descriptor in descriptors:
        if not isinstance(descriptor, dict) or _attestation(descriptor):
            continue
        digest = _digest(descriptor.get("digest"), "a manifest digest", archive.path)
        doc, _ = _checked(archive, _blob(digest), digest, "the manifest")
        media_type = descriptor.get("mediaType") or (doc.get("mediaType") if isinstance(doc, dict) else None)
        named = tags + _oci_tags(descriptor.get("annotations"))
        if media_type in INDEX_TYPES or (isinstance(doc, dict) and "manifests" in doc and "layers" not in doc):
            found += _oci_images(archive, _need(doc, "manifests", list, f"the index {digest}", archive.path), named,
                                 depth + 1)
            continue
        config = _need(doc, "config", dict, f"the manifest {digest}", archive.path)
        config_digest = _digest(config.get("digest"), "a config digest", archive.path)
        layer_refs = []
        for layer in _need(doc, "layers", list, f"the manifest {digest}", archive.path):
            layer_digest = _digest(layer.get("digest") if isinstance(layer, dict) else None, "a layer digest",
                                   archive.path)
            layer_refs.append((_blob(layer_digest), layer_digest))
        found.append(_image(archive, named, _blob(config_digest), config_digest, layer_refs, digest))
    return found


def _saved_images(archive: _Archive) -> list[Image]:
    """The images of the archive: an OCI layout's (Docker 25 and later save one, with a manifest.json
    naming its tags beside it), else a `docker save` manifest.json's."""
    if not archive.has(INDEX):
        if not archive.has(MANIFEST):
            raise not_an_image(archive.path, f"it holds neither {INDEX} (an OCI image layout) nor {MANIFEST} "
                               "(a `docker save` tarball)")
        return _docker_images(archive)
    index = archive.read_json(INDEX, "the index")
    found = _oci_images(archive, _need(index, "manifests", list, INDEX, archive.path), [])
    if archive.has(MANIFEST):
        repo_tags = {image.config_digest: image.tags for image in _docker_images(archive)}
        found = [dataclasses.replace(i, tags=tuple(dict.fromkeys((*repo_tags.get(i.config_digest, ()), *i.tags))))
                 for i in found]
    return found


# The scan: names first, then only the SGLang packages, kept under the config digest.

SCAN_FILE = "scan.json"


def scan(path: Path, *, log=print) -> list[Found]:
    """Every SGLang package in every image of the archive at ``path``."""
    path = Path(os.path.abspath(path))
    with _opened(path) as archive:
        found_images = _saved_images(archive)
        if not found_images:
            raise not_an_image(path, "it names no image (only attestations, or an empty index)")
        return [Found(image, install) for image in found_images for install in _installs(archive, image, log)]


def _what(image: Image, index: int) -> str:
    layer = image.layers[index]
    return f"layer {index + 1} of {len(image.layers)} ({layer.digest or layer.member}) of {image.archive}"


def _layer(archive: _Archive, image: Image, index: int, *, verify: bool = True) -> Iterator:
    """The layer's members; ``verify``: read to its end and checked against its digests."""
    layer = image.layers[index]
    with archive.open(layer.member) as raw:
        yield from layers.members(raw, _what(image, index), digest=layer.digest if verify else None,
                                  diff_id=layer.diff_id if verify else None)


def _installs(archive: _Archive, image: Image, log) -> list[Install]:
    algorithm, hex_ = image.config_digest.split(":", 1)
    entry = _images_dir() / f"{algorithm}-{hex_}"
    inuse.use(entry)
    with exclusive(cache_dir() / "locks" / f"image-{hex_[:16]}.lock", f"the scan of {image.describe()}"):
        cached = _cached(entry, image)
        if cached is None:
            staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=debris.prefix(entry.parent, entry.name),
                                            suffix=".scan"))
            try:
                _scan(archive, image, staging, log)
                shutil.rmtree(entry, ignore_errors=True)
                os.replace(staging, entry)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            cached = _cached(entry, image)
        else:
            log(f"image {image.describe()}: read before, its SGLang packages kept in {entry}")
    installs, notes = cached
    for note in notes:
        log(f"image {image.describe()}: {note}")
    return installs


@dataclass(eq=False)  # one per copy: compared by identity
class _Candidate:
    """A copy of SGLang in the image (in a site directory, an editable install's source, or a directory on the
    server's path), while the image is scanned."""
    site: str  # the directory it is found from
    infos: list[str]  # its sglang-*.dist-info directories there
    site_node: layers.Node
    package: str | None = None  # its sglang/ in the image, once known
    node: layers.Node | None = None  # that sglang/
    editable: bool = False


def _scan(archive: _Archive, image: Image, staging: Path, log) -> None:
    """Names first (every layer, digests checked), then the SGLang package the server imports (every copy when
    that cannot be told), recorded in ``staging``."""
    fs = layers.Filesystem(keep=lambda path: image_python.keep(path, image.runtime))
    for index in range(len(image.layers)):
        fs.apply(index, _layer(archive, image, index), _what(image, index))
    log(f"image {image.describe()}: {len(image.layers)} layer(s) read, names only")
    notes: list[str] = []
    path = image_python.search_path(fs, image.runtime)
    candidates = _candidates(fs)
    _editable_packages(fs, candidates, image, notes)
    candidates += _path_copies(fs, path, candidates)
    answered, choice, why = _answered(fs, path, [c for c in candidates if c.package is not None], notes)
    plan = layers.Plan()
    trees_ = [staging / "trees" / str(n) for n in range(len(answered))]
    for found, tree in zip(answered, trees_):
        for name in found.infos:
            plan.add(found.site_node.children[name], tree / name, f"{found.site}/{name}")
        plan.add(found.node, tree / PACKAGE, found.package)
    layers.extract(plan, lambda i: _layer(archive, image, i, verify=False), lambda i: _what(image, i),
                   archives.Budget(f"the SGLang packages of {image.describe()} in {image.archive}"))
    recorded = []
    for found, tree in zip(answered, trees_):
        version, dist_info, note = _version(found, tree)
        notes += [note] if note else []
        recorded.append({"site": found.site, "package": found.package, "dist_info": dist_info,
                         "editable": found.editable, "version": version.to_json() if version else None,
                         "tree": tree.relative_to(staging).as_posix(), "digest": layers.tree_digest(tree),
                         "choice": choice.value, "why": why})
    log(f"image {image.describe()}: {len(recorded)} SGLang package(s) extracted"
        + "".join(f"; {r['package']}" for r in recorded))
    write_atomic(staging / SCAN_FILE, json.dumps({"schema": SCAN_SCHEMA, "config_digest": image.config_digest,
                                                  "installs": recorded, "notes": notes}, sort_keys=True) + "\n")


def _candidates(fs: layers.Filesystem) -> list[_Candidate]:
    """Each site directory's sglang/ and dist-info."""
    found = []
    for parts, site in fs.directories(SITE_DIRS):
        site_path = "/" + "/".join(parts)
        package = site.children.get(PACKAGE)
        package = package if package is not None and package.kind is layers.Kind.DIR else None
        infos = _infos(site)
        if package is None and not infos:
            continue
        found.append(_Candidate(site_path, infos, site, f"{site_path}/{PACKAGE}" if package else None, package))
    return found


def _path_copies(fs: layers.Filesystem, path: image_python.SearchPath, known_copies: list[_Candidate]
                 ) -> list[_Candidate]:
    """Each sglang/ on the server's path that is no copy known already (PYTHONPATH, the working directory, a
    .pth's directory that is no editable install's)."""
    known, found = {id(c.node) for c in known_copies if c.node is not None}, []
    for entry in path.entries:
        node = image_python.regular_package(fs, entry)
        if node is not None and id(node) not in known:
            known.add(id(node))
            site = fs.find(layers.parts(entry, entry), follow=True)
            found.append(_Candidate(entry, _infos(site), site, f"{entry}/{PACKAGE}", node))
    return found


def _infos(site: layers.Node) -> list[str]:
    return sorted(name for name, child in site.children.items()
                  if child.kind is layers.Kind.DIR and _DIST_INFO.match(name))


def _editable_packages(fs: layers.Filesystem, candidates: list[_Candidate], image: Image, notes: list[str]) -> None:
    """Each editable install's package, where its direct_url.json points; a dist-info without a package anywhere
    is noted, and not checked."""
    for candidate in (c for c in candidates if c.package is None):
        sources = [s for s in (_editable_source(candidate.site_node.children[info]) for info in candidate.infos) if s]
        source = posixpath.normpath(sources[0]) if sources else None
        node = fs.find((*layers.parts(source, str(image.archive)), PACKAGE), follow=True) if source else None
        if node is None or node.kind is not layers.Kind.DIR:
            where = f"its editable source {source} holds no {PACKAGE}/" if source else f"no {PACKAGE}/ beside it"
            notes.append(f"{candidate.site}: {', '.join(candidate.infos)} without its package ({where}): "
                         "a broken or half-removed install, not checked")
            continue
        candidate.package, candidate.node, candidate.editable = f"{source}/{PACKAGE}", node, True


def _editable_source(info: layers.Node) -> str | None:
    """The directory an editable install's ``direct_url.json`` (PEP 610) names; None when not editable."""
    found = info.children.get("direct_url.json") if info.kind is layers.Kind.DIR else None
    try:
        doc = json.loads(found.data) if found is not None and found.data else None
    except ValueError:
        return None
    dir_info = doc.get("dir_info") if isinstance(doc, dict) else None
    url = urlsplit(doc["url"]) if isinstance(dir_info, dict) and isinstance(doc.get("url"), str) else None
    if url is None or dir_info.get("editable") is not True or url.scheme != "file" or not url.path.startswith("/"):
        return None
    return unquote(url.path)


def _answered(fs: layers.Filesystem, path: image_python.SearchPath, copies: list[_Candidate],
              notes: list[str]) -> tuple[list[_Candidate], Choice, str]:
    """The copy the server imports: the first regular package on its path (else an editable install's hook of
    its interpreter); every copy, undecided, when that cannot be told (the only one: answered as that).
    The copies not answered are named in ``notes``."""
    by_node = {id(c.node): c for c in copies}
    on_path = [by_node[id(n)] for e in path.entries if (n := image_python.regular_package(fs, e)) is not None]
    hooks = [c for site in path.sites for c in copies if c.editable and c.site == site] if path.complete else []
    server = list(dict.fromkeys([*on_path, *hooks]))
    names = ", ".join(c.package for c in copies)
    if server:
        chosen, choice = server[0], Choice.IMPORTED
        why = f"the first of the copies on the server's path ({path.describe()})" if chosen in on_path else \
            f"the editable install's import hook in {chosen.site}, after the whole path ({path.describe()})"
        for other in copies:
            if other is not chosen:
                notes.append(f"{other.package}: not what the server imports ("
                             f"{'after ' + chosen.package + ' on its path' if other in server else 'not on its path'})")
        return [chosen], choice, why
    if len(copies) == 1:
        return copies, Choice.ONLY, f"the image's only copy; the server's path: {path.describe()}"
    if not copies:
        return [], Choice.UNDECIDED, ""
    none = "its interpreter imports none of them, " if path.complete else ""
    return copies, Choice.UNDECIDED, (f"which of {len(copies)} copies ({names}) the server imports cannot be told: "
                                      f"{none}{path.describe()}")

    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key.strip().lower() == "version" and value.strip():
            return value.strip()
    return None


def _version(found: _Candidate, tree: Path) -> tuple[TreeVersion | None, str | None, str | None]:
    """What the dist-info says (else the package's version.py), the dist-info it came from, and a note."""
    told = {info: v for info in found.infos if (v := metadata_version(tree / info / "METADATA"))}
    if len(told) == 1:
        (info, text), = told.items()
        parsed = lenient(text)
        if parsed:
            where = f"{found.site}/{info}"
            return TreeVersion(parsed[0], parsed[1], f"{where}/METADATA", text), where, None
    read = read_version(tree, tree, repo=None, rev="HEAD")
    version = TreeVersion(read.version, read.local, f"{found.package}/version.py", read.told) if read else None
    if len(found.infos) > 1:
        return version, None, (f"{found.site}: {len(found.infos)} sglang dist-info directories "
                               f"({', '.join(found.infos)}): the version is "
                               f"{'read from its version.py' if version else 'not told'}")
    return version, (f"{found.site}/{found.infos[0]}" if found.infos else None), None


def _cached(entry: Path, image: Image) -> tuple[list[Install], list[str]] | None:
    """What an earlier scan of this image found, or None when there is none complete (rescan)."""
    try:
        doc = json.loads((entry / SCAN_FILE).read_text(encoding="utf-8"))
        if doc["schema"] != SCAN_SCHEMA or doc["config_digest"] != image.config_digest:
            return None
        installs = [Install(r["site"], r["package"], r["dist_info"], r["editable"],
                            TreeVersion(**r["version"]) if r["version"] else None, entry / r["tree"], r["digest"],
                            Choice(r["choice"]), r["why"])
                    for r in doc["installs"]]
        notes = [str(note) for note in doc["notes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (installs, notes) if all((i.tree / PACKAGE).is_dir() for i in installs) else None
