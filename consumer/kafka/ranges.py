"""A bounded range of a topic for a group of its own (a source's backfill): the offsets at a
time, a group's committed offsets, and committing a group's first offsets."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from consumer.kafka.admin import with_admin
from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import client_kwargs
from consumer.settings import Settings

__all__ = ["commit_offsets", "committed_offsets", "offsets_at"]


async def offsets_at(settings: Settings, topic: str, time_ms: int | None) -> dict[int, int]:
    """Per partition of `topic`: the offset of its first record at or after `time_ms` (its end
    offset when it has none; None: the end offsets now)."""
    partitions = await topic_partitions(settings, topic)
    if not partitions:
        raise ValueError(f"topic {topic} does not exist")
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **client_kwargs(settings))
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
        if time_ms is None:
            return {tp.partition: ends[tp] for tp in tps}
        found = await consumer.offsets_for_times(dict.fromkeys(tps, time_ms))
        return {tp.partition: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in tps}
    finally:
        await consumer.stop()


async def committed_offsets(settings: Settings, group: str, topic: str) -> dict[int, int]:
    """What `group` committed on `topic`'s partitions (a partition without a commit is absent)."""
    committed = await with_admin(settings, lambda admin: admin.list_consumer_group_offsets(group))
    return {
        tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic and meta.offset >= 0
    }


async def commit_offsets(settings: Settings, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` for `group` (where its members will start), as a member of no generation."""
    consumer = AIOKafkaConsumer(group_id=group, enable_auto_commit=False, **client_kwargs(settings))
    await consumer.start()
    try:
        tps = {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    finally:
        await consumer.stop()
