"""Per-lane stats: counted per job outcome, merged across instances, shown by `promptbus stats`
and served as Prometheus families with a `lane` label."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from consumer.runtime.metrics import StatsCollector
from consumer.runtime.stats import ServiceStats, format_lanes, merge_snapshots, read_snapshot


def _stats(instance: str) -> ServiceStats:
    stats = ServiceStats(instance=instance)
    interactive, bulk = stats.lane("interactive"), stats.lane("bulk")
    interactive.ended(0.2, ok=True)
    interactive.ended(0.4, ok=True)
    bulk.ended(30.0, ok=True)
    bulk.ended(10.0, ok=False)
    bulk.inflight, bulk.paused = 500, 1
    return stats


def test_lane_counters_add_up_and_gauges_count_live_instances_only() -> None:
    live, gone = _stats("a"), _stats("b")
    snaps = [read_snapshot(orjson.dumps(s.snapshot())) for s in (live, gone)]
    snaps[1]["updated_at"] = 0.0  # long gone
    merged = merge_snapshots(snaps, now_s=snaps[0]["updated_at"], live_within_s=10.0)
    bulk, interactive = merged["lanes"]["bulk"], merged["lanes"]["interactive"]
    assert (bulk["results"], bulk["dead_letters"]) == (2, 2)
    assert (bulk["inflight"], bulk["paused"]) == (500, 1)  # the gone instance's gauges are not summed
    assert bulk["latency_s_max"] == 30.0
    assert bulk["latency_s_mean"] == pytest.approx(20.0)
    assert interactive["latency_s_mean"] == pytest.approx(0.3)
    lines = format_lanes(merged)
    assert lines[0].startswith("lane bulk: results=2 dead_letters=2 latency_mean=20.000s")
    assert "in_flight=500 paused=1" in lines[0]
    assert lines[1].startswith("lane interactive: results=4 dead_letters=0 latency_mean=0.300s")


def test_lane_metrics_carry_a_lane_label() -> None:
    registry = CollectorRegistry()
    registry.register(StatsCollector(_stats("a")))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert samples[("promptbus_lane_jobs_total", (("lane", "bulk"), ("outcome", "dead_letter")))] == 1
    assert samples[("promptbus_lane_jobs_total", (("lane", "interactive"), ("outcome", "result")))] == 2
    assert samples[("promptbus_lane_latency_seconds_total", (("lane", "bulk"),))] == pytest.approx(40.0)
    assert samples[("promptbus_lane_inflight", (("lane", "bulk"),))] == 500
    assert samples[("promptbus_lane_paused", (("lane", "bulk"),))] == 1
    assert samples[("promptbus_lane_paused", (("lane", "interactive"),))] == 0
