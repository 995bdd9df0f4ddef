"""The async limiter: FIFO admission within the limit, tokens, pauses that never stall, and
pacing by the provider's announced budget."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Coroutine
from typing import Any

import pytest

from consumer.core.completion import Usage
from consumer.core.errors import RateLimitHint
from consumer.core.limit import AIMDLimit, FixedLimit
from consumer.runtime.limiter import AsyncLimiter
from consumer.testing.simulator import TokenBucket


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
    """With 2 requests left and no rate known yet, the third waits for the announced reset."""
    clock = [0.0]
    limiter = AsyncLimiter(FixedLimit(8), clock=lambda: clock[0])
    limiter.note_budget(RateLimitHint(remaining_requests=2, reset_requests_s=30.0))
    first = await limiter.acquire()
    second = await limiter.acquire()
    assert limiter.pacing_wait_s == pytest.approx(30.0, abs=0.01), "spent: wait until the bucket is full"
    third = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()
    clock[0] = 31.0  # the bucket refilled
    limiter._wake()
    token = await asyncio.wait_for(third, timeout=5)
    for t in (first, second, token):
        t.success()
    limiter.note_budget(RateLimitHint(remaining_requests=0, reset_requests_s=5.0), token)
    assert limiter.pacing_wait_s == pytest.approx(5.0, abs=0.01)


async def drive(
    client: Coroutine[Any, Any, None], limiter: AsyncLimiter, clock: list[float], *, run_s: float
) -> None:
    """Run `client` while the fake clock advances in 5 ms steps, up to run_s (bounded)."""
    task = asyncio.create_task(client)
    for _ in range(round(run_s / 0.005)):
        if task.done():
            break
        clock[0] = round(clock[0] + 0.005, 3)
        limiter._wake()  # the limiter's timers run on the loop's clock, not the fake one
        for _ in range(3):
            await asyncio.sleep(0)
    await asyncio.wait_for(task, timeout=5)


def _hint(bucket: TokenBucket) -> RateLimitHint:
    """What the simulator's headers say about `bucket` (remaining rounded down, reset in ms)."""
    return RateLimitHint(
        remaining_requests=math.floor(bucket.level), reset_requests_s=round(bucket.full_in_s(), 3)
    )


async def test_admission_spacing_follows_the_hinted_rate() -> None:
    """Against a bucket of 5 refilled at 10/s (answers at once): the first ones go together,
    then one per 100 ms of the limiter's clock, and the bucket never refuses one."""
    clock = [0.0]
    limiter = AsyncLimiter(FixedLimit(64), clock=lambda: clock[0])
    bucket = TokenBucket()
    admitted_at: list[float] = []
    refused = 0

    async def client() -> None:
        nonlocal refused
        for _ in range(40):
            token = await limiter.acquire()
            admitted_at.append(clock[0])
            bucket.configure(5, 0.5, clock[0])
            if bucket.level < 1:
                refused += 1
                token.dropped()
                limiter.note_budget(_hint(bucket), token, rejected=True)
                continue
            bucket.take(1)
            token.success()
            limiter.note_budget(_hint(bucket), token)

    await drive(client(), limiter, clock, run_s=10.0)
    assert refused == 0
    assert admitted_at[:4] == [admitted_at[0]] * 4, "the full bucket's burst goes at once"
    steady = admitted_at[10:]
    # one per 100 ms on average; a refill the mirror had not counted yet may let one go early,
    # never a burst: any 11 in a row span at least a second
    assert (steady[-1] - steady[0]) / (len(steady) - 1) == pytest.approx(0.1, rel=0.06)
    assert all(steady[k + 10] - steady[k] >= 0.95 for k in range(len(steady) - 10))
    assert limiter.pacer.rate_per_s == pytest.approx(10.0, rel=0.05)


async def test_an_older_hint_never_overrides_a_newer_one() -> None:
    clock = [0.0]
    limiter = AsyncLimiter(FixedLimit(8), clock=lambda: clock[0])
    older = await limiter.acquire()
    newer = await limiter.acquire()
    limiter.note_budget(RateLimitHint(remaining_requests=0, reset_requests_s=10.0), newer)
    limiter.note_budget(RateLimitHint(remaining_requests=50), older)
    assert limiter.pacing_wait_s == pytest.approx(10.0, abs=0.01)
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert limiter.waiting == 0


async def test_without_hints_nothing_is_paced() -> None:
    limiter = AsyncLimiter(FixedLimit(100))
    tokens = [await limiter.acquire() for _ in range(100)]
    assert limiter.inflight == 100 and limiter.pacing_wait_s == 0.0 and not limiter.pacer.active
    for t in tokens:
        t.success()
        limiter.note_budget(None, t)  # a local server sends no rate-limit headers
    assert not limiter.pacer.active


async def test_a_429_empties_the_mirror_until_the_refill() -> None:
    clock = [0.0]
    limiter = AsyncLimiter(FixedLimit(8), clock=lambda: clock[0])
    token = await limiter.acquire()
    token.dropped()
    limiter.note_budget(
        RateLimitHint(retry_after_s=0.2, remaining_requests=0, reset_requests_s=3.0), token, rejected=True
    )
    assert limiter.pacing_wait_s == pytest.approx(3.0, abs=0.01), "no rate known: wait for a full bucket"
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    clock[0] = 3.1
    limiter._wake()
    (await asyncio.wait_for(waiter, timeout=5)).success()


async def test_a_cancelled_waiter_hands_its_slot_on() -> None:
    """A waiter cancelled after being handed a slot passes it to the next one; nothing leaks."""
    limiter = AsyncLimiter(FixedLimit(1))
    holder = await limiter.acquire()
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    holder.success()  # the slot goes to `first`, which is cancelled before it runs
    first.cancel()
    token = await asyncio.wait_for(second, timeout=5)
    assert first.cancelled()
    assert limiter.inflight == 1
    token.success()
    assert limiter.inflight == 0 and limiter.waiting == 0


async def test_a_token_budget_paces_by_estimates_corrected_by_usage() -> None:
    """Requests estimated at 10 tokens that really cost 20, against a bucket of 200 tokens
    refilled at 100/s (a token limit only): the limiter learns the 2x from the answers' usage
    and settles at 5 requests a second without refusals after the first answers."""
    clock = [0.0]
    limiter = AsyncLimiter(FixedLimit(64), clock=lambda: clock[0])
    bucket = TokenBucket()
    admitted_at: list[float] = []
    refused_once_paced = 0

    def hint() -> RateLimitHint:
        return RateLimitHint(
            limit_tokens=200,
            remaining_tokens=math.floor(bucket.level),
            reset_tokens_s=round(bucket.full_in_s(), 3),
        )

    async def client() -> None:
        nonlocal refused_once_paced
        for _ in range(60):
            paced = limiter.tokens.active
            token = await limiter.acquire(estimated_tokens=10)
            admitted_at.append(clock[0])
            bucket.configure(200, 2.0, clock[0])
            if not bucket.holds(20):
                refused_once_paced += paced
                token.dropped()
                limiter.note_budget(hint(), token, rejected=True)
                continue
            bucket.take(20)
            token.success()
            limiter.note_budget(hint(), token, usage=Usage(input_tokens=15, output_tokens=5))

    await drive(client(), limiter, clock, run_s=20.0)
    assert limiter.cost_ratio == pytest.approx(2.0, rel=0.05)
    assert refused_once_paced == 0
    steady = admitted_at[20:]
    assert (steady[-1] - steady[0]) / (len(steady) - 1) == pytest.approx(0.2, rel=0.1)
