"""The prefill probe's stand-ins answer what older trees call, and only those trees' results name it.

No SGLang: a result path written here in an older tree's idiom (a fix ported into it: the
scheduler's ``stream_output``, the tree cache's ``release_aborted_request``, the mamba pool, the
bootstrap queue's metadata allocator) and one in today's idiom run on the probe's real stand-in
scheduler; the probe's own observations read what each did.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest


OLDER_NAMES = ["bootstrap-queue-metadata-allocator", "mamba-pool-free", "scheduler-stream-output",
               "tree-cache-release-aborted-request"]


class OlderIdiom:
    """A retirement as 0.4.6 to 0.5.12 would write it: every step through that tree's names."""

    def process_batch_result_disagg_prefill(self, batch, result):
        req = batch.reqs[0]
        self.disagg_prefill_bootstrap_queue.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)
        self.tree_cache.release_aborted_request(req.rid)
        self.tree_cache.req_to_token_pool.mamba_pool.free(req.mamba_pool_idx)
        self.stream_output([req], False, None)


class TodaysIdiom:
    """The same retirement through the names 0.5.20 calls."""

    def process_batch_result_disagg_prefill(self, batch, result):
        req = batch.reqs[0]
        self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)
        self.tree_cache.finish(None, SimpleNamespace(name="ABORT"))
        self.tree_cache.req_to_token_pool.mamba_allocator.free(req.mamba_pool_idx)
        self.output_streamer.stream_output([req], False)


@pytest.fixture
def probe(fresh_probe):
    return fresh_probe("probe_prefill_differential.py")


def retire(probe, mixin):
    """One delivery through ``mixin`` on the probe's stand-in scheduler; the world the observations read."""
    probe.sg.prefill = SimpleNamespace(SchedulerDisaggregationPrefillMixin=mixin)
    probe.sg.SPEC_NONE = None
    scheduler = probe._scheduler_class(mixin)(mamba_cache=False)
    req = SimpleNamespace(rid=probe.RID, metadata_buffer_index=probe.METADATA_BUFFER, mamba_pool_idx=3)
    scheduler.process_batch_result_disagg_prefill(SimpleNamespace(reqs=[req]), None)
    world = SimpleNamespace(scheduler=scheduler, kvless_mamba_released=0)
    return {key: probe.OBSERVATIONS[key](world, req) for key in ("abort_streamed", "cache_aborted", "mamba_freed",
                                                                 "metadata_freed")}


@pytest.mark.parametrize("mixin", [OlderIdiom, TodaysIdiom])
def test_a_retirement_is_seen_whichever_names_the_tree_calls(probe, mixin):
    assert retire(probe, mixin) == {"abort_streamed": 1, "cache_aborted": 1, "mamba_freed": 1, "metadata_freed": 1}


def test_each_older_name_called_is_named_in_the_adaptations_and_none_where_today_s_are(probe):
    retire(probe, TodaysIdiom)
    assert probe.SCENARIOS.adaptations == set()  # today's trees keep their results' bytes
    retire(probe, OlderIdiom)
    assert sorted(probe.SCENARIOS.adaptations) == OLDER_NAMES


def test_the_pending_queue_of_0_4_5_reaches_the_same_allocator(probe):
    class PendingQueue:
        def process_batch_result_disagg_prefill(self, batch, result):
            self.disagg_prefill_pending_queue.req_to_metadata_buffer_idx_allocator.free(7)

    assert retire(probe, PendingQueue)["metadata_freed"] == 1
    assert probe.SCENARIOS.adaptations == {"pending-queue-metadata-allocator"}


def test_a_chunk_is_scheduled_as_the_tree_records_it(probe):
    older = SimpleNamespace(origin_input_ids=array("q", range(16)), output_ids=[], fill_ids=[])
    probe.schedule_chunk(older, 8)
    assert older.fill_ids == list(range(8))  # up to 0.5.12: the chunk is the truncated fill_ids
    assert probe.SCENARIOS.adaptations == {"chunk-fill-ids"}

    ranges = []
    today = SimpleNamespace(set_extend_range=lambda start, end: ranges.append((start, end)))
    probe.schedule_chunk(today, 8)
    assert ranges == [(0, 8)] and probe.SCENARIOS.adaptations == {"chunk-fill-ids"}


def test_what_a_tree_s_module_defines_is_parsed_not_matched_as_text(fresh_probe, tmp_path):
    """A sender's abort is found however it is laid out, and one only named in a comment is not there."""
    probe = fresh_probe("probe_prefill_differential.py")
    laid_out = tmp_path / "laid_out.py"
    laid_out.write_text("class KVSender:\n    async def abort (\n        self,\n    ):\n        pass\n")
    commented = tmp_path / "commented.py"
    commented.write_text("class KVSender:\n    # def abort(self): not yet\n    def poll(self):\n        pass\n")
    assert probe._defines(laid_out, "abort")
    assert not probe._defines(commented, "abort")
