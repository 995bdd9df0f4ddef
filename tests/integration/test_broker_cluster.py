"""Failover on the 3-node local cluster: what the broker acknowledged survives a SIGKILL.

A producer with ``acks=all`` keeps writing while the partition leader is killed with
SIGKILL; with replication factor 3 and ``min.insync.replicas=2`` every acknowledged record
must still be readable from the new leader. The killed node then restarts on its data dir
and rejoins the in-sync replicas. Right after the kill, while the metadata still names the
dead node, the admin reads a service makes at start go on too (they pick a broker at random).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer.kafka.clients import topic_partitions
from consumer.testing.cluster import LocalKafka
from consumer.testing.harness import service_env, settings_from_env

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

log = logging.getLogger(__name__)

ACKED_BEFORE_KILL = 2_000
# acks for records sent after the kill: proof that a new leader took over the writes
ACKED_AFTER_KILL = 3_000
SEND_CHUNK = 100
# bounds of the write loop: whichever comes first ends it
MAX_SENDS = 60_000
MAX_WRITE_S = 180.0
MAX_POLLS = 600
POLL_MS = 500
STATE_POLLS = 240
STATE_POLL_S = 0.5
#: topic reads made right after the kill; each sends its request to a random broker of the
#: three, so without retries all of them reaching a live one by chance is (2/3)^16, 0.15%
READS_AFTER_KILL = 16


async def _wait_for_isr(cluster: LocalKafka, topic: str, size: int) -> list[int]:
    """Poll the partition's ISR (bounded) until it has ``size`` members; returns the last ISR seen."""
    isr: list[int] = []
    for _ in range(STATE_POLLS):
        isr = await cluster.isr_of(topic, 0)
        if len(isr) >= size:
            break
        await asyncio.sleep(STATE_POLL_S)
    return isr


async def _wait_for_leader(cluster: LocalKafka, topic: str) -> int:
    """Poll the partition's leader (bounded) until the metadata names one; -1 if it never does
    (the broker answering may learn of an election after the writers already use it)."""
    leader = -1
    for _ in range(STATE_POLLS):
        leader = await cluster.leader_of(topic, 0)
        if leader != -1:
            break
        await asyncio.sleep(STATE_POLL_S)
    return leader


async def test_acked_records_survive_leader_sigkill(kafka_cluster: LocalKafka, topic_name: str) -> None:
    await kafka_cluster.create_topic(topic_name, partitions=1, rf=3)
    assert await _wait_for_isr(kafka_cluster, topic_name, 3) == [1, 2, 3]
    leader = await _wait_for_leader(kafka_cluster, topic_name)
    assert leader in (1, 2, 3)

    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_cluster.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        retry_backoff_ms=100,
    )
    acked: set[int] = set()
    acked_after_kill = 0
    failed = 0
    acked_when_killed = -1
    killed = asyncio.Event()
    settings = settings_from_env(service_env(kafka_cluster.bootstrap))
    partitions_read: list[list[int]] = []

    async def write() -> None:
        """Write in chunks, not waiting for the kill: it lands while sends are in flight."""
        nonlocal failed, acked_after_kill
        sent = 0
        deadline = time.monotonic() + MAX_WRITE_S
        while (
            (not killed.is_set() or acked_after_kill < ACKED_AFTER_KILL)
            and sent < MAX_SENDS
            and time.monotonic() < deadline
        ):
            after_kill = killed.is_set()
            values = range(sent, sent + SEND_CHUNK)
            futures = [await producer.send(topic_name, value=str(v).encode()) for v in values]
            sent += SEND_CHUNK
            results = await asyncio.gather(*futures, return_exceptions=True)
            for v, result in zip(values, results, strict=True):
                if isinstance(result, BaseException):
                    failed += 1  # not acknowledged: no promise was made for this record
                else:
                    acked.add(v)
                    acked_after_kill += after_kill

    async def kill_leader_mid_write() -> None:
        nonlocal acked_when_killed
        for _ in range(int(MAX_WRITE_S / 0.05)):
            if len(acked) >= ACKED_BEFORE_KILL:
                break
            await asyncio.sleep(0.05)
        acked_when_killed = len(acked)
        await asyncio.to_thread(kafka_cluster.kill, leader)
        killed.set()
        for _ in range(READS_AFTER_KILL):
            partitions_read.append(await topic_partitions(settings, topic_name))

    await producer.start()
    try:
        await asyncio.gather(write(), kill_leader_mid_write())
    finally:
        await producer.stop()

    log.info(
        "killed node %d after %d acks; %d acked in all, %d of them sent after the kill; %d sends failed",
        leader,
        acked_when_killed,
        len(acked),
        acked_after_kill,
        failed,
    )
    try:
        assert killed.is_set()
        assert acked_when_killed >= ACKED_BEFORE_KILL
        assert partitions_read == [[0]] * READS_AFTER_KILL
        # writes went on being acknowledged after the leader died: a new leader took over
        assert acked_after_kill >= ACKED_AFTER_KILL, f"{acked_after_kill} acked after kill ({failed} failed)"
        new_leader = await _wait_for_leader(kafka_cluster, topic_name)
        assert new_leader not in (leader, -1)

        read = await _read_everything(kafka_cluster.bootstrap, topic_name)
        missing = acked - read
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:10]}"
    finally:
        # the cluster outlives this test: always bring the node back
        await asyncio.to_thread(kafka_cluster.restart, leader)

    assert await _wait_for_isr(kafka_cluster, topic_name, 3) == [1, 2, 3]


async def _read_everything(bootstrap: str, topic: str) -> set[int]:
    """Every value in partition 0 of ``topic`` up to its log end (bounded polling)."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: set[int] = set()
        for _ in range(MAX_POLLS):
            if await consumer.position(tp) >= end:
                break
            for batch in (await consumer.getmany(tp, timeout_ms=POLL_MS)).values():
                values.update(int(r.value) for r in batch if r.value is not None)
        assert await consumer.position(tp) >= end, "did not reach the end of the partition"
        return values
    finally:
        await consumer.stop()

