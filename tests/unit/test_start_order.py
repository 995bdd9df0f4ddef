"""The composition root's start sequence: parts start in order, and stop in reverse, also when
one of them fails to start (`consumer.app.start_part`)."""

from __future__ import annotations

import contextlib

import pytest

from consumer.app import start_part


class _Part:
    def __init__(self, name: str, events: list[str], *, fails: bool = False) -> None:
        self.name, self.events, self.fails = name, events, fails

    async def start(self) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    async def stop(self) -> None:
        self.events.append(f"stop {self.name}")


async def test_parts_stop_in_reverse_of_their_start() -> None:
    events: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        for name in ("sink", "producer", "intake"):
            await start_part(stack, _Part(name, events))
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
                await start_part(stack, part)
    assert events == ["start sink", "start producer", "stop producer", "stop sink"]
