"""The outcome follower: every result and dead letter of one run's topics, live, with positions.

`OutcomeFollower(settings)` reads the result and dead-letter topics from the beginning in a
background task of the caller's event loop (no consumer group), so a test or benchmark can
wait for "N new outcomes" within ~100 ms while service processes are killed and restarted
around it. Each record is kept as an `Outcome` (duplicates kept, in arrival order): where it
is, which job and input offset it answers, its output or dead-letter kind. Every wait is
bounded and returns False instead of raising, so the caller can print the service log first.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.waits import cancel_and_wait

__all__ = ["Outcome", "OutcomeFollower", "duplicate_count"]

#: how long one fetch waits for records before the follower looks again
FOLLOW_FETCH_MS = 100
#: how often the waits look at what was read
POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Outcome:
    """One outcome record as read: where it is, and which job it answers."""

    dead: bool
    partition: int
    offset: int
    job_id: Any
    source_partition: int
    source_offset: int
    #: the result's output, or a dead letter's error kind
    output: Any
    #: the record's timestamp (the producer's clock, ms since the epoch)
    timestamp_ms: int = 0
    #: the input topic it answers (a lane's topic, or the jobs topic)
    source_topic: str = ""
    #: the result's lane and the tier that answered (None for dead letters)
    lane: str | None = None
    tier: str | None = None
    #: the result's deployment (None: a tier without deployments, or a dead letter) and when
    #: the service had its answer (`completed_at`, RFC 3339)
    deployment: str | None = None
    completed_at: str | None = None


def _outcome(dead: bool, partition: int, offset: int, timestamp_ms: int, value: dict[str, Any]) -> Outcome:
    source = value.get("source") or {}
    return Outcome(
        dead,
        partition,
        offset,
        value.get("id"),
        int(source.get("partition", -1)),
        int(source.get("offset", -1)),
        (value.get("error") or {}).get("kind") if dead else value.get("output"),
        timestamp_ms,
        str(source.get("topic", "")),
        None if dead else value.get("lane"),
        None if dead else value.get("tier"),
        None if dead else value.get("deployment"),
        None if dead else value.get("completed_at"),
    )


@dataclass
class OutcomeFollower:
    """Every result and dead letter of one run's topics, as they arrive (module docstring).

    `isolation_level` "read_committed" sees only committed transactions (what a downstream
    reader sees under exactly_once); "read_uncommitted" also sees records of aborted ones.
    """

    settings: Settings
    isolation_level: str = "read_committed"
    outcomes: list[Outcome] = field(default_factory=list)
    _consumer: AIOKafkaConsumer | None = None
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Assign every partition of the result and dead-letter topics (they must exist)."""
        tps = []
        for topic in (self.settings.results_topic, self.settings.dlq_topic):
            parts = await topic_partitions(self.settings, topic)
            if not parts:
                raise RuntimeError(f"topic {topic} does not exist yet")
            tps += [TopicPartition(topic, p) for p in parts]
        self._consumer = AIOKafkaConsumer(
            isolation_level=self.isolation_level,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            **client_kwargs(self.settings),
        )
        await self._consumer.start()
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._follow(), name="outcome-follower")

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=FOLLOW_FETCH_MS)
            for tp, recs in batches.items():
                dead = tp.topic == self.settings.dlq_topic
                for r in recs:
                    if r.value is not None:
                        value = orjson.loads(r.value)
                        self.outcomes.append(_outcome(dead, tp.partition, r.offset, r.timestamp, value))

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def __aenter__(self) -> OutcomeFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ what was read
    @property
    def records(self) -> int:
        """Outcome records read so far (duplicates included)."""
        return len(self.outcomes)

    def ids(self) -> set[Any]:
        """Job ids with at least one outcome."""
        return {o.job_id for o in self.outcomes}

    def results(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.dead]

    def dead_letters(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.dead]

    def ids_from(self, partitions: Collection[int]) -> set[Any]:
        """Ids with a result whose input came from one of these partitions."""
        return {o.job_id for o in self.outcomes if not o.dead and o.source_partition in partitions}

    def by_source_partition(self) -> dict[int, int]:
        """Result records per input partition (for failure messages)."""
        counts = Counter(o.source_partition for o in self.outcomes if not o.dead)
        return dict(sorted(counts.items()))

    def duplicates(self) -> int:
        """Outcome records beyond the first per job id."""
        return duplicate_count(o.job_id for o in self.outcomes)

    # ------------------------------------------------------------------ bounded waits
    def check_alive(self) -> None:
        """Re-raise what stopped the follow task, if anything did."""
        if self._task is not None and self._task.done():
            self._task.result()

    async def wait(self, condition: Callable[[], bool], *, timeout_s: float) -> bool:
        """Poll `condition` for at most timeout_s; True when it held."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if condition():
                return True
            await asyncio.sleep(POLL_S)
        return condition()

    async def wait_for_ids(self, expected: Collection[Any], *, timeout_s: float) -> bool:
        """True once every expected id has an outcome."""
        wanted = set(expected)
        return await self.wait(lambda: wanted <= self.ids(), timeout_s=timeout_s)

    async def wait_for_count(self, count: int, *, timeout_s: float) -> bool:
        """True once `count` outcome records were read."""
        return await self.wait(lambda: self.records >= count, timeout_s=timeout_s)

    async def wait_for_dead(
        self, matches: Callable[[Outcome], bool], count: int, *, timeout_s: float
    ) -> bool:
        """True once `count` dead letters that `matches` were read."""
        return await self.wait(
            lambda: sum(1 for o in self.outcomes if o.dead and matches(o)) >= count, timeout_s=timeout_s
        )

    async def settle(self, *, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until the follower has read every record the topics hold now: once
        the service stopped, its every outcome is here. True when it caught up.

        A fetch moves the positions and hands its records to the follow loop, which keeps them,
        in one step: a position at the end means its records are kept.
        """
        consumer = self._consumer
        assert consumer is not None
        ends = await consumer.end_offsets(list(consumer.assignment()))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if all([await consumer.position(tp) >= end for tp, end in ends.items()]):
                return True
            await asyncio.sleep(POLL_S)
        return False


def duplicate_count(ids: Iterable[Any]) -> int:
    """Records beyond the first per id."""
    return sum(n - 1 for n in Counter(ids).values() if n > 1)
