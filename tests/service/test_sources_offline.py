"""Sources in offline and auto mode on the real broker, through the simulator's Batch API: the
enriched records are written from the batches topic's record alone, by whichever instance
collects the provider batch, once per record; the input offsets commit once the batch record
is durable."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from consumer.kafka.clients import read_topic
from consumer.settings import Settings
from consumer.testing.harness import InProcessService, service_env, settings_from_env, tier_file_dict
from consumer.testing.records import RawRecord, produce_records, read_records, wait_for_records
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

PARTITIONS = 2
PROMPT = "Label this review of a ${product.name}:\n${review.text}"


def review(i: int, text: str) -> bytes:
    return orjson.dumps({"id": i, "product": {"name": "kettle"}, "review": {"text": text}})


def offline_tiers(base_url: str, sources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tiers = tier_file_dict(
        base_url + "/v1",
        provider="openai",
        api_key_env="PB_TEST_BATCH_KEY",
        offline={"enabled": True, "poll_s": 0.3, "collect_s": 0.3},
    )
    tiers["sources"] = {
        name: {"tier": "small", "prompt": PROMPT, "unchanged": "ask", **source}
        for name, source in sources.items()
    }
    return tiers


@pytest.fixture
async def offline_settings(
    kafka_bootstrap: str, create_topic: Any, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, str, str]:
    monkeypatch.setenv("PB_TEST_BATCH_KEY", "k")
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=PARTITIONS))
    source_topic = await create_topic(f"{topic_name}-reviews", partitions=PARTITIONS)
    return settings, source_topic, f"{topic_name}-reviews-enriched"


async def committed(settings: Settings, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of `topic` (-1: none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.group_id)
    finally:
        await admin.close()
    return {
        p: (meta.offset if (meta := offsets.get(TopicPartition(topic, p))) is not None else -1)
        for p in range(PARTITIONS)
    }


async def recorded_batches(settings: Settings) -> list[dict[str, Any]]:
    return [
        orjson.loads(v)
        async for _, v in read_topic(settings, settings.batches_topic, from_beginning=True, follow=False)
        if v is not None
    ]


def check_enriched(produced: list[RawRecord], enriched: list[RawRecord], source_topic: str) -> None:
    """One enriched record per input: its key, its value plus the answer, its headers."""
    assert sorted(r.key or b"" for r in enriched) == sorted(r.key or b"" for r in produced), "once per record"
    by_key = {r.key: r for r in enriched}
    for original in produced:
        out = by_key[original.key]
        row = orjson.loads(out.value or b"")
        value = orjson.loads(original.value or b"")
        assert row == {**value, "sentiment": answer_for(value["review"]["text"])}
        headers = dict(out.headers)
        assert headers["trace-id"] == dict(original.headers)["trace-id"]
        assert (
            headers["promptbus-source"] == f"{source_topic}/{original.partition}/{original.offset}".encode()
        )
        assert headers["promptbus-tier"] == b"small" and headers["promptbus-attempts"] == b"1"


async def test_an_offline_source_is_written_back_from_its_provider_batch(offline_settings: Any) -> None:
    settings, source_topic, out_topic = offline_settings
    records = [
        RawRecord(f"r-{i}".encode(), review(i, f"review {i}"), (("trace-id", b"t%d" % i),)) for i in range(12)
    ]
    async with SimulatorServer(SimulatorConfig(seed=1, batch_delay_s=1.0)) as base_url:
        tiers = offline_tiers(
            base_url,
            {
                "reviews": {
                    "topic": source_topic,
                    "mode": "offline",
                    "into": {"topic": out_topic, "field": "sentiment"},
                }
            },
        )
        async with InProcessService(settings, tiers) as svc:
            produced = await produce_records(settings, source_topic, records)
            enriched = await wait_for_records(settings, out_topic, len(records), timeout_s=60)
            await asyncio.sleep(1.0)  # nothing more comes: once per record
            enriched = await read_records(settings, out_topic)
            snapshot = svc.stats_snapshot()
    check_enriched(produced, list(enriched), source_topic)
    (batch,) = await recorded_batches(settings)  # its tombstone follows it: compaction drops both
    assert {m["origin"]["source"] for m in batch["members"]} == {"reviews"}
    ends = {p: 0 for p in range(PARTITIONS)}
    for r in produced:
        ends[r.partition] = max(ends[r.partition], r.offset + 1)
    assert await committed(settings, source_topic) == ends
    assert snapshot["sources"]["reviews"]["enriched"] == len(records)


async def test_another_instance_collects_the_batch_and_writes_the_enriched_records(
    offline_settings: Any,
) -> None:
    """The instance that submitted the batch stops before it ends; the next one, a new process
    state with nothing of the first in memory, collects it from the batches topic."""
    settings, source_topic, out_topic = offline_settings
    records = [
        RawRecord(f"k-{i}".encode(), review(i, f"text {i}"), (("trace-id", b"x%d" % i),)) for i in range(10)
    ]
    async with SimulatorServer(SimulatorConfig(seed=2, batch_delay_s=4.0)) as base_url:
        tiers = offline_tiers(
            base_url,
            {
                "reviews": {
                    "topic": source_topic,
                    "mode": "offline",
                    "into": {"topic": out_topic, "field": "sentiment"},
                }
            },
        )
        async with InProcessService(settings, tiers):
            produced = await produce_records(settings, source_topic, records)
            deadline = time.monotonic() + 30
            recorded: list[dict[str, Any]] = []
            while time.monotonic() < deadline and not recorded:
                recorded = await recorded_batches(settings)
                await asyncio.sleep(0.2)
            assert recorded, "the batch was recorded"
        assert await read_records(settings, out_topic) == [], "stopped before the batch ended"
        # the first instance committed the input offsets once the batch record was durable
        first_commits = await committed(settings, source_topic)
        assert sum(o for o in first_commits.values() if o > 0) == len(records)
        async with InProcessService(settings, tiers) as svc:
            enriched = await wait_for_records(settings, out_topic, len(records), timeout_s=60)
            await asyncio.sleep(1.0)
            enriched = await read_records(settings, out_topic)
            snapshot = svc.stats_snapshot()
    check_enriched(produced, list(enriched), source_topic)
    assert snapshot["sources"]["reviews"]["records_in"] == 0, "the second instance read no input record"
    assert snapshot["sources"]["reviews"]["enriched"] == len(records)


async def test_auto_sends_a_source_with_a_short_deadline_online_and_one_without_offline(
    offline_settings: Any, create_topic: Any, topic_name: str
) -> None:
    settings, soon_topic, soon_out = offline_settings
    later_topic = await create_topic(f"{topic_name}-later", partitions=PARTITIONS)
    later_out = f"{topic_name}-later-enriched"
    soon = [RawRecord(f"s-{i}".encode(), review(i, f"soon {i}"), (("trace-id", b"s"),)) for i in range(5)]
    later = [RawRecord(f"l-{i}".encode(), review(i, f"later {i}"), (("trace-id", b"l"),)) for i in range(5)]
    async with SimulatorServer(SimulatorConfig(seed=3, batch_delay_s=1.0)) as base_url:
        tiers = offline_tiers(
            base_url,
            {
                # 10 minutes leave less than the completion window (24h) plus the margin: online
                "soon": {
                    "topic": soon_topic,
                    "mode": "auto",
                    "deadline_s": 600,
                    "into": {"topic": soon_out, "field": "sentiment"},
                },
                # no deadline: it can wait, so auto goes offline (here through the tier's default_mode)
                "later": {"topic": later_topic, "into": {"topic": later_out, "field": "sentiment"}},
            },
        )
        tiers["tiers"]["small"]["default_mode"] = "auto"
        async with InProcessService(settings, tiers) as svc:
            produced_soon = await produce_records(settings, soon_topic, soon)
            produced_later = await produce_records(settings, later_topic, later)
            enriched_soon = await wait_for_records(settings, soon_out, len(soon), timeout_s=60)
            enriched_later = await wait_for_records(settings, later_out, len(later), timeout_s=60)
            await asyncio.sleep(1.0)
            enriched_soon = await read_records(settings, soon_out)
            enriched_later = await read_records(settings, later_out)
            stats = svc.stats_snapshot()["tiers"]["small"]
    check_enriched(produced_soon, list(enriched_soon), soon_topic)
    check_enriched(produced_later, list(enriched_later), later_topic)
    assert stats["auto_online"] == len(soon) and stats["auto_offline"] == len(later)
    members = [m["origin"]["source"] for b in await recorded_batches(settings) for m in b["members"]]
    assert set(members) <= {"later"}
