"""How many request plans of a tier run at once; the others wait here, compactly.

A plan is a task with its request plan, task group and limiter wait: several KB. Past the
tier's concurrency limit a started plan only waits for a limiter slot, so with a slow
provider and `max_inflight` jobs held, a task per held unbatched job would be most of the
memory a held job costs. `PlanGate` starts at most `limit` plans per tier and keeps the rest
as (members, key) in arrival order, starting the next one as a plan ends. The limit is a
multiple of the limiter's highest limit: plans sleeping out a retry backoff hold no slot, and
the limiter must still find work whenever it opens one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

__all__ = ["MIN_RUNNING_PLANS", "PLANS_PER_SLOT", "PlanGate", "running_plan_limit"]

T = TypeVar("T")

#: plans running per slot of the limiter's highest limit
PLANS_PER_SLOT = 4
#: plans that may always run per tier, however low its limiter's highest limit
MIN_RUNNING_PLANS = 64


def running_plan_limit(limiter_max: int) -> int:
    """Plans of a tier that may run at once, for its limiter's highest limit."""
    return max(MIN_RUNNING_PLANS, PLANS_PER_SLOT * limiter_max)


class PlanGate(Generic[T]):
    """Per tier: at most `limits[tier]` plans running (`launch` starts one and returns its
    task); the rest queued in arrival order."""

    def __init__(self, limits: Mapping[str, int], launch: Callable[[str, T], asyncio.Task[None]]) -> None:
        self._limits = dict(limits)
        self._launch = launch
        self._running: dict[str, int] = dict.fromkeys(self._limits, 0)
        self._queued: dict[str, deque[T]] = {tier: deque() for tier in self._limits}

    def submit(self, tier: str, plan: T) -> None:
        """Start the plan now when the tier has room, else queue it."""
        if self._running[tier] < self._limits[tier]:
            self._start(tier, plan)
        else:
            self._queued[tier].append(plan)

    def _start(self, tier: str, plan: T) -> None:
        self._running[tier] += 1
        task = self._launch(tier, plan)
        task.add_done_callback(lambda _: self._ended(tier))

    def _ended(self, tier: str) -> None:
        self._running[tier] -= 1
        queue = self._queued[tier]
        while queue and self._running[tier] < self._limits[tier]:
            self._start(tier, queue.popleft())

    def queued(self) -> int:
        """Plans waiting to start, over all tiers."""
        return sum(len(q) for q in self._queued.values())

    def drop(self, matches: Callable[[T], bool]) -> list[T]:
        """Remove the queued plans `matches` selects (revoked partitions, shutdown); return them."""
        dropped: list[T] = []
        for tier, queue in self._queued.items():
            kept: deque[T] = deque()
            for plan in queue:
                (dropped if matches(plan) else kept).append(plan)
            self._queued[tier] = kept
        return dropped
