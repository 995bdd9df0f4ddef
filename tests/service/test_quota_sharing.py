"""Sharing a fleet quota over the group (`consumer.runtime.quotas.QuotaSharing`) on the
in-memory board with a fake clock: shares follow the demand each instance publishes and add up
to the quota; a new instance keeps the floor until it has read the board; a stopped instance's
share frees at once, a dead one's once its record is older than the session timeout."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest

from consumer.core.quota import FLOOR_SHARE, QuotaFigures
from consumer.kafka.board import TopicBoard
from consumer.runtime.quotas import FleetQuota, QuotaSharing
from consumer.runtime.stats import ServiceStats
from consumer.testing.memory import MemoryBroker, MemoryProducer, MemoryTopicFollower

TOPIC = "quotas"
SESSION_TIMEOUT_S = 10.0


@dataclass
class Tier:
    """A limiter as its quota sees it: requests waiting and in flight."""

    waiting: int = 0
    inflight: int = 0
    woken: int = 0

    def wake(self) -> None:
        self.woken += 1


class Instance:
    def __init__(self, broker: MemoryBroker, name: str, clock: list[float], *, group: str = "g") -> None:
        self.tier = Tier()
        self.quota = FleetQuota("key", QuotaFigures(requests_per_minute=1200), clock=lambda: clock[0])
        self.quota.attach(self.tier)
        self.stats = ServiceStats(instance=name)
        board = TopicBoard(
            MemoryTopicFollower(broker, TOPIC, clock=lambda: clock[0]),
            MemoryProducer(broker),
            topic=TOPIC,
            group=group,
            instance=name,
        )
        self.sharing = QuotaSharing(
            board,
            {"key": self.quota},
            session_timeout_s=SESSION_TIMEOUT_S,
            stats=self.stats,
            clock=lambda: clock[0],
        )

    async def kill(self) -> None:
        """What SIGKILL leaves: the part stops publishing, nothing is removed."""
        task = self.sharing._task
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def round(self) -> None:
        """What one pass of the part's loop does: publish the demand, split the quota."""
        await self.sharing._publish()
        self.sharing.rebalance()


async def rounds(instances: list[Instance]) -> None:
    for i in instances:
        await i.sharing._publish()
    for i in instances:
        i.sharing.rebalance()


@pytest.fixture
def clock() -> list[float]:
    return [100.0]


async def test_shares_follow_demand_and_add_up_to_the_quota(clock: list[float]) -> None:
    broker = MemoryBroker(partitions=1)
    group = [Instance(broker, name, clock) for name in ("a", "b", "c")]
    for i in group:
        await i.sharing.start()
    for i, (waiting, inflight) in zip(group, [(300, 10), (100, 10), (0, 0)], strict=True):
        i.tier.waiting, i.tier.inflight = waiting, inflight
    await rounds(group)
    fractions = {i.sharing._board.instance: i.quota.fraction for i in group}
    rest = 1.0 - 3 * FLOOR_SHARE
    assert fractions == pytest.approx(
        {"a": FLOOR_SHARE + rest * 310 / 420, "b": FLOOR_SHARE + rest * 110 / 420, "c": FLOOR_SHARE}
    )
    assert sum(fractions.values()) == pytest.approx(1.0)
    # every instance computed the same split from the same records
    assert all(i.quota.split == group[0].quota.split for i in group)
    a = group[0]
    assert a.quota.share_per_minute()["requests"] == pytest.approx(1200 * fractions["a"])
    assert a.stats.quotas["key"].instances_live == 3 and a.stats.quotas["key"].demand == 310
    for i in group:
        await i.sharing.stop()


async def test_a_new_instance_keeps_the_floor_until_it_has_read_the_board(clock: list[float]) -> None:
    broker = MemoryBroker(partitions=1)
    first = Instance(broker, "first", clock)
    await first.sharing.start()
    first.tier.waiting = 50
    await first.round()
    assert first.quota.fraction == pytest.approx(1.0), "alone, it has the whole quota"
    late = Instance(broker, "late", clock)
    assert late.quota.fraction == pytest.approx(FLOOR_SHARE), "before it starts: the floor"
    late.tier.waiting = 50
    await late.sharing.start()  # reads the board, publishes, reads its own record back
    assert late.quota.fraction == pytest.approx(0.5)
    await first.round()
    assert first.quota.fraction + late.quota.fraction == pytest.approx(1.0)
    for i in (first, late):
        await i.sharing.stop()


async def test_a_stopped_instance_frees_its_share_at_once(clock: list[float]) -> None:
    broker = MemoryBroker(partitions=1)
    group = [Instance(broker, name, clock) for name in ("a", "b")]
    for i in group:
        i.tier.waiting = 10
        await i.sharing.start()
    await rounds(group)
    assert group[0].quota.fraction == pytest.approx(0.5)
    await group[1].sharing.stop()
    group[0].sharing.rebalance()
    assert group[0].quota.fraction == pytest.approx(1.0)
    await group[0].sharing.stop()


async def test_a_dead_instance_frees_its_share_once_its_record_is_older_than_the_session(
    clock: list[float],
) -> None:
    broker = MemoryBroker(partitions=1)
    group = [Instance(broker, name, clock) for name in ("a", "b", "killed")]
    for i in group:
        i.tier.waiting = 10
        await i.sharing.start()
    await rounds(group)
    survivors = group[:2]
    await group[2].kill()  # publishes no more, and nothing removes its record
    clock[0] += SESSION_TIMEOUT_S - 0.5
    await rounds(survivors)
    assert sum(i.quota.fraction for i in survivors) == pytest.approx(2 / 3), "not dead yet"
    clock[0] += 1.0
    await rounds(survivors)
    assert all(i.quota.fraction == pytest.approx(0.5) for i in survivors)
    assert all(set(i.quota.split) == {"a", "b"} for i in survivors)
    for i in survivors:
        await i.sharing.stop()


async def test_the_group_and_records_of_other_kinds_are_kept_apart(clock: list[float]) -> None:
    broker = MemoryBroker(partitions=1)
    mine = Instance(broker, "mine", clock)
    other_group = Instance(broker, "theirs", clock, group="another")
    for i in (mine, other_group):
        i.tier.waiting = 10
        await i.sharing.start()
    await mine.sharing._board.publish([("something-else", b"[1, 2]")])
    await rounds([mine, other_group])
    assert mine.quota.fraction == pytest.approx(1.0) and other_group.quota.fraction == pytest.approx(1.0)
    for i in (mine, other_group):
        await i.sharing.stop()


async def test_a_share_that_grows_wakes_the_limiters(clock: list[float]) -> None:
    broker = MemoryBroker(partitions=1)
    only = Instance(broker, "only", clock)
    only.tier.waiting = 3
    await only.sharing.start()
    assert only.tier.woken >= 1, "from the floor to the whole quota: its limiters look again"
    await only.sharing.stop()
