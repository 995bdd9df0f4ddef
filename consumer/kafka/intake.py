"""Intake: the consumer-group edge. `JobIntake` is the Protocol; `KafkaIntake` wraps aiokafka.

Kafka vocabulary is kept verbatim (assignment, pause, resume, commit, highwater). Offsets are
committed only by the delivery sink (`consumer.kafka.sink`), never automatically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import OffsetAndMetadata

from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InRecord:
    """One fetched input record."""

    source: SourceOffset
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


class RebalanceHandler(Protocol):
    """What the pipeline does when the group moves partitions (awaited inside the rebalance)."""

    async def on_revoked(self, partitions: set[TopicPartition]) -> None: ...

    async def on_assigned(self, partitions: set[TopicPartition]) -> None: ...


class JobIntake(Protocol):
    group_id: str

    async def start(self, handler: RebalanceHandler) -> None: ...

    async def stop(self) -> None: ...

    async def poll(self, timeout_s: float, max_records: int) -> list[InRecord]: ...

    def assignment(self) -> set[TopicPartition]: ...

    def pause(self, partitions: Iterable[TopicPartition]) -> None: ...

    def resume(self, partitions: Iterable[TopicPartition]) -> None: ...

    def paused(self) -> set[TopicPartition]: ...

    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...

    def has_unfetched(self) -> bool:
        """True when some assigned partition holds records not fetched yet (could still join a window)."""
        ...


class _Listener(ConsumerRebalanceListener):
    def __init__(self, handler: RebalanceHandler, forget: Callable[[set[TopicPartition]], None]) -> None:
        self._handler = handler
        self._forget = forget

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        try:
            await self._handler.on_revoked(set(revoked))
        finally:
            # a partition assigned again is read from its committed offset, not from where
            # this instance had fetched to: its old fetch position must not count as fetched
            self._forget(set(revoked))

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        await self._handler.on_assigned(set(assigned))


class KafkaIntake:
    """aiokafka consumer in a group on the jobs topic, manual commits, read_committed."""

    def __init__(self, settings: Settings, *, client_id: str) -> None:
        self.group_id = settings.group_id
        self._topic = settings.jobs_topic
        self._consumer = AIOKafkaConsumer(
            group_id=settings.group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
            # the pipeline polls continuously even when paused, so a short poll interval is safe
            max_poll_interval_ms=300_000,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=3_000,
            **client_kwargs(settings),
        )
        self._next_offset: dict[TopicPartition, int] = {}
        self._listener: _Listener | None = None

    async def start(self, handler: RebalanceHandler) -> None:
        self._listener = _Listener(handler, self._forget_positions)
        self._consumer.subscribe([self._topic], listener=self._listener)
        await self._consumer.start()

    def rejoin(self) -> None:
        """Ask the group for a new assignment: a rebalance revokes every partition (the
        handler's `on_revoked`) and assigns them afresh, read from their committed offsets.

        Subscribing again is aiokafka's public way to make its coordinator rejoin the group.
        """
        if self._listener is None:
            return  # not started: the first join assigns afresh anyway
        log.info("rejoining group %s for a new assignment", self.group_id)
        self._consumer.subscribe([self._topic], listener=self._listener)

    async def stop(self) -> None:
        await self._consumer.stop()

    def _forget_positions(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._next_offset.pop(tp, None)

    async def poll(self, timeout_s: float, max_records: int) -> list[InRecord]:
        batches = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[InRecord] = []
        for tp, records in batches.items():
            out += [
                InRecord(
                    SourceOffset(tp, r.offset),
                    r.key,
                    r.value,
                    tuple(r.headers) if r.headers else (),
                    r.timestamp,
                )
                for r in records
            ]
        for tp in self._consumer.assignment():
            # the consumer's own position: it also steps over transaction markers, which take
            # an offset after a transactional producer's records but are never returned
            # (last record + 1 would leave one "unfetched" offset behind forever)
            self._next_offset[tp] = await self._consumer.position(tp)
        return out

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.pause(*partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._consumer.paused())

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if offsets:
            await self._consumer.commit({tp: OffsetAndMetadata(off, "") for tp, off in offsets.items()})

    def has_unfetched(self) -> bool:
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                return True  # nothing fetched yet for it: records may be there
            if high > self._next_offset.get(tp, 0):
                return True
        return False
