"""Merging the instances' stats snapshots, the text `promptbus stats` prints, and the
OpenTelemetry instruments that read the same stats."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from consumer.cli.stats import format_stats
from consumer.core.lag import PartitionLag
from consumer.core.snapshots import by_group, merge_snapshots, read_snapshot, with_group_lag
from consumer.runtime.metrics import register_otel_metrics
from consumer.runtime.stats import ServiceStats


def snapshot(instance: str, updated_at: float, **tier: Any) -> dict[str, Any]:
    stats = ServiceStats(instance=instance)
    ts = stats.tier("small")
    for key, value in tier.items():
        if key == "batch_size_reason":  # made when a snapshot asks (`TierStats.size_reason`)
            ts.size_reason = lambda text=value: text
        else:
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


def test_the_stats_text_says_why_each_tier_batches_as_it_does() -> None:
    """The reason comes from the tier's adaptive size and goes with the batch size shown: from
    the live instance with the largest size, never from a departed one."""
    merged = merge_snapshots(
        [
            snapshot(
                "a", 100.0, batch_size=1, batch_size_reason="size 1: at size 2, batching agreed 71% < 80%"
            ),
            snapshot(
                "b",
                100.0,
                batch_size=8,
                batch_size_reason="size 8: agreement 99% of 120, 7.0 requests saved per 8 jobs (max_items)",
            ),
            snapshot("gone", 10.0, batch_size=16, batch_size_reason="size 16: stale"),
        ],
        now_s=101.0,
        live_within_s=10.0,
    )
    tier = merged["tiers"]["small"]
    assert tier["batch_size"] == 8
    assert tier["batch_size_reason"].startswith("size 8: agreement 99%")
    lines = format_stats(merged).splitlines()
    assert "tier small batch size 8: agreement 99% of 120, 7.0 requests saved per 8 jobs (max_items)" in lines
    only_gone = merge_snapshots([snapshot("gone", 10.0, batch_size=16, batch_size_reason="x")],
                                now_s=101.0, live_within_s=10.0)
    assert only_gone["tiers"]["small"]["batch_size_reason"] == ""
    assert not any(line.startswith("tier small batch ") for line in format_stats(only_gone).splitlines())


def test_the_reason_flows_from_the_tier_runtime_into_a_readable_snapshot() -> None:
    from consumer.core.completion import Completion, CompletionRequest
    from consumer.core.window import PackKey
    from consumer.providers.fake import FakeProvider
    from consumer.runtime.tiers import TierRuntime
    from consumer.settings import TierConfig

    config = TierConfig.model_validate(
        {
            "provider": "openai_compat",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m",
            "batching": {"enabled": True, "max_items": 8, "verify_fraction": 0.25},
        }
    )
    stats = ServiceStats(instance="i-1")
    def unused(_request: CompletionRequest) -> Completion:
        raise AssertionError("nothing is sent here")

    tier = TierRuntime.build("small", config, FakeProvider(unused), stats.tier("small"))
    assert tier.current_batch_size() == 1, "measuring agreement: nothing is trusted beyond 1"
    key = PackKey("small", "Classify:\n", "text", "{}", "online")
    assert tier.limits_for(key, 0.0).max_items == 1
    for _ in range(4):
        tier.sizes.record(key, "complete", 2, 1.0)
        tier.sizes.record_agreement(key, 2, 2, 2, 1.0)
    assert tier.current_batch_size() == 2
    published = read_snapshot(orjson.dumps(stats.snapshot()))
    reason = published["tiers"]["small"]["batch_size_reason"]
    assert reason.startswith("size 2: agreement 100% of 8, valid 100%")
    merged = merge_snapshots([published], now_s=published["updated_at"], live_within_s=10.0)
    assert f"tier small batch {reason}" in format_stats(merged).splitlines()


def test_a_closed_circuit_says_its_held_requests_were_held_while_it_was_open() -> None:
    stats = ServiceStats(instance="a")
    stats.tier("back").circuit_opened, stats.tier("back").held_requests = 2, 2
    stats.tier("one").circuit_opened, stats.tier("one").held_requests = 1, 1
    stats.tier("none").circuit_opened = 1  # opened while no request was waiting
    snapshot = stats.snapshot()
    merged = merge_snapshots(
        [read_snapshot(orjson.dumps(snapshot))], now_s=snapshot["updated_at"], live_within_s=10.0
    )
    text = format_stats(merged)
    assert "tier back circuit: closed (opened 2x, held 2 requests while open)" in text.splitlines()
    assert "tier one circuit: closed (opened 1x, held 1 request while open)" in text.splitlines()
    assert "tier none circuit: closed (opened 1x)" in text.splitlines()
    assert "requests held" not in text


async def test_a_tier_with_tls_verify_false_is_warned_about_in_stats_from_a_real_build() -> None:
    from consumer.app.tiers import build_tiers
    from consumer.settings import TierFile

    tier_file = TierFile.model_validate(
        {
            "tiers": {
                "lax": {
                    "provider": "openai_compat", "base_url": "https://127.0.0.1:9/v1", "model": "m",
                    "deployments": [{"name": "a"}, {"name": "b", "tls": {"verify": False}}],
                },
                "strict": {"provider": "openai_compat", "base_url": "https://127.0.0.1:9/v1", "model": "m"},
            }
        }
    )
    stats = ServiceStats(instance="a")

    _tiers, clients = await build_tiers(tier_file, stats)
    for client in clients:
        await client.close()
    snapshot = stats.snapshot()
    merged = merge_snapshots(
        [read_snapshot(orjson.dumps(snapshot)), read_snapshot(orjson.dumps(snapshot))],
        now_s=snapshot["updated_at"],
        live_within_s=10.0,
    )
    lines = format_stats(merged).splitlines()
    assert "tier lax WARNING: tls.verify is false: provider certificates are not checked" in lines
    assert merged["tiers"]["lax"]["tls_unverified"] == 1, "a shared gauge: not summed over instances"
    assert not any(line.startswith("tier strict WARNING") for line in lines)


async def test_the_circuit_per_tier_in_stats_text_and_metrics() -> None:
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client.parser import text_string_to_metric_families

    from consumer.runtime.metrics import build_app

    stats = ServiceStats(instance="a")
    down = stats.tier("down")
    down.circuit_open, down.outage_s, down.circuit_opened, down.held_requests = 1, 12.5, 1, 40
    stats.tier("up")
    text = format_stats(merge_snapshots([read_snapshot(orjson.dumps(stats.snapshot()))],
                                        now_s=stats.snapshot()["updated_at"], live_within_s=10.0))
    expected = (
        "tier down circuit: OPEN for 12.5 s: provider unreachable, jobs held "
        "(opened 1x, held 40 requests while open)"
    )
    assert expected in text
    assert "tier up circuit: closed" in text
    async with TestClient(TestServer(build_app(stats, lambda: True))) as client:
        body = await (await client.get("/metrics")).text()
    samples = {
        (s.name, s.labels.get("tier")): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert samples[("promptbus_tier_circuit_open", "down")] == 1
    assert samples[("promptbus_tier_circuit_open", "up")] == 0


def test_a_snapshot_names_its_group_and_stats_are_shown_per_group() -> None:
    mine = ServiceStats(instance="a", group="orders")
    mine.items_in = 3
    theirs = ServiceStats(instance="b", group="other")
    theirs.items_in = 40
    theirs.tier("big")
    older = read_snapshot(orjson.dumps({"items_in": 7, "updated_at": 1.0}))  # before groups were recorded
    snaps = [read_snapshot(orjson.dumps(s.snapshot())) for s in (mine, theirs)] + [older]
    assert snaps[0]["group"] == "orders"
    groups = by_group(snaps)
    assert list(groups) == ["", "orders", "other"]
    merged = merge_snapshots(groups["orders"], now_s=snaps[0]["updated_at"], live_within_s=10.0)
    assert merged["items_in"] == 3 and merged["instances_seen"] == 1 and "big" not in merged["tiers"]
    text = format_stats({"group": "orders", **merged})
    assert text.splitlines()[:2] == ["group orders:", "instances: 1 live, 1 seen"]
    assert "items in: 3 " in text


def test_fallback_and_auto_counts_reach_stats_lines_and_metrics() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from consumer.cli.stats import routing_lines
    from consumer.runtime.metrics import StatsCollector

    stats = ServiceStats("i1")
    backup = stats.tier("backup")
    backup.fallback_jobs["main"] += 3
    main = stats.tier("main")
    main.count_auto("offline")
    main.count_auto("online")
    main.offline_saved_usd = 0.5
    merged = merge_snapshots([stats.snapshot(), stats.snapshot()], now_s=0.0, live_within_s=1e12)
    assert routing_lines("backup", merged["tiers"]["backup"]) == ["tier backup fallback: answered 6 for main"]
    assert routing_lines("main", merged["tiers"]["main"]) == [
        "tier main mode auto: 2 offline, 2 online; offline saved $1.0000"
    ]
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats))
    text = generate_latest(registry).decode()
    assert 'promptbus_tier_fallback_jobs_total{from="main",tier="backup"} 3.0' in text
    assert 'promptbus_tier_auto_offline_total{tier="main"} 1.0' in text


def test_no_oldest_uncommitted_age_is_shown_beside_a_lag_of_zero() -> None:
    """The instances' oldest-uncommitted age is as old as their last refresh: once the broker
    counts no lag for the group, nothing is uncommitted and no age is shown (0 in --json)."""
    stats = ServiceStats(instance="a", group="orders")
    stats.lag = {("jobs", 0): PartitionLag(0, 0.0), ("jobs", 1): PartitionLag(3, 5.6)}
    snap = read_snapshot(orjson.dumps(stats.snapshot()))
    merged = merge_snapshots([snap], now_s=snap["updated_at"], live_within_s=10.0)
    assert (merged["lag_records"], merged["oldest_uncommitted_age_s"]) == (3, 5.6)
    assert "lag: 3 records over 2 partitions, oldest uncommitted 5.6 s" in format_stats(merged).splitlines()

    caught_up = with_group_lag(merged, records=0, partitions=12)
    assert (caught_up["lag_records"], caught_up["oldest_uncommitted_age_s"]) == (0, 0.0)
    lines = format_stats(caught_up).splitlines()
    assert "lag: 0 records over 12 partitions" in lines
    assert not any("oldest uncommitted" in line for line in lines)

    behind = with_group_lag(merged, records=40, partitions=12)
    assert behind["oldest_uncommitted_age_s"] == 5.6
    assert "lag: 40 records over 12 partitions, oldest uncommitted 5.6 s" in format_stats(behind).splitlines()
    assert merged["lag_records"] == 3, "the merged snapshot itself is left as it was"


async def test_the_limit_says_why_it_is_where_it_is_in_stats_text_and_metrics() -> None:
    """From the tier's limiter (its algorithm, the provider's announced budget, a pause) into
    the snapshot, the merged `promptbus stats` line and `promptbus_tier_limit_reason`."""
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client.parser import text_string_to_metric_families

    from consumer.core.completion import Completion, CompletionRequest
    from consumer.core.errors import RateLimitHint
    from consumer.core.limit import AIMDLimit
    from consumer.providers.fake import FakeProvider
    from consumer.runtime.metrics import build_app
    from consumer.runtime.tiers import TierRuntime
    from consumer.settings import TierConfig

    config = TierConfig.model_validate(
        {"provider": "openai_compat", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    )

    def unused(_request: CompletionRequest) -> Completion:
        raise AssertionError("nothing is sent here")

    stats = ServiceStats(instance="a")
    tier = TierRuntime.build("small", config, FakeProvider(unused), stats.tier("small"))
    limiter = tier.limiter
    algorithm = limiter.gates[0].algorithm
    assert isinstance(algorithm, AIMDLimit) and algorithm.watches_latency
    tier.refresh_gauges(0.0)
    assert stats.tier("small").limit_reason == "idle"
    tokens = [await limiter.acquire() for _ in range(4)]
    limiter.note_budget(RateLimitHint(remaining_requests=100, limit_requests=200), tokens[0])
    assert not algorithm.watches_latency, "a provider that announces its budget refuses past it"
    for token in tokens[:2]:  # answered with the limit in use: it grows
        token.success()
    tier.refresh_gauges(0.0)
    assert stats.tier("small").limit_reason == "growing" and stats.tier("small").limit == 6
    limiter.pause(30.0)
    tier.refresh_gauges(0.0)
    assert stats.tier("small").limit_reason == "paused"

    other = snapshot("b", 0.0, limit=9, limit_reason="growing")
    third = snapshot("c", 0.0, limit=9, limit_reason="paused")
    mine = read_snapshot(orjson.dumps(stats.snapshot()))
    merged = merge_snapshots([mine, other, third], now_s=mine["updated_at"], live_within_s=1e12)
    assert merged["tiers"]["small"]["limit_reasons"] == {"paused": 2, "growing": 1}
    line = next(x for x in format_stats(merged).splitlines() if x.startswith("tier small: requests="))
    assert "limit=24 (paused: 2 instances, growing: 1 instance) batch_size=" in line
    async with TestClient(TestServer(build_app(stats, lambda: True))) as client:
        body = await (await client.get("/metrics")).text()
    reasons = {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "promptbus_tier_limit_reason" and s.labels["tier"] == "small"
    }
    assert reasons["paused"] == 1 and sum(reasons.values()) == 1 and "quota_share" in reasons
