"""Kafka clients the CLI uses: submit jobs, read results/dead letters, read stats snapshots."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from consumer.kafka.admin import with_admin
from consumer.kafka.connection import (
    MAX_MESSAGE_BYTES,
    TOPIC_AUTHORIZATION_FAILED,
    client_kwargs,
    topic_refused,
)
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings

log = logging.getLogger(__name__)


def job_producer(settings: Settings) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        acks="all",
        enable_idempotence=True,
        linger_ms=10,
        max_request_size=MAX_MESSAGE_BYTES,
        **client_kwargs(settings),
    )


async def submit_jobs(
    settings: Settings,
    jobs: Iterable[bytes],
    *,
    progress: Any = None,
    key_of: Any = None,
    headers: Sequence[tuple[str, bytes]] = (),
) -> int:
    """Produce job records (key: the job id; `headers` on each) and wait until all are
    acknowledged; return the count."""
    producer = job_producer(settings)
    await producer.start()
    sent = 0
    try:
        pending: list[asyncio.Future[Any]] = []
        for value in jobs:
            key = key_of(value) if key_of else None
            pending.append(await producer.send(settings.jobs_topic, value, key=key, headers=list(headers)))
            sent += 1
            if len(pending) >= 1000:
                await asyncio.gather(*pending)
                pending.clear()
                if progress:
                    progress(sent)
        await asyncio.gather(*pending)
        if progress:
            progress(sent)
    finally:
        await producer.stop()
    return sent


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """Partition ids of a topic (empty when it does not exist); ConfigError when the broker's
    ACLs refuse the user the topic (a reader would otherwise wait on it, reading nothing)."""
    described = await with_admin(settings, lambda admin: admin.describe_topics([topic]))
    for t in described:
        if t.get("topic") != topic:
            continue
        if t.get("error_code") == TOPIC_AUTHORIZATION_FAILED:
            raise topic_refused(settings.kafka, topic)
        if not t.get("error_code"):
            return sorted(p["partition"] for p in t.get("partitions", []))
    return []


def committed_reader(settings: Settings) -> AIOKafkaConsumer:
    """A consumer in no group that reads committed records only and never commits (the caller
    assigns its partitions)."""
    return AIOKafkaConsumer(
        isolation_level="read_committed",
        enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        **client_kwargs(settings),
    )


async def read_topic(
    settings: Settings, topic: str, *, from_beginning: bool, follow: bool, idle_stop_s: float = 1.0
) -> AsyncIterator[tuple[bytes | None, bytes | None]]:
    """Yield (key, value) of a topic, read_committed, without joining a consumer group.

    Without `follow`, stop at the end offsets seen at start.
    """
    partitions = await topic_partitions(settings, topic)
    if not partitions:
        # a topic not made yet holds nothing; and a consumer stopped straight after its start
        # has aiokafka's coordinator raise CancelledError from its clean-up
        return
    consumer = committed_reader(settings)
    try:
        await consumer.start()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        end = await consumer.end_offsets(tps)
        while True:
            if not follow:
                # checked before waiting: an empty topic returns at once
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= end[tp] for tp in tps):
                    return
            batch = await consumer.getmany(timeout_ms=int(idle_stop_s * 1000))
            for _, records in batch.items():
                for r in records:
                    yield r.key, r.value
    finally:
        await consumer.stop()


async def read_latest(settings: Settings, topic: str) -> dict[bytes, bytes]:
    """The latest record value of every key of a compacted topic (a tombstone removes its key)."""
    latest: dict[bytes, bytes] = {}
    async for key, value in read_topic(settings, topic, from_beginning=True, follow=False):
        if key is None:
            continue
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = value
    return latest


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A consumer group's lag as the broker sees it: per (topic, partition), log end offset
    minus the group's committed offset (a partition it never committed counts from its
    first offset)."""

    per_partition: dict[tuple[str, int], int]
    #: the group committed an offset on some partition (it has read, or reads, something)
    committed: bool = False

    @property
    def records(self) -> int:
        return sum(self.per_partition.values())


async def group_lag(settings: Settings, group: str, topics: Sequence[str]) -> GroupLag:
    """The lag of `group` over every partition of `topics` and of the topics it committed on.

    Read from the broker (committed offsets and log ends), so it holds whether or not an
    instance is running; topics that do not exist are left out."""
    committed = await with_admin(settings, lambda admin: admin.list_consumer_group_offsets(group))
    partitions = [
        TopicPartition(topic, p)
        for topic in dict.fromkeys([*topics, *(tp.topic for tp in committed)])
        for p in await topic_partitions(settings, topic)
    ]
    if not partitions:
        return GroupLag({}, committed=bool(committed))
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **client_kwargs(settings))
    try:
        await consumer.start()
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        firsts = await consumer.beginning_offsets(partitions)
    finally:
        await consumer.stop()
    lag = {}
    for tp in partitions:
        meta = committed.get(tp)
        start = meta.offset if meta is not None and meta.offset >= 0 else firsts[tp]
        lag[(tp.topic, tp.partition)] = max(0, ends[tp] - start)
    return GroupLag(lag, committed=bool(committed))
