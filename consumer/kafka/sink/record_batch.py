"""Producing in Kafka record batches: the sinks' producers (acks=all, idempotent, large
batches) and `produce_record_batches`, which hands records over one batch per partition."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaProducer

from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.partitioning import partition_for
from consumer.kafka.records import OutRecord
from consumer.settings import Settings

#: producer batch size per partition (aiokafka default 16 KiB)
PRODUCER_BATCH_BYTES = 256 * 1024


class ProducerFactory(Protocol):
    def __call__(self, *, transactional_id: str | None) -> AIOKafkaProducer: ...


def kafka_producer_factory(settings: Settings, client_id: str) -> ProducerFactory:
    """Producers with acks=all and idempotence; transactional when given a transactional_id."""

    def make(*, transactional_id: str | None) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            transactional_id=transactional_id,
            transaction_timeout_ms=round(settings.transaction_timeout_s * 1000),
            linger_ms=5,
            # results are small and many, and a partition's next batch waits until the one
            # before it is sent: batches well above aiokafka's default mean fewer such waits
            # (bench/pipeline_bench.py measures it)
            max_batch_size=PRODUCER_BATCH_BYTES,
            max_request_size=MAX_MESSAGE_BYTES,
            **client_kwargs(settings),
        )

    return make


def _append(batch: Any, record: OutRecord) -> Any:
    """Add `record` to an aiokafka BatchBuilder; None when the batch is full."""
    return batch.append(key=record.key, value=record.value, timestamp=None, headers=list(record.headers))


M = TypeVar("M")


async def produce_record_batches(
    producer: AIOKafkaProducer,
    items: Sequence[tuple[M, OutRecord]],
    on_batch: Callable[[asyncio.Future[Any], list[M]], None],
) -> None:
    """Hand `items` to `producer` as record batches, one per (topic, partition), in order.

    A batch carries one delivery future instead of one per record, which costs far less CPU
    per record than producing them one by one (bench/README.md). Records keep the default
    partitioning (murmur2 of the key, `consumer.kafka.partitioning`; keyless ones spread).
    `on_batch(delivered, members)` is called for each batch handed over, with the tags of its
    records (one per record); whatever was not passed to it was not handed over when this
    raises. Serves both sinks (in exactly_once, inside the partition's transaction).
    """
    by_partition: dict[tuple[str, int], list[tuple[M, OutRecord]]] = {}
    partitions: dict[str, list[int]] = {}
    for member, record in items:
        known = partitions.get(record.topic)
        if known is None:
            known = partitions[record.topic] = sorted(await producer.partitions_for(record.topic))
        by_partition.setdefault((record.topic, partition_for(record.key, known)), []).append((member, record))
    for (topic, partition), group in by_partition.items():
        batch = producer.create_batch()
        members: list[M] = []
        for member, record in group:
            if _append(batch, record) is None:
                on_batch(await producer.send_batch(batch, topic, partition=partition), members)
                batch, members = producer.create_batch(), []
                _append(batch, record)  # a fresh batch always takes its first record
            members.append(member)
        on_batch(await producer.send_batch(batch, topic, partition=partition), members)
