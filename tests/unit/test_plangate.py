"""PlanGate: at most `limit` plans of a key (tier, lane) run; the rest start in arrival order as
plans end, in the tasks already running; one key's queue never holds back another's."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from consumer.runtime.plangate import MIN_RUNNING_PLANS, PLANS_PER_SLOT, PlanGate, running_plan_limit


def test_the_running_limit_is_a_multiple_of_the_limiters_max_with_a_floor() -> None:
    assert running_plan_limit(1) == MIN_RUNNING_PLANS
    assert running_plan_limit(100) == PLANS_PER_SLOT * 100


class Plans:
    """Plans that start (recorded in order) and end when released; the tasks they run in."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.release: dict[tuple[str, int], asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.changed = asyncio.Event()

    async def run(self, key: str, i: int) -> None:
        self.started.append((key, i))
        self.changed.set()
        await self.release.setdefault((key, i), asyncio.Event()).wait()
        if i < 0:
            raise RuntimeError("a plan that fails (a bug)")

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(coro))

    def end(self, key: str, i: int) -> None:
        self.release.setdefault((key, i), asyncio.Event()).set()

    async def until(self, count: int) -> None:
        """Wait (bounded) until `count` plans have started."""
        async with asyncio.timeout(5):
            while len(self.started) < count:
                self.changed.clear()
                await self.changed.wait()


async def test_plans_past_the_limit_wait_and_start_in_order_in_the_running_tasks() -> None:
    plans = Plans()
    gate: PlanGate[str, int] = PlanGate(lambda key: 2, plans.run, plans.spawn)
    for i in range(5):
        gate.submit("t", i)
    await plans.until(2)
    assert plans.started == [("t", 0), ("t", 1)] and gate.queued() == 3
    plans.end("t", 1)
    await plans.until(3)
    assert plans.started[2] == ("t", 2) and gate.queued() == 2
    assert gate.drop(lambda i: i == 4) == [4]
    for i in (0, 2, 3):
        plans.end("t", i)
    await asyncio.wait_for(asyncio.gather(*plans.tasks), 5)
    assert plans.started == [("t", 0), ("t", 1), ("t", 2), ("t", 3)] and gate.queued() == 0
    assert len(plans.tasks) == 2, "queued plans ran in the tasks already running"


async def test_a_failing_plan_does_not_end_its_task_or_hold_back_the_queue() -> None:
    plans = Plans()
    gate: PlanGate[str, int] = PlanGate(lambda key: 1, plans.run, plans.spawn)
    for i in (-1, 1):
        gate.submit("t", i)
    plans.end("t", -1)
    await plans.until(2)
    plans.end("t", 1)
    await asyncio.wait_for(asyncio.gather(*plans.tasks), 5)
    assert plans.started == [("t", -1), ("t", 1)] and len(plans.tasks) == 1


async def test_a_full_key_does_not_hold_back_another_keys_plans() -> None:
    plans = Plans()
    gate: PlanGate[str, int] = PlanGate(lambda key: 1, plans.run, plans.spawn)
    for i in range(3):
        gate.submit("small/bulk", i)
    gate.submit("small/interactive", 0)
    await plans.until(2)
    assert plans.started == [("small/bulk", 0), ("small/interactive", 0)], "the urgent lane's plan starts"
    assert gate.queued() == 2
    for i in range(3):
        plans.end("small/bulk", i)
    plans.end("small/interactive", 0)
    await asyncio.wait_for(asyncio.gather(*plans.tasks), 5)
    assert gate.queued() == 0 and len(plans.started) == 4
