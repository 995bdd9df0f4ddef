"""The group's board (`consumer.kafka.board`): every instance publishes its own records and
reads every instance's latest ones, on the in-memory edges and on the real broker alike (the
same test code): what a new instance reads at start, what a removed record does, other groups
unseen, and the ages that tell a live instance from a dead one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from consumer.kafka.board import BoardRecord, TopicBoard, board_key

#: bound of every wait for a record to come round
WAIT_S = 20.0


@contextlib.asynccontextmanager
async def board_of(bus: Any, instance: str, *, group: str | None = None) -> AsyncIterator[TopicBoard]:
    """A started board of `instance` in the bus's group (or `group`), on the bus's edges."""
    settings = bus.settings
    await bus.edges.ensure_topics(settings)
    producer = bus.edges.producer(settings, f"test-{instance}", None)
    await producer.start()
    board = TopicBoard(
        bus.edges.follower(settings, f"test-{instance}", settings.quotas_topic),
        producer,
        topic=settings.quotas_topic,
        group=group if group is not None else settings.group_id,
        instance=instance,
    )
    await board.start()
    try:
        yield board
    finally:
        await board.stop()
        await producer.stop()


async def until(board: TopicBoard, done: Callable[[list[BoardRecord]], bool]) -> list[BoardRecord]:
    """The board's records once `done` says so (bounded: the last read when it never does)."""
    deadline = time.monotonic() + WAIT_S
    records = board.records()
    while not done(records) and time.monotonic() < deadline:
        await board.wait_for_change(board.version, 0.2)
        records = board.records()
    return records


def values(records: list[BoardRecord]) -> dict[tuple[str, str], Any]:
    return {(r.instance, r.name): orjson.loads(r.value) for r in records}


async def test_each_instance_reads_every_instances_latest_records(make_bus: Any) -> None:
    bus = make_bus(partitions=1)
    async with board_of(bus, "a") as a, board_of(bus, "b") as b:
        await a.publish([("demand", b'{"n": 1}'), ("other", b'{"n": 7}')])
        await b.publish([("demand", b'{"n": 2}')])
        await a.publish([("demand", b'{"n": 3}')])  # replaces a's first one
        want = {("a", "demand"): {"n": 3}, ("a", "other"): {"n": 7}, ("b", "demand"): {"n": 2}}
        for board in (a, b):
            assert values(await until(board, lambda rs: values(rs) == want)) == want


async def test_a_new_instance_reads_what_was_published_before_it_started(make_bus: Any) -> None:
    bus = make_bus(partitions=1)
    async with board_of(bus, "early") as early:
        await early.publish([("demand", b'{"n": 5}')])
        await until(early, lambda rs: len(rs) == 1)
        async with board_of(bus, "late") as late:
            # read at start, before anything is awaited
            assert values(late.records()) == {("early", "demand"): {"n": 5}}


async def test_a_removed_record_is_gone_for_everyone(make_bus: Any) -> None:
    bus = make_bus(partitions=1)
    async with board_of(bus, "a") as a, board_of(bus, "b") as b:
        await a.publish([("demand", b"{}")])
        await until(b, lambda rs: len(rs) == 1)
        await a.publish([("demand", None)])
        assert await until(b, lambda rs: not rs) == []
        async with board_of(bus, "c") as c:
            assert c.records() == []


async def test_another_groups_records_are_not_seen(make_bus: Any) -> None:
    bus = make_bus(partitions=1)
    async with board_of(bus, "mine") as mine, board_of(bus, "theirs", group="another-group") as theirs:
        await theirs.publish([("demand", b'{"n": 1}')])
        await mine.publish([("demand", b'{"n": 2}')])
        assert values(await until(mine, lambda rs: len(rs) == 1)) == {("mine", "demand"): {"n": 2}}
        assert values(await until(theirs, lambda rs: len(rs) == 1)) == {("theirs", "demand"): {"n": 1}}
        # a key another tool wrote is no instance's record
        await bus.produce_raw(bus.settings.quotas_topic, [(b"not json", b"x")])
        await mine.publish([("demand", b'{"n": 3}')])
        assert values(await until(mine, lambda rs: values(rs).get(("mine", "demand")) == {"n": 3})) == {
            ("mine", "demand"): {"n": 3}
        }


async def test_ages_say_which_instances_still_publish(make_bus: Any) -> None:
    """A record read while following is new when it arrives; one read at start is as old as its
    timestamp: a dead instance's last record does not look fresh to an instance that starts
    after it died."""
    bus = make_bus(partitions=1)
    async with board_of(bus, "gone") as gone:
        await gone.publish([("demand", b"{}")])
        await until(gone, lambda rs: len(rs) == 1)
    await asyncio.sleep(1.5)  # the record ages while nobody follows the board
    async with board_of(bus, "new") as new:
        (record,) = new.records()
        assert record.instance == "gone" and record.age_s >= 1.4
        await new.publish([("demand", b"{}")])
        records = await until(new, lambda rs: len(rs) == 2)
        ages = {r.instance: r.age_s for r in records}
        assert ages["new"] < ages["gone"]


def test_a_key_names_group_instance_and_record_unambiguously() -> None:
    assert board_key("g/1", "i", "n") != board_key("g", "1/i", "n")
    assert orjson.loads(board_key("g", "i", "n")) == ["g", "i", "n"]
