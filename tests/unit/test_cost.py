"""Cost accounting: prices, cached tokens, cache writes, the batch discount, batching's saving,
and how the tier's tokens and cost show in stats and /metrics."""

from __future__ import annotations

import orjson
import pytest

from consumer.cli.stats import format_stats
from consumer.core.completion import Usage
from consumer.core.cost import BatchSaving, Pricing, alone_input_estimate, alone_output_estimate, cost_usd
from consumer.core.errors import ConfigError
from consumer.core.snapshots import merge_snapshots, read_snapshot
from consumer.runtime.stats import ServiceStats
from consumer.settings import parse_tier_file

PRICES = Pricing(
    input_per_mtok=3.0, output_per_mtok=15.0, cached_input_per_mtok=0.3, cache_write_per_mtok=3.75
)


def test_uncached_input_and_output_at_their_prices() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000)
    assert cost_usd(usage, PRICES) == pytest.approx(3.0 + 1.5)


def test_cached_tokens_at_the_cached_price_and_writes_at_the_write_price() -> None:
    # 1,000 prompt tokens: 600 read from the cache, 300 written to it, 100 neither
    usage = Usage(input_tokens=1000, output_tokens=0, cached_input_tokens=600, cache_write_tokens=300)
    expected = (100 * 3.0 + 600 * 0.3 + 300 * 3.75) / 1e6
    assert cost_usd(usage, PRICES) == pytest.approx(expected)


def test_unset_cache_prices_fall_back_to_the_input_price() -> None:
    plain = Pricing(input_per_mtok=2.0, output_per_mtok=8.0)
    usage = Usage(input_tokens=1000, output_tokens=0, cached_input_tokens=500, cache_write_tokens=200)
    assert cost_usd(usage, plain) == pytest.approx(1000 * 2.0 / 1e6)


def test_offline_requests_at_the_batch_price() -> None:
    prices = Pricing(input_per_mtok=1.0, output_per_mtok=4.0, batch_discount=0.5)
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_usd(usage, prices) == pytest.approx(5.0)
    assert cost_usd(usage, prices, offline=True) == pytest.approx(2.5)


def test_a_share_of_a_batched_usage() -> None:
    usage = Usage(input_tokens=101, output_tokens=50, cached_input_tokens=40, cache_write_tokens=9)
    assert usage.share(4) == Usage(25, 12, 10, 2)
    assert usage.share(0) == usage
    assert usage + usage == Usage(202, 100, 80, 18)


def test_alone_estimates_use_the_batched_prompts_own_tokens_per_character() -> None:
    # the batched prompt: 4,000 characters that the provider counted as 800 tokens (5 chars each)
    assert alone_input_estimate(800, 4000, 20_000) == 4000
    assert alone_input_estimate(0, 0, 4000) == 1000  # nothing measured: 4 characters a token
    assert alone_output_estimate(100, 5) == 60  # less 8 tokens of JSON per answer
    assert alone_output_estimate(3, 5) == 5


def test_a_measured_saving_wins_over_the_estimate() -> None:
    measured = BatchSaving.from_counts(
        verify_batched_tokens=300, verify_alone_tokens=1200, batched_tokens=10, alone_tokens_estimate=10
    )
    assert measured.measured and measured.saved_fraction == pytest.approx(0.75)
    estimate = BatchSaving.from_counts(
        verify_batched_tokens=0, verify_alone_tokens=0, batched_tokens=500, alone_tokens_estimate=2000
    )
    assert not estimate.measured and estimate.saved_fraction == pytest.approx(0.75)
    assert (
        BatchSaving.from_counts(
            verify_batched_tokens=0, verify_alone_tokens=0, batched_tokens=0, alone_tokens_estimate=0
        ).saved_fraction
        is None
    )


def _tier_file(**extra: object) -> dict[str, object]:
    return {"tiers": {"t": {"provider": "anthropic", "model": "claude-sonnet-4-5", **extra}}}


def test_tier_keys_parse_with_defaults() -> None:
    tier = parse_tier_file(_tier_file()).tiers["t"]
    assert (tier.prompt_cache, tier.dedupe, tier.dedupe_window_s, tier.pricing) == ("auto", False, 60.0, None)
    priced = parse_tier_file(
        _tier_file(
            prompt_cache="off",
            dedupe=True,
            dedupe_window_s=5,
            pricing={
                "input_per_mtok": 3,
                "output_per_mtok": 15,
                "cached_input_per_mtok": 0.3,
                "cache_write_per_mtok": 3.75,
                "batch_discount": 0.5,
            },
        )
    ).tiers["t"]
    assert priced.pricing is not None
    assert priced.pricing.pricing() == Pricing(3, 15, 0.3, 3.75, 0.5)


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"prompt_cache": "on"}, "tiers.t.prompt_cache"),
        ({"dedupe_window_s": -1}, "tiers.t.dedupe_window_s"),
        ({"pricing": {"input_per_mtok": 1}}, "tiers.t.pricing.output_per_mtok"),
        ({"pricing": {"input_per_mtok": 1, "output_per_mtok": -2}}, "tiers.t.pricing.output_per_mtok"),
        (
            {"pricing": {"input_per_mtok": 1, "output_per_mtok": 2, "batch_discount": 1}},
            "tiers.t.pricing.batch_discount",
        ),
        ({"pricing": {"input_per_mtok": 1, "output_per_mtok": 2, "cached": 1}}, "tiers.t.pricing.cached"),
    ],
)
def test_bad_values_name_their_key(extra: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_tier_file(_tier_file(**extra))
    assert where in str(err.value)


async def test_tokens_and_cost_in_stats_text_and_metrics() -> None:
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client.parser import text_string_to_metric_families

    from consumer.runtime.metrics import build_app

    stats = ServiceStats(instance="a")
    t = stats.tier("small")
    t.input_tokens, t.output_tokens, t.cached_input_tokens, t.cost_usd = 1500, 40, 1200, 0.0123
    t.batched_tokens, t.alone_tokens_estimate = 250, 1000
    snap = read_snapshot(orjson.dumps(stats.snapshot()))
    text = format_stats(merge_snapshots([snap], now_s=snap["updated_at"], live_within_s=10.0))
    assert "tier small tokens: in=1500 out=40 cached_in=1200 cache_write=0 cost=$0.0123 deduped=0" in text
    assert "batching saved 75% of tokens (250 batched vs 1000 alone, estimate from prompt lengths)" in text
    # a batching that cost more tokens than asking alone says so, never "saved -153%"
    t.batched_tokens, t.alone_tokens_estimate = 253, 100
    snap = read_snapshot(orjson.dumps(stats.snapshot()))
    text = format_stats(merge_snapshots([snap], now_s=snap["updated_at"], live_within_s=10.0))
    assert "batching cost 153% more tokens than asking alone (253 batched vs 100 alone, estimate" in text
    assert "saved -" not in text
    async with TestClient(TestServer(build_app(stats, lambda: True))) as client:
        body = await (await client.get("/metrics")).text()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.labels.get("tier") == "small"
    }
    assert samples["promptbus_tier_input_tokens_total"] == 1500
    assert samples["promptbus_tier_output_tokens_total"] == 40
    assert samples["promptbus_tier_cached_input_tokens_total"] == 1200
    assert samples["promptbus_tier_cost_usd_total"] == pytest.approx(0.0123)


def test_offline_answers_count_at_the_batch_price() -> None:
    from consumer.core.completion import Completion
    from consumer.core.offline import BatchItemResult
    from consumer.runtime.offline import count_offline_usage
    from consumer.runtime.stats import TierStats

    answered = Completion(
        "ok", "stop", usage=Usage(1_000_000, 0, cached_input_tokens=0), provider="anthropic", model="m"
    )
    items = [BatchItemResult("a", completion=answered), BatchItemResult("b", error=None)]
    stats = TierStats()
    count_offline_usage(stats, items, Pricing(input_per_mtok=3.0, output_per_mtok=15.0, batch_discount=0.5))
    assert (stats.input_tokens, stats.output_tokens) == (1_000_000, 0)
    assert stats.cost_usd == pytest.approx(1.5)
