"""The async limiter grants its slots by lane: the highest lane first, every lane with work its
min_share, the nearest deadline first within a lane; a cancelled waiter leaves no trace."""

from __future__ import annotations

import asyncio
import contextlib

from consumer.core.lanes import Lane
from consumer.core.limit import FixedLimit
from consumer.runtime.limiter import AsyncLimiter

INTERACTIVE = Lane("interactive", "t.i", rank=0)
BULK = Lane("bulk", "t.b", rank=1, min_share=0.25)


async def _queue(
    limiter: AsyncLimiter, order: list[str], name: str, lane: Lane, deadline_s: float | None
) -> None:
    token = await limiter.acquire(lane=lane, deadline_s=deadline_s)
    order.append(name)
    await asyncio.sleep(0)
    token.success()


async def test_a_free_slot_goes_to_the_highest_lane_then_the_nearest_deadline() -> None:
    limiter = AsyncLimiter(FixedLimit(1))
    held = await limiter.acquire()
    order: list[str] = []
    tasks = [
        asyncio.create_task(_queue(limiter, order, "bulk", BULK, None)),
        asyncio.create_task(_queue(limiter, order, "int-late", INTERACTIVE, 50.0)),
        asyncio.create_task(_queue(limiter, order, "int-none", INTERACTIVE, None)),
        asyncio.create_task(_queue(limiter, order, "int-soon", INTERACTIVE, 10.0)),
    ]
    await asyncio.sleep(0.01)
    assert limiter.waiting == 4 and limiter.waiting_in("interactive") == 3
    held.success()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    assert order == ["int-soon", "int-late", "int-none", "bulk"]


async def test_a_lower_lane_keeps_its_min_share_while_the_higher_lane_is_saturated() -> None:
    limiter = AsyncLimiter(FixedLimit(1))
    held = await limiter.acquire()
    order: list[str] = []
    tasks = [asyncio.create_task(_queue(limiter, order, f"i{n}", INTERACTIVE, None)) for n in range(40)]
    tasks += [asyncio.create_task(_queue(limiter, order, f"b{n}", BULK, None)) for n in range(40)]
    await asyncio.sleep(0.01)
    held.success()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    first_40 = order[:40]
    bulk = sum(name.startswith("b") for name in first_40)
    assert 0.25 * 40 - 2 <= bulk <= 0.25 * 40 + 1, first_40


async def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    limiter = AsyncLimiter(FixedLimit(1))
    held = await limiter.acquire()
    order: list[str] = []
    gone = asyncio.create_task(_queue(limiter, order, "gone", INTERACTIVE, 1.0))
    stays = asyncio.create_task(_queue(limiter, order, "stays", BULK, None))
    await asyncio.sleep(0.01)
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    assert limiter.waiting == 1
    held.success()
    await asyncio.wait_for(stays, timeout=5)
    assert order == ["stays"] and limiter.inflight == 0 and limiter.waiting == 0
