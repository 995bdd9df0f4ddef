"""The hand-over topic: where an old owner publishes the work it hands over at a rebalance and
a new owner reads it (`consumer.core.handover`).

`HandOverBoard` is the Protocol; `TopicHandOverBoard` keeps it on a group's board
(`consumer.kafka.board.TopicBoard`) on the compacted `PROMPTBUS_HANDOVER_TOPIC` (one
partition, compact,delete, a day's retention: a hand-over matters for a deadline's time). Each
hand-over is one key of the board (group, instance, name); its finished record replaces it.
The same class runs on the memory edges (a memory follower and producer under the board).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import orjson

from consumer.core.handover import HandOver
from consumer.core.offsets import DoneOffsets
from consumer.kafka.board import TopicBoard

log = logging.getLogger(__name__)

__all__ = ["HandOverBoard", "TopicHandOverBoard", "decode_hand_over", "encode_hand_over"]


class HandOverBoard(Protocol):
    """The group's hand-overs: published by old owners, read by new ones."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, handovers: Sequence[HandOver]) -> None:
        """Publish these hand-overs and wait until the broker has them."""
        ...

    async def read_to_end(self, timeout_s: float) -> bool:
        """Wait (bounded) until every hand-over published before this call is read."""
        ...

    def handovers(self) -> list[HandOver]:
        """The latest record of every hand-over of this group read so far."""
        ...

    @property
    def version(self) -> int:
        """Grows whenever records were read."""
        ...


def encode_hand_over(h: HandOver) -> bytes:
    return orjson.dumps(
        {
            "topic": h.topic,
            "partition": h.partition,
            "offsets": h.offsets.ranges,
            "deadline_ms": h.deadline_ms,
            "finished": h.finished,
            "completed": h.completed.ranges,
        }
    )


def decode_hand_over(name: str, value: bytes) -> HandOver | None:
    """The hand-over in `value`; None (logged) for a record that is not one."""
    try:
        raw = orjson.loads(value)
        return HandOver(
            name,
            str(raw["topic"]),
            int(raw["partition"]),
            DoneOffsets(tuple((int(a), int(b)) for a, b in raw["offsets"])),
            int(raw["deadline_ms"]),
            bool(raw["finished"]),
            DoneOffsets(tuple((int(a), int(b)) for a, b in raw["completed"])),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        log.warning("hand-over record %r is not readable; ignored", name)
        return None


class TopicHandOverBoard:
    """`HandOverBoard` on a group's board over the hand-over topic."""

    def __init__(self, board: TopicBoard) -> None:
        self._board = board
        self._read: dict[tuple[str, str, bytes], HandOver | None] = {}

    async def start(self) -> None:
        await self._board.start()

    async def stop(self) -> None:
        await self._board.stop()

    async def publish(self, handovers: Sequence[HandOver]) -> None:
        await self._board.publish((h.name, encode_hand_over(h)) for h in handovers)

    async def read_to_end(self, timeout_s: float) -> bool:
        return await self._board.read_to_end(timeout_s)

    def handovers(self) -> list[HandOver]:
        out = []
        read = self._read
        for record in self._board.records():
            # a record's value decoded once (a key's latest value changes as it is replaced)
            key = (record.instance, record.name, record.value)
            h = read.get(key, ...)
            if h is ...:
                h = read[key] = decode_hand_over(f"{record.instance}/{record.name}", record.value)
            if h is not None:
                out.append(h)
        if len(read) > 4 * len(out) + 64:  # replaced values: forget them
            live = {(r.instance, r.name, r.value) for r in self._board.records()}
            self._read = {k: v for k, v in read.items() if k in live}
        return out

    @property
    def version(self) -> int:
        return self._board.version
