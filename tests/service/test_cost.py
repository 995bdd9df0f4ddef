"""Tokens, prompt caching and cost end to end (`make_bus`): an Anthropic tier on the simulator,
batched jobs with a long shared instruction, priced; the tier's stats add up the providers'
usage, each result carries its share, and `verify_fraction` measures what batching saved."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from consumer.cli import format_stats
from consumer.runtime.stats import merge_snapshots
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from tests.service.harness import tier_file_dict

#: about 1,500 tokens (4 characters each), ending with the data-marker line
INSTRUCTION = ("Label the sentiment of the review as positive or negative. " * 102)[:6000] + "\nTEXT:\n"
PRICING = {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cached_input_per_mtok": 0.3,
           "cache_write_per_mtok": 3.75}


def _jobs(n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"job-{i}", "tier": "small", "prompt": INSTRUCTION + "${text}",
         "variables": {"text": f"review number {i}: fine"}, "batch": True}
        for i in range(n)
    ]


def _tiers(base_url: str, *, prompt_cache: str, verify_fraction: float = 0.0) -> dict[str, Any]:
    tiers = tier_file_dict(
        base_url, provider="anthropic", model="claude-sonnet-4-5", max_items=10,
        options={"temperature": 0, "max_tokens": 16}, prompt_cache=prompt_cache, pricing=PRICING,
    )
    tiers["tiers"]["small"]["batching"].update(verify_fraction=verify_fraction, initial_items=10)
    return tiers


@pytest.mark.parametrize("prompt_cache", ["auto", "off"])
async def test_tokens_cache_and_cost_add_up(make_bus: Callable[..., Any], prompt_cache: str) -> None:
    bus = make_bus(partitions=1)
    jobs = _jobs(40)
    async with SimulatorServer(SimulatorConfig()) as base_url:
        service = bus.service(_tiers(base_url, prompt_cache=prompt_cache))
        async with service:
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        tier = service.stats_snapshot()["tiers"]["small"]
    assert len(outcomes.results) == 40 and not outcomes.dead
    assert tier["input_tokens"] > 0 and tier["output_tokens"] > 0 and tier["cost_usd"] > 0
    usages = [rs[0]["usage"] for rs in outcomes.results.values()]
    # each result its share of its request: the shares add up to at most the tier's tokens
    assert 0 < sum(u["input_tokens"] for u in usages) <= tier["input_tokens"]
    if prompt_cache == "auto":
        assert tier["cache_write_tokens"] > 0 and tier["cached_input_tokens"] > 0
        assert any(u["cached_input_tokens"] > 0 for u in usages)
    else:
        assert tier["cached_input_tokens"] == tier["cache_write_tokens"] == 0
    assert tier["batched_tokens"] > 0 and tier["alone_tokens_estimate"] > tier["batched_tokens"]


async def test_verify_fraction_measures_the_saving(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    jobs = _jobs(40)
    async with SimulatorServer(SimulatorConfig()) as base_url:
        service = bus.service(_tiers(base_url, prompt_cache="off", verify_fraction=0.5))
        async with service:
            await bus.produce(jobs)
            await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
            for _ in range(100):  # bounded: verification requests run after the results
                if service.stats_snapshot()["tiers"]["small"]["verify_alone_tokens"] > 0:
                    break
                await asyncio.sleep(0.05)
        snapshot = service.stats_snapshot()
    tier = snapshot["tiers"]["small"]
    assert 0 < tier["verify_batched_tokens"] < tier["verify_alone_tokens"]
    text = format_stats(merge_snapshots([snapshot], now_s=snapshot["updated_at"], live_within_s=10.0))
    assert "measured on verified jobs" in text
