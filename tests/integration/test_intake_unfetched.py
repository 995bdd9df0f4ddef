"""`KafkaIntake.has_unfetched` against a real broker: rule 3 of the batching rules flushes a
window as soon as nothing fetched-but-unrouted could still join it, so the intake must know
when it has read everything — also when the jobs came from a transactional producer, whose
commit marker takes an offset after the last record and is never returned as a record.

Also `KafkaIntake.rejoin` (the exactly_once sink asks for it after a fence): a partition the
sink forgot is assigned again and read from its committed offset; one still owned is kept and
goes on from where it was fetched to, nothing read twice."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import AIOKafkaProducer

from consumer.kafka.intake import InRecord, KafkaIntake
from consumer.kafka.records import TopicPartition
from consumer.testing.harness import service_env, settings_from_env

pytestmark = pytest.mark.integration

RECORDS = 5
#: polls are bounded in count; each waits at most POLL_S
MAX_POLLS = 100
POLL_S = 0.2


class _Handler:
    """Rebalance callbacks the intake calls; kept in order, to be read by the tests."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, set[TopicPartition]]] = []

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        if partitions:  # aiokafka also revokes the empty set before its first join
            self.calls.append(("revoked", partitions))

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        self.calls.append(("lost", partitions))

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        self.calls.append(("assigned", partitions))


async def _read_all(intake: KafkaIntake, expected: int) -> list[InRecord]:
    records: list[InRecord] = []
    for _ in range(MAX_POLLS):
        records += await intake.poll(POLL_S, 500)
        if len(records) >= expected:
            break
    return records


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
async def test_nothing_unfetched_once_every_record_is_read(
    kafka_bootstrap: str, create_topic: Callable[..., Awaitable[str]], topic_name: str, transactional: bool
) -> None:
    await create_topic(topic_name, partitions=1)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        enable_idempotence=True,
        transactional_id=f"t-{uuid.uuid4().hex[:8]}" if transactional else None,
    )
    await producer.start()
    try:
        if transactional:
            async with producer.transaction():
                for i in range(RECORDS):
                    await producer.send(topic_name, f"job {i}".encode())
        else:
            for i in range(RECORDS):
                await producer.send_and_wait(topic_name, f"job {i}".encode())
    finally:
        await producer.stop()

    settings = settings_from_env(service_env(kafka_bootstrap, PROMPTBUS_JOBS_TOPIC=topic_name))
    intake = KafkaIntake(settings, client_id="test-unfetched")
    await intake.start(_Handler())
    try:
        records = await _read_all(intake, RECORDS)
        assert [r.value for r in records] == [f"job {i}".encode() for i in range(RECORDS)]
        # the next poll returns nothing; by then the intake must know it has read everything
        # (the transaction's commit marker is past the last record, and is not one)
        unfetched = True
        for _ in range(MAX_POLLS):
            assert await intake.poll(POLL_S, 500) == []
            unfetched = intake.has_unfetched()
            if not unfetched:
                break
        assert not unfetched, "has_unfetched() stayed true after every record was read"
    finally:
        await intake.stop()


@pytest.mark.parametrize("forgotten", [True, False], ids=["forgotten", "kept"])
async def test_rejoin_reads_a_forgotten_partition_from_its_commit_and_a_kept_one_on(
    kafka_bootstrap: str, create_topic: Callable[..., Awaitable[str]], topic_name: str, forgotten: bool
) -> None:
    """What the exactly_once sink relies on after a fence: the fenced partition (forgotten by
    the sink) is assigned again and read from its committed offset (here 2), not from where
    the intake was. A partition still owned through the same rebalance is kept: read on from
    its fetch position (nothing again), as in any rebalance that leaves it here."""
    await create_topic(topic_name, partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for i in range(RECORDS):
            await producer.send_and_wait(topic_name, f"job {i}".encode())
    finally:
        await producer.stop()
    tp = TopicPartition(topic_name, 0)
    settings = settings_from_env(service_env(kafka_bootstrap, PROMPTBUS_JOBS_TOPIC=topic_name))
    handler = _Handler()
    intake = KafkaIntake(settings, client_id="test-rejoin")
    intake.rejoin()  # before start: nothing to rejoin, and no harm done
    await intake.start(handler)
    try:
        assert len(await _read_all(intake, RECORDS)) == RECORDS
        await intake.commit({tp: 2})
        assert handler.calls == [("assigned", {tp})]

        if forgotten:
            intake.owned.revoke({tp})  # what the sink does to a fenced partition
        intake.rejoin()
        again: list[InRecord] = []
        for _ in range(MAX_POLLS):
            again += await intake.poll(POLL_S, 500)
            if len(handler.calls) == 3 and (not forgotten or len(again) >= RECORDS - 2):
                break
        for _ in range(5):  # after the assignment, a kept partition reads nothing again
            again += await intake.poll(POLL_S, 500)
        assert handler.calls == [("assigned", {tp}), ("revoked", {tp}), ("assigned", {tp})]
        expected = [f"job {i}".encode() for i in range(2, RECORDS)] if forgotten else []
        assert [r.value for r in again] == expected
    finally:
        await intake.stop()
