"""Lanes: job topics with a priority, sharing each tier's provider fairly (DESIGN.md "lanes").

A `Lane` is one job topic and how urgent its jobs are. The lane of a job is the lane whose
topic it was read from. Lanes are ranked (0 = the highest, the first lane of the tier file).

`LaneScheduler` decides which waiting request gets a tier limiter's free slot:

1. a lane that has requests waiting and has fallen a whole slot behind its `min_share` of the
   slots granted over the last `window_s` seconds is owed one; the lane owed most (then the
   higher) wins (a whole slot: a lane is not owed the very first slots of a quiet tier);
2. otherwise the highest lane with a request waiting wins;
3. within a lane, the request whose jobs' deadline is nearest goes first (no deadline: after
   every request with one); equal deadlines go first come, first served.

So an urgent lane takes every slot it can use, and a lower lane with work waiting still gets
at least its `min_share` of the tier's requests whenever the higher lanes would take them
all: nothing starves. Pure: the caller passes `now_s` and performs the grant.

`LaneWindows` keeps the collection windows (`consumer.core.window`) of lanes apart where
sharing would delay a job: a window holding a job of a lane with `max_wait_ms` flushes at most
that long after its first member (and waits at most that long for a next one). Jobs of
different lanes share a window, and so a packed prompt, only when their lanes flush by the
same wait, so neither waits longer than it would alone; the request then waits for its slot
in the more urgent lane (`pack_lane`), so the other is not delayed there either.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from consumer.core.window import CollectionWindows, Flush, PackKey, WindowLimits

__all__ = [
    "DEFAULT_LANE_NAME",
    "DEFAULT_MIN_SHARE",
    "SHARE_WINDOW_S",
    "Lane",
    "LaneScheduler",
    "LaneWindows",
    "pack_lane",
]

T = TypeVar("T")

#: the name of the one lane a service without `lanes` runs (on the jobs topic)
DEFAULT_LANE_NAME = "default"
#: the share of a tier's requests a lane below the first keeps when it names none: enough that
#: a lane with work always moves (one request in twenty while the lanes above would take every
#: slot), small enough that the urgent lanes keep nineteen in twenty. The first lane needs none:
#: it wins every slot no other lane is owed.
DEFAULT_MIN_SHARE = 0.05
#: the span `min_share` is measured over ("over any few seconds")
SHARE_WINDOW_S = 5.0


@dataclass(frozen=True, slots=True)
class Lane:
    """One job topic and its place among the lanes.

    name: as in the tier file (results carry it); topic: the Kafka topic its jobs are read
    from; rank: 0 for the highest lane, then 1, 2, ...; min_share: the share of each tier's
    requests it keeps while it has work waiting; max_inflight: its records held before its
    partitions pause; max_wait_ms: a collection window holding one of its jobs flushes at most
    this long after the job arrived (None: the tier's `batching.max_wait_ms`).
    """

    name: str
    topic: str
    rank: int = 0
    min_share: float = 0.0
    max_inflight: int = 10_000
    max_wait_ms: float | None = None


def pack_lane(lanes: list[Lane]) -> Lane:
    """The lane a request carrying jobs of `lanes` is scheduled in: the highest of them (a
    request is as urgent as its most urgent job)."""
    return min(lanes, key=lambda lane: lane.rank)


@dataclass(order=True, slots=True)
class _Entry(Generic[T]):
    deadline_s: float
    seq: int
    item: T = field(compare=False)
    alive: bool = field(default=True, compare=False)


@dataclass(slots=True)
class _LaneQueue(Generic[T]):
    lane: Lane
    heap: list[_Entry[T]] = field(default_factory=list)
    live: int = 0

    def head(self) -> _Entry[T]:
        while not self.heap[0].alive:
            heapq.heappop(self.heap)
        return self.heap[0]


class LaneScheduler(Generic[T]):
    """Waiting items (a limiter's waiters) by lane; `pop` hands out the next one by the rules
    of this module. Lanes are learnt from the items pushed (nothing to configure)."""

    def __init__(self, window_s: float = SHARE_WINDOW_S) -> None:
        self._window_s = window_s
        self._queues: dict[str, _LaneQueue[T]] = {}
        self._ranked: list[_LaneQueue[T]] = []
        self._entries: dict[int, tuple[_LaneQueue[T], _Entry[T]]] = {}
        #: (grant time, lane name), oldest first, within window_s
        self._grants: collections.deque[tuple[float, str]] = collections.deque()
        self._granted: collections.Counter[str] = collections.Counter()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def waiting(self, lane: str) -> int:
        """Items of `lane` waiting."""
        queue = self._queues.get(lane)
        return queue.live if queue is not None else 0

    def granted(self, lane: str, now_s: float) -> int:
        """Items of `lane` handed out within the last `window_s` seconds."""
        self._expire(now_s)
        return self._granted[lane]

    def push(self, item: T, lane: Lane, deadline_s: float | None = None) -> None:
        """Queue `item` in `lane`, ordered by `deadline_s` (None: no deadline)."""
        queue = self._queues.get(lane.name)
        if queue is None:
            queue = self._queues[lane.name] = _LaneQueue(lane)
            self._ranked.append(queue)
            self._ranked.sort(key=lambda q: (q.lane.rank, q.lane.name))
        self._seq += 1
        entry = _Entry(math.inf if deadline_s is None else deadline_s, self._seq, item)
        heapq.heappush(queue.heap, entry)
        queue.live += 1
        self._entries[id(item)] = (queue, entry)

    def discard(self, item: T) -> bool:
        """Forget a waiting item (its waiter gave up); False when it is not waiting."""
        found = self._entries.pop(id(item), None)
        if found is None:
            return False
        queue, entry = found
        entry.alive = False
        queue.live -= 1
        return True

    def peek(self, now_s: float) -> T | None:
        """The item `pop(now_s)` would hand out, left waiting (None: nothing waits)."""
        queue = self._choose(now_s)
        return queue.head().item if queue is not None else None

    def pop(self, now_s: float) -> T | None:
        """Hand out the next item and count the grant to its lane (None: nothing waits)."""
        queue = self._choose(now_s)
        if queue is None:
            return None
        entry = queue.head()
        heapq.heappop(queue.heap)
        queue.live -= 1
        del self._entries[id(entry.item)]
        name = queue.lane.name
        self._grants.append((now_s, name))
        self._granted[name] += 1
        return entry.item

    def _expire(self, now_s: float) -> None:
        horizon_s = now_s - self._window_s
        grants = self._grants
        while grants and grants[0][0] <= horizon_s:
            _, name = grants.popleft()
            self._granted[name] -= 1

    def _choose(self, now_s: float) -> _LaneQueue[T] | None:
        self._expire(now_s)
        total = len(self._grants)
        owed: _LaneQueue[T] | None = None
        owed_most = 0.0
        first: _LaneQueue[T] | None = None
        for queue in self._ranked:  # highest first
            if queue.live <= 0:
                continue
            if first is None:
                first = queue
            deficit = queue.lane.min_share * total - self._granted[queue.lane.name]
            if deficit >= 1.0 and deficit > owed_most:  # behind by a whole slot at least
                owed, owed_most = queue, deficit
        return owed if owed is not None else first


class LaneWindows(Generic[T]):
    """Collection windows apart by lane wait (`Lane.max_wait_ms`): the same interface as
    `CollectionWindows`, with each item's lane."""

    def __init__(self) -> None:
        self._by_wait: dict[float | None, CollectionWindows[T]] = {}
        #: a tier's limits capped by a lane's wait, made once per (limits, wait)
        self._capped: dict[tuple[WindowLimits, float], WindowLimits] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._by_wait.values())

    def add(
        self,
        key: PackKey,
        item: T,
        *,
        lane: Lane | None,
        input_chars: int,
        partition: Hashable,
        limits: WindowLimits,
        now_s: float,
    ) -> list[Flush[T]]:
        """Put `item` in the window of its key among its lane wait's windows (see
        `CollectionWindows.add`); a lane's max_wait_ms caps the tier's waits."""
        wait_ms = lane.max_wait_ms if lane is not None else None
        windows = self._by_wait.get(wait_ms)
        if windows is None:
            windows = self._by_wait[wait_ms] = CollectionWindows()
        if wait_ms is not None and wait_ms < limits.max_wait_ms:
            capped = self._capped.get((limits, wait_ms))
            if capped is None:
                capped = replace(limits, max_wait_ms=wait_ms, window_ms=min(limits.window_ms, wait_ms))
                self._capped[(limits, wait_ms)] = capped
            limits = capped
        return windows.add(
            key, item, input_chars=input_chars, partition=partition, limits=limits, now_s=now_s
        )

    def due(self, now_s: float, *, can_still_join: Callable[[PackKey], bool]) -> list[Flush[T]]:
        """The windows due at `now_s` (`CollectionWindows.due`)."""
        return [f for w in self._by_wait.values() for f in w.due(now_s, can_still_join=can_still_join)]

    def next_deadline_s(self) -> float | None:
        """The earliest time a window becomes due by time alone, or None without windows."""
        due = [d for w in self._by_wait.values() if (d := w.next_deadline_s()) is not None]
        return min(due) if due else None

    def drain_partitions(self, partitions: Collection[Hashable]) -> list[T]:
        """Remove and return the items read from `partitions` (revoked); others stay."""
        return [i for w in self._by_wait.values() for i in w.drain_partitions(partitions)]

    def drain_all(self) -> list[Flush[T]]:
        """Close every window (shutdown)."""
        return [f for w in self._by_wait.values() for f in w.drain_all()]
