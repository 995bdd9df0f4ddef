"""Latency histograms: bucket counting, merging by bucket across instances, quantiles."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.histogram import (
    ONLINE_BOUNDS_S,
    Histogram,
    histogram_from_dict,
    merge_histograms,
    quantile,
)
from consumer.core.snapshots import merge_snapshots
from consumer.runtime.latency import JOB_LATENCY, OFFLINE_JOB_LATENCY
from consumer.runtime.stats import ServiceStats

values = st.lists(st.floats(min_value=0.0, max_value=2000.0, allow_nan=False), max_size=60)


def filled(observed: list[float]) -> Histogram:
    h = Histogram(ONLINE_BOUNDS_S)
    for v in observed:
        h.observe(v)
    return h


def test_a_value_on_a_bound_counts_in_that_bucket_like_prometheus_le() -> None:
    h = filled([0.025, 0.026, 700.0])
    assert h.counts[0] == 1 and h.counts[1] == 1 and h.counts[-1] == 1
    assert h.cumulative()[-1] == (float("inf"), 3)


@given(values, values)
def test_observing_a_request_s_values_at_once_equals_observing_them_one_by_one(
    before: list[float], batch: list[float]
) -> None:
    at_once = filled(before)
    at_once.observe_all(batch)
    one_by_one = filled(before + batch)
    assert at_once.counts == one_by_one.counts
    assert at_once.sum == one_by_one.sum  # the same additions in the same order


@given(st.lists(values, max_size=5))
def test_merging_instances_equals_one_histogram_of_all_their_observations(parts: list[list[float]]) -> None:
    merged = merge_histograms(filled(p) for p in parts)
    everything = filled([v for p in parts for v in p])
    if not parts:
        assert merged is None
        return
    assert merged is not None
    assert merged.counts == everything.counts
    assert merged.sum == pytest.approx(everything.sum)


@given(values, values, values)
def test_merge_is_commutative_and_associative(a: list[float], b: list[float], c: list[float]) -> None:
    ha, hb, hc = filled(a), filled(b), filled(c)
    left = merge_histograms([merge_histograms([ha, hb]), hc])  # type: ignore[list-item]
    right = merge_histograms([hc, merge_histograms([hb, ha])])  # type: ignore[list-item]
    assert left is not None and right is not None
    assert left.counts == right.counts
    assert left.sum == pytest.approx(right.sum)


@given(values.filter(bool), st.floats(0, 1), st.floats(0, 1))
def test_quantiles_are_monotonic_and_inside_the_observed_buckets(
    observed: list[float], q1: float, q2: float
) -> None:
    h = filled(observed)
    lo, hi = sorted((q1, q2))
    a, b = quantile(h, lo), quantile(h, hi)
    assert a is not None and b is not None
    assert a <= b
    # never above the bucket that holds the largest value (nor above the last finite bound)
    top = min((bound for bound in ONLINE_BOUNDS_S if bound >= max(observed)), default=ONLINE_BOUNDS_S[-1])
    assert 0.0 <= b <= top


def test_quantile_interpolates_inside_a_bucket_like_histogram_quantile() -> None:
    h = filled([0.3] * 10)  # all in (0.25, 0.5]
    assert quantile(h, 0.5) == pytest.approx(0.375)
    assert quantile(Histogram(ONLINE_BOUNDS_S), 0.5) is None


def test_different_bounds_do_not_merge_and_a_bad_record_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="different bounds"):
        merge_histograms([Histogram((1.0,)), Histogram((2.0,))])
    with pytest.raises(ValueError, match="bounds, counts"):
        histogram_from_dict({"counts": [1]})
    with pytest.raises(ValueError, match="bounds \\+ 1"):
        Histogram((1.0, 2.0), [1, 2])


def test_stats_merge_percentiles_per_tier_across_live_instances_only() -> None:
    now = time.time()
    snaps = []
    for instance, latency in (("a", 0.3), ("b", 40.0), ("old", 500.0)):
        stats = ServiceStats(instance)
        for _ in range(50):
            stats.latency.observe(JOB_LATENCY, ("small", "default", "result"), latency)
        stats.latency.observe(OFFLINE_JOB_LATENCY, ("small", "default", "dead_letter"), 3000.0)
        snap = stats.snapshot()
        if instance == "old":
            snap["updated_at"] = now - 3600
        snaps.append(snap)
    merged = merge_snapshots(snaps, now_s=now, live_within_s=10)
    p = merged["job_latency"]["small"]
    assert p["jobs"] == 100, "the stale instance is left out"
    assert 0.25 <= p["p50_s"] <= 0.5 or 30.0 <= p["p50_s"] <= 60.0
    assert 30.0 <= p["p99_s"] <= 60.0
    assert merged["offline_job_latency"]["small"]["jobs"] == 2


def test_stats_merge_percentiles_per_lane_and_the_text_names_each_lane() -> None:
    from consumer.cli.stats import format_stats

    now = time.time()
    stats = ServiceStats("a")
    for _ in range(20):
        stats.latency.observe(JOB_LATENCY, ("small", "interactive", "result"), 0.2)
        stats.latency.observe(JOB_LATENCY, ("small", "bulk", "result"), 90.0)
    stats.latency.observe(JOB_LATENCY, ("other", "bulk", "dead_letter"), 90.0)
    merged = merge_snapshots([stats.snapshot()], now_s=now, live_within_s=10)
    lanes = merged["lane_job_latency"]
    assert lanes["interactive"]["jobs"] == 20 and lanes["bulk"]["jobs"] == 21, "tiers and outcomes merge"
    assert lanes["interactive"]["p99_s"] < 1.0 < 60.0 <= lanes["bulk"]["p50_s"]
    text = format_stats(merged)
    assert "lane interactive job latency (live instances, 20 jobs): p50=" in text
    assert "lane bulk job latency (live instances, 21 jobs)" in text
