"""How many request plans of a tier run at once; the others wait here, compactly.

A plan is a task with its request plan, task group and limiter wait: several KB. Past the
tier's concurrency limit a started plan only waits for a limiter slot, so with a slow
provider and `max_inflight` jobs held, a task per held unbatched job would be most of the
memory a held job costs. `PlanGate` starts at most `limit` plans per key (a tier and a lane:
a lane's plans never queue behind another lane's, so the limiter's lane priority sees them)
and keeps the rest as (members, key) in arrival order, starting the next one as a plan ends. The limit is a
multiple of the limiter's highest limit: plans sleeping out a retry backoff hold no slot, and
the limiter must still find work whenever it opens one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["MIN_RUNNING_PLANS", "PLANS_PER_SLOT", "PlanGate", "running_plan_limit"]

K = TypeVar("K")
T = TypeVar("T")

#: plans running per slot of the limiter's highest limit
PLANS_PER_SLOT = 4
#: plans that may always run per tier, however low its limiter's highest limit
MIN_RUNNING_PLANS = 64


def running_plan_limit(limiter_max: int) -> int:
    """Plans of a tier that may run at once, for its limiter's highest limit."""
    return max(MIN_RUNNING_PLANS, PLANS_PER_SLOT * limiter_max)


class PlanGate(Generic[K, T]):
    """Per key: at most `limit_of(key)` plans running (`launch` starts one and returns its
    task); the rest queued in arrival order."""

    def __init__(
        self, limit_of: Callable[[K], int], launch: Callable[[K, T], asyncio.Task[None]]
    ) -> None:
        self._limit_of = limit_of
        self._launch = launch
        self._limits: dict[K, int] = {}
        self._running: dict[K, int] = {}
        self._queued: dict[K, deque[T]] = {}

    def submit(self, key: K, plan: T) -> None:
        """Start the plan now when its key has room, else queue it."""
        limit = self._limits.get(key)
        if limit is None:
            limit = self._limits[key] = self._limit_of(key)
            self._running[key], self._queued[key] = 0, deque()
        if self._running[key] < limit:
            self._start(key, plan)
        else:
            self._queued[key].append(plan)

    def _start(self, key: K, plan: T) -> None:
        self._running[key] += 1
        task = self._launch(key, plan)
        task.add_done_callback(lambda _: self._ended(key))

    def _ended(self, key: K) -> None:
        self._running[key] -= 1
        queue = self._queued[key]
        while queue and self._running[key] < self._limits[key]:
            self._start(key, queue.popleft())

    def queued(self) -> int:
        """Plans waiting to start, over all keys."""
        return sum(len(q) for q in self._queued.values())

    def drop(self, matches: Callable[[T], bool]) -> list[T]:
        """Remove the queued plans `matches` selects (revoked partitions, shutdown); return them."""
        dropped: list[T] = []
        for key, queue in self._queued.items():
            kept: deque[T] = deque()
            for plan in queue:
                (dropped if matches(plan) else kept).append(plan)
            self._queued[key] = kept
        return dropped
