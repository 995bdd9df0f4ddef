"""Which waiting request gets a tier limiter's free slot (docs/operations.md "Lanes" and
docs/tenants.md).

`LaneScheduler` holds the waiting items (a limiter's waiters) by lane and hands out the next:

1. a lane that has requests waiting and has fallen a whole slot behind its `min_share` of the
   slots granted over the last `window_s` seconds is owed one; the lane owed most (then the
   higher) wins (a whole slot: a lane is not owed the very first slots of a quiet tier);
2. otherwise the highest lane with a request waiting wins;
3. within a lane, the tenant with the least weighted service so far goes first (weighted fair
   queuing, `consumer.core.fairshare`: a tenant that was idle banks no credit);
4. within a tenant, the request whose jobs' deadline is nearest goes first (no deadline:
   after every request with one); equal deadlines go first come, first served.

So an urgent lane takes every slot it can use, and a lower lane with work waiting still gets
at least its `min_share` of the tier's requests whenever the higher lanes would take them
all: nothing starves; and within a lane one tenant's backlog never goes ahead of another's.
Pure: the caller passes `now_s` and performs the grant.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from consumer.core.fairshare import FairQueue
from consumer.core.lanes import Lane
from consumer.core.tenants import DEFAULT_TENANT

__all__ = ["SHARE_WINDOW_S", "LaneScheduler"]

T = TypeVar("T")

#: the span `min_share` is measured over ("over any few seconds")
SHARE_WINDOW_S = 5.0


@dataclass(slots=True)
class _LaneQueue(Generic[T]):
    lane: Lane
    waiting: FairQueue[T] = field(default_factory=FairQueue)


class LaneScheduler(Generic[T]):
    """Waiting items (a limiter's waiters) by lane and tenant; `pop` hands out the next one by
    the rules of this module. Lanes and tenants are learnt from the items pushed; `weight_of`
    names a tenant's weight (> 0)."""

    def __init__(
        self, window_s: float = SHARE_WINDOW_S, weight_of: Callable[[str], float] = lambda _t: 1.0
    ) -> None:
        self._window_s = window_s
        self._weight_of = weight_of
        self._queues: dict[str, _LaneQueue[T]] = {}
        self._ranked: list[_LaneQueue[T]] = []
        self._lane_of: dict[int, _LaneQueue[T]] = {}
        #: (grant time, lane name), oldest first, within window_s
        self._grants: collections.deque[tuple[float, str]] = collections.deque()
        self._granted: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return len(self._lane_of)

    def waiting(self, lane: str) -> int:
        """Items of `lane` waiting."""
        queue = self._queues.get(lane)
        return len(queue.waiting) if queue is not None else 0

    def waiting_of(self, lane: str, tenant: str) -> int:
        """Items of `tenant` waiting in `lane`."""
        queue = self._queues.get(lane)
        return queue.waiting.waiting(tenant) if queue is not None else 0

    def granted(self, lane: str, now_s: float) -> int:
        """Items of `lane` handed out within the last `window_s` seconds."""
        self._expire(now_s)
        return self._granted[lane]

    def push(
        self, item: T, lane: Lane, deadline_s: float | None = None, tenant: str = DEFAULT_TENANT
    ) -> None:
        """Queue `item` in `lane` for `tenant`, ordered by `deadline_s` (None: no deadline)."""
        queue = self._queues.get(lane.name)
        if queue is None:
            queue = self._queues[lane.name] = _LaneQueue(lane, FairQueue(self._weight_of))
            self._ranked.append(queue)
            self._ranked.sort(key=lambda q: (q.lane.rank, q.lane.name))
        queue.waiting.push(item, tenant, deadline_s)
        self._lane_of[id(item)] = queue

    def discard(self, item: T) -> bool:
        """Forget a waiting item (its waiter gave up); False when it is not waiting."""
        queue = self._lane_of.pop(id(item), None)
        if queue is None:
            return False
        return queue.waiting.discard(item)

    def peek(self, now_s: float) -> T | None:
        """The item `pop(now_s)` would hand out, left waiting (None: nothing waits)."""
        queue = self._choose(now_s)
        return queue.waiting.peek() if queue is not None else None

    def pop(self, now_s: float) -> T | None:
        """Hand out the next item and count the grant to its lane (None: nothing waits)."""
        queue = self._choose(now_s)
        if queue is None:
            return None
        item = queue.waiting.pop()
        assert item is not None
        del self._lane_of[id(item)]
        name = queue.lane.name
        self._grants.append((now_s, name))
        self._granted[name] += 1
        return item

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
            if not queue.waiting:
                continue
            if first is None:
                first = queue
            deficit = queue.lane.min_share * total - self._granted[queue.lane.name]
            if deficit >= 1.0 and deficit > owed_most:  # behind by a whole slot at least
                owed, owed_most = queue, deficit
        return owed if owed is not None else first
