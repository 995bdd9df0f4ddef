"""Offline mode through the simulator's Batch API, with a service restart while the batch runs,
on the in-memory edges and on the real broker (`make_bus`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from consumer.testing.harness import tier_file_dict
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for
from tests.service.harness import job


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
