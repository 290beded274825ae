"""grammar_release on the real bracket releases: 0.5.15 releases a grammar-rejected prefill's KV under its
transfer and again at its end, and a success overwrites its abort; 0.5.16 releases it once, after the terminal
poll, and keeps the abort (``--sglang``; read from the cells of the session's release matrix)."""

from __future__ import annotations

import pytest


def releases(observed: dict) -> tuple:
    return observed["release_count"], observed["released_in_flight"], observed["finish_reason"], observed["abort_kept"]


@pytest.mark.sglang
def test_a_grammar_rejection_releases_the_kv_once_after_the_transfer_only_from_0_5_16(release_matrix):
    base, head = (release_matrix.observed("grammar_release", side) for side in ("base", "head"))
    assert len(base) == len(head) == 8, "every scenario ran without error on both releases"
    assert releases(base["G1"]) == (2, 1, "FINISH_LENGTH", False)
    assert releases(base["G2"]) == (2, 1, "FINISH_ABORT", False)
    for sid in ("G1", "G2", "G3", "G4"):
        assert releases(head[sid]) == (1, 0, "FINISH_ABORT", True), sid
        assert head[sid]["sent_after_release"] == 0, sid
    assert (releases(base["G9"]), releases(head["G9"])) == ((1, 0, "FINISH_LENGTH", False), (1, 0, "FINISH_ABORT", True))
    # controls: a grammar that accepts, or none, is released once at the terminal poll on both releases
    for sid, finish in (("G6", "FINISH_LENGTH"), ("G7", "FINISH_LENGTH"), ("G8", "FINISH_ABORT")):
        assert base[sid] == head[sid], sid
        assert (base[sid]["release_count"], base[sid]["released_in_flight"], base[sid]["finish_reason"]) \
            == (1, 0, finish), sid
