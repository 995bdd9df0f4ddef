"""Which waiting request gets a tier limiter's free slot (docs/operations.md "Lanes").

`LaneScheduler` holds the waiting items (a limiter's waiters) by lane and hands out the next:

1. a lane that has requests waiting and has fallen a whole slot behind its `min_share` of the
   slots granted over the last `window_s` seconds is owed one; the lane owed most (then the
   higher) wins (a whole slot: a lane is not owed the very first slots of a quiet tier);
2. otherwise the highest lane with a request waiting wins;
3. within a lane, the request whose jobs' deadline is nearest goes first (no deadline: after
   every request with one); equal deadlines go first come, first served.

So an urgent lane takes every slot it can use, and a lower lane with work waiting still gets
at least its `min_share` of the tier's requests whenever the higher lanes would take them
all: nothing starves. Pure: the caller passes `now_s` and performs the grant.
"""

from __future__ import annotations

import collections
import heapq
import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from consumer.core.lanes import Lane

__all__ = ["SHARE_WINDOW_S", "LaneScheduler"]

T = TypeVar("T")

#: the span `min_share` is measured over ("over any few seconds")
SHARE_WINDOW_S = 5.0


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
