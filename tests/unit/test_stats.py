"""Merging the instances' stats snapshots, the text `promptbus stats` prints, and the
OpenTelemetry instruments that read the same stats."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from consumer.cli import format_stats
from consumer.runtime.metrics import register_otel_metrics
from consumer.runtime.stats import ServiceStats, merge_snapshots, read_snapshot


def snapshot(instance: str, updated_at: float, **tier: Any) -> dict[str, Any]:
    stats = ServiceStats(instance=instance)
    ts = stats.tier("small")
    for key, value in tier.items():
        setattr(ts, key, value)
    snap = dict(stats.snapshot())
    snap["updated_at"] = updated_at
    return snap


def test_counters_add_up_and_budgets_are_the_largest_live_value() -> None:
    """Instances on one API key each learn the same budget: summing it would double it."""
    merged = merge_snapshots(
        [
            snapshot(
                "a",
                100.0,
                provider_requests=5,
                limit=4,
                budget_requests_per_s=20.0,
                budget_tokens_per_s=600.0,
            ),
            snapshot(
                "b",
                100.0,
                provider_requests=7,
                limit=6,
                budget_requests_per_s=19.5,
                budget_tokens_per_s=610.0,
            ),
            snapshot("gone", 10.0, provider_requests=3, limit=8, budget_requests_per_s=99.0),
        ],
        now_s=101.0,
        live_within_s=10.0,
    )
    tier = merged["tiers"]["small"]
    assert tier["provider_requests"] == 15
    assert tier["limit"] == 10, "live concurrency limits add up"
    assert tier["budget_requests_per_s"] == 20.0 and tier["budget_tokens_per_s"] == 610.0


def test_the_stats_text_shows_the_budgets_only_when_learnt() -> None:
    paced = merge_snapshots(
        [snapshot("a", 100.0, budget_requests_per_s=20.0, budget_tokens_per_s=600.0)],
        now_s=100.0,
        live_within_s=10.0,
    )
    assert "paced at 20 req/s and 600 tokens/s" in format_stats(paced)
    unpaced = merge_snapshots([snapshot("a", 100.0)], now_s=100.0, live_within_s=10.0)
    assert "paced at" not in format_stats(unpaced)


def test_otel_instruments_read_the_same_stats_as_prometheus() -> None:
    stats = ServiceStats(instance="a")
    stats.results = 7
    stats.tier("small").provider_requests = 3
    stats.agreement.record("small", 4, 1, 1)
    stats.agreement.record("small", 4, 0, 1)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_otel_metrics(provider, stats)
    data = reader.get_metrics_data()
    assert data is not None
    values = {
        (metric.name, tuple(sorted((point.attributes or {}).items()))): point.value  # type: ignore[union-attr]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }
    assert values[("promptbus.results", ())] == 7
    assert values[("promptbus.tier.provider_requests", (("tier", "small"),))] == 3
    assert values[("promptbus.tier.verify_compared", (("size", "4"), ("tier", "small")))] == 2
    assert values[("promptbus.tier.verify_agreed", (("size", "4"), ("tier", "small")))] == 1
    provider.shutdown()


def test_stats_topic_records_are_read_or_refused_with_the_reason() -> None:
    stats = ServiceStats(instance="i-1")
    stats.tier("small").limit = 4
    stats.dead_letters["invalid_job"] += 2
    stats.agreement.record("small", 4, agreed=2, compared=3)
    published = stats.snapshot()
    assert read_snapshot(orjson.dumps(published)) == published
    refused = {
        b"oops": "stats snapshot: Invalid JSON",
        b"[]": "stats snapshot: Input should be an object",
        b'{"tiers": 5}': "field 'tiers': Input should be an object",
        b'{"items_in": "many"}': "field 'items_in': Input should be a valid integer",
    }
    for value, reason in refused.items():
        with pytest.raises(ValueError) as info:
            read_snapshot(value)
        assert str(info.value).startswith(reason), (value, str(info.value))
