"""The async limiter: FIFO admission within the limit, tokens, and pauses that never stall."""

from __future__ import annotations

import asyncio

from consumer.core.limit import AIMDLimit, FixedLimit
from consumer.runtime.limiter import AsyncLimiter


async def test_admits_at_most_limit_and_serves_waiters_in_order() -> None:
    limiter = AsyncLimiter(FixedLimit(2))
    order: list[int] = []
    peak = 0

    async def worker(i: int) -> None:
        nonlocal peak
        token = await limiter.acquire()
        order.append(i)
        peak = max(peak, limiter.inflight)
        await asyncio.sleep(0.01)
        token.success()

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(10))), timeout=10)
    assert peak == 2
    assert order == list(range(10))
    assert limiter.inflight == 0 and limiter.waiting == 0


async def test_pause_with_nothing_in_flight_does_not_stall_waiters() -> None:
    """Waiters queued behind a pause must all be admitted once it ends (nothing else wakes them)."""
    limiter = AsyncLimiter(FixedLimit(4))
    limiter.pause(0.05)
    done = 0

    async def worker() -> None:
        nonlocal done
        token = await limiter.acquire()
        await asyncio.sleep(0.001)
        token.success()
        done += 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(12))), timeout=10)
    assert done == 12


async def test_dropped_tokens_shrink_an_aimd_limit_and_ignored_ones_do_not() -> None:
    limiter = AsyncLimiter(AIMDLimit(8, min_limit=1, max_limit=16))
    (await limiter.acquire()).ignore()
    assert limiter.limit == 8
    (await limiter.acquire()).dropped()
    assert limiter.limit == 4
    token = await limiter.acquire()
    token.success()
    token.success()  # ending a token twice counts once
    assert limiter.inflight == 0


async def test_announced_request_budget_paces_admissions() -> None:
    """With 2 requests left in the provider's window, the third waits for the window's reset."""
    from consumer.core.errors import RateLimitHint

    clock = [0.0]
    limiter = AsyncLimiter(FixedLimit(8), clock=lambda: clock[0])
    limiter.note_budget(RateLimitHint(remaining_requests=2, reset_requests_s=30.0))
    first = await limiter.acquire()
    second = await limiter.acquire()
    assert limiter.paused_for_s == 30.0, "the budget is spent: pause until the window resets"
    third = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()
    clock[0] = 31.0  # the window reset
    limiter._wake()
    token = await asyncio.wait_for(third, timeout=5)
    for t in (first, second, token):
        t.success()
    limiter.note_budget(RateLimitHint(remaining_requests=0, reset_requests_s=5.0))
    assert limiter.paused_for_s == 5.0
