"""Commit watermarks for out-of-order completion (DESIGN.md "Delivery semantics").

Jobs of one partition finish in any order (batching, retries), but Kafka commits one
position per partition: "everything before this offset is done". `OffsetTracker` keeps, per
partition, the offsets read and not yet finished, and yields the watermark: the lowest
unfinished tracked offset, or (when all are finished) the last tracked offset + 1. That is
the Kafka convention for a committed offset (the next offset to read), so committing it
never skips an unfinished job. Offsets need not be contiguous: compaction and transaction
markers leave gaps, and a gap is never waited for.

Offsets must be tracked in increasing order per partition (the order a consumer reads
them); `forget` a partition on revoke, after which late completions are ignored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

__all__ = ["OffsetTracker"]


@dataclass(slots=True)
class _Partition:
    #: tracked offsets in read order, finished ones included until they reach the front
    order: deque[int] = field(default_factory=deque)
    #: tracked offsets not finished yet
    pending: set[int] = field(default_factory=set)
    last_tracked: int = -1
    #: the position last committed (or, before any commit, the first offset tracked)
    committed: int = -1

    def watermark(self) -> int:
        # Finished offsets at the front no longer hold the watermark back: drop them.
        order, pending = self.order, self.pending
        while order and order[0] not in pending:
            order.popleft()
        return order[0] if order else self.last_tracked + 1


class OffsetTracker:
    """Per-partition commit watermarks; partitions are any hashable (e.g. TopicPartition)."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, _Partition] = {}

    def track(self, tp: Hashable, offset: int) -> None:
        """A record at `offset` was read from `tp` and is now in flight.

        Raises ValueError when `offset` is not above the last offset tracked for `tp`
        (a consumer reads in order; a seek back must `forget` the partition first).
        """
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition(committed=offset)
        elif offset <= part.last_tracked:
            raise ValueError(f"offset {offset} of {tp!r} is not above the last tracked {part.last_tracked}")
        part.order.append(offset)
        part.pending.add(offset)
        part.last_tracked = offset

    def complete(self, tp: Hashable, offset: int) -> bool:
        """The record at `offset` of `tp` has its outcome durably written.

        Returns False (and changes nothing) when the offset is not in flight: the partition
        was forgotten (revoked), or the offset was completed already.
        """
        part = self._parts.get(tp)
        if part is None or offset not in part.pending:
            return False
        part.pending.discard(offset)
        return True

    def watermark(self, tp: Hashable) -> int | None:
        """The offset to commit for `tp` now (None for an unknown partition)."""
        part = self._parts.get(tp)
        return part.watermark() if part is not None else None

    def committable(self) -> dict[Hashable, int]:
        """Partitions whose watermark advanced since the last commit -> offset to commit."""
        out: dict[Hashable, int] = {}
        for tp, part in self._parts.items():
            mark = part.watermark()
            if mark > part.committed:
                out[tp] = mark
        return out

    def mark_committed(self, offsets: Mapping[Hashable, int]) -> None:
        """These positions were committed (unknown partitions are ignored)."""
        for tp, offset in offsets.items():
            part = self._parts.get(tp)
            if part is not None and offset > part.committed:
                part.committed = offset

    def forget(self, tp: Hashable) -> None:
        """Drop all state of `tp` (revoked); its late completions are then ignored."""
        self._parts.pop(tp, None)

    def partitions(self) -> list[Hashable]:
        """The partitions being tracked."""
        return list(self._parts)

    def pending_count(self, tp: Hashable | None = None) -> int:
        """Offsets in flight, for `tp` or for all partitions."""
        if tp is not None:
            part = self._parts.get(tp)
            return len(part.pending) if part is not None else 0
        return sum(len(p.pending) for p in self._parts.values())
