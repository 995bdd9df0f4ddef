"""The limiter as a pool of deployments behind one waiter queue: a request is granted to a
deployment with room (never one that is down, except as its probe), a paused deployment is
passed over, the lane scheduler decides who goes next whichever deployment frees a slot, and
a waiter that finds every deployment down is told so."""

from __future__ import annotations

import asyncio

import pytest

from consumer.core.lanes import Lane
from consumer.core.limit import FixedLimit
from consumer.runtime.limiter import AsyncLimiter, Gate, NoDeploymentUp

INTERACTIVE = Lane("interactive", "t.i", rank=0)
BULK = Lane("bulk", "t.b", rank=1)


def _pool(*limits: int, up: list[bool] | None = None) -> tuple[AsyncLimiter, list[bool]]:
    flags = up if up is not None else [True] * len(limits)
    gates = [Gate(FixedLimit(n), up=lambda i=i: flags[i]) for i, n in enumerate(limits)]
    return AsyncLimiter(gates=gates), flags


async def test_each_request_goes_to_a_deployment_with_room_and_waits_once_when_none_has() -> None:
    limiter, _ = _pool(1, 1)
    first, second = await limiter.acquire(), await limiter.acquire()
    assert {first.gate.index, second.gate.index} == {0, 1}
    third = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert not third.done() and limiter.waiting == 1
    second.success()
    token = await asyncio.wait_for(third, timeout=5)
    assert token.gate is second.gate and limiter.inflight == 2


async def test_a_deployment_that_is_down_is_given_nothing_but_its_probe() -> None:
    limiter, up = _pool(4, 4, up=[True, False])
    tokens = [await limiter.acquire() for _ in range(4)]
    assert {t.gate.index for t in tokens} == {0}
    probe = await limiter.acquire(probe=limiter.gates[1])
    assert probe.gate.index == 1
    # every deployment down: a waiter is told at once, a probe still goes
    up[0] = False
    with pytest.raises(NoDeploymentUp):
        await asyncio.wait_for(limiter.acquire(), timeout=5)
    for t in [*tokens, probe]:
        t.success()
    assert limiter.inflight == 0 and limiter.waiting == 0


async def test_waiters_leave_when_every_deployment_goes_down_and_come_back_to_one_that_is_up() -> None:
    limiter, up = _pool(1, 1)
    held = [await limiter.acquire(), await limiter.acquire()]
    waiting = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    up[0] = up[1] = False
    limiter.wake()  # what a circuit change does
    for task in waiting:
        with pytest.raises(NoDeploymentUp):
            await asyncio.wait_for(task, timeout=5)
    up[1] = True
    held[1].success()
    again = await asyncio.wait_for(limiter.acquire(), timeout=5)
    assert again.gate.index == 1


async def test_a_paused_deployment_is_passed_over() -> None:
    limiter, _ = _pool(4, 4)
    limiter.pause(60.0, limiter.gates[0])  # its quota is exhausted: it alone pauses
    tokens = [await asyncio.wait_for(limiter.acquire(), timeout=5) for _ in range(4)]
    assert {t.gate.index for t in tokens} == {1}
    assert limiter.paused_for_s == 0.0, "the tier is not paused while one deployment admits"


async def test_the_lane_scheduler_decides_who_goes_next_whichever_deployment_frees_a_slot() -> None:
    limiter, _ = _pool(1, 1)
    held = [await limiter.acquire(), await limiter.acquire()]
    order: list[str] = []

    async def queue(name: str, lane: Lane) -> None:
        token = await limiter.acquire(lane=lane)
        order.append(f"{name}@{token.gate.index}")
        await asyncio.sleep(0)

    tasks = [asyncio.create_task(queue("bulk", BULK)), asyncio.create_task(queue("int", INTERACTIVE))]
    await asyncio.sleep(0)
    held[1].success()
    await asyncio.sleep(0.01)
    held[0].success()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    assert order == ["int@1", "bulk@0"]


async def test_weights_share_the_requests_when_every_deployment_has_the_same_room() -> None:
    gates = [Gate(FixedLimit(4), weight=w) for w in (1.0, 3.0)]
    limiter = AsyncLimiter(gates=gates)
    counts = [0, 0]
    for _ in range(400):
        token = await limiter.acquire()
        counts[token.gate.index] += 1
        token.success()
    assert counts == [100, 300]
