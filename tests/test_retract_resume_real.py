"""retract_resume on the real bracket releases: on 0.5.11 a decode request resumed after a retraction (or read
late) holds the next request's hidden states and top-k, written into the metadata slot it was handed as a view,
and on the NSA pool the index keys the next request wrote into its pages; 0.5.12 hands it copies and offloads its
index keys with its KV, through the pool (its allocator's offload raises TypeError) (``--sglang``; read from the
cells of the session's release matrix)."""

from __future__ import annotations

import pytest


@pytest.mark.sglang
def test_a_request_reads_the_next_request_s_metadata_from_its_reused_slot_only_before_0_5_12(release_matrix):
    base, head = release_matrix.observed("retract_resume", "base"), release_matrix.observed("retract_resume", "head")
    assert len(base) == len(head) == 10, "every scenario ran without error on both releases"
    # the slots free at the end, alike on both: every committed request's slot given back; M1w's and M3's B holds it
    slots_free = {"M1": 1, "M1k": 1, "M1w": 0, "M2": 1, "M3": 0, "M4": 1, "M5": 2, "M6": 1}
    for sid in ("M1", "M1w", "M2", "M3"):
        assert base[sid] == {"hidden_owner": "other", "output_id_owner": "own", "slots_free": slots_free[sid]}, sid
        assert head[sid] == {"hidden_owner": "own", "output_id_owner": "own", "slots_free": slots_free[sid]}, sid
    assert base["M1k"] == {"topk_owner": "other", "topk_p_owner": "other", "slots_free": 1}
    assert head["M1k"] == {"topk_owner": "own", "topk_p_owner": "own", "slots_free": 1}
    # controls: no reuse, another slot, no speculative decoding
    own = {"hidden_owner": "own", "topk_owner": "own", "topk_p_owner": "own", "output_id_owner": "own"}
    assert base["M4"] == head["M4"] == own | {"slots_free": 1}
    assert base["M5"] == head["M5"] == own | {"slots_free": 2}
    assert base["M6"] == head["M6"] == {"hidden_owner": "none", "topk_owner": "none", "topk_p_owner": "none",
                                        "output_id_owner": "own", "slots_free": 1}
    # the index-key half: the KV offloaded on both; the index keys on 0.5.12 only, through the pool's own methods
    assert base["I1"] == {"index_owner": "other", "kv_owner": "own", "allocator_path": "ok"}
    assert head["I1"] == {"index_owner": "own", "kv_owner": "own", "allocator_path": "raised TypeError"}
    assert base["I2"] == {"index_owner": "own", "kv_owner": "own", "allocator_path": "ok"}
    assert head["I2"] == {"index_owner": "own", "kv_owner": "own", "allocator_path": "raised TypeError"}
