"""The group's board on a compacted topic: every instance publishes its own keyed record and
reads every instance's latest (the tenants' budgets, `consumer.runtime.budgets`). `GroupBoard`
is the Protocol; `KafkaBoard` the real one, `consumer.testing.memory.MemoryBoard` the fake.

`KafkaBoard.start` reads the topic from its beginning to the end offsets it finds (so the caller
knows what every instance wrote before it admits anything), then follows it in a task. A record
that is not a JSON object (another tool wrote it) is skipped with a warning; a tombstone removes
its key. `publish` returns once the broker acknowledged the record (acks=all, the service's
side producer), and the record counts as read at once.
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

log = logging.getLogger(__name__)

__all__ = ["BoardRecords", "GroupBoard", "KafkaBoard"]

#: how long one fetch of the follower waits for new records
_FETCH_WAIT_MS = 500


class GroupBoard(Protocol):
    """The group's board: every instance publishes its own keyed record and reads every
    instance's latest (a compacted topic)."""

    async def start(self) -> None:
        """Read every instance's latest record (before the service admits anything)."""
        ...

    async def stop(self) -> None: ...

    async def publish(self, key: bytes, value: dict[str, Any]) -> None:
        """Write this instance's record; returns once it is acknowledged."""
        ...

    def latest(self) -> Mapping[bytes, dict[str, Any]]:
        """Every instance's latest record read so far, by key."""
        ...

    async def changed(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for records newer than the last call saw; True when some came."""
        ...


class BoardRecords:
    """Every writer's latest record as read so far (the part of a board both edges share): a
    record that is not a JSON object is skipped with a warning, a tombstone removes its key."""

    def __init__(self, topic: str) -> None:
        self._topic = topic
        self._latest: dict[bytes, dict[str, Any]] = {}
        self._changed = asyncio.Event()

    def latest(self) -> Mapping[bytes, dict[str, Any]]:
        return self._latest

    def written(self, key: bytes, value: dict[str, Any]) -> None:
        """This instance's own record, acknowledged: it counts as read."""
        self._latest[key] = value

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """One record read from the topic."""
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

    async def changed(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for records read since the last call; True when some came."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=timeout_s)
        came = self._changed.is_set()
        self._changed.clear()
        return came


class KafkaBoard(BoardRecords):
    """Every instance's latest record on `topic` (created beforehand, like every topic of the
    service); this instance's written with `producer`."""

    def __init__(self, settings: Settings, topic: str, producer: Any) -> None:
        super().__init__(topic)
        self._settings = settings
        self._producer = producer
        self._consumer = committed_reader(settings)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read every record up to the end offsets found now, then follow the topic."""
        partitions = await topic_partitions(self._settings, self._topic)
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

    async def publish(self, key: bytes, value: dict[str, Any]) -> None:
        """Write this instance's record and wait for the broker's acknowledgement."""
        await (await self._producer.send(self._topic, orjson.dumps(value), key=key))
        self.written(key, value)

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
                self.take(r.key, r.value)
