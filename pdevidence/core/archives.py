"""What a file's first bytes say it is (a tar archive, or a compressed stream of one), and how much an untrusted
archive may make the harness write (``Budget``)."""

from __future__ import annotations

import tarfile

from . import errors, settings

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


# What one untrusted archive may give: a wheel, a source archive, an image (each of its layers counted on its own).

MEMBER_BYTES = "PDEVIDENCE_ARCHIVE_FILE_BYTES"
ARCHIVE_BYTES = "PDEVIDENCE_ARCHIVE_BYTES"
MEMBERS = "PDEVIDENCE_ARCHIVE_MEMBERS"


class Budget:
    """Members counted as they are read, and bytes as they are extracted, against the settings' limits: a
    member over one is refused before a byte of it is written."""

    def __init__(self, what: str):
        self.what = what
        self.limits = {name: settings.get(name) for name in (MEMBER_BYTES, ARCHIVE_BYTES, MEMBERS)}
        self.members = self.written = 0

    def member(self, name: str) -> None:
        """One more member read."""
        self.members += 1
        self._within(name, MEMBERS, self.members, f"is its member number {self.members}")

    def extract(self, name: str, size: int) -> None:
        """``size`` bytes of member ``name`` about to be written."""
        self._within(name, MEMBER_BYTES, size, f"holds {size} bytes uncompressed")
        self.written += size
        self._within(name, ARCHIVE_BYTES, self.written, f"takes what is extracted to {self.written} bytes")

    def _within(self, name: str, setting: str, found: int, said: str) -> None:
        limit = self.limits[setting]
        if found > limit:
            raise errors.integrity(f"{self.what}: member {name!r} {said}, over the limit of {limit} ({setting})",
                                   todo=f"do not trust the archive; if it is a genuine SGLang build, raise {setting}")
