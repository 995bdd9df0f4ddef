"""The consumer-lag gauges against the broker's own numbers (the real broker and the in-memory
fake, the same test): while the provider is held, lag per partition equals the records
produced minus the group's committed offset, and the oldest uncommitted record ages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as KafkaTP

from consumer.core.completion import CompletionRequest
from consumer.kafka.clients import group_lag
from consumer.providers.fake import FakeProvider, text_completion
from consumer.runtime.lag import LAG_REFRESH_S
from consumer.testing.harness import job, tier_file_dict

PARTITIONS = 2


async def _end_offsets(bus: Any) -> dict[int, int]:
    topic = bus.settings.jobs_topic
    if bus.name == "memory":
        return {p: len(bus.broker.topic(topic)[p]) for p in range(PARTITIONS)}
    consumer = AIOKafkaConsumer(bootstrap_servers=bus.settings.kafka_bootstrap_servers)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([KafkaTP(topic, p) for p in range(PARTITIONS)])
    finally:
        await consumer.stop()
    return {tp.partition: off for tp, off in ends.items()}


async def _broker_lag(bus: Any) -> dict[int, int]:
    ends = await _end_offsets(bus)
    out = {}
    for p, end in ends.items():
        committed = await bus.committed(p)
        out[p] = end - max(0, committed)
    return out


async def test_lag_equals_produced_minus_committed_while_the_provider_is_held(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=PARTITIONS)
    open_gate = asyncio.Event()
    open_gate.set()

    async def answer(request: CompletionRequest) -> Any:
        await open_gate.wait()
        return text_completion("positive")

    provider = FakeProvider(answer, name="small")
    first = [job(i, batch=False) for i in range(6)]
    held = [job(i, batch=False) for i in range(6, 16)]
    tiers = tier_file_dict("http://unused/v1", batching=False)
    async with bus.service(tiers, providers={"small": provider}) as svc:
        await bus.produce(first)
        await bus.wait_for_outcomes({j["id"] for j in first}, timeout_s=30)
        deadline = time.monotonic() + 30
        while sum((await _broker_lag(bus)).values()) != 0:  # the first jobs' offsets commit
            assert time.monotonic() < deadline, "the first jobs' offsets never committed"
            await asyncio.sleep(0.2)
        open_gate.clear()
        await bus.produce(held)
        expected = await _broker_lag(bus)
        assert sum(expected.values()) == len(held), "held jobs stay uncommitted"
        topic = bus.settings.jobs_topic
        if bus.name == "kafka":  # what `promptbus stats` shows: the broker's figure for the group
            group = await group_lag(bus.settings, bus.settings.group_id, [topic])
            assert {p: n for (_, p), n in group.per_partition.items()} == expected
            assert group.records == len(held)
        deadline = time.monotonic() + 4 * LAG_REFRESH_S
        seen: dict[int, int] = {}
        while time.monotonic() < deadline:
            lag = svc.stats.lag
            seen = {p: v.records for (t, p), v in lag.items() if t == topic}
            if seen == expected and all(v.oldest_age_s > 0 for v in lag.values() if v.records):
                break
            await asyncio.sleep(0.2)
        assert seen == expected, f"lag gauges {seen}, broker says {expected}"
        assert all(v.oldest_age_s > 0 for v in svc.stats.lag.values() if v.records), "held jobs age"
        assert await _broker_lag(bus) == expected, "nothing committed meanwhile"
        open_gate.set()
        await bus.wait_for_outcomes({j["id"] for j in first + held}, timeout_s=30)
