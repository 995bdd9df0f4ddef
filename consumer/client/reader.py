"""The Kafka edge of a run: one consumer reading the results and dead-letter topics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from consumer.client.outcomes import ProgressCallback
from consumer.client.tracker import RunTracker
from consumer.settings import Settings

#: how long one fetch waits for records before the deadline is checked again
FETCH_WAIT_S = 0.5


class OutcomeReader:
    """One consumer assigned every partition of the results and dead-letter topics (no group)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: Any = None
        self.partitions: list[Any] = []

    async def open(self, ensure_topics: Callable[[], Awaitable[None]]) -> None:
        """Start the consumer and assign both topics' partitions, creating the topics first
        (`ensure_topics`) when either is missing."""
        from aiokafka import AIOKafkaConsumer

        from consumer.kafka.clients import topic_partitions
        from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
        from consumer.kafka.records import TopicPartition

        s = self.settings
        topics = (s.results_topic, s.dlq_topic)
        self._consumer = AIOKafkaConsumer(
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            **client_kwargs(s),
        )
        # the consumer's bootstrap and the partition lookups overlap: a new process's collect
        # pays one round trip for them, not three
        _, *found = await asyncio.gather(self._consumer.start(), *(topic_partitions(s, t) for t in topics))
        if not all(found):
            await ensure_topics()
            found = list(await asyncio.gather(*(topic_partitions(s, t) for t in topics)))
        pairs = zip(topics, found, strict=True)
        self.partitions = [TopicPartition(topic, p) for topic, parts in pairs for p in parts]
        self._consumer.assign(self.partitions)

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def end_offsets(self) -> dict[Any, int]:
        """Where every partition ends now."""
        ends: dict[Any, int] = await self._consumer.end_offsets(self.partitions)
        return ends

    async def offsets_at(self, at_ms: int) -> dict[Any, int]:
        """The first offset stamped at or after `at_ms` per partition (the end where none is)."""
        found = await self._consumer.offsets_for_times({tp: at_ms for tp in self.partitions})
        ends = await self.end_offsets()
        return {tp: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in self.partitions}

    async def follow(
        self,
        tracker: RunTracker,
        start: Mapping[Any, int],
        *,
        started: float,
        deadline: float | None,
        on_progress: ProgressCallback | None,
    ) -> None:
        """Read from `start` until the run is complete or `deadline` (monotonic) passes."""
        consumer = self._consumer
        for tp in self.partitions:
            consumer.seek(tp, start.get(tp, 0))
        results_topic = self.settings.results_topic
        while not tracker.complete:
            wait_s = FETCH_WAIT_S
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
                if wait_s <= 0:
                    return
            batches = await consumer.getmany(timeout_ms=max(1, int(wait_s * 1000)))
            new = 0
            for tp, records in batches.items():
                add = tracker.add_result if tp.topic == results_topic else tracker.add_dead_letter
                for r in records:
                    new += add(r.key, r.value)
            if new and on_progress is not None:
                on_progress(tracker.progress(time.monotonic() - started))
