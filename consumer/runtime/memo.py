"""What each source key's last enrichment read and answered, kept across restarts and
instances: the memo that lets `unchanged: skip` write an update of a key whose prompt fields
did not change with the answer it already has, without asking the model again.

It lives in a compacted topic (`PROMPTBUS_ENRICHMENTS_TOPIC`): key `SOURCE NUL RECORD-KEY`,
value `{"read": digest, "answer": ...}` (a tombstone when the row was deleted). Every instance
reads the whole topic at start, and catches up on what was written since whenever partitions
are assigned to it: a key's memo is written by the owner of its partition only, so between
two assignments no other instance writes one this instance needs, and a key's memo is there
whichever instance its partition moves to. Whether or not Debezium sends `before` does not
matter, since what the record is compared with is the memo. An instance writes what it
enriched (batched, every `FLUSH_S`): a memo lost in a crash, or written by a partition's last
owner after the next one caught up, only costs one more request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any, NamedTuple

import orjson

from consumer.kafka.board import TopicFollower
from consumer.kafka.records import OutRecord
from consumer.kafka.sink.record_batch import produce_record_batches
from consumer.waits import cancel_and_wait

__all__ = ["EnrichmentMemo", "Recalled"]

log = logging.getLogger(__name__)

#: how often this instance's new memos are produced
FLUSH_S = 0.2


class Recalled(NamedTuple):
    """A key's last enrichment: the digest of what its prompt read, and its answer."""

    read: str
    answer: Any


def memo_key(source: str, key: bytes) -> bytes:
    return _prefix(source) + key


@functools.cache
def _prefix(source: str) -> bytes:
    return source.encode() + b"\x00"


class EnrichmentMemo:
    """The memo topic read (`follower`) and written (`producer`, aiokafka's `send`)."""

    def __init__(self, follower: TopicFollower, producer: Any, topic: str) -> None:
        self._follower = follower
        self._producer = producer
        self._topic = topic
        #: what this instance wrote (None: forgot) and has not read back yet; wins over the topic's
        self._mine: dict[bytes, bytes | None] = {}
        #: this instance's memos not produced yet, in order: their keys (their values: `_mine`'s)
        self._pending: list[bytes] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._follower.start()
        self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(Exception):
            await self._flush()
        await self._follower.stop()

    async def catch_up(self) -> None:
        """Read the memos written since the last catch-up (partitions were assigned); this
        instance's own that were read back are the topic's now, and leave `_mine`."""
        await self._follower.catch_up()
        latest = self._follower.latest()
        for mk in [mk for mk, value in self._mine.items() if value is not None and mk in latest]:
            if latest[mk].value == self._mine[mk]:
                del self._mine[mk]

    def recall(self, source: str, key: bytes | None) -> Recalled | None:
        """The key's last enrichment, if any is known."""
        if key is None:
            return None
        mk = memo_key(source, key)
        if mk in self._mine:
            value = self._mine[mk]
        else:
            found = self._follower.latest().get(mk)
            value = found.value if found is not None else None
        if not value:
            return None
        try:
            data = orjson.loads(value)
            return Recalled(str(data["read"]), data.get("answer"))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None

    def remember(self, source: str, key: bytes | None, read: str, answer: Any) -> None:
        if key is None:
            return
        mk = memo_key(source, key)
        # built as bytes: one per enriched record, and a dict or tuple per record would be an
        # object the young generation's collections walk
        self._mine[mk] = b'{"read":"' + read.encode() + b'","answer":' + orjson.dumps(answer) + b"}"
        self._pending.append(mk)

    def forget(self, source: str, key: bytes | None) -> None:
        if key is None:
            return
        mk = memo_key(source, key)
        self._mine[mk] = None
        self._pending.append(mk)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self._flush()
            except Exception as exc:  # a broker hiccup: memos are an optimisation, the next flush tries again
                log.warning("enrichment memo: could not write %d entries: %s", len(self._pending), exc)

    async def _flush(self) -> None:
        """Hand the new memos to the producer, a record batch per partition."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        mine, topic = self._mine, self._topic
        # a key remembered twice since the last flush is produced once, with its latest value
        items = [(None, OutRecord(topic, key, mine.get(key))) for key in dict.fromkeys(pending)]
        try:
            await produce_record_batches(self._producer, items, _delivered)
        except Exception:
            self._pending[:0] = pending
            raise


def _delivered(_future: Any, _items: Any) -> None:
    """A memo's delivery is not waited for: one lost costs a request, nothing else."""
