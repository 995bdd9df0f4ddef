"""Merging the instances' stats snapshots, and the text `promptbus stats` prints."""

from __future__ import annotations

from typing import Any

from consumer.cli import format_stats
from consumer.runtime.stats import ServiceStats, merge_snapshots


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
