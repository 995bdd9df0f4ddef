"""Per-lane stats: counted per job outcome, merged across instances, shown by `promptbus stats`
and served as Prometheus families with a `lane` label."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from consumer.cli.stats import format_lanes
from consumer.core.errors import ErrorKind
from consumer.core.lanes import Lane
from consumer.core.snapshots import merge_snapshots, read_snapshot
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import Ticket
from consumer.runtime.admission import Rejection
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.metrics import StatsCollector
from consumer.runtime.outcomes import RecordLimits
from consumer.runtime.stats import ServiceStats
from consumer.telemetry import Telemetry
from consumer.testing.harness import service_env, settings_from_env


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


def test_a_record_rejected_in_a_lane_is_a_dead_letter_of_that_lane_too() -> None:
    """The lane lines count dead letters as the totals do: a record rejected at admission
    (`unknown_tier`) counts in the dead letters of the lane it was read in."""
    delivered: list[OutRecord | None] = []

    class RecordingSink:
        def deliver(self, ticket: Ticket, record: OutRecord | None) -> None:
            delivered.append(record)

    settings = settings_from_env(service_env("127.0.0.1:9"))
    stats = ServiceStats(instance="a")
    writer = OutcomeWriter(settings, cast(Any, RecordingSink()), stats, Telemetry.disabled(), RecordLimits())
    raw = orjson.dumps({"id": "j1", "tier": "nope", "prompt": "p"})
    rejection = Rejection(ErrorKind.UNKNOWN_TIER, "tier 'nope' is not configured", raw, job_id="j1")
    source = SourceOffset(TopicPartition("jobs.bulk", 0), 7)
    writer.reject(Ticket(source, 0), rejection, Lane("bulk", "jobs.bulk", rank=1))

    assert [r.topic for r in delivered if r is not None] == [settings.dlq_topic]
    snap = read_snapshot(orjson.dumps(stats.snapshot()))
    merged = merge_snapshots([snap], now_s=snap["updated_at"], live_within_s=10.0)
    assert merged["dead_letters"] == {"unknown_tier": 1}
    assert merged["lanes"]["bulk"]["dead_letters"] == sum(merged["dead_letters"].values())
    assert format_lanes(merged) == [
        "lane bulk: results=0 dead_letters=1 latency_mean=0.000s latency_max=0.000s in_flight=0 paused=0"
    ]
