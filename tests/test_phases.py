"""Where a run's time goes (core/phases.py): phases that overlap count once, as a clock on the wall saw them."""

from __future__ import annotations

from pdevidence.core import phases


def test_overlapping_spans_of_one_phase_count_once():
    with phases.recording() as spans:
        phases.add(phases.PROBING, 10.0, 20.0)
        phases.add(phases.PROBING, 15.0, 25.0)  # a second engine's children, side by side with the first's
        phases.add(phases.PROBING, 30.0, 31.0)
    assert spans.seconds(phases.PROBING) == 16.0


def test_other_is_what_no_phase_covered_and_shares_may_overlap():
    with phases.recording() as spans:
        phases.add(phases.ENGINE_START, 0.0, 8.0)
        phases.add(phases.PROBING, 5.0, 12.0)  # the next era's engine started while this one probed
    assert phases.describe(spans, 20.0) == "20.0 s: engine start 8.0 s, probing 7.0 s, other 8.0 s"


def test_nothing_is_kept_outside_a_recording():
    phases.add(phases.PROBING, 0.0, 1.0)
    with phases.recording() as spans:
        pass
    assert spans.seconds(phases.PROBING) == 0.0 and spans.busy() == 0.0
