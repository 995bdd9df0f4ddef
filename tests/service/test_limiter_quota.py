"""A limiter handed a fleet quota: it admits a request only when its concurrency limit, the
provider's mirrored budgets and this instance's share of the quota all allow it; one instance
without rate-limit headers paces by the quota alone; every limiter naming one quota shares its
bucket; each request settles to what it used. Fake clock; counts, not durations."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Sequence
from typing import Any

import pytest

from consumer.core.completion import Usage
from consumer.core.errors import RateLimitHint
from consumer.core.limit import FixedLimit
from consumer.core.quota import BURST_S, QuotaFigures, QuotaKind
from consumer.runtime.limiter import AsyncLimiter
from consumer.runtime.quotas import FleetQuota


async def drive(
    clients: Sequence[Coroutine[Any, Any, None]],
    limiters: Sequence[AsyncLimiter],
    clock: list[float],
    *,
    run_s: float,
) -> None:
    """Run the clients while the fake clock advances in 5 ms steps, up to run_s (bounded)."""
    tasks = [asyncio.create_task(c) for c in clients]
    for _ in range(round(run_s / 0.005)):
        if all(t.done() for t in tasks):
            break
        clock[0] = round(clock[0] + 0.005, 3)
        for limiter in limiters:
            limiter.wake()  # the limiter's timers run on the loop's clock, not the fake one
        for _ in range(3):
            await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def quota(clock: list[float], **figures: int) -> FleetQuota:
    """A quota this instance has whole (its bucket starts full)."""
    return FleetQuota("key", QuotaFigures(**figures), clock=lambda: clock[0], floor_share=1.0)


async def test_one_instance_without_headers_paces_by_the_quota_alone() -> None:
    """1200 requests a minute, answers at once, no rate-limit headers: 20 a second after the
    first bucketful, however many workers ask."""
    clock = [0.0]
    limiter = AsyncLimiter(
        FixedLimit(64), clock=lambda: clock[0], quota=quota(clock, requests_per_minute=1200)
    )
    admitted: list[float] = []

    async def worker() -> None:
        while True:
            token = await limiter.acquire(10.0, output_tokens=16)
            admitted.append(clock[0])
            limiter.note_budget(None, token, usage=Usage(input_tokens=10, output_tokens=4))
            token.success()

    await drive([worker() for _ in range(8)], [limiter], clock, run_s=10.0)
    assert not limiter.pacer.active, "nothing announced a budget: the quota alone paced"
    assert 20 * 10 - 1 <= len(admitted) <= math.floor(20 * BURST_S + 20 * 10) + 1


async def test_limiters_naming_one_quota_share_its_bucket() -> None:
    """Two tiers naming one quota of 600 requests a minute: together 10 a second, in turns."""
    clock = [0.0]
    shared = quota(clock, requests_per_minute=600)
    limiters = [AsyncLimiter(FixedLimit(16), clock=lambda: clock[0], quota=shared) for _ in range(2)]
    admitted = [0, 0]
    demands: list[int] = []

    async def worker(i: int) -> None:
        while True:
            token = await limiters[i].acquire(5.0, output_tokens=5)
            demands.append(shared.demand())
            admitted[i] += 1
            limiters[i].note_budget(None, token, usage=Usage(input_tokens=5, output_tokens=5))
            token.success()

    await drive([worker(0), worker(1)], limiters, clock, run_s=10.0)
    assert 10 * 10 - 1 <= sum(admitted) <= math.floor(10 * BURST_S + 10 * 10) + 1
    # the first to ask may take the full bucket it finds; from then on they take turns
    assert abs(admitted[0] - admitted[1]) <= 10 * BURST_S + 2, f"the tiers take turns: {admitted}"
    assert max(demands) == 2, "each tier's worker waits or is in flight: both count in the demand"


@pytest.mark.parametrize(("quota_per_minute", "expected_per_s"), [(1200, 5.0), (120, 2.0)])
async def test_the_tighter_of_the_mirror_and_the_quota_admits(
    quota_per_minute: int, expected_per_s: float
) -> None:
    """A provider announcing 5 requests a second under a quota of 20: the mirror admits. A
    quota of 2 a second under the same provider: the quota admits."""
    clock = [0.0]
    q = quota(clock, requests_per_minute=quota_per_minute)
    limiter = AsyncLimiter(FixedLimit(64), clock=lambda: clock[0], quota=q)
    level, level_s = 5.0, 0.0  # the provider: 5 a second, holds 5
    admitted: list[float] = []

    def hint() -> RateLimitHint:
        return RateLimitHint(remaining_requests=math.floor(level), reset_requests_s=(5.0 - level) / 5.0)

    async def worker() -> None:
        nonlocal level, level_s
        while True:
            token = await limiter.acquire(10.0, output_tokens=10)
            now_s = clock[0]
            level, level_s = min(5.0, level + 5.0 * (now_s - level_s)), now_s
            if level < 1.0:
                limiter.note_budget(hint(), token, rejected=True)
                token.dropped()
                continue
            level -= 1.0
            admitted.append(now_s)
            limiter.note_budget(hint(), token, usage=Usage(input_tokens=10, output_tokens=2))
            token.success()

    await drive([worker()], [limiter], clock, run_s=20.0)
    steady = [t for t in admitted if t >= 5.0]
    assert len(steady) / 15.0 == pytest.approx(expected_per_s, rel=0.1)


async def test_a_request_settles_to_its_usage_and_a_429_gives_everything_back() -> None:
    clock = [0.0]
    q = quota(clock, tokens_per_minute=12000)  # 200 tokens a second
    full = 200 * BURST_S
    limiter = AsyncLimiter(FixedLimit(8), clock=lambda: clock[0], quota=q)

    def level() -> float:
        return q._bucket.levels(clock[0])[QuotaKind.TOKENS]

    token = await limiter.acquire(20.0, output_tokens=16)
    assert q.reserved_tokens == 36.0 and level() == pytest.approx(full - 36.0)
    limiter.note_budget(None, token, usage=Usage(input_tokens=18, output_tokens=3))
    token.success()
    assert q.reserved_tokens == 0.0
    assert level() == pytest.approx(full - 21.0), "it settled to its usage"

    refused = await limiter.acquire(20.0, output_tokens=16)
    limiter.note_budget(RateLimitHint(retry_after_s=1.0), refused, rejected=True)
    refused.dropped()
    assert level() == pytest.approx(full - 21.0), "a 429 used nothing"

    failed = await limiter.acquire(10.0, output_tokens=16)
    failed.ignore()  # a 5xx or a timeout: the input may have been counted, no output came
    assert level() == pytest.approx(full - 31.0)
    assert q.reserved_tokens == 0.0


async def test_a_waiter_on_the_quota_is_woken_when_another_tier_gives_tokens_back() -> None:
    """One tier's request reserved most of the bucket; another tier's waiter needs it. When the
    first settles to a small usage, the waiter goes at once: no timer, no clock movement."""
    clock = [0.0]
    q = quota(clock, tokens_per_minute=round(46 / BURST_S * 60))  # the bucket holds 46
    first, second = (AsyncLimiter(FixedLimit(8), clock=lambda: clock[0], quota=q) for _ in range(2))
    holder = await first.acquire(30.0, output_tokens=16)  # all 46
    waiter = asyncio.create_task(second.acquire(20.0, output_tokens=16))
    await asyncio.sleep(0.01)
    assert not waiter.done() and q.demand() == 2
    first.note_budget(None, holder, usage=Usage(input_tokens=8, output_tokens=2))  # 36 come back
    holder.success()
    token = await asyncio.wait_for(waiter, timeout=5)
    token.ignore()


async def test_a_limiter_without_a_quota_reserves_nothing() -> None:
    limiter = AsyncLimiter(FixedLimit(2))
    token = await limiter.acquire(100.0, output_tokens=1000)
    assert token.reservation is None and limiter.quota is None
    token.success()
