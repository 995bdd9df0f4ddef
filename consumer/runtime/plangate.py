"""How many request plans of a tier run at once; the others wait here, compactly.

A plan is a task with its request plan, task group and limiter wait: several KB. Past the
tier's concurrency limit a started plan only waits for a limiter slot, so with a slow
provider and `max_inflight` jobs held, a task per held unbatched job would be most of the
memory a held job costs. `PlanGate` runs at most `limit` plans per key (a tier, a lane and a
tenant account: a lane's or an account's plans never queue behind another's running ones, so
the limiter's lane priority and fair share see them) and keeps the rest as (members, key). A
running plan's task, once its plan ends, runs the next queued plan of its key itself: the plan
of the tenant with the least weighted service so far (the tenants the tier file does not name
share one account), and within a tenant the nearest deadline, then the first come
(`consumer.core.fairshare`), so one tenant's flood never fills the queue ahead of another
tenant's few. Under a backlog the same tasks run plan after plan, and a task is made only when
a key has room and nothing queued. The limit is a multiple of the limiter's highest limit:
plans sleeping out a retry backoff hold no slot, and the limiter must still find work whenever
it opens one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

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
    """Per key: at most `limit_of(key)` plans running, the rest queued by tenant.

    run: runs one plan (a plan that fails has logged why and left its jobs uncommitted; the
    task goes on with the next); spawn: makes a task of a coroutine (one the service's drain
    waits for); weight_of: a tenant's fair-share weight.
    """

    def __init__(
        self,
        limit_of: Callable[[K], int],
        run: Callable[[K, T], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        weight_of: Callable[[str], float] = lambda _tenant: 1.0,
    ) -> None:
        self._limit_of = limit_of
        self._run = run
        self._spawn = spawn
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
            self._running[key] += 1
            self._spawn(self._drive(key, plan))
        else:
            self._queued[key].push(plan, tenant, deadline_s)

    async def _drive(self, key: K, plan: T) -> None:
        """Run `plan`, then the queued plans of its key one after another until none is left."""
        queue = self._queued[key]
        try:
            while True:
                try:
                    await self._run(key, plan)
                except Exception:
                    pass
                following = queue.pop()
                if following is None:
                    return
                plan = following
        finally:
            self._running[key] -= 1

    def queued(self) -> int:
        """Plans waiting to start, over all keys."""
        return sum(len(q) for q in self._queued.values())

    def drop(self, matches: Callable[[T], bool]) -> list[T]:
        """Remove the queued plans `matches` selects (revoked partitions, shutdown); return them."""
        return [plan for queue in self._queued.values() for plan in queue.remove_where(matches)]
