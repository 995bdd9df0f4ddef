"""Async concurrency limiter around a pure limit algorithm (`consumer.core.limit`).

A caller acquires a `Token` before a provider call and ends it exactly once:
`success()` (the call returned; its RTT feeds the algorithm), `dropped()` (overload:
429/529/503/timeout — the algorithm shrinks), or `ignore()` (a failure that says nothing
about load, e.g. a 400). Waiters are served first-in first-out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

from consumer.core.errors import RateLimitHint


class LimitAlgorithm(Protocol):
    @property
    def limit(self) -> int: ...

    def update(self, rtt_ms: float, inflight: int, dropped: bool, now_s: float) -> int: ...


class Token:
    """One slot of the limiter; end it exactly once."""

    __slots__ = ("_done", "_limiter", "_started_s")

    def __init__(self, limiter: AsyncLimiter, started_s: float) -> None:
        self._limiter = limiter
        self._started_s = started_s
        self._done = False

    def success(self) -> None:
        self._end(dropped=False, sample=True)

    def dropped(self) -> None:
        self._end(dropped=True, sample=True)

    def ignore(self) -> None:
        self._end(dropped=False, sample=False)

    def _end(self, *, dropped: bool, sample: bool) -> None:
        if self._done:
            return
        self._done = True
        self._limiter._release(self._started_s, dropped=dropped, sample=sample)


class AsyncLimiter:
    """Admits at most `limit` concurrent calls; the limit moves with the algorithm's samples."""

    def __init__(self, algorithm: LimitAlgorithm, clock: Callable[[], float] = time.monotonic) -> None:
        self._algorithm = algorithm
        self._clock = clock
        self._inflight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._paused_until_s = 0.0
        self._wake_timer: asyncio.TimerHandle | None = None
        #: requests the provider said are left in its window, minus those admitted since
        self._budget: int | None = None
        self._budget_reset_s = 1.0

    @property
    def limit(self) -> int:
        return self._algorithm.limit

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def paused_for_s(self) -> float:
        return max(0.0, self._paused_until_s - self._clock())

    def pause(self, duration_s: float) -> None:
        """Admit nothing new for duration_s (quota exhausted, Retry-After): calls already running go on."""
        until_s = self._clock() + duration_s
        if until_s <= self._paused_until_s:
            return
        self._paused_until_s = until_s
        self._wake_after_pause()

    def note_budget(self, hint: RateLimitHint | None) -> None:
        """Pace admissions by the request budget a provider announced (x-ratelimit-remaining-*).

        The limit bounds concurrency, not rate: with a requests-per-minute ceiling, a few slots
        can exhaust the window. Each admission spends one of the announced remaining requests;
        at zero the limiter pauses until the provider's window resets.
        """
        if hint is None or hint.remaining_requests is None:
            return
        self._budget_reset_s = hint.reset_requests_s if hint.reset_requests_s else 1.0
        self._budget = hint.remaining_requests
        if self._budget <= 0:
            self._budget = None
            self.pause(self._budget_reset_s)

    def _spend_budget(self) -> None:
        if self._budget is None:
            return
        self._budget -= 1
        if self._budget <= 0:
            self._budget = None
            self.pause(self._budget_reset_s)

    def _wake_after_pause(self) -> None:
        # nothing else may wake the waiters when a pause ends (nothing in flight to release)
        if self._wake_timer is not None and not self._wake_timer.cancelled():
            self._wake_timer.cancel()
        with contextlib.suppress(RuntimeError):  # no running loop: nobody can be waiting either
            self._wake_timer = asyncio.get_running_loop().call_later(self.paused_for_s + 0.001, self._wake)

    async def acquire(self) -> Token:
        """Wait for a slot: first come, first served; a released slot is handed to the oldest waiter."""
        if self._inflight < self.limit and not self._waiters and self.paused_for_s <= 0:
            self._inflight += 1
            self._spend_budget()
            return Token(self, self._clock())
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake()  # a slot may be free with nothing in flight to release it (after a pause)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._inflight -= 1  # a slot was handed to us that we will not use: pass it on
                self._wake()
            elif fut in self._waiters:
                self._waiters.remove(fut)
            raise
        return Token(self, self._clock())  # _wake counted the slot for us

    def _release(self, started_s: float, *, dropped: bool, sample: bool) -> None:
        now_s = self._clock()
        if sample:
            self._algorithm.update((now_s - started_s) * 1000.0, self._inflight, dropped, now_s)
        self._inflight -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand free slots to the oldest waiters (none while paused)."""
        if self.paused_for_s > 0:
            if self._waiters:
                self._wake_after_pause()
            return
        while self._waiters and self._inflight < self.limit and self.paused_for_s <= 0:
            fut = self._waiters.popleft()
            if not fut.done():
                self._inflight += 1
                self._spend_budget()
                fut.set_result(None)
