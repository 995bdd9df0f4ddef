"""The broker guarantees promptbus builds on, proven against a real Kafka broker.

* an idempotent ``acks=all`` producer, and a consumer group that resumes exactly at its
  committed offsets after a restart (the at-least-once path);
* a transactional producer whose committed transaction also commits consumer offsets and
  whose aborted transaction stays invisible to ``read_committed`` readers (exactly-once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

pytestmark = pytest.mark.integration

FIRST_BATCH = 10_000
SECOND_BATCH = 500
PARTITIONS = 3
# polls are bounded in count, not time: each getmany waits at most POLL_MS
MAX_POLLS = 600
POLL_MS = 500

CreateTopic = Callable[..., Awaitable[str]]


async def _produce(producer: AIOKafkaProducer, topic: str, values: range) -> None:
    """Send every value without waiting for each ack, then wait for all acks."""
    futures = [
        await producer.send(topic, key=str(v).encode(), value=str(v).encode()) for v in values
    ]
    await asyncio.gather(*futures)


async def _consume(consumer: AIOKafkaConsumer, expected: int) -> list[ConsumerRecord[bytes, bytes]]:
    """Poll until ``expected`` records arrived (or the poll budget is spent), then drain once more
    so that records beyond the expected ones would be seen too."""
    records: list[ConsumerRecord[bytes, bytes]] = []
    for _ in range(MAX_POLLS):
        batches = await consumer.getmany(timeout_ms=POLL_MS)
        for batch in batches.values():
            records.extend(batch)
        if len(records) >= expected:
            break
    for batch in (await consumer.getmany(timeout_ms=POLL_MS)).values():
        records.extend(batch)
    return records


def _group_consumer(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )


async def test_group_resumes_exactly_at_committed_offsets(
    kafka_bootstrap: str, topic_name: str, create_topic: CreateTopic
) -> None:
    await create_topic(topic_name, partitions=PARTITIONS)
    group = f"g-{topic_name}"
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all", linger_ms=5
    )
    await producer.start()
    try:
        await _produce(producer, topic_name, range(FIRST_BATCH))

        # Step 1: a group member reads everything and commits where it stopped.
        first = _group_consumer(kafka_bootstrap, topic_name, group)
        await first.start()
        try:
            records = await _consume(first, FIRST_BATCH)
            values = [int(r.value) for r in records if r.value is not None]
            assert len(values) == FIRST_BATCH  # idempotent producer: no duplicates
            assert set(values) == set(range(FIRST_BATCH))
            await first.commit()
            partitions = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]
            committed = {tp: await first.committed(tp) for tp in partitions}
            end_offsets = await first.end_offsets(partitions)
        finally:
            await first.stop()
        assert committed == end_offsets
        assert sum(o for o in committed.values() if o is not None) == FIRST_BATCH

        # Step 2: more work arrives while no member runs.
        await _produce(producer, topic_name, range(FIRST_BATCH, FIRST_BATCH + SECOND_BATCH))
    finally:
        await producer.stop()

    # Step 3: a new member of the same group starts at the committed offsets, not earliest.
    second = _group_consumer(kafka_bootstrap, topic_name, group)
    await second.start()
    try:
        records = await _consume(second, SECOND_BATCH)
    finally:
        await second.stop()
    first_offset: dict[TopicPartition, int] = {}
    for r in records:
        first_offset.setdefault(TopicPartition(r.topic, r.partition), r.offset)
    # every partition got new records, and each was first seen exactly at its committed offset
    assert first_offset == committed
    values = [int(r.value) for r in records if r.value is not None]
    assert sorted(values) == list(range(FIRST_BATCH, FIRST_BATCH + SECOND_BATCH))


async def _read_all(bootstrap: str, topic: str, isolation_level: str) -> list[bytes]:
    """Every value in partition 0 of ``topic`` up to its current log end, as one isolation level sees it."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        # With read_committed, end_offsets is the last stable offset; after the abort marker
        # is written that is the log end, so reading up to it reads every record that exists.
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        for _ in range(MAX_POLLS):
            if await consumer.position(tp) >= end:
                break
            for batch in (await consumer.getmany(tp, timeout_ms=POLL_MS)).values():
                values.extend(r.value for r in batch if r.value is not None)
        assert await consumer.position(tp) >= end, "did not reach the end of the partition"
        return values
    finally:
        await consumer.stop()


async def test_transactions_commit_offsets_and_hide_aborted_records(
    kafka_bootstrap: str, topic_name: str, create_topic: CreateTopic
) -> None:
    input_topic = await create_topic(f"{topic_name}-in")
    output_topic = await create_topic(f"{topic_name}-out")
    group = f"g-{topic_name}"
    input_tp = TopicPartition(input_topic, 0)

    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await plain.start()
    try:
        await _produce(plain, input_topic, range(5))
    finally:
        await plain.stop()

    consumer = _group_consumer(kafka_bootstrap, input_topic, group)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{topic_name}")
    await consumer.start()
    await producer.start()
    try:
        inputs = await _consume(consumer, 5)
        assert [int(r.value) for r in inputs if r.value is not None] == list(range(5))
        next_offset = inputs[-1].offset + 1

        # Committed transaction: outputs and the input offsets become visible together.
        async with producer.transaction():
            for i in range(3):
                await producer.send(output_topic, value=f"committed-{i}".encode())
            await producer.send_offsets_to_transaction({input_tp: next_offset}, group)

        # Aborted transaction: wait for the broker to ack the records (so they really are in
        # the log), then abort.
        await producer.begin_transaction()
        futures = [await producer.send(output_topic, value=f"aborted-{i}".encode()) for i in range(3)]
        await asyncio.gather(*futures)
        await producer.abort_transaction()

        assert await consumer.committed(input_tp) == next_offset
    finally:
        await producer.stop()
        await consumer.stop()

    committed_view = await _read_all(kafka_bootstrap, output_topic, "read_committed")
    assert committed_view == [f"committed-{i}".encode() for i in range(3)]
    uncommitted_view = await _read_all(kafka_bootstrap, output_topic, "read_uncommitted")
    assert sorted(uncommitted_view) == sorted(
        [f"committed-{i}".encode() for i in range(3)] + [f"aborted-{i}".encode() for i in range(3)]
    )
