"""The composition root's start sequence: parts start in order, and stop in reverse, also when
one of them fails to start, and a stop set while one is starting ends the start
(`consumer.app.start_part`)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from consumer.app import start_part


class _Part:
    def __init__(self, name: str, events: list[str], *, fails: bool = False, hangs: bool = False) -> None:
        self.name, self.events, self.fails, self.hangs = name, events, fails, hangs
        self.entered = asyncio.Event()

    async def start(self) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} cannot start")
        if self.hangs:  # a group join the cluster never completes
            self.events.append(f"starting {self.name}")
            self.entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.events.append(f"start of {self.name} cancelled")
                raise
        self.events.append(f"start {self.name}")

    async def stop(self) -> None:
        self.events.append(f"stop {self.name}")


async def test_parts_stop_in_reverse_of_their_start() -> None:
    events: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        for name in ("sink", "producer", "intake"):
            await start_part(stack, _Part(name, events), asyncio.Event())
        events.append("running")
    started = ["start sink", "start producer", "start intake"]
    assert events == [*started, "running", "stop intake", "stop producer", "stop sink"]


async def test_a_part_that_fails_to_start_stops_the_parts_started_before_it() -> None:
    events: list[str] = []
    parts = [_Part("sink", events), _Part("producer", events), _Part("metrics", events, fails=True)]
    parts.append(_Part("intake", events))
    with pytest.raises(RuntimeError, match="metrics cannot start"):
        async with contextlib.AsyncExitStack() as stack:
            for part in parts:
                await start_part(stack, part, asyncio.Event())
    assert events == ["start sink", "start producer", "stop producer", "stop sink"]


async def test_a_stop_during_a_start_that_never_ends_stops_it_and_what_started_before() -> None:
    events: list[str] = []
    stop = asyncio.Event()
    parts = [_Part("sink", events), _Part("intake", events, hangs=True), _Part("prober", events)]

    async def run() -> list[bool]:
        started = []
        async with contextlib.AsyncExitStack() as stack:
            for part in parts:
                started.append(await start_part(stack, part, stop))
                if not started[-1]:
                    break
        return started

    task = asyncio.create_task(run())
    await asyncio.wait_for(parts[1].entered.wait(), 5)
    stop.set()
    assert await asyncio.wait_for(task, 5) == [True, False]
    cancelled = ["starting intake", "start of intake cancelled", "stop intake"]
    assert events == ["start sink", *cancelled, "stop sink"]


async def test_a_stop_set_before_a_start_starts_nothing() -> None:
    events: list[str] = []
    stop = asyncio.Event()
    stop.set()
    async with contextlib.AsyncExitStack() as stack:
        assert not await start_part(stack, _Part("sink", events), stop)
    assert events == []
