"""Offline mode through the simulator's Batch API, with a service restart while the batch runs,
on the in-memory edges and on the real broker (`make_bus`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from consumer.kafka.clients import read_topic
from consumer.testing.harness import (
    InProcessService,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_offline_batch_survives_a_restart(
    make_bus: Callable[..., Any], provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = make_bus(partitions=2)
    batches_topic = bus.settings.batches_topic
    os.environ["PB_TEST_BATCH_KEY"] = "k"
    sim = SimulatorConfig(seed=3, batch_delay_s=4.0, batch_error_rate=0.1)
    try:
        async with SimulatorServer(sim) as base_url:
            tiers = tier_file_dict(
                base_url + ("/v1" if provider == "openai" else ""),
                provider=provider,
                api_key_env="PB_TEST_BATCH_KEY",
                offline={"enabled": True, "poll_s": 0.3, "collect_s": 0.3},
            )
            jobs = [job(i, batch=False, mode="offline") for i in range(30)]
            async with bus.service(tiers):
                await bus.produce(jobs)
                # wait (bounded) until the batch is recorded on the batches topic, then stop the service
                deadline = time.monotonic() + 30
                recorded = 0
                while time.monotonic() < deadline and recorded == 0:
                    recorded = len([v for _, v in await bus.read(batches_topic) if v is not None])
                    await asyncio.sleep(0.2)
                assert recorded >= 1
            # something other than promptbus wrote to the batches topic after the batch's record
            await bus.produce_raw(
                batches_topic,
                [(b"small:not-json", b"{oops"), (b"small:no-members", b'{"tier": "small", "batch_id": "x"}')],
            )
            # the batch is still running at the provider; a new instance resumes tracking it
            async with bus.service(tiers):
                outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    finally:
        del os.environ["PB_TEST_BATCH_KEY"]

    assert outcomes.ids() == {j["id"] for j in jobs}
    assert outcomes.duplicates() == {}
    for j in jobs:
        if j["id"] in outcomes.results:
            assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
        else:
            assert outcomes.dead[j["id"]][0]["error"]["kind"] == "batch_failed"
    assert 0 < len(outcomes.dead) < len(jobs), "about 10% of items were errored by the simulator"
    skipped = [r.getMessage() for r in caplog.records if "is not a batch record" in r.getMessage()]
    # each foreign record is skipped with its reason (again after a re-assignment re-reads the topic)
    assert any("b'small:not-json'" in m and "Invalid JSON" in m for m in skipped), skipped
    assert any("b'small:no-members'" in m and "field 'members': Field required" in m for m in skipped), (
        skipped
    )


async def test_offline_embed_jobs_survive_a_restart(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embed jobs with chat jobs in one offline collection: two provider batches (one per
    endpoint, /v1/embeddings for the embed jobs), tracked to the end by a new instance."""
    from consumer.testing.simulator.embeddings import embedding_vector

    settings = settings_from_env(service_env(kafka_bootstrap, partitions=2))
    monkeypatch.setenv("PB_TEST_BATCH_KEY", "k")
    sim = SimulatorConfig(seed=5, batch_delay_s=3.0)
    async with SimulatorServer(sim) as base_url:
        tiers = tier_file_dict(
            base_url + "/v1",
            provider="openai",
            api_key_env="PB_TEST_BATCH_KEY",
            offline={"enabled": True, "poll_s": 0.3, "collect_s": 0.3},
        )
        embeds = [
            {"id": f"emb-{i}", "tier": "small", "kind": "embed", "input": f"text {i}", "mode": "offline",
             "options": {"dimensions": 10}}
            for i in range(12)
        ]
        chats = [job(i, batch=False, mode="offline") for i in range(4)]
        async with InProcessService(settings, tiers):
            await produce(settings, [*embeds, *chats])
            deadline = time.monotonic() + 30
            recorded = 0
            while time.monotonic() < deadline and recorded < 2:
                recorded = len(
                    [
                        v
                        async for _, v in read_topic(
                            settings, settings.batches_topic, from_beginning=True, follow=False
                        )
                        if v is not None
                    ]
                )
                await asyncio.sleep(0.2)
            assert recorded == 2, "one provider batch per endpoint"
        async with InProcessService(settings, tiers):
            outcomes = await wait_for_outcomes(settings, {j["id"] for j in [*embeds, *chats]}, timeout_s=60)
    assert not outcomes.dead, list(outcomes.dead.items())[:2]
    assert outcomes.duplicates() == {}
    for j in embeds:
        (result,) = outcomes.results[j["id"]]
        assert result["embedding"] == embedding_vector(j["input"], "sim-model", 10)
        assert result["output"] is None and result["dimensions"] == 10
    for j in chats:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
