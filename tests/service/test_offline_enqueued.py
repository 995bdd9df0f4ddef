"""Offline batches under a provider's enqueued token limit (OpenAI's `token_limit_exceeded`),
against the simulator enforcing one (`batch_max_enqueued_tokens`), on the in-memory edges and
on the real broker (`make_bus`): the collector keeps what it submits under the tier's
`offline.max_enqueued_tokens`, and a batch the provider fails for its limit anyway is held and
submitted again, never dead-lettered."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from consumer.core.offline import token_shards
from consumer.testing.harness import job, tier_file_dict
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for, estimate_tokens

JOBS = 30


@pytest.fixture
def api_key() -> Iterator[str]:
    os.environ["PB_TEST_ENQUEUED_KEY"] = "k"
    yield "PB_TEST_ENQUEUED_KEY"
    del os.environ["PB_TEST_ENQUEUED_KEY"]


def offline_tiers(base_url: str, api_key_env: str, max_enqueued_tokens: int) -> dict[str, Any]:
    """An openai tier whose offline jobs go in batches of 10 (max_items), polled often."""
    return tier_file_dict(
        base_url + "/v1",
        provider="openai",
        api_key_env=api_key_env,
        offline={
            "enabled": True,
            "poll_s": 0.2,
            "collect_s": 0.2,
            "max_items": 10,
            "max_enqueued_tokens": max_enqueued_tokens,
        },
    )


def job_tokens(jobs: list[dict[str, Any]]) -> int:
    """What the simulator counts of these jobs' batch lines (their one user message)."""
    return sum(estimate_tokens(j["prompt"].replace("${text}", j["variables"]["text"])) for j in jobs)


def assert_every_job_answered(outcomes: Any, jobs: list[dict[str, Any]]) -> None:
    assert outcomes.ids() == {j["id"] for j in jobs}
    assert dict(outcomes.dead) == {}, "nothing is dead-lettered for the enqueued token limit"
    assert outcomes.duplicates() == {}
    for j in jobs:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])


async def test_submissions_stay_under_the_tiers_enqueued_token_limit(
    make_bus: Callable[..., Any], api_key: str
) -> None:
    """Three collections of 10 (about 145 tokens each) under a limit of 300, the provider's
    own: two go at once, the third waits until one of them ended; the provider fails none."""
    bus = make_bus(partitions=2)
    jobs = [job(i, batch=False, mode="offline") for i in range(JOBS)]
    limit = 2 * job_tokens(jobs[10:20]) + 5  # two collections fit, three do not
    server = SimulatorServer(SimulatorConfig(seed=5, batch_delay_s=1.0, batch_max_enqueued_tokens=limit))
    async with server as base_url, bus.service(offline_tiers(base_url, api_key, limit)):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=90)
        counters = server.sim.stats_.snapshot()
    assert_every_job_answered(outcomes, jobs)
    assert counters["batches_over_enqueued_limit"] == 0
    assert counters["batches_created"] == 3


async def test_a_batch_the_provider_fails_for_its_limit_is_submitted_again(
    make_bus: Callable[..., Any], api_key: str
) -> None:
    """The provider's limit is lower than the tier says (the organisation's other work holds
    part of it): the third batch fails `token_limit_exceeded`; the tracker holds it and submits
    it again once another batch ended, and every job gets its result."""
    bus = make_bus(partitions=2)
    jobs = [job(i, batch=False, mode="offline") for i in range(JOBS)]
    provider_limit = 2 * job_tokens(jobs[10:20]) + 5
    server = SimulatorServer(
        SimulatorConfig(seed=5, batch_delay_s=1.0, batch_max_enqueued_tokens=provider_limit)
    )
    async with server as base_url, bus.service(offline_tiers(base_url, api_key, 10 * provider_limit)):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=90)
        counters = server.sim.stats_.snapshot()
    assert_every_job_answered(outcomes, jobs)
    assert counters["batches_over_enqueued_limit"] >= 1, "the provider refused a batch"
    assert counters["batches_created"] == 3 + counters["batches_over_enqueued_limit"]


def test_a_collection_is_cut_into_shards_that_fit() -> None:
    assert token_shards([40, 40, 40, 40], 100) == [range(0, 2), range(2, 4)]
    assert token_shards([150, 10, 10], 100) == [range(0, 1), range(1, 3)], "one over the limit goes alone"
    assert token_shards([], 100) == []
