"""abort_notify on the real bracket releases: 0.5.12 lets the prefill side write into an aborted request's
pages, 0.5.13 tells it and it stops (``--sglang``; read from the cells of the session's release matrix)."""

from __future__ import annotations

import pytest


@pytest.mark.sglang
def test_a_decode_abort_mid_transfer_stops_the_prefill_writes_only_from_0_5_13(release_matrix):
    base, head = release_matrix.observed("abort_notify", "base"), release_matrix.observed("abort_notify", "head")
    assert len(base) == len(head) == 12, "every scenario ran without error on both releases"
    assert (base["N2"]["abort_sent"], base["N2"]["chunks_after_abort"], base["N2"]["pages_after_abort"]) == (0, 2, 4)
    assert (head["N2"]["abort_sent"], head["N2"]["chunks_after_abort"], head["N2"]["pages_after_abort"]) == (1, 0, 0)
    assert (head["N6"]["abort_ranks"], head["N7"]["abort_max_per_rank"]) == (2, 1)
    assert head["N3"]["room_status"] == base["N3"]["room_status"] == "Success"  # a finished room is not failed
    # controls: both releases write a transfer never aborted whole, beside an aborted one too
    assert base["N9"]["chunks_written"] == head["N9"]["chunks_written"] == 3
    assert base["N10"]["other_room_pages"] == head["N10"]["other_room_pages"] == 6
    # N12, the decode alone: both give the aborted request up a day later, and the prefill's last write lands in
    # the pages given back (what no notification stops there)
    assert base["N12"] == head["N12"] == {"gave_up": True, "written_after_free": 8, "written_into_other": 8}
