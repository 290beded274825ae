"""Which releases ship PD disaggregation: read from each wheel's file list."""

from __future__ import annotations

import zipfile

import pytest

from pdevidence.core.errors import HarnessError
from pdevidence.sources import pd_release


def wheel(tmp_path, *names: str):
    path = tmp_path / "sglang-0.4.4.post2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name in ("sglang/__init__.py", *names):
            archive.writestr(name, "")
    return path


def test_a_wheel_ships_pd_when_it_holds_both_doors(tmp_path):
    assert pd_release.ships_pd(wheel(tmp_path, *pd_release.DOORS))
    assert not pd_release.ships_pd(wheel(tmp_path, "sglang/srt/disaggregation/prefill.py"))
    assert not pd_release.ships_pd(wheel(tmp_path, "sglang/srt/managers/scheduler.py"))


def test_a_file_that_is_not_a_wheel_is_an_integrity_failure_naming_it(tmp_path):
    bad = tmp_path / "sglang-0.4.4-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(HarnessError, match="sglang-0.4.4-py3-none-any.whl is not a readable wheel"):
        pd_release.ships_pd(bad)
