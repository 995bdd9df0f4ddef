"""Tokens, prompt caching and cost end to end (`make_bus`): an Anthropic tier on the simulator,
batched jobs with a long shared instruction, priced; the tier's stats add up the providers'
usage, each result carries its share, and `verify_fraction` measures what batching saved."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from consumer.cli.stats import format_stats
from consumer.core.completion import Completion, CompletionRequest
from consumer.core.snapshots import merge_snapshots
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import tier_file_dict
from consumer.testing.simulator import (
    SimulatorConfig,
    SimulatorServer,
    answer_for,
    batched_answer,
    extract_input,
    parse_batch_items,
)

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


def _answers(request: CompletionRequest) -> Completion:
    text = request.messages[-1].content
    items = parse_batch_items(text)
    if items is not None:
        return text_completion(orjson.dumps(batched_answer(items)).decode())
    return text_completion(answer_for(extract_input(text)))


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_requests_of_one_prefix_share_its_bytes_and_cache_key(
    make_bus: Callable[..., Any], provider: str
) -> None:
    bus = make_bus(partitions=1)
    fake = FakeProvider(_answers, name="small")
    tiers = _tiers("http://127.0.0.1:9", prompt_cache="auto")
    tiers["tiers"]["small"]["provider"] = provider
    tiers["tiers"]["small"]["batching"]["max_items"] = 4
    tiers["tiers"]["small"]["batching"]["initial_items"] = 4
    jobs = [*_jobs(12), {**_jobs(1)[0], "id": "alone", "batch": False}]
    async with bus.service(tiers, providers={"small": fake}):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    assert len(outcomes.results) == 13 and not outcomes.dead
    batched = [r for r in fake.requests if r.answer_schema is not None]
    ordinary = [r for r in fake.requests if r not in batched]
    assert len(batched) >= 2 and ordinary
    heads = {r.cache_split()[0] for r in batched if r.cache_split() is not None}
    assert len(heads) == 1, "every batched request starts with the same bytes"
    (head,) = heads
    assert head.startswith(INSTRUCTION[:100]) and head.endswith("TEXT:\n")
    assert '[{"id":' not in head, "the items come after the prefix"
    assert len({r.cache_key for r in batched}) == 1 and batched[0].cache_key is not None
    for r in ordinary:
        assert r.cache_split() == (INSTRUCTION, "review number 0: fine")
    schemas = {repr(r.answer_schema) for r in batched}
    if provider == "anthropic":
        assert len(schemas) == 1, "the forced tool names no alias: one tool for every request"
    else:
        assert len(schemas) == len(batched), "OpenAI's strict schema names each request's aliases"
