"""In-memory Kafka edges: the service's intake and producers over a broker held in a dict.

`MemoryBroker` holds topics (partitions of records) and each group's committed offsets.
`MemoryIntake` is a `JobIntake` over it (every partition of the jobs topic assigned at start,
pause/resume, commits into the broker); `MemoryProducer` has the part of aiokafka's producer
the sinks and the stats publisher use (record batches, `send_and_wait`), so the real
`AtLeastOnceSink` runs on it unchanged: its watermark, acks and commits are the code under
test, only the sockets are gone. `MemoryTopicReader` is the offline tracker's `TopicReader`
(the one member of its group), `MemoryTopicFollower` the `TopicFollower` a group's board
(`consumer.kafka.board.TopicBoard`) reads. `memory_edges(broker)` hands them to `run_service`.

Faults are injected through these objects, never by patching modules: `MemoryProducer.fail`
makes the next batches fail with an error, `MemoryBroker.hold_commits` stops commits.
exactly_once (transactions) needs a real broker.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumer.core.lag import PartitionOffsets
from consumer.kafka.admin import topic_specs
from consumer.kafka.assignment import Assignment
from consumer.kafka.board import FollowedRecord, FollowedRecords
from consumer.kafka.connection import MAX_MESSAGE_BYTES
from consumer.kafka.intake import InRecord, RebalanceHandler
from consumer.kafka.partitioning import partition_for
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.kafka.topicreader import TopicRead
from consumer.settings import Settings
from consumer.testing.memory_group import MemoryGroup
from consumer.waits import wait_at_most


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record as the memory broker keeps it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


@dataclass
class MemoryBroker:
    """Topics and committed offsets; `partitions` for topics created on first use."""

    partitions: int = 4
    topics: dict[str, list[list[StoredRecord]]] = field(default_factory=dict)
    committed: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    #: while set, commits raise (a coordinator that cannot be reached)
    hold_commits: bool = False
    #: each group's members (`MemoryGroup`)
    groups: dict[str, MemoryGroup] = field(default_factory=dict)
    _appended: asyncio.Event = field(default_factory=asyncio.Event)

    def group(self, group_id: str) -> MemoryGroup:
        """The members of `group_id` (none yet when it is new)."""
        return self.groups.setdefault(group_id, MemoryGroup())

    def topic(self, name: str, partitions: int | None = None) -> list[list[StoredRecord]]:
        """The partitions of `name`, created when missing (with `partitions`, default the
        broker's `partitions`)."""
        if name not in self.topics:
            self.topics[name] = [[] for _ in range(partitions or self.partitions)]
        return self.topics[name]

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] = (),
        partition: int | None = None,
    ) -> int:
        """Append one record (partitioned by key as the real producer does); its offset."""
        parts = self.topic(topic)
        if partition is None:
            partition = partition_for(key, list(range(len(parts))))
        parts[partition].append(StoredRecord(key, value, tuple(headers), int(time.time() * 1000)))
        self._appended.set()
        return len(parts[partition]) - 1

    def records(self, topic: str) -> list[StoredRecord]:
        """Every record of `topic`, partition by partition."""
        return [r for part in self.topic(topic) for r in part]

    async def wait_for_records(self, timeout_s: float) -> None:
        """Return when a record is appended, or after `timeout_s`."""
        self._appended.clear()
        await wait_at_most(self._appended.wait(), timeout_s)


class MemoryIntake:
    """A `JobIntake` on the memory broker: a member of its group (`MemoryGroup`); alone, it
    owns every partition of its topics."""

    def __init__(
        self,
        broker: MemoryBroker,
        settings: Settings,
        owned: Assignment | None = None,
        topics: Sequence[str] | None = None,
    ) -> None:
        self._broker = broker
        self._topics = list(topics) if topics else [settings.jobs_topic]
        self.group_id = settings.group_id
        #: the owned partitions' fetch positions (shared with the sink, as the real intake's)
        self.owned = owned if owned is not None else Assignment()
        self._paused: set[TopicPartition] = set()
        self._handler: RebalanceHandler | None = None
        #: its commits carry no finished offsets, so it never meets records an earlier owner finished
        self.skipped_done = 0

    def subscribed(self) -> set[TopicPartition]:
        """Every partition of its topics."""
        return {TopicPartition(t, p) for t in self._topics for p in range(len(self._broker.topic(t)))}

    async def start(self, handler: RebalanceHandler) -> None:
        self._handler = handler
        await self._broker.group(self.group_id).join(self)

    async def revoke_all(self) -> None:
        """A rebalance began (the listener's revoke: every owned partition)."""
        assert self._handler is not None
        await self._handler.on_revoked(set(self.owned))

    async def take(self, partitions: set[TopicPartition]) -> None:
        """The rebalance's assignment: the owned partitions not in it are lost, those in it go
        on where they were fetched to, new ones are read from their committed offsets."""
        assert self._handler is not None
        lost = {tp for tp in self.owned if tp not in partitions}
        self.owned.revoke(lost)
        self._paused -= lost
        if lost:
            await self._handler.on_lost(lost)
        committed = self._broker.committed.setdefault(self.group_id, {})
        for tp in partitions:
            if tp not in self.owned:
                state = self.owned.assign(tp)
                state.fetched_to, state.done_read = committed.get(tp, 0), True
        await self._handler.on_assigned(set(partitions))

    async def stop(self) -> None:
        """Leave the group as aiokafka's consumer does on close: the partitions go without a
        revoke callback (the service's drain has made its final commit already); the others
        rebalance."""
        self.owned.revoke(set(self.owned))
        if self._handler is not None:
            self._handler = None
            await self._broker.group(self.group_id).leave(self)

    async def leave_group(self) -> None:
        await self.stop()

    def rejoin(self) -> None:
        """A single member keeps its assignment."""

    async def poll(self, timeout_s: float, max_records: int) -> list[InRecord]:
        taken = self._take(max_records)
        if not taken:
            await self._broker.wait_for_records(timeout_s)
            taken = self._take(max_records)
        return taken

    def _take(self, max_records: int) -> list[InRecord]:
        out: list[InRecord] = []
        for tp in self.owned:
            state = self.owned.get(tp)
            if tp in self._paused or state is None:
                continue
            position = state.fetched_to or 0
            part = self._broker.topic(tp.topic)[tp.partition]
            end = min(len(part), position + max_records - len(out))
            for offset in range(position, end):
                r = part[offset]
                out.append(InRecord(SourceOffset(tp, offset), r.key, r.value, r.headers, r.timestamp_ms))
            state.fetched_to = max(position, end)
            if len(out) >= max_records:
                break
        return out

    def assignment(self) -> set[TopicPartition]:
        return set(self.owned)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._paused.update(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._paused.difference_update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        if self._broker.hold_commits:
            raise ConnectionError("memory broker: commits are held")
        committed = self._broker.committed.setdefault(self.group_id, {})
        for tp, point in offsets.items():
            committed[tp] = int(getattr(point, "offset", point))

    async def partition_offsets(self) -> dict[TopicPartition, PartitionOffsets]:
        committed = self._broker.committed.get(self.group_id, {})
        out: dict[TopicPartition, PartitionOffsets] = {}
        for tp in self.owned:
            state = self.owned.get(tp)
            done = committed.get(tp)
            position = state.fetched_to if state is not None and state.fetched_to is not None else done or 0
            out[tp] = PartitionOffsets(len(self._broker.topic(tp.topic)[tp.partition]), done, position)
        return out

    def has_unfetched(self) -> bool:
        for tp in self.owned:
            state = self.owned.get(tp)
            if tp in self._paused or state is None:
                continue
            if (state.fetched_to or 0) < len(self._broker.topic(tp.topic)[tp.partition]):
                return True
        return False


class MemoryTopicReader:
    """A `TopicReader` on the memory broker: the one member of its group, so it is assigned
    every partition of the topic when it starts and reads them from the beginning."""

    def __init__(self, broker: MemoryBroker, topic: str) -> None:
        self._broker = broker
        self._topic = topic
        self._positions: dict[int, int] = {}
        self._rewound = False

    async def start(self) -> None:
        self._positions = dict.fromkeys(range(len(self._broker.topic(self._topic))), 0)
        self._rewound = True

    async def stop(self) -> None:
        self._positions = {}

    async def read(self, timeout_s: float) -> TopicRead:
        records = self._take()
        if not records:
            await self._broker.wait_for_records(timeout_s)
            records = self._take()
        rewound, self._rewound = self._rewound, False
        return TopicRead(rewound, records)

    def _take(self) -> list[InRecord]:
        out: list[InRecord] = []
        parts = self._broker.topic(self._topic)
        for partition, position in self._positions.items():
            tp = TopicPartition(self._topic, partition)
            for offset in range(position, len(parts[partition])):
                r = parts[partition][offset]
                out.append(InRecord(SourceOffset(tp, offset), r.key, r.value, r.headers, r.timestamp_ms))
            self._positions[partition] = len(parts[partition])
        return out


class MemoryTopicFollower:
    """A `TopicFollower` on the memory broker: the records there at `start` are as old as their
    timestamps; later ones are new when the follower first looks (every call reads up to the
    end, so nothing waits for a fetch)."""

    def __init__(self, broker: MemoryBroker, topic: str, clock: Any = time.monotonic) -> None:
        self._broker = broker
        self._topic = topic
        self._clock = clock
        self._positions: list[int] = []
        self._records = FollowedRecords()

    async def start(self) -> None:
        self._positions = [0] * len(self._broker.topic(self._topic))
        self._sync(catching_up=True)

    async def stop(self) -> None:
        self._positions = []

    async def catch_up(self) -> None:
        self._sync()

    async def read_to_end(self, timeout_s: float) -> bool:
        self._sync()
        return True

    def _sync(self, *, catching_up: bool = False) -> None:
        wall_s = time.time()
        read = []
        for partition, records in enumerate(self._broker.topic(self._topic)[: len(self._positions)]):
            for r in records[self._positions[partition] :]:
                age_s = max(0.0, wall_s - r.timestamp_ms / 1000.0) if catching_up else 0.0
                read.append((r.key, r.value, age_s))
            self._positions[partition] = len(records)
        self._records.apply(read, self._clock())

    def latest(self) -> dict[bytes, FollowedRecord]:
        self._sync()
        return self._records.latest

    @property
    def version(self) -> int:
        self._sync()
        return self._records.version

    async def wait_for_change(self, version: int, timeout_s: float) -> int:
        if self.version == version:
            await self._broker.wait_for_records(timeout_s)
        return self.version

    def now_s(self) -> float:
        return float(self._clock())


class _RecordBatch:
    """aiokafka's BatchBuilder surface: `append` returns None when the batch is full."""

    def __init__(self, max_records: int) -> None:
        self.records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
        self._max = max_records

    def append(
        self, *, key: bytes | None, value: bytes | None, timestamp: Any, headers: list[tuple[str, bytes]]
    ) -> Any:
        if len(self.records) >= self._max:
            return None
        self.records.append((key, value, headers))
        return True


class MemoryProducer:
    """The producer surface the sinks and the stats publisher use, writing to the memory broker."""

    BATCH_RECORDS = 500

    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker
        self._failures: list[BaseException] = []
        self.started = False
        self.sent = 0

    def fail(self, error: BaseException, times: int = 1) -> None:
        """The next `times` batches fail with `error` (their records are not written)."""
        self._failures.extend(itertools.repeat(error, times))

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def flush(self) -> None:
        return None

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(len(self._broker.topic(topic))))

    def create_batch(self) -> _RecordBatch:
        return _RecordBatch(self.BATCH_RECORDS)

    async def send_batch(self, batch: _RecordBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        delivered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._failures:
            delivered.set_exception(self._failures.pop(0))
            return delivered
        for key, value, headers in batch.records:
            self._broker.append(topic, key, value, headers, partition=partition)
        self.sent += len(batch.records)
        delivered.set_result(None)
        return delivered

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> asyncio.Future[Any]:
        """Write one record; the future is already done (aiokafka's resolves on the ack)."""
        self._broker.append(topic, key, value, headers)
        self.sent += 1
        delivered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        await (await self.send(topic, value, key, headers))


@dataclass(frozen=True)
class MemoryEdges:
    """The service's Kafka edges on a `MemoryBroker` (see `consumer.kafka.edges.KafkaEdges`)."""

    broker: MemoryBroker

    async def ensure_topics(
        self,
        settings: Settings,
        lane_topics: Sequence[str] = (),
        enriched_topics: Sequence[str] = (),
        output_topics: Sequence[str] = (),
    ) -> dict[str, str]:
        specs = topic_specs(settings, lane_topics, enriched_topics, output_topics)
        report = {s.name: "exists" if s.name in self.broker.topics else "created" for s in specs}
        for spec in specs:
            self.broker.topic(spec.name, spec.partitions)
        return report

    async def max_record_bytes(self, settings: Settings, topics: list[str]) -> dict[str, int]:
        return dict.fromkeys(topics, MAX_MESSAGE_BYTES)

    def intake(
        self, settings: Settings, client_id: str, owned: Assignment, topics: Sequence[str] = ()
    ) -> MemoryIntake:
        return MemoryIntake(self.broker, settings, owned, topics)

    def producer(self, settings: Settings, client_id: str, transactional_id: str | None) -> MemoryProducer:
        return MemoryProducer(self.broker)

    def topic_reader(
        self, settings: Settings, client_id: str, topic: str, group_id: str
    ) -> MemoryTopicReader:
        return MemoryTopicReader(self.broker, topic)

    def follower(
        self, settings: Settings, client_id: str, topic: str, *, follow: bool = True
    ) -> MemoryTopicFollower:
        return MemoryTopicFollower(self.broker, topic)

    async def read_latest(self, settings: Settings, topic: str) -> dict[bytes, bytes]:
        latest: dict[bytes, bytes] = {}
        for record in self.broker.records(topic):
            if record.key is None:
                continue
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest[record.key] = record.value
        return latest


def memory_edges(broker: MemoryBroker | None = None) -> MemoryEdges:
    """Edges on `broker` (a new one with 4 partitions per topic when None)."""
    return MemoryEdges(broker if broker is not None else MemoryBroker())
