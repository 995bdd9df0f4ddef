"""The group's board on a compacted topic of one partition: every instance publishes its own
keyed record and reads every instance's latest (the tenants' budgets,
`consumer.runtime.budgets`). `GroupBoard` is the Protocol; `KafkaBoard` the real one,
`consumer.testing.memory.MemoryBoard` the fake.

One partition puts every instance's records in one order, which is what lets writers share
something without a lock: `publish` returns the offset its record got, and `read_past(offset)`
returns once every record up to it has been read, so the writer knows every record written
before its own (a claim decided after that cannot have missed an earlier one).

`start` reads the topic from its beginning to the end offset it finds (so the caller knows
what every instance wrote before it admits anything), then the board follows it. A record
that is not a JSON object (another tool wrote it) is skipped with a warning; a tombstone
removes its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from consumer.kafka.clients import committed_reader, topic_partitions
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.waits import wait_at_most

log = logging.getLogger(__name__)

__all__ = ["BoardRecords", "GroupBoard", "KafkaBoard"]

#: how long one fetch of the follower waits for new records
_FETCH_WAIT_MS = 500


class GroupBoard(Protocol):
    """The group's board: every instance publishes its own keyed record and reads every
    instance's latest, in the one order of the topic's one partition."""

    async def start(self) -> None:
        """Read every instance's latest record (before the service admits anything)."""
        ...

    async def stop(self) -> None: ...

    async def publish(self, key: bytes, value: dict[str, Any]) -> int:
        """Write this instance's record; returns its offset once it is acknowledged."""
        ...

    async def read_past(self, offset: int) -> None:
        """Return once every record up to `offset` has been read (`latest` holds them)."""
        ...

    def latest(self) -> Mapping[bytes, dict[str, Any]]:
        """Every instance's latest record read so far, by key."""
        ...

    async def changed(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for records newer than the last call saw; True when some came."""
        ...


class BoardRecords:
    """Every writer's latest record as read so far, in log order (the part of a board both
    edges share)."""

    def __init__(self, topic: str) -> None:
        self._topic = topic
        self._latest: dict[bytes, dict[str, Any]] = {}
        self._changed = asyncio.Event()
        #: the offset of the next record to read
        self._next_offset = 0
        self._advanced = asyncio.Event()

    def latest(self) -> Mapping[bytes, dict[str, Any]]:
        return self._latest

    def take(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        """The record at `offset`, read in order: a record that is not a JSON object is skipped
        with a warning, a tombstone removes its key."""
        self._next_offset = max(self._next_offset, offset + 1)
        self._advanced.set()
        if key is None:
            return
        if value is None:
            if self._latest.pop(key, None) is not None:
                self._changed.set()
            return
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            log.warning("board %s: record %r skipped, not a JSON object", self._topic, key)
            return
        self._latest[key] = record
        self._changed.set()

    async def read_past(self, offset: int) -> None:
        """Return once the record at `offset` (and every one before it) has been read."""
        while self._next_offset <= offset:
            self._advanced.clear()
            await self._advanced.wait()

    async def changed(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for records read since the last call; True when some came."""
        if timeout_s > 0 and not self._changed.is_set():
            await wait_at_most(self._changed.wait(), timeout_s)
        came = self._changed.is_set()
        self._changed.clear()
        return came


class KafkaBoard(BoardRecords):
    """Every instance's latest record on `topic` (created beforehand with one partition, like
    every topic of the service); this instance's written with `producer` (acks=all)."""

    def __init__(self, settings: Settings, topic: str, producer: Any) -> None:
        super().__init__(topic)
        self._settings = settings
        self._producer = producer
        self._consumer = committed_reader(settings)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read every record up to the end offset found now, then follow the topic."""
        partitions = await topic_partitions(self._settings, self._topic)
        if len(partitions) != 1:
            log.warning(
                "board %s has %d partitions: instances' claims on it are not in one order; give it one",
                self._topic,
                len(partitions),
            )
        await self._consumer.start()
        tps = [TopicPartition(self._topic, p) for p in partitions]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        end = await self._consumer.end_offsets(tps)
        while any([await self._consumer.position(tp) < end[tp] for tp in tps]):
            await self._fetch()
        await self.changed(0)  # what was there before the start is not news
        self._task = asyncio.create_task(self._follow(), name=f"promptbus-board-{self._topic}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    async def publish(self, key: bytes, value: dict[str, Any]) -> int:
        """Write this instance's record; its offset once the broker acknowledged it."""
        metadata = await (await self._producer.send(self._topic, orjson.dumps(value), key=key))
        return int(metadata.offset)

    async def _follow(self) -> None:
        while True:
            try:
                await self._fetch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # aiokafka retries inside; this is past that
                log.warning("board %s: reading failed (%s); trying again", self._topic, exc)
                await asyncio.sleep(1.0)

    async def _fetch(self) -> None:
        batch = await self._consumer.getmany(timeout_ms=_FETCH_WAIT_MS)
        for records in batch.values():
            for r in records:
                self.take(r.offset, r.key, r.value)
