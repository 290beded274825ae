"""fetch.download verifies before it publishes; fetch.extract_tar never writes outside its tree."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pytest

from pdevidence.core import errors
from pdevidence.core.errors import HarnessError
from pdevidence.sources import fetch

PAYLOAD = b"sglang source archive\n" * 1000
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# --- download ---------------------------------------------------------------------------------


def test_download_writes_the_file_and_returns_its_sha256(http_server, tmp_path):
    url = http_server.serve("/a.tar.gz", PAYLOAD)
    dest = tmp_path / "dl" / "a.tar.gz"

    digest = fetch.download(url, dest, expected_sha256=PAYLOAD_SHA)

    assert digest == PAYLOAD_SHA
    assert dest.read_bytes() == PAYLOAD
    assert leftovers(dest.parent) == ["a.tar.gz"]  # no .part file beside it


def test_download_without_an_expected_hash_still_reports_the_actual_one(http_server, tmp_path):
    url = http_server.serve("/a.tar.gz", PAYLOAD)
    assert fetch.download(url, tmp_path / "a.tar.gz") == PAYLOAD_SHA


def test_download_with_the_wrong_sha256_is_an_integrity_error_and_leaves_nothing(http_server, tmp_path):
    url = http_server.serve("/a.tar.gz", PAYLOAD)
    dest = tmp_path / "dl" / "a.tar.gz"
    wrong = "0" * 64

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, dest, expected_sha256=wrong)

    assert caught.value.code == errors.INTEGRITY
    assert wrong in str(caught.value) and PAYLOAD_SHA in str(caught.value)
    assert leftovers(dest.parent) == []


def test_download_cut_short_of_its_content_length_is_an_error_and_leaves_nothing(http_server, tmp_path):
    url = http_server.serve("/a.tar.gz", PAYLOAD, truncate_to=100)
    dest = tmp_path / "dl" / "a.tar.gz"

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, dest)

    assert caught.value.code == errors.ENVIRONMENT
    assert "truncated" in str(caught.value)
    assert f"got 100 of {len(PAYLOAD)} bytes" in str(caught.value)
    assert leftovers(dest.parent) == []


def test_download_of_a_chunked_transfer_cut_short_is_an_error_and_leaves_nothing(http_server, tmp_path):
    # GitHub's archive endpoint streams without a Content-Length; http.client raises
    # IncompleteRead (not an OSError) when a chunk ends early.
    url = http_server.serve("/a.tar.gz", PAYLOAD, chunked=True, truncate_to=100)
    dest = tmp_path / "dl" / "a.tar.gz"

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, dest)

    assert caught.value.code == errors.ENVIRONMENT
    assert leftovers(dest.parent) == []


def test_download_of_a_complete_chunked_transfer_succeeds(http_server, tmp_path):
    url = http_server.serve("/a.tar.gz", PAYLOAD, chunked=True)
    assert fetch.download(url, tmp_path / "a.tar.gz", expected_sha256=PAYLOAD_SHA) == PAYLOAD_SHA


def test_download_of_a_missing_file_is_an_error_with_the_todo(http_server, tmp_path):
    dest = tmp_path / "dl" / "a.tar.gz"

    with pytest.raises(HarnessError) as caught:
        fetch.download(http_server.url("/nope"), dest, todo_unreachable="use the local clone")

    assert "Not Found" in str(caught.value)
    assert caught.value.todo == "use the local clone"
    assert leftovers(dest.parent) == []


def test_download_from_an_unreachable_url_names_it_and_passes_the_todo(unreachable_url, tmp_path):
    dest = tmp_path / "dl" / "a.tar.gz"
    url = unreachable_url + "/a.tar.gz"

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, dest, what="sglang@abc", todo_unreachable="point SGLANG_REPO at a clone")

    err = caught.value
    assert err.code == errors.ENVIRONMENT
    assert url in err.what and "sglang@abc" in err.what
    assert err.todo == "point SGLANG_REPO at a clone"
    assert "point SGLANG_REPO at a clone" in str(err)
    assert leftovers(dest.parent) == []


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The waits between tries, recorded instead of slept."""
    waited: list[float] = []
    monkeypatch.setattr(fetch.children, "sleep", waited.append)
    monkeypatch.setenv("PDEVIDENCE_DOWNLOAD_BACKOFF", "2")
    return waited


def test_a_download_that_fails_on_the_way_is_tried_again_each_wait_twice_the_last(http_server, tmp_path, waits,
                                                                                  capsys):
    url = http_server.serve("/a.tar.gz", PAYLOAD, fail_first=2)
    dest = tmp_path / "dl" / "a.tar.gz"

    assert fetch.download(url, dest, expected_sha256=PAYLOAD_SHA, what="the archive") == PAYLOAD_SHA

    assert dest.read_bytes() == PAYLOAD and leftovers(dest.parent) == ["a.tar.gz"]
    assert http_server.hits("/a.tar.gz") == 3 and waits == [2, 4]
    said = capsys.readouterr().err
    assert "the archive: cannot fetch the archive" in said and "trying again in 2 s (try 2 of 4)" in said


def test_a_transfer_cut_short_is_tried_again(http_server, tmp_path, waits):
    url = http_server.serve("/a.tar.gz", PAYLOAD, truncate_to=100)

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, tmp_path / "a.tar.gz")

    assert http_server.hits("/a.tar.gz") == 4 and waits == [2, 4, 8]
    assert "is truncated" in caught.value.what and "(tried 4 times" in caught.value.what


def test_a_download_that_keeps_failing_is_one_clear_error_after_its_last_try(http_server, tmp_path, waits,
                                                                            monkeypatch):
    monkeypatch.setenv("PDEVIDENCE_DOWNLOAD_TRIES", "3")
    url = http_server.serve("/a.tar.gz", PAYLOAD, fail_first=10)
    dest = tmp_path / "dl" / "a.tar.gz"

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, dest, todo_unreachable="use the local clone")

    assert http_server.hits("/a.tar.gz") == 3 and waits == [2, 4]
    assert "Service Unavailable" in caught.value.what and "(tried 3 times: PDEVIDENCE_DOWNLOAD_TRIES)" in caught.value.what
    assert caught.value.todo == "use the local clone" and caught.value.code == errors.ENVIRONMENT
    assert leftovers(dest.parent) == []


@pytest.mark.parametrize("answer", [{"status": 404}, {"status": 403}], ids=["404", "403"])
def test_an_answer_is_not_tried_again(http_server, tmp_path, waits, answer):
    url = http_server.serve("/a.tar.gz", b"no", **answer)

    with pytest.raises(HarnessError):
        fetch.download(url, tmp_path / "a.tar.gz")

    assert http_server.hits("/a.tar.gz") == 1 and waits == []


def test_a_download_whose_bytes_are_wrong_is_not_tried_again(http_server, tmp_path, waits):
    url = http_server.serve("/a.tar.gz", PAYLOAD)

    with pytest.raises(HarnessError) as caught:
        fetch.download(url, tmp_path / "a.tar.gz", expected_sha256="0" * 64)

    assert caught.value.code == errors.INTEGRITY and http_server.hits("/a.tar.gz") == 1 and waits == []


# --- extract_tar ------------------------------------------------------------------------------


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_extract_tar_strips_the_top_directory(make_tarball, tmp_path):
    archive = write(tmp_path / "in" / "a.tar.gz", make_tarball({
        "sglang-abc/python/pyproject.toml": b"[project]\nname = 'sglang'\n",
        "sglang-abc/python/sglang/__init__.py": b"__version__ = '0'\n",
        "sglang-abc/README.md": b"hi\n",
    }))
    dest = tmp_path / "trees" / "git-abc"
    dest.parent.mkdir()

    fetch.extract_tar(archive, dest)

    assert (dest / "python" / "pyproject.toml").read_bytes() == b"[project]\nname = 'sglang'\n"
    assert (dest / "python" / "sglang" / "__init__.py").exists()
    assert (dest / "README.md").read_bytes() == b"hi\n"
    assert not (dest / "sglang-abc").exists()
    assert leftovers(dest.parent) == ["git-abc"]  # the staging directory is gone


def test_extract_tar_without_strip_keeps_the_archive_layout(make_tarball, tmp_path):
    archive = write(tmp_path / "a.tar", make_tarball({"top/a.txt": b"a"}, gz=False))
    dest = tmp_path / "out"

    fetch.extract_tar(archive, dest, strip_top=False)

    assert (dest / "top" / "a.txt").read_bytes() == b"a"


def test_extract_tar_keeps_symlinks_that_stay_inside_the_tree(make_tarball, tmp_path):
    archive = write(tmp_path / "in" / "a.tar.gz", make_tarball([
        ("file", "top/docs/real.md", b"doc"),
        ("symlink", "top/docs/alias.md", "real.md"),
        ("symlink", "top/link-to-docs", "docs"),
    ]))
    dest = tmp_path / "out"

    fetch.extract_tar(archive, dest)

    assert (dest / "docs" / "alias.md").is_symlink()
    assert (dest / "docs" / "alias.md").read_bytes() == b"doc"
    assert (dest / "link-to-docs" / "real.md").read_bytes() == b"doc"


def test_extract_tar_refuses_an_existing_destination(make_tarball, tmp_path):
    archive = write(tmp_path / "a.tar.gz", make_tarball({"top/a": b"a"}))
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        fetch.extract_tar(archive, tmp_path / "out")


HOSTILE = {
    "dot-dot member": [("file", "top/../../evil.txt", b"x")],
    "absolute member": [("file", "top/a", b"a"), ("file", "/tmp/pdevidence-evil.txt", b"x")],
    "symlink escaping": [("file", "top/a", b"a"), ("symlink", "top/link", "../../../etc")],
    "absolute symlink": [("file", "top/a", b"a"), ("symlink", "top/link", "/etc/passwd")],
    "hardlink escaping": [("file", "top/a", b"a"), ("hardlink", "top/h", "../victim.txt")],
    "absolute hardlink": [("file", "top/a", b"a"), ("hardlink", "top/h", "/etc/passwd")],
    # Each link looks inside on paper ("s/s/s/../../.." cancels out) but "s" is "." once
    # extracted, so the real path climbs three levels: out of the tree, to tmp_path/victim.txt.
    "hardlink through an in-archive symlink": [
        ("symlink", "top/s", "."),
        ("hardlink", "top/h", "top/s/s/s/../../../victim.txt"),
        ("file", "top/h", b"overwritten"),
    ],
    "symlink through an in-archive symlink": [
        ("symlink", "top/s", "."),
        ("symlink", "top/l", "s/s/s/../../../victim.txt"),
    ],
    "hardlink to a member that does not exist": [("hardlink", "top/h", "top/missing")],
}


@pytest.mark.parametrize("entries", HOSTILE.values(), ids=HOSTILE.keys())
def test_extract_tar_refuses_members_that_escape_the_tree(entries, make_tarball, tmp_path):
    victim = write(tmp_path / "victim.txt", b"original")
    archive = write(tmp_path / "in" / "a.tar.gz", make_tarball(entries))
    dest = tmp_path / "trees" / "out"
    dest.parent.mkdir()

    with pytest.raises(HarnessError) as caught:
        fetch.extract_tar(archive, dest)

    assert caught.value.code == errors.INTEGRITY
    assert "a.tar.gz" in str(caught.value)
    assert not dest.exists()
    assert leftovers(dest.parent) == []  # no staging directory left behind
    assert victim.read_bytes() == b"original"
    assert leftovers(tmp_path) == ["in", "trees", "victim.txt"]
    assert not Path("/tmp/pdevidence-evil.txt").exists()


@pytest.mark.parametrize("setting, value, said", [
    ("PDEVIDENCE_ARCHIVE_FILE_BYTES", "4K", "member 'top/big.bin' holds 5000 bytes uncompressed, over the limit of 4096"),
    ("PDEVIDENCE_ARCHIVE_BYTES", "6K", "member 'top/big.bin' takes what is extracted to 8000 bytes, over the limit "
     "of 6144"),
    ("PDEVIDENCE_ARCHIVE_MEMBERS", "1", "member 'top/big.bin' is its member number 2, over the limit of 1"),
])
def test_extract_tar_refuses_an_archive_over_a_limit_naming_the_member_and_the_setting(setting, value, said,
                                                                                        make_tarball, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv(setting, value)
    archive = write(tmp_path / "in" / "a.tar.gz", make_tarball({"top/small.bin": b"s" * 3000, "top/big.bin": b"b" * 5000}))
    dest = tmp_path / "trees" / "out"
    dest.parent.mkdir()

    with pytest.raises(HarnessError) as caught:
        fetch.extract_tar(archive, dest)

    assert caught.value.code == errors.INTEGRITY
    assert f"the archive a.tar.gz: {said} ({setting})" in str(caught.value)
    assert not dest.exists() and leftovers(dest.parent) == []


@pytest.mark.parametrize("content", [
    pytest.param(b"this is not a tar archive\n" * 20, id="not a tar"),
    pytest.param(b"", id="empty file"),
    pytest.param("cut", id="gzip cut in half"),
])
def test_extract_tar_refuses_a_corrupt_archive(content, make_tarball, tmp_path):
    if content == "cut":
        whole = make_tarball({f"top/{i}.txt": bytes([i]) * 5000 for i in range(20)})
        content = whole[: len(whole) // 2]
    archive = write(tmp_path / "in" / "a.tar.gz", content)
    dest = tmp_path / "trees" / "out"
    dest.parent.mkdir()

    with pytest.raises(HarnessError) as caught:
        fetch.extract_tar(archive, dest)

    assert caught.value.code == errors.INTEGRITY
    assert "not a readable tar archive" in str(caught.value)
    assert not dest.exists()
    assert leftovers(dest.parent) == []


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count open files")
def test_failed_downloads_do_not_leak_file_descriptors(unreachable_url, tmp_path):
    # Each descriptor with what it names (a socket's inode): another part of the process closing one of its own
    # while the downloads fail is no leak, and a leaked socket that reuses a freed number still shows.
    def open_fds() -> set[tuple[str, str]]:
        found = set()
        for fd in Path("/proc/self/fd").iterdir():
            try:
                found.add((fd.name, os.readlink(fd)))
            except FileNotFoundError:  # the listing's own descriptor, closed by now
                pass
        return found

    gc.collect()
    before = open_fds()
    for _ in range(5):
        with pytest.raises(HarnessError):
            fetch.download(unreachable_url + "/a", tmp_path / "a")
    assert open_fds() - before == set()
