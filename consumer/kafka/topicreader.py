"""A topic that one member of a consumer group reads at a time, from its beginning on every
assignment. `TopicReader` is the Protocol; `KafkaTopicReader` wraps aiokafka, and
`consumer.testing.memory.MemoryTopicReader` is the in-memory one.

The offline `BatchTracker` reads the compacted batches topic this way: the group makes
exactly one instance the tracker, and a new owner rebuilds what is open from the whole topic.
The reader commits nothing: every assignment starts from the beginning.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs, group_kwargs
from consumer.kafka.intake import InRecord
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.settings import Settings


@dataclass(frozen=True, slots=True)
class TopicRead:
    """What one `TopicReader.read` returns."""

    #: the assignment changed since the last read: what was read before may be another
    #: member's now, and `records` start again from the beginning of what is owned now
    rewound: bool
    #: the records read, in offset order per partition
    records: list[InRecord]


class TopicReader(Protocol):
    """A group member on one topic that reads it from the beginning whenever it is assigned."""

    async def start(self) -> None:
        """Join the group."""
        ...

    async def stop(self) -> None:
        """Leave the group (another member takes the topic over)."""
        ...

    async def read(self, timeout_s: float) -> TopicRead:
        """The records fetched next; waits up to `timeout_s` when there are none."""
        ...


class KafkaTopicReader:
    """aiokafka consumer in group `group_id` on `topic`, read_committed, never committing."""

    def __init__(self, settings: Settings, *, topic: str, group_id: str, client_id: str) -> None:
        self._topic = topic
        self._consumer = AIOKafkaConsumer(
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            **group_kwargs(settings),
            **client_kwargs(settings),
        )
        #: assignment changes seen by the rebalance listener, and by the last `read`
        self._rewinds = 0
        self._rewinds_read = 0

    async def start(self) -> None:
        self._consumer.subscribe([self._topic], listener=_Rewind(self._rewind))
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def read(self, timeout_s: float) -> TopicRead:
        batch = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000))
        rewound, self._rewinds_read = self._rewinds != self._rewinds_read, self._rewinds
        records = [
            InRecord(
                SourceOffset(TopicPartition(r.topic, r.partition), r.offset),
                r.key,
                r.value,
                tuple(r.headers or ()),
                r.timestamp,
            )
            for rs in batch.values()
            for r in rs
        ]
        return TopicRead(rewound, records)

    async def _rewind(self, assigned: Any) -> None:
        self._rewinds += 1
        if assigned:
            await self._consumer.seek_to_beginning(*assigned)


class _Rewind(ConsumerRebalanceListener):
    def __init__(self, rewind: Callable[[Any], Awaitable[None]]) -> None:
        self._rewind = rewind

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._rewind(())

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._rewind(assigned)
