"""Hand-over of a partition's running work at a rebalance (DESIGN.md "Rebalances").

When a partition moves, its old owner usually has requests running for some of its records.
Rather than let the new owner read those records again and ask the same questions (an answer
time lost, and the old owner's answers thrown away), the old owner publishes a `HandOver`:
the offsets it still has in flight and a deadline. It keeps working on them and writes their
outcomes; once those are durable it publishes the same hand-over again, `finished`, naming
the offsets it `completed` (the ones it gave up are left to the new owner).

The new owner meanwhile parks those offsets: it tracks them (its commits wait for them) but
does not run them; it takes every other record of the partition as usual. A finished
hand-over completes the offsets it names (no outcome is written by the new owner: the old one
wrote it) and releases the others; at the deadline, with no finished record, the new owner
runs them itself. So the commit rule holds: the new owner commits past an offset only once
the old owner's outcome for it was acknowledged.

Pure bookkeeping here: what the old owner still owes (`OutgoingHandOver`) and, from every
hand-over read, what a new owner does with a record it reads (`HandOverBook.verdict`). Times
are wall-clock milliseconds, passed in: the deadline is read on another machine.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace

from consumer.core.offsets import NO_OFFSETS, DoneOffsets

__all__ = ["HandOver", "HandOverBook", "OutgoingHandOver", "Verdict"]


@dataclass(frozen=True, slots=True)
class HandOver:
    """One partition's work handed from an old owner to the next one.

    name: unique per hand-over (its key; the finished record replaces the first one);
    offsets: in flight at the old owner when it handed over; deadline_ms: wall-clock time
    past which the new owner runs them itself; finished: the old owner writes nothing more
    for them; completed: of `offsets`, those whose outcomes are durable (when finished).
    """

    name: str
    topic: str
    partition: int
    offsets: DoneOffsets
    deadline_ms: int
    finished: bool = False
    completed: DoneOffsets = NO_OFFSETS

    def withdrawn(self) -> HandOver:
        """The record of a hand-over made void (the partition stayed here): finished, naming none."""
        return replace(self, finished=True, completed=NO_OFFSETS)


class Verdict(enum.Enum):
    """What the new owner does with a record of a partition it was handed."""

    RUN = "run"  # an ordinary record: take it in
    PARK = "park"  # the old owner is working on it: wait for its outcome
    COMPLETED = "completed"  # the old owner's outcome is durable: count it done, write nothing


class OutgoingHandOver:
    """What an old owner still owes one hand-over: its offsets not completed nor given up."""

    def __init__(self, handover: HandOver) -> None:
        self.handover = handover
        self._pending = set(handover.offsets)
        self._completed: list[int] = []

    @property
    def open(self) -> bool:
        """True while some offset is neither completed nor given up."""
        return bool(self._pending)

    def owes(self, offset: int) -> bool:
        return offset in self._pending

    def complete(self, offset: int) -> bool:
        """The outcome of `offset` is durable; True when it was owed."""
        if offset not in self._pending:
            return False
        self._pending.discard(offset)
        self._completed.append(offset)
        return True

    def give_up(self, offset: int) -> bool:
        """No outcome will come for `offset` from here (the new owner runs it); True when owed."""
        if offset not in self._pending:
            return False
        self._pending.discard(offset)
        return True

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.handover.deadline_ms

    def finished(self) -> HandOver:
        """The record saying so: the completed offsets are done, the rest the new owner's."""
        self._pending.clear()
        return replace(self.handover, finished=True, completed=DoneOffsets.of(self._completed))


class HandOverBook:
    """Every hand-over read (the latest record of each name), and what it makes of a record.

    An offset is COMPLETED when a finished hand-over of its partition names it completed;
    else PARKED while an unfinished one holds it and its deadline has not passed; else RUN.
    A hand-over withdrawn by its old owner (it kept the partition) is finished with nothing
    completed, so it parks nothing.
    """

    def __init__(self) -> None:
        self._parked: dict[Hashable, list[HandOver]] = {}
        self._completed: dict[Hashable, DoneOffsets] = {}

    def load(self, handovers: Iterable[HandOver], *, now_ms: int | None = None, keep_ms: int = 0) -> None:
        """Replace what is known with these hand-overs (each name's latest record).

        With `now_ms`, a hand-over whose deadline passed more than `keep_ms` ago is left out:
        by then its new owner has committed past what it completed (else those records are
        done again, a duplicate, never a loss), and a topic deleted and made again under the
        same name cannot meet an old hand-over's offsets for long.
        """
        parked: dict[Hashable, list[HandOver]] = {}
        completed: dict[Hashable, DoneOffsets] = {}
        for h in handovers:
            if now_ms is not None and h.deadline_ms + keep_ms < now_ms:
                continue
            tp = (h.topic, h.partition)
            if h.finished:
                if h.completed:
                    completed[tp] = completed.get(tp, NO_OFFSETS).union(h.completed)
            elif h.offsets:
                parked.setdefault(tp, []).append(h)
        self._parked, self._completed = parked, completed

    def verdict(self, topic: str, partition: int, offset: int, now_ms: int) -> Verdict:
        tp = (topic, partition)
        done = self._completed.get(tp)
        if done is not None and offset in done:
            return Verdict.COMPLETED
        for h in self._parked.get(tp, ()):
            if offset in h.offsets and now_ms < h.deadline_ms:
                return Verdict.PARK
        return Verdict.RUN

    @property
    def active(self) -> bool:
        """Whether any hand-over parks or completes anything."""
        return bool(self._parked or self._completed)

    def touches(self, topic: str, partition: int) -> bool:
        """Whether any hand-over names this partition (else every record of it runs)."""
        tp = (topic, partition)
        return tp in self._parked or tp in self._completed
