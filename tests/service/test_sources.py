"""Sources end to end on the real broker: a topic a company already has, read into a tier and
written back enriched under its own keys (JSON here; the registry formats in
tests/integration/test_sources_registry.py)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from consumer.core.completion import Completion, CompletionRequest
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import InProcessService, service_env, settings_from_env, tier_file_dict
from consumer.testing.records import RawRecord, produce_records, read_records, wait_for_records

PARTITIONS = 4
PROMPT = "Classify the sentiment of this review of ${product.name}.\nREVIEW:\n${review.text}"


def label(text: str) -> str:
    return "positive" if "good" in text else "negative"


def fake_answer(request: CompletionRequest) -> Completion:
    """A packed prompt's items (its last line) each answered by `label`; any other prompt's
    last line likewise."""
    last_line = request.messages[-1].content.rpartition("\n")[2]
    if last_line.startswith("[{"):
        items = orjson.loads(last_line)
        return text_completion(orjson.dumps({i["id"]: label(i["input"]) for i in items}).decode())
    return text_completion(label(last_line))


def source_tiers(source_topic: str, out_topic: str, **source: Any) -> dict[str, Any]:
    tiers = tier_file_dict("http://127.0.0.1:9/v1", max_items=10)
    tiers["sources"] = {
        "reviews": {
            "topic": source_topic,
            "tier": "small",
            "prompt": PROMPT,
            "batch": True,
            "into": {"topic": out_topic, "field": "sentiment"},
            **source,
        }
    }
    return tiers


def partition_of(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a key (murmur2, as Java's)."""
    return int(DefaultPartitioner()(key, list(range(partitions)), list(range(partitions))))


@pytest.fixture
async def source_settings(kafka_bootstrap: str, create_topic: Any, topic_name: str) -> Any:
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=PARTITIONS))
    source_topic = await create_topic(f"{topic_name}-reviews", partitions=PARTITIONS)
    return settings, source_topic, f"{topic_name}-reviews-enriched"


def review(i: int, text: str, product: str = "kettle") -> bytes:
    return orjson.dumps({"id": i, "product": {"name": product}, "review": {"text": text, "stars": i % 5}})


async def test_a_json_topic_is_written_back_enriched_under_its_keys_with_its_headers(
    source_settings: Any,
) -> None:
    settings, source_topic, out_topic = source_settings
    records = [
        RawRecord(
            f"r-{i}".encode(), review(i, "good value" if i % 2 else "broke fast"), (("trace-id", b"t%d" % i),)
        )
        for i in range(40)
    ]
    provider = FakeProvider(fake_answer)
    tiers = source_tiers(source_topic, out_topic)
    async with InProcessService(settings, tiers, providers={"small": provider}):
        produced = await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, len(records), timeout_s=60)
    assert len(enriched) == len(records)
    by_key = {r.key: r for r in enriched}
    assert set(by_key) == {r.key for r in records}
    for original in produced:
        out = by_key[original.key]
        row = orjson.loads(out.value or b"")
        assert row == {**orjson.loads(original.value or b""), "sentiment": label(row["review"]["text"])}
        headers = dict(out.headers)
        assert headers["trace-id"] == dict(original.headers)["trace-id"]
        where = f"{source_topic}/{original.partition}/{original.offset}"
        assert headers["promptbus-source"] == where.encode()
        assert headers["promptbus-tier"] == b"small" and headers["promptbus-attempts"] == b"1"
        assert out.partition == partition_of(original.key or b"", PARTITIONS)
    # batched: the shared prefix (the product's name written into the prompt) let them share requests
    assert len(provider.requests) < len(records)


async def test_tombstones_undecodable_records_and_missing_fields(source_settings: Any) -> None:
    settings, source_topic, out_topic = source_settings
    records = [
        RawRecord(b"ok-1", review(1, "good")),
        RawRecord(b"gone", None),  # a tombstone: the enriched topic forgets the key too
        RawRecord(b"bad-json", b"{not json", (("h", b"v"),)),
        RawRecord(b"no-field", orjson.dumps({"review": {"text": "good"}})),
        RawRecord(b"ok-2", review(2, "bad")),
    ]
    async with InProcessService(
        settings, source_tiers(source_topic, out_topic), providers={"small": FakeProvider(fake_answer)}
    ) as svc:
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, 3, timeout_s=60)
        dead_records = await wait_for_records(settings, settings.dlq_topic, 2, timeout_s=30)
        snapshot = svc.stats_snapshot()
    by_key = {r.key: r for r in enriched}
    assert set(by_key) == {b"ok-1", b"ok-2", b"gone"}
    assert by_key[b"gone"].value is None
    dead = {r.key: r for r in dead_records}
    assert set(dead) == {b"bad-json", b"no-field"}, dead
    bad = orjson.loads(dead[b"bad-json"].value or b"")
    assert bad["error"]["kind"] == "undecodable"
    assert base64.b64decode(bad["raw"]) == b"{not json"
    headers = dict(dead[b"bad-json"].headers)
    assert headers["h"] == b"v" and headers["promptbus-error-kind"] == b"undecodable"
    missing = orjson.loads(dead[b"no-field"].value or b"")
    assert missing["error"]["kind"] == "invalid_job"
    assert "no field 'product.name'" in missing["error"]["message"]
    assert base64.b64decode(missing["raw"]) == records[3].value
    source = snapshot["sources"]["reviews"]
    assert source["records_in"] == 5 and source["enriched"] == 2 and source["tombstones"] == 1
    assert source["dead_letters"] == {"undecodable": 1, "invalid_job": 1}


async def test_per_key_order_holds_when_answers_come_back_out_of_order(source_settings: Any) -> None:
    """Two versions of each key asked at once, the older answered last: the last record of a
    key on the enriched topic is the enrichment of its latest version; the stale ones dropped."""
    settings, source_topic, out_topic = source_settings
    keys = [f"k-{i}".encode() for i in range(6)]

    async def slow_for_old(request: CompletionRequest) -> Completion:
        text = request.messages[-1].content.rpartition("\n")[2]
        await asyncio.sleep(0.6 if "old" in text else 0.0)
        return text_completion(f"answer to {text}")

    tiers = source_tiers(source_topic, out_topic, batch=False)
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(slow_for_old)}) as svc:
        await produce_records(settings, source_topic, [RawRecord(k, review(1, "old")) for k in keys])
        await produce_records(settings, source_topic, [RawRecord(k, review(2, "new")) for k in keys])
        await wait_for_records(settings, out_topic, len(keys), timeout_s=30)
        await asyncio.sleep(1.5)  # the old answers come back after the new ones were written
        snapshot = svc.stats_snapshot()
    latest: dict[bytes | None, Any] = {}
    for r in await read_records(settings, out_topic):
        latest[r.key] = orjson.loads(r.value or b"")
    assert {k: v["review"]["text"] for k, v in latest.items()} == dict.fromkeys(keys, "new")
    assert all(v["sentiment"] == "answer to new" for v in latest.values())
    assert snapshot["sources"]["reviews"]["stale_dropped"] == len(keys)


async def test_an_unchanged_update_is_written_with_the_kept_answer_across_a_restart(
    source_settings: Any,
) -> None:
    """`unchanged: skip`: an update that changed nothing the prompt reads (here: the stars) is
    written with its key's last answer and never asked, also by the next run (the memo is in a
    compacted topic); a changed field is asked; `unchanged: ask` asks every record."""
    settings, source_topic, out_topic = source_settings
    provider = FakeProvider(fake_answer)
    tiers = source_tiers(source_topic, out_topic, batch=False)

    def version(key: str, stars: int, text: str = "good") -> RawRecord:
        value = {"product": {"name": "kettle"}, "review": {"text": text}, "stars": stars}
        return RawRecord(key.encode(), orjson.dumps(value))

    async with InProcessService(settings, tiers, providers={"small": provider}):
        await produce_records(settings, source_topic, [version("a", 1), version("b", 1)])
        await wait_for_records(settings, out_topic, 2, timeout_s=30)
        await produce_records(settings, source_topic, [version("a", 2), version("b", 2, "broke")])
        await wait_for_records(settings, out_topic, 4, timeout_s=30)
    assert len(provider.requests) == 3  # a v1, b v1, b v2 (its text changed); a v2 kept a v1's answer
    async with InProcessService(settings, tiers, providers={"small": provider}) as svc:
        await produce_records(settings, source_topic, [version("a", 3), version("b", 3, "broke")])
        enriched = await wait_for_records(settings, out_topic, 6, timeout_s=30)
        snapshot = svc.stats_snapshot()
    assert len(provider.requests) == 3, "the next run kept both answers too"
    assert snapshot["sources"]["reviews"]["skipped_unchanged"] == 2
    latest = {r.key: orjson.loads(r.value or b"") for r in enriched}
    kept = {"product": {"name": "kettle"}, "review": {"text": "good"}, "stars": 3, "sentiment": "positive"}
    assert latest[b"a"] == kept
    assert latest[b"b"]["sentiment"] == "negative" and latest[b"b"]["stars"] == 3
    headers = {r.key: dict(r.headers) for r in enriched[-2:]}
    assert all(h["promptbus-attempts"] == b"0" for h in headers.values())

    asked = FakeProvider(fake_answer)
    always = source_tiers(source_topic, out_topic, batch=False, unchanged="ask")
    async with InProcessService(settings, always, providers={"small": asked}):
        await produce_records(settings, source_topic, [version("a", 4)])
        await wait_for_records(settings, out_topic, 7, timeout_s=30)
    assert len(asked.requests) == 1


async def test_exactly_once_writes_each_enrichment_in_the_transaction_of_its_offsets(
    kafka_bootstrap: str, create_topic: Any, topic_name: str
) -> None:
    """exactly_once: the enriched records, tombstones and dead letters commit in one transaction
    with the input offsets; a read_committed reader sees each exactly once."""
    env = service_env(kafka_bootstrap, partitions=PARTITIONS, guarantee="exactly_once")
    settings = settings_from_env(env)
    source_topic = await create_topic(f"{topic_name}-reviews", partitions=PARTITIONS)
    out_topic = f"{topic_name}-reviews-enriched"
    records = [RawRecord(f"e-{i}".encode(), review(i, "good" if i % 2 else "bad")) for i in range(30)]
    records += [RawRecord(b"gone", None), RawRecord(b"junk", b"\x00not json")]
    tiers = source_tiers(source_topic, out_topic)
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}):
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, 31, timeout_s=60)
        dead = await wait_for_records(settings, settings.dlq_topic, 1, timeout_s=30)
    assert sorted(r.key or b"" for r in enriched) == sorted(r.key or b"" for r in records[:31])
    assert [r.key for r in dead] == [b"junk"]
