"""Raw records for source tests and benchmarks: produced with their own keys and headers, and
read back whole (partition, offset, key, value, headers), as a company's topic holds them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import client_kwargs
from consumer.settings import Settings

__all__ = ["RawRecord", "produce_records", "read_records", "wait_for_records"]


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as a topic holds it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int = -1
    offset: int = -1
    #: its Kafka timestamp (None: the producer's clock when produced)
    timestamp_ms: int | None = None


async def produce_records(settings: Settings, topic: str, records: Iterable[RawRecord]) -> list[RawRecord]:
    """Produce `records` in order (acks=all, idempotent, the default partitioner for a key);
    returns them with the partition and offset each got."""
    producer = AIOKafkaProducer(acks="all", enable_idempotence=True, linger_ms=5, **client_kwargs(settings))
    await producer.start()
    try:
        pending = []
        for r in records:
            at_ms, headers = r.timestamp_ms, list(r.headers)
            sent = await producer.send(topic, r.value, key=r.key, headers=headers, timestamp_ms=at_ms)
            pending.append((r, sent))
        out = []
        for r, fut in pending:
            meta = await fut
            out.append(RawRecord(r.key, r.value, r.headers, meta.partition, meta.offset, meta.timestamp))
        return out
    finally:
        await producer.stop()


async def read_records(settings: Settings, topic: str) -> list[RawRecord]:
    """Every record of `topic` up to its end now, partition by partition in offset order."""
    partitions = await topic_partitions(settings, topic)
    if not partitions:
        return []
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False, isolation_level="read_committed", **client_kwargs(settings)
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[RawRecord] = []
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    headers = tuple(r.headers)
                    out.append(RawRecord(r.key, r.value, headers, r.partition, r.offset, r.timestamp))
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


async def wait_for_records(
    settings: Settings, topic: str, count: int, *, timeout_s: float = 60.0
) -> Sequence[RawRecord]:
    """The records of `topic` once it holds at least `count` (bounded: what it holds then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = await read_records(settings, topic)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        await asyncio.sleep(0.3)
