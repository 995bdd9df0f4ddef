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


M = TypeVar("M")
#: one record to produce, with what its sender tags it with
Tagged = tuple[M, OutRecord]


async def produce_record_batches(
    producer: AIOKafkaProducer,
    items: Sequence[Tagged[M]],
    on_batch: Callable[[asyncio.Future[Any], Sequence[Tagged[M]]], None],
    window: Callable[[], float] | None = None,
) -> list[Tagged[M]]:
    """Hand `items` ((tag, record) pairs) to `producer` as record batches, one per (topic,
    partition), in order.

    A batch carries one delivery future instead of one per record, which costs far less CPU
    per record than producing them one by one (bench/README.md). Records keep the default
    partitioning (murmur2 of the key, `consumer.kafka.partitioning`; keyless ones spread).
    `on_batch(delivered, batch_items)` is called for each batch handed over, with its items;
    whatever was not passed to it was not handed over when this raises. Serves both sinks
    (in exactly_once, inside the partition's transaction).

    window: seconds left in which a batch may still be handed over, asked before each one
    (None: no limit). A batch waits in `send_batch` while the partition's previous one is
    not sent yet (the brokers unreachable): that wait ends with the window, and the batch is
    not handed over then. Returns the items not handed over because the window closed (each
    partition's in order; none without a window).
    """
    by_partition: dict[tuple[str, int], list[Tagged[M]]] = {}
    partitions: dict[str, list[int]] = {}
    for item in items:
        topic, key = item[1].topic, item[1].key
        known = partitions.get(topic)
        if known is None:
            known = partitions[topic] = sorted(await producer.partitions_for(topic))
        place = (topic, partition_for(key, known))
        group = by_partition.get(place)
        if group is None:
            group = by_partition[place] = []
        group.append(item)

    async def hand_over(batch: Any, topic: str, partition: int) -> asyncio.Future[Any] | None:
        if window is None:
            return await producer.send_batch(batch, topic, partition=partition)
        left_s = window()
        if left_s <= 0:
            return None
        try:
            # the batch is queued in the producer at once or not at all: cancelled, the wait
            # for the previous batch ends without it
            return await asyncio.wait_for(producer.send_batch(batch, topic, partition=partition), left_s)
        except TimeoutError:
            return None

    groups = list(by_partition.items())
    for n, ((topic, partition), group) in enumerate(groups):
        batch, first = producer.create_batch(), 0
        for i, (_, record) in enumerate(group):
            # aiokafka's record builder takes headers as a list only
            headers = list(record.headers)
            if batch.append(key=record.key, value=record.value, timestamp=None, headers=headers) is None:
                delivered = await hand_over(batch, topic, partition)
                if delivered is None:
                    return _left_over(group[first:], groups[n + 1 :])
                on_batch(delivered, group[first:i])
                batch, first = producer.create_batch(), i
                # a fresh batch always takes its first record
                batch.append(key=record.key, value=record.value, timestamp=None, headers=headers)
        delivered = await hand_over(batch, topic, partition)
        if delivered is None:
            return _left_over(group[first:], groups[n + 1 :])
        on_batch(delivered, group[first:])
    return []


def _left_over(
    rest: Sequence[Tagged[M]], later: Sequence[tuple[tuple[str, int], list[Tagged[M]]]]
) -> list[Tagged[M]]:
    return [*rest, *(item for _place, group in later for item in group)]
