"""One deployment's admission state in a tier's limiter (`Gate`): its concurrency limit, the
mirrors of its provider's budgets, its pause and fleet quota. `consumer.runtime.limiter`'s
`AsyncLimiter` is the pool of a tier's gates behind its one waiter queue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from consumer.core.deployments import Room
from consumer.core.limit import ConcurrencyLimit, LimitReason
from consumer.core.pacing import BudgetPacer, TokenBudget
from consumer.runtime.quotas import FleetQuota

__all__ = ["Gate", "NoDeploymentUp"]


class _Pool(Protocol):
    """What a gate knows of the limiter it belongs to."""

    @property
    def waiting(self) -> int: ...

    def wake(self) -> None: ...


class NoDeploymentUp(Exception):
    """Raised to a waiter (not a probe) when every deployment's circuit is open: its caller
    goes back to the circuit, which holds it or moves it to the fallback tier."""


class Gate:
    """One deployment's admission state: its concurrency limit, the mirrors of its provider's
    budgets, its pause and its fleet quota. The pool (`AsyncLimiter`) asks each gate whether it
    admits a request now; `up` says whether its circuit is closed (None: always).

    It is the quota's user (`consumer.runtime.quotas.QuotaUser`): it counts the pool's waiters
    in the quota's demand only when it is the pool's first gate naming that quota.
    """

    __slots__ = (
        "_counts_waiting", "_pool", "algorithm", "cost_ratio", "index", "inflight", "pacer",
        "paused_until_s", "quota", "seq", "tokens", "up", "weight",
    )

    def __init__(
        self,
        algorithm: ConcurrencyLimit,
        *,
        pacer: BudgetPacer | None = None,
        tokens: TokenBudget | None = None,
        quota: FleetQuota | None = None,
        weight: float = 1.0,
        up: Callable[[], bool] | None = None,
    ) -> None:
        self.algorithm = algorithm
        self.pacer = pacer if pacer is not None else BudgetPacer()
        self.tokens = tokens if tokens is not None else TokenBudget()
        self.quota = quota
        self.weight = weight
        self.up = up
        self.cost_ratio = 1.0  # actual / estimated tokens of answered requests, smoothed
        self.inflight = 0
        self.seq = 0
        self.paused_until_s = 0.0
        self.index = 0
        self._pool: _Pool | None = None
        self._counts_waiting = False

    def join(self, pool: _Pool, index: int, *, counts_waiting: bool) -> None:
        """It is `pool`'s gate number `index` (its quota, if any, counts the pool's waiters in
        its demand when `counts_waiting`)."""
        self._pool, self.index, self._counts_waiting = pool, index, counts_waiting
        if self.quota is not None:
            self.quota.attach(self)

    @property
    def limit(self) -> int:
        return self.algorithm.limit

    @property
    def waiting(self) -> int:
        pool = self._pool
        return pool.waiting if pool is not None and self._counts_waiting else 0

    def wake(self) -> None:
        if self._pool is not None:
            self._pool.wake()

    def is_up(self) -> bool:
        return self.up is None or self.up()

    def mirror_wait_s(self, estimated_tokens: float, now_s: float) -> float:
        """Seconds until the mirrors of the provider's budgets hold a request of these tokens."""
        return max(self.pacer.wait_s(now_s), self.tokens.wait_s(estimated_tokens * self.cost_ratio, now_s))

    def wait_s(self, estimated_tokens: float, now_s: float) -> float:
        """Seconds until its pause and mirrors admit the request (0.0: now; the quota apart)."""
        return max(self.paused_until_s - now_s, self.mirror_wait_s(estimated_tokens, now_s), 0.0)

    def limit_reason(self, waiting_tokens: float | None, now_s: float) -> LimitReason:
        """Why the deployment admits what it does: paused, or (with a request of
        `waiting_tokens` estimated tokens waiting, None: none, and a slot free) held back by its
        provider's announced budgets or its fleet quota share, else what its limit algorithm
        says."""
        if self.paused_until_s > now_s:
            return "paused"
        if waiting_tokens is not None and self.inflight < self.limit:
            if self.mirror_wait_s(waiting_tokens, now_s) > 0:
                return "paced"
            if self.quota is not None:
                return "quota_share"
        return self.algorithm.reason

    def room(self, ready: bool, now_s: float) -> Room:
        level = self.pacer.level(now_s)
        return Room(self.is_up(), ready, self.limit - self.inflight, level, self.weight, self.seq)
