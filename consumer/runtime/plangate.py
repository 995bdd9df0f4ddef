"""How many request plans of a tier run at once; the others wait here, compactly.

A plan is a task with its request plan, task group and limiter wait: several KB. Past the
tier's concurrency limit a started plan only waits for a limiter slot, so with a slow
provider and `max_inflight` jobs held, a task per held unbatched job would be most of the
memory a held job costs. `PlanGate` starts at most `limit` plans per key (a tier, a lane and
a tenant account: a lane's or an account's plans never queue behind another's running ones, so
the limiter's lane priority and fair share see them) and keeps the rest as (members, key),
starting the next one as a plan ends: the plan of the tenant with the least weighted service
so far (the tenants the tier file does not name share one account), and within a tenant the
nearest deadline, then the first come (`consumer.core.fairshare`), so one tenant's flood never
fills the queue ahead of another tenant's few. The limit is a multiple of the limiter's highest limit: plans
sleeping out a retry backoff hold no slot, and the limiter must still find work whenever it
opens one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from consumer.core.fairshare import FairQueue
from consumer.core.tenants import DEFAULT_TENANT

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
    task); the rest queued by tenant (`weight_of`: a tenant's fair-share weight)."""

    def __init__(
        self,
        limit_of: Callable[[K], int],
        launch: Callable[[K, T], asyncio.Task[None]],
        weight_of: Callable[[str], float] = lambda _tenant: 1.0,
    ) -> None:
        self._limit_of = limit_of
        self._launch = launch
        self._weight_of = weight_of
        self._limits: dict[K, int] = {}
        self._running: dict[K, int] = {}
        self._queued: dict[K, FairQueue[T]] = {}

    def submit(
        self, key: K, plan: T, tenant: str = DEFAULT_TENANT, deadline_s: float | None = None
    ) -> None:
        """Start the plan now when its key has room, else queue it as `tenant`'s."""
        limit = self._limits.get(key)
        if limit is None:
            limit = self._limits[key] = self._limit_of(key)
            self._running[key], self._queued[key] = 0, FairQueue(self._weight_of)
        if self._running[key] < limit:
            self._start(key, plan)
        else:
            self._queued[key].push(plan, tenant, deadline_s)

    def _start(self, key: K, plan: T) -> None:
        self._running[key] += 1
        task = self._launch(key, plan)
        task.add_done_callback(lambda _: self._ended(key))

    def _ended(self, key: K) -> None:
        self._running[key] -= 1
        queue = self._queued[key]
        while queue and self._running[key] < self._limits[key]:
            plan = queue.pop()
            assert plan is not None
            self._start(key, plan)

    def queued(self) -> int:
        """Plans waiting to start, over all keys."""
        return sum(len(q) for q in self._queued.values())

    def drop(self, matches: Callable[[T], bool]) -> list[T]:
        """Remove the queued plans `matches` selects (revoked partitions, shutdown); return them."""
        return [plan for queue in self._queued.values() for plan in queue.remove_where(matches)]
