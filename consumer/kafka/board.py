"""A group's board: every instance publishes its own keyed records to a compacted topic and
reads every instance's latest ones (`GroupBoard`, implemented by `TopicBoard`).

What the instances of one consumer group share beside the jobs' partitions goes over it: each
instance's demand on a fleet quota (`consumer.runtime.quotas`), and whatever else must be known
group-wide and kept across restarts, with no store beside Kafka. A record's key is (group,
instance, name), so groups sharing the topic never see each other's records, and each
instance writes only its own. The latest record of every key stays in the compacted topic:
a new instance reads what every instance, live or dead, last published, before it starts;
a record's age (`BoardRecord.age_s`) says whether its instance still publishes.

Underneath is a `TopicFollower`: the latest record of every key of a compacted topic, read
from the beginning at start (every partition, no consumer group, nothing committed), then
followed as it grows. `KafkaTopicFollower` is the real one on aiokafka; the in-memory one is
`consumer.testing.memory.MemoryTopicFollower`. The offline collector follows the batches
topic the same way.

Ages without trusting clocks across machines: a record read while catching up at start is
as old as its Kafka timestamp says (the writer's clock); a record read while following is
new when it arrives, and ages on this instance's monotonic clock from then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer

from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.waits import cancel_and_wait, wait_at_most

__all__ = [
    "BoardRecord",
    "FollowedRecord",
    "FollowedRecords",
    "GroupBoard",
    "KafkaTopicFollower",
    "TopicBoard",
    "TopicFollower",
    "board_key",
]

log = logging.getLogger(__name__)

#: a follower's start reads the topic up to its end as it was then; past this it follows
#: from where it got (the rest comes in as it is read)
CATCH_UP_TIMEOUT_S = 60.0
#: `read_to_end` looks at the following task's positions at least this often
READ_TO_END_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class FollowedRecord:
    """The latest value of one key, and how old it was when it was read.

    read_s: when it was read (the follower's monotonic clock); age_at_read_s: its age then
    (0 for a record read while following; from its Kafka timestamp while catching up).
    """

    value: bytes
    read_s: float
    age_at_read_s: float

    def age_s(self, now_s: float) -> float:
        """Its age at now_s (the follower's clock)."""
        return self.age_at_read_s + max(0.0, now_s - self.read_s)


class FollowedRecords:
    """Every key's latest record read so far (`latest`), and how many reads brought some
    (`version`): what both followers, the real and the in-memory one, keep."""

    def __init__(self) -> None:
        self.latest: dict[bytes, FollowedRecord] = {}
        self.version = 0

    def apply(self, records: Iterable[tuple[bytes | None, bytes | None, float]], read_s: float) -> bool:
        """Records read at read_s, as (key, value, age then), in the order read: a value
        replaces its key's, a tombstone (None) removes it. True when any had a key."""
        applied = False
        for key, value, age_s in records:
            if key is None:
                continue
            applied = True
            if value is None:
                self.latest.pop(key, None)
            else:
                self.latest[key] = FollowedRecord(value, read_s, age_s)
        if applied:
            self.version += 1
        return applied


class TopicFollower(Protocol):
    """The latest record of every key of a compacted topic, kept current (tombstones remove)."""

    async def start(self) -> None:
        """Read the topic from its beginning up to its end as it is now, then keep following it."""
        ...

    async def stop(self) -> None: ...

    async def catch_up(self) -> None:
        """Read what was written since, up to the topic's end as it is now (what a follower made
        with `follow=False` reads only when asked)."""
        ...

    async def read_to_end(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until what was written before this call is read; True
        once it is."""
        ...

    def latest(self) -> Mapping[bytes, FollowedRecord]:
        """Every key's latest record read so far."""
        ...

    @property
    def version(self) -> int:
        """Grows by one whenever records were read."""
        ...

    async def wait_for_change(self, version: int, timeout_s: float) -> int:
        """Return the version once it is past `version` (at once if it is), or after
        `timeout_s`."""
        ...

    def now_s(self) -> float:
        """The follower's clock (what `FollowedRecord.age_s` takes)."""
        ...


class KafkaTopicFollower:
    """A `TopicFollower` on aiokafka: every partition assigned by hand (no group), from the
    beginning, read_committed."""

    def __init__(
        self,
        settings: Settings,
        *,
        topic: str,
        client_id: str,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        follow: bool = True,
    ) -> None:
        """follow: keep reading new records as they come (False: only at `start` and when
        `catch_up` is asked)."""
        self._settings = settings
        self._topic = topic
        self._follows = follow
        self._tps: list[TopicPartition] = []
        self._clock = clock
        self._wall_clock = wall_clock
        self._consumer = AIOKafkaConsumer(
            client_id=client_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            # a record should reach the others promptly when the topic is quiet
            fetch_max_wait_ms=100,
            **client_kwargs(settings),
        )
        self._records = FollowedRecords()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = False

    async def start(self) -> None:
        partitions = await topic_partitions(self._settings, self._topic)
        if not partitions:
            raise RuntimeError(f"topic {self._topic} does not exist (it is created at start)")
        await self._consumer.start()
        self._started = True
        tps = self._tps = [TopicPartition(self._topic, p) for p in partitions]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        await self.catch_up()
        if self._follows:
            self._task = asyncio.create_task(self._follow(), name=f"promptbus-follow-{self._topic}")

    async def catch_up(self) -> None:
        tps = self._tps
        ends = await self._consumer.end_offsets(tps)
        if not await wait_at_most(self._catch_up(tps, ends), CATCH_UP_TIMEOUT_S):
            log.warning(
                "topic %s: not read to its end within %.0f s; going on", self._topic, CATCH_UP_TIMEOUT_S
            )

    async def _catch_up(self, tps: list[TopicPartition], ends: Mapping[TopicPartition, int]) -> None:
        while True:
            behind = [tp for tp in tps if await self._consumer.position(tp) < ends[tp]]
            if not behind:
                return
            batch = await self._consumer.getmany(*behind, timeout_ms=500)
            self._apply(batch, ends)

    async def read_to_end(self, timeout_s: float) -> bool:
        ends = await self._consumer.end_offsets(self._tps)
        if not self._follows:
            return await wait_at_most(self._catch_up(self._tps, ends), timeout_s)
        # the following task reads on; wait until its positions reach the ends as they were
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if all([await self._consumer.position(tp) >= ends[tp] for tp in self._tps]):
                return True
            if loop.time() >= deadline:
                return False
            await wait_at_most(self._changed.wait(), min(READ_TO_END_POLL_S, deadline - loop.time()))

    async def _follow(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=1000)
            self._apply(batch, None)

    def _apply(self, batch: Mapping[Any, list[Any]], ends: Mapping[TopicPartition, int] | None) -> None:
        wall_s = self._wall_clock()
        read = []
        for tp, records in batch.items():
            end = ends.get(TopicPartition(tp.topic, tp.partition), 0) if ends is not None else 0
            for r in records:
                age_s = max(0.0, wall_s - r.timestamp / 1000.0) if r.offset < end else 0.0
                read.append((r.key, r.value, age_s))
        if self._records.apply(read, self._clock()):
            self._changed.set()
            self._changed = asyncio.Event()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._started:
            self._started = False
            await self._consumer.stop()

    def latest(self) -> Mapping[bytes, FollowedRecord]:
        return self._records.latest

    @property
    def version(self) -> int:
        return self._records.version

    async def wait_for_change(self, version: int, timeout_s: float) -> int:
        if self._records.version == version:
            await wait_at_most(self._changed.wait(), timeout_s)
        return self._records.version

    def now_s(self) -> float:
        return self._clock()


@dataclass(frozen=True, slots=True)
class BoardRecord:
    """One instance's latest record of one name, and its age in seconds (when it was read
    from the board)."""

    instance: str
    name: str
    value: bytes
    age_s: float


class GroupBoard(Protocol):
    """What the instances of one consumer group share: each publishes its own records (one per
    name, the latest kept) and reads every instance's latest ones, its own included."""

    @property
    def instance(self) -> str:
        """This instance's id: the records it publishes are its own."""
        ...

    async def start(self) -> None:
        """Read every instance's latest records (live or dead), then keep them current."""
        ...

    async def stop(self) -> None: ...

    async def publish(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        """Publish this instance's (name, value) records, and wait until the broker has them
        (a value of None removes the name)."""
        ...

    def records(self) -> list[BoardRecord]:
        """Every instance's latest record of each name, this group's only."""
        ...

    @property
    def version(self) -> int:
        """Grows whenever records were read (`wait_for_change`)."""
        ...

    async def wait_for_change(self, version: int, timeout_s: float) -> int:
        """Return the version once it is past `version`, or after `timeout_s`."""
        ...


def board_key(group: str, instance: str, name: str) -> bytes:
    """The Kafka key of an instance's record: (group, instance, name) as a JSON array, so no
    name can be read as another's."""
    return orjson.dumps([group, instance, name])


class TopicBoard:
    """A `GroupBoard` on a compacted topic: `follower` reads it, `producer` writes it (on the
    real edges, aiokafka; on the memory edges, the memory broker)."""

    def __init__(
        self, follower: TopicFollower, producer: Any, *, topic: str, group: str, instance: str
    ) -> None:
        self._follower = follower
        self._producer = producer
        self._topic = topic
        self._group = group
        self._instance = instance
        #: the (instance, name) of each key read, this group's only (None: another group's)
        self._names: dict[bytes, tuple[str, str] | None] = {}

    @property
    def instance(self) -> str:
        return self._instance

    async def start(self) -> None:
        await self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()

    async def publish(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        delivered = [
            await self._producer.send(self._topic, value, key=board_key(self._group, self._instance, name))
            for name, value in records
        ]
        await asyncio.gather(*delivered)

    async def read_to_end(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until what was published before this call is read."""
        return await self._follower.read_to_end(timeout_s)

    def records(self) -> list[BoardRecord]:
        now_s = self._follower.now_s()
        out = []
        for key, record in self._follower.latest().items():
            owner = self._names.get(key, ...)
            if owner is ...:
                owner = self._names[key] = self._owner(key)
            if owner is not None:
                out.append(BoardRecord(owner[0], owner[1], record.value, record.age_s(now_s)))
        return out

    def _owner(self, key: bytes) -> tuple[str, str] | None:
        """(instance, name) of a key of this group; None for another group's, or a key
        another tool wrote."""
        try:
            parts = orjson.loads(key)
        except orjson.JSONDecodeError:
            return None
        if not (isinstance(parts, list) and len(parts) == 3 and all(isinstance(p, str) for p in parts)):
            return None
        group, instance, name = parts
        return (instance, name) if group == self._group else None

    @property
    def version(self) -> int:
        return self._follower.version

    async def wait_for_change(self, version: int, timeout_s: float) -> int:
        return await self._follower.wait_for_change(version, timeout_s)
