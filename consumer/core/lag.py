"""Consumer lag per partition: how many records are not committed, and for how long the oldest
of them that this instance has read has waited.

The intake reports, per owned partition, the log end offset, the group's committed offset and
its own fetch position (`PartitionOffsets`). Lag is end minus committed: promptbus commits a
record only once its outcome is acknowledged, so work in flight counts as lag too.

Age: the records between the committed offset and the fetch position were read and are not
committed yet; the oldest of them is the one at the committed offset. `LagTracker` keeps,
per partition, the fetch position at each update ("read up to here by then"); the record at
the committed offset was read no later than the first update whose position is above it, so
its age is at least the time since that update (a lower bound, short by less than the update
interval). A commit watermark held back by one job shows as an age that keeps growing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from typing import Generic, NamedTuple, TypeVar

__all__ = ["LagTracker", "PartitionLag", "PartitionOffsets"]

K = TypeVar("K", bound=Hashable)


class PartitionOffsets(NamedTuple):
    """One owned partition as the intake sees it."""

    #: the log end offset (the last stable offset under read_committed): the next offset written
    end: int
    #: the group's committed offset (the next offset to read after a restart); None: no commit
    #: yet, counted from the partition's first offset (`start`)
    committed: int | None
    #: the next offset this instance's consumer will hand to the pipeline
    position: int
    #: the partition's first offset (log start)
    start: int = 0


class PartitionLag(NamedTuple):
    """What `promptbus_consumer_lag_records` and `promptbus_oldest_uncommitted_age_seconds` show."""

    records: int
    oldest_age_s: float


class LagTracker(Generic[K]):
    """Lag and oldest-uncommitted age per partition from successive `PartitionOffsets`."""

    def __init__(self) -> None:
        #: per partition: (fetch position, time of the update that saw it), increasing
        self._marks: dict[K, deque[tuple[int, float]]] = {}

    def update(self, now_s: float, offsets: Mapping[K, PartitionOffsets]) -> dict[K, PartitionLag]:
        """The lag of every partition in `offsets` (partitions not in it are forgotten)."""
        for gone in set(self._marks) - set(offsets):
            del self._marks[gone]
        out: dict[K, PartitionLag] = {}
        for tp, o in offsets.items():
            committed = o.start if o.committed is None else o.committed
            marks = self._marks.setdefault(tp, deque())
            if marks and o.position < marks[-1][0]:
                marks.clear()  # read again from an earlier offset (assigned afresh)
            if not marks or o.position > marks[-1][0]:
                marks.append((o.position, now_s))
            # marks at or below the committed offset say nothing about what is uncommitted
            while marks and marks[0][0] <= committed:
                marks.popleft()
            age_s = now_s - marks[0][1] if marks and committed < o.position else 0.0
            out[tp] = PartitionLag(max(0, o.end - committed), max(0.0, age_s))
        return out
