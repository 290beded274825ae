"""What a file's first bytes say it is: a tar archive, or a compressed stream (of one)."""

from __future__ import annotations

import tarfile

HEAD = tarfile.BLOCKSIZE  # how many first bytes tell
COMPRESSIONS = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd", "bzip2": b"BZh", "xz": b"\xfd7zXZ\x00"}


def compression(head: bytes) -> str | None:
    """The compression the first bytes name (gzip, zstd, bzip2, xz), or None."""
    return next((name for name, magic in COMPRESSIONS.items() if head.startswith(magic)), None)


def is_tar(head: bytes) -> bool:
    """The first block is a tar header whose checksum holds."""
    try:
        tarfile.TarInfo.frombuf(head[:tarfile.BLOCKSIZE], tarfile.ENCODING, "surrogateescape")
    except tarfile.TarError:
        return False
    return True
