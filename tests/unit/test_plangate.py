"""PlanGate: at most `limit` plans of a key (tier, lane) run; the rest start in arrival order as
plans end; one key's queue never holds back another's."""

from __future__ import annotations

import asyncio

from consumer.runtime.plangate import MIN_RUNNING_PLANS, PLANS_PER_SLOT, PlanGate, running_plan_limit


def test_the_running_limit_is_a_multiple_of_the_limiters_max_with_a_floor() -> None:
    assert running_plan_limit(1) == MIN_RUNNING_PLANS
    assert running_plan_limit(100) == PLANS_PER_SLOT * 100


async def test_plans_past_the_limit_wait_and_start_in_order_as_others_end() -> None:
    release = {i: asyncio.Event() for i in range(5)}
    started: list[int] = []

    async def plan(i: int) -> None:
        started.append(i)
        await release[i].wait()

    gate: PlanGate[str, int] = PlanGate(lambda key: 2, lambda key, i: asyncio.create_task(plan(i)))
    for i in range(5):
        gate.submit("t", i)
    await asyncio.sleep(0)
    assert started == [0, 1] and gate.queued() == 3
    release[1].set()
    await asyncio.sleep(0.01)
    assert started == [0, 1, 2] and gate.queued() == 2
    assert gate.drop(lambda i: i == 4) == [4]
    for i in (0, 2, 3):
        release[i].set()
    await asyncio.sleep(0.01)
    assert started == [0, 1, 2, 3] and gate.queued() == 0


async def test_a_full_key_does_not_hold_back_another_keys_plans() -> None:
    hold = asyncio.Event()
    started: list[tuple[str, int]] = []

    async def plan(key: str, i: int) -> None:
        started.append((key, i))
        await hold.wait()

    gate: PlanGate[str, int] = PlanGate(lambda key: 1, lambda key, i: asyncio.create_task(plan(key, i)))
    for i in range(3):
        gate.submit("small/bulk", i)
    gate.submit("small/interactive", 0)
    await asyncio.sleep(0)
    assert started == [("small/bulk", 0), ("small/interactive", 0)], "the urgent lane's plan starts"
    assert gate.queued() == 2
    hold.set()
    await asyncio.sleep(0.01)
    assert gate.queued() == 0
