"""The advisor's model beside published P/D-versus-aggregated runs (planner/published.py): every
effect a source measured comes out in its direction (or, if the source measured none, as none), by
its median over the simulation's seeds, except the misses each entry names with their likely reason.
The sizes and their errors are a report (`python -m planner.published`), not a pass mark."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from planner.published import PUBLISHED, agrees, attains, predict, render
from planner.simulate import Outcome


@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda e: e.name)
def test_every_published_effect_comes_out_in_its_direction_but_the_named_misses(entry):
    predicted = predict(entry)
    assert set(entry.measured) <= set(predicted)
    for effect, measured in entry.measured.items():
        middle = statistics.median(predicted[effect])
        if effect in entry.misses:
            # Still a miss: when the model gets it right, the entry must say so.
            assert not agrees(measured, middle), (effect, "now agrees: remove it from misses")
        else:
            assert agrees(measured, middle), (effect, measured, predicted[effect])


def test_each_seed_is_a_draw_of_its_own_and_the_report_gives_their_median_and_range():
    entry = PUBLISHED[0]
    predicted = predict(entry, seeds=(0, 1, 2))
    ttft = predicted["mean TTFT"]
    assert len(set(ttft)) == 3 and ttft == sorted(ttft)
    row = next(line for line in render([(entry, predicted)]).splitlines() if "| mean TTFT |" in line)
    assert f"| {ttft[1]:+.0%} | {ttft[0]:+.0%} to {ttft[2]:+.0%} |" in row


def test_the_report_names_each_source_and_effect():
    entry = PUBLISHED[0]
    text = render([(entry, {effect: [value] * 3 for effect, value in entry.measured.items()})])
    assert "| predicted (median of 3 seeds) |" in text
    assert f"| {entry.name} | mean ITL | -30% | -30% | -30% to -30% | same | +0% |" in text
    assert f"| {entry.name} | output tokens/s | -5% | -5% | -5% to -5% | both negligible | +0 points |" in text
    assert all(e.source.startswith("https://") for e in PUBLISHED)


def test_goodput_as_distserve_counts_it_is_the_share_of_requests_within_both_targets():
    served = Outcome(
        {},
        {},
        0.0,
        0.0,
        0.0,
        goodput_rps=9.0,
        requests_per_s=10.0,
        meets_slo=False,
        saturated=False,
        mean_decode_batch=0.0,
        requests=100,
    )
    # Each latency's own percentile (meets_slo) plays no part: only the requests within both.
    assert attains(0.9)(served)
    assert not attains(0.9)(replace(served, goodput_rps=8.9))
    assert not attains(0.9)(replace(served, saturated=True))
