"""What each source key's last enrichment read and answered, kept across restarts and
instances: the memo that lets `unchanged: skip` write an update of a key whose prompt fields
did not change with the answer it already has, without asking the model again.

It lives in a compacted topic (`PROMPTBUS_ENRICHMENTS_TOPIC`): key `SOURCE NUL RECORD-KEY`,
value `{"read": digest, "answer": ...}` (a tombstone when the row was deleted). Every instance
reads the whole topic at start and follows it (a group's board, `consumer.kafka.board`), so a
key's memo is there whichever instance its partition moves to; whether or not Debezium sends
`before` does not matter, since what the record is compared with is the memo. An instance writes
what it enriched (batched, every `FLUSH_S`): a memo lost in a crash only costs one more request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NamedTuple

import orjson

from consumer.kafka.board import TopicFollower
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
    return source.encode() + b"\x00" + key


class EnrichmentMemo:
    """The memo topic read (`follower`) and written (`producer`, aiokafka's `send`)."""

    def __init__(self, follower: TopicFollower, producer: Any, topic: str) -> None:
        self._follower = follower
        self._producer = producer
        self._topic = topic
        #: what this instance wrote (None: forgot) and has not read back yet; wins over the topic's
        self._mine: dict[bytes, bytes | None] = {}
        self._pending: list[tuple[bytes, bytes | None]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._follower.start()
        self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(Exception):
            await self._flush()
        await self._follower.stop()

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
        value = orjson.dumps({"read": read, "answer": answer})
        self._mine[mk] = value
        self._pending.append((mk, value))

    def forget(self, source: str, key: bytes | None) -> None:
        if key is None:
            return
        mk = memo_key(source, key)
        self._mine[mk] = None
        self._pending.append((mk, None))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self._flush()
            except Exception as exc:  # a broker hiccup: memos are an optimisation, the next flush tries again
                log.warning("enrichment memo: could not write %d entries: %s", len(self._pending), exc)

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            for key, value in pending:
                await self._producer.send(self._topic, value, key=key)
        except Exception:
            self._pending[:0] = pending
            raise
