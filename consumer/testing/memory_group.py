"""The consumer groups of the memory broker (`consumer.testing.memory`): members join and
leave, and each change is one eager rebalance with a sticky assignment, as aiokafka runs it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from consumer.kafka.records import TopicPartition


class GroupMember(Protocol):
    """What the group asks of a member (`consumer.testing.memory.MemoryIntake`)."""

    @property
    def owned(self) -> Iterable[TopicPartition]: ...

    def subscribed(self) -> set[TopicPartition]: ...

    async def revoke_all(self) -> None: ...

    async def take(self, partitions: set[TopicPartition]) -> None: ...


def sticky_assignment(
    owned: Sequence[set[TopicPartition]], partitions: set[TopicPartition]
) -> list[set[TopicPartition]]:
    """A balanced assignment of `partitions` to the members whose current partitions are
    `owned` (in member order) that moves as few as it must: each member keeps what it owns up
    to its share, the rest go to the members below theirs (what a sticky assignor does)."""
    base, extra = divmod(len(partitions), len(owned))
    shares = [base + (1 if i < extra else 0) for i in range(len(owned))]
    new: list[set[TopicPartition]] = []
    taken: set[TopicPartition] = set()
    for mine, share in zip(owned, shares, strict=True):
        kept = set(sorted(tp for tp in mine if tp in partitions and tp not in taken)[:share])
        new.append(kept)
        taken |= kept
    free = iter(sorted(partitions - taken))
    for mine, share in zip(new, shares, strict=True):
        while len(mine) < share:
            mine.add(next(free))
    return new


class MemoryGroup:
    """The members of one group on the memory broker. Each join or leave is one eager
    rebalance as aiokafka runs it: every member's partitions revoked, then a sticky assignment
    (`sticky_assignment`) handed to each."""

    def __init__(self) -> None:
        self.members: list[GroupMember] = []
        #: rebalances run so far
        self.generation = 0

    async def join(self, member: GroupMember) -> None:
        self.members.append(member)
        await self._rebalance(member.subscribed())

    async def leave(self, member: GroupMember) -> None:
        self.members.remove(member)
        if self.members:
            await self._rebalance(member.subscribed())

    async def _rebalance(self, partitions: set[TopicPartition]) -> None:
        self.generation += 1
        for member in self.members:
            await member.revoke_all()
        new = sticky_assignment([set(m.owned) for m in self.members], partitions)
        for member, assigned in zip(self.members, new, strict=True):
            await member.take(assigned)
