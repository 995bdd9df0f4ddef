"""Offline jobs of a tier with deployments, through two simulators' Batch APIs: each provider
batch goes to one deployment (under `offline.max_enqueued_tokens`, the one with the most
room), its batches-topic record names it, and a restarted service reads each batch back from
where it went; a record that names no deployment is read from the tier's own keys."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from consumer.testing.harness import job, tier_file_dict
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for


async def _recorded(bus: Any, count: int) -> list[dict[str, Any]]:
    """The batches topic's records once it holds `count` (bounded)."""
    deadline = time.monotonic() + 30
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        records = [orjson.loads(v) for _, v in await bus.read(bus.settings.batches_topic) if v is not None]
        if len(records) >= count:
            break
        await asyncio.sleep(0.2)
    return records


async def test_each_batch_goes_to_one_deployment_and_is_read_back_from_it_after_a_restart(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=2)
    os.environ["PB_TEST_BATCH_KEY"] = "k"
    slow = SimulatorConfig(seed=4, batch_delay_s=3.0)
    try:
        async with SimulatorServer(slow) as east, SimulatorServer(slow) as west:
            tiers = tier_file_dict(
                east + "/v1",
                provider="openai",
                api_key_env="PB_TEST_BATCH_KEY",
                offline={"enabled": True, "poll_s": 0.3, "collect_s": 0.3, "max_items": 10},
            )
            tiers["tiers"]["small"]["deployments"] = [
                {"name": "east", "base_url": east + "/v1"},
                {"name": "west", "base_url": west + "/v1", "model": "sim-west"},
            ]
            jobs = [job(i, batch=False, mode="offline") for i in range(40)]
            async with bus.service(tiers):
                await bus.produce(jobs)
                records = await _recorded(bus, 4)
            # the batches still run at the providers; a new instance resumes tracking each
            async with bus.service(tiers):
                outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    finally:
        del os.environ["PB_TEST_BATCH_KEY"]
    assert {r["deployment"] for r in records} == {"east", "west"}, [r.get("deployment") for r in records]
    assert sum(len(r["members"]) for r in records) == len(jobs)
    assert outcomes.ids() == {j["id"] for j in jobs} and not outcomes.dead
    went = {m["job"]["id"]: r["deployment"] for r in records for m in r["members"]}
    for j in jobs:
        result = outcomes.results[j["id"]][0]
        assert result["output"] == answer_for(j["variables"]["text"])
        assert result["deployment"] == went[j["id"]], "the result names where its batch went"
