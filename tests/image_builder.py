"""Saved container images built by the tests themselves: layers, `docker save` tarballs, OCI image layouts.

There is no container runtime here: each archive is written as the formats say (a layer is a tar
of changes, whiteouts included; `docker save` is a tar of manifest.json, a config and the layer
tars; an OCI layout is oci-layout, index.json and blobs/sha256/...).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_TYPES = {"none": "application/vnd.oci.image.layer.v1.tar", "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
               "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}


def file(path: str, data: bytes | str, mode: int = 0o644) -> tuple:
    return ("file", path, data.encode() if isinstance(data, str) else data, mode)


def directory(path: str) -> tuple:
    return ("dir", path)


def symlink(path: str, target: str) -> tuple:
    return ("symlink", path, target)


def hardlink(path: str, target: str) -> tuple:
    return ("hardlink", path, target)


def whiteout(path: str) -> tuple:
    """Deletes ``path`` from the layers below."""
    parent, _, name = path.rpartition("/")
    return file(f"{parent}/.wh.{name}", b"")


def opaque(path: str) -> tuple:
    """Hides everything the layers below put in directory ``path``."""
    return file(f"{path}/.wh..wh..opq", b"")


def layer(*entries: tuple) -> bytes:
    """An uncompressed layer tar of ``entries``, in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            kind, path = entry[0], entry[1]
            info = tarfile.TarInfo(path)
            info.mtime = 1767225600
            if kind == "file":
                info.size, info.mode = len(entry[2]), entry[3]
                tar.addfile(info, io.BytesIO(entry[2]))
                continue
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry[2]
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, entry[2]
            tar.addfile(info)
    return buf.getvalue()


def sglang_files(version: str, init: str = "", *, extra: dict[str, str] | None = None) -> dict[str, bytes]:
    """A tiny stand-in of an installed SGLang: its package and its dist-info, as site-packages holds them."""
    files = {"sglang/__init__.py": init, "sglang/version.py": f'__version__ = "{version}"\n',
             "sglang/srt/__init__.py": "", "sglang/srt/door.py": "OPEN = True\n",
             f"sglang-{version}.dist-info/METADATA": f"Metadata-Version: 2.4\nName: sglang\nVersion: {version}\n",
             f"sglang-{version}.dist-info/RECORD": "", **(extra or {})}
    return {name: text.encode() for name, text in files.items()}


def installed(site: str, files: dict[str, bytes]) -> list[tuple]:
    return [file(f"{site}/{name}", data) for name, data in files.items()]


@dataclass(frozen=True)
class Compressed:
    """A gzip layer made a block at a time (``zeros_layer``): its blob, and the digest of the tar inside it."""
    blob: bytes
    diff_id: str


def _tar_blocks(files: dict[str, bytes], zeros: tuple[str, int]) -> Iterator[bytes]:
    """A layer tar of ``files``, then a file of ``zeros[1]`` zero bytes at ``zeros[0]``, a MiB at a time."""
    for name, data in [*files.items(), zeros]:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = data if isinstance(data, int) else len(data), 0o644, 1767225600
        yield info.tobuf(tarfile.PAX_FORMAT)
        if isinstance(data, int):
            block = bytes(1 << 20)
            for start in range(0, data, len(block)):
                yield block[:min(len(block), data - start)]
        else:
            yield data
        yield bytes(-info.size % tarfile.BLOCKSIZE)
    yield bytes(2 * tarfile.BLOCKSIZE)


def zeros_layer(files: dict[str, bytes], zeros: tuple[str, int]) -> Compressed:
    """A gzip layer whose file of zeros may be far larger than the test's disk or memory allow: it is never
    held whole, only its (tiny) compressed blob."""
    packer, tar_digest, blob = zlib.compressobj(1, zlib.DEFLATED, 31), hashlib.sha256(), []
    for block in _tar_blocks(files, zeros):
        tar_digest.update(block)
        blob.append(packer.compress(block))
    blob.append(packer.flush())
    return Compressed(b"".join(blob), f"sha256:{tar_digest.hexdigest()}")


def compress(data: bytes | Compressed, compression: str) -> bytes:
    if isinstance(data, Compressed):
        assert compression == "gzip", "a layer made compressed is gzip"
        return data.blob
    if compression == "gzip":
        return gzip.compress(data, mtime=0)
    if compression == "zstd":
        import zstandard
        return zstandard.ZstdCompressor().compress(data)
    return data


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def config(layers: list[bytes | Compressed], architecture: str = "amd64", settings: dict | None = None) -> bytes:
    """The image config; ``settings`` its ``config`` object (Env, WorkingDir, Entrypoint, Cmd)."""
    diff_ids = [t.diff_id if isinstance(t, Compressed) else sha256(t) for t in layers]
    return json.dumps({"architecture": architecture, "os": "linux", "config": settings or {},
                       "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()


def tar_of(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def docker_save(path: Path, layers: list[bytes], tags: list[str] | None = None, settings: dict | None = None) -> Path:
    """A `docker save` tarball of the legacy format: <id>/layer.tar, <config digest>.json, manifest.json;
    ``settings`` the config's Env, WorkingDir, Entrypoint and Cmd."""
    cfg = config(layers, settings=settings)
    names = [f"{hashlib.sha256(str(i).encode() + t).hexdigest()}/layer.tar" for i, t in enumerate(layers)]
    config_name = f"{hashlib.sha256(cfg).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": tags if tags is not None else ["example/sglang:test"],
                 "Layers": names}]
    return tar_of(path, {config_name: cfg, **dict(zip(names, layers)), "manifest.json": json.dumps(manifest).encode()})


def oci_blobs(layers: list[bytes], compression: str = "gzip", tags: list[str] | None = None,
              architecture: str = "amd64", settings: dict | None = None) -> dict[str, bytes]:
    """The files of an OCI image layout of one image."""
    return _oci(layers, compression, tags, architecture, settings)[0]


def _oci(layers: list[bytes], compression: str, tags: list[str] | None, architecture: str,
         settings: dict | None = None) -> tuple[dict[str, bytes], str, list[str]]:
    """The layout's files, the config's blob name and the layers' blob names."""
    blobs = {}

    def blob(data: bytes) -> str:
        digest = sha256(data)
        blobs[f"blobs/sha256/{digest.split(':')[1]}"] = data
        return digest

    cfg = config(layers, architecture, settings)
    stored = [compress(t, compression) for t in layers]
    config_digest, layer_digests = blob(cfg), [blob(s) for s in stored]
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                                      "size": len(cfg)},
                           "layers": [{"mediaType": LAYER_TYPES[compression], "digest": d, "size": len(s)}
                                      for d, s in zip(layer_digests, stored)]}).encode()
    digest = blob(manifest)
    annotations = {"org.opencontainers.image.ref.name": tags[0]} if tags else {}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest),
                            "annotations": annotations}]}
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index).encode(), **blobs}
    name = "blobs/sha256/{}".format
    return files, name(config_digest.split(":")[1]), [name(d.split(":")[1]) for d in layer_digests]


def docker_save_oci(path: Path, layers: list[bytes], tags: list[str]) -> Path:
    """`docker save` of Docker 25 and later: an OCI layout (its index untagged here) with a manifest.json
    naming the tags beside it."""
    files, config_name, layer_names = _oci(layers, "none", None, "amd64")
    manifest = [{"Config": config_name, "RepoTags": tags, "Layers": layer_names}]
    return tar_of(path, {**files, "manifest.json": json.dumps(manifest).encode()})


def write_dir(path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def oci_layout(path: Path, layers: list[bytes | Compressed], compression: str = "gzip", tags: list[str] | None = None,
               settings: dict | None = None) -> Path:
    """An OCI image layout: a directory, or a tar of one when ``path`` ends in .tar."""
    files = oci_blobs(layers, compression, tags, settings=settings)
    return tar_of(path, files) if path.suffix == ".tar" else write_dir(path, files)


def manifest_digest(path: Path) -> str:
    """The digest of the one image manifest an OCI layout directory's index names."""
    return json.loads((path / "index.json").read_text())["manifests"][0]["digest"]
