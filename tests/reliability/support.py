"""Helpers for the fault tests: a live outcome follower and bounded waits on it.

`OutcomeFollower` reads the result and dead-letter topics from the beginning in a background
task of the test's event loop (no consumer group), so a test can wait for "N new outcomes"
within ~100 ms while service processes are killed and restarted around it. Every wait is
bounded and returns False instead of raising, so the caller can print the service log tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from consumer.kafka.clients import job_producer, topic_partitions
from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from tests.service.harness import ServiceProcess, job

#: how long one follower fetch waits for records before checking for stop
FOLLOW_FETCH_MS = 100


@dataclass
class OutcomeFollower:
    """Every result and dead letter of one test's topics, as they arrive (duplicates kept).

    `isolation_level` "read_committed" sees only committed transactions (what a downstream
    reader sees under exactly_once); "read_uncommitted" also sees records of aborted ones.
    """

    settings: Settings
    isolation_level: str = "read_committed"
    results: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    dead: dict[Any, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    records: int = 0
    _consumer: AIOKafkaConsumer | None = None
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Assign every partition of the result and dead-letter topics (they must exist)."""
        tps = []
        for topic in (self.settings.results_topic, self.settings.dlq_topic):
            parts = await topic_partitions(self.settings, topic)
            assert parts, f"topic {topic} does not exist yet"
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
                for r in recs:
                    if r.value is None:
                        continue
                    value = orjson.loads(r.value)
                    target = self.results if tp.topic == self.settings.results_topic else self.dead
                    target[value["id"]].append(value)
                    self.records += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def __aenter__(self) -> OutcomeFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def ids(self) -> set[Any]:
        return set(self.results) | set(self.dead)

    def by_source_partition(self) -> dict[int, int]:
        """Result records per input partition (for failure messages)."""
        counts: dict[int, int] = defaultdict(int)
        for recs in self.results.values():
            for r in recs:
                counts[r["source"]["partition"]] += 1
        return dict(sorted(counts.items()))

    def check_alive(self) -> None:
        """Re-raise what stopped the follow task, if anything did."""
        if self._task is not None and self._task.done():
            self._task.result()

    async def wait(self, condition: Callable[[], bool], *, timeout_s: float) -> bool:
        """Poll `condition` every 50 ms for at most timeout_s; True when it held."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if condition():
                return True
            await asyncio.sleep(0.05)
        return condition()


def mixed_jobs(count: int, *, batch_every: int = 2) -> list[dict[str, Any]]:
    """`count` jobs, every `batch_every`-th one unbatched, the rest batch-eligible."""
    return [job(i, batch=(i % batch_every != 0)) for i in range(count)]


def duplicate_count(outcomes: dict[Any, list[dict[str, Any]]], *more: dict[Any, list[Any]]) -> int:
    """Outcome records beyond the first per id (over results and dead letters together)."""
    counts: dict[Any, int] = defaultdict(int)
    for table in (outcomes, *more):
        for jid, recs in table.items():
            counts[jid] += len(recs)
    return sum(n - 1 for n in counts.values() if n > 1)


def logs_of(services: Iterable[ServiceProcess], n: int = 60) -> str:
    """The last `n` log lines of each service process, for assertion messages."""
    return "\n".join(f"----- {s.log_path.name}\n{s.log_tail(n)}" for s in services)


async def stop_gracefully(service: ServiceProcess, timeout_s: float) -> tuple[int, float]:
    """SIGTERM and wait (in a thread, so the follower keeps running): (exit code, seconds taken)."""
    started = time.monotonic()
    code = await asyncio.to_thread(service.terminate, timeout_s)
    return code, time.monotonic() - started


_PARTITION = re.compile(r"partition=(\d+)")


def assignment_of(service: ServiceProcess) -> set[int] | None:
    """Partitions of the process's latest `assigned [...]` log line (None before any)."""
    return assignments_of(service)[-1] if assignments_of(service) else None


def assignments_of(service: ServiceProcess) -> list[set[int]]:
    """Partitions of every `assigned [...]` log line of the process, oldest first."""
    if not service.log_path.exists():
        return []
    return [
        {int(p) for p in _PARTITION.findall(line)}
        for line in service.log_path.read_text(errors="replace").splitlines()
        if "consumer.runtime.pipeline: assigned [" in line
    ]


@dataclass
class JobStream:
    """Produce `jobs` as a steady stream: `chunk` jobs every `interval_s`, until the jobs run
    out or `stop` is set. `sent` holds the jobs acknowledged so far, `chunks` their count."""

    settings: Settings
    jobs: list[dict[str, Any]]
    chunk: int
    interval_s: float
    sent: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        producer = job_producer(self.settings)
        await producer.start()
        try:
            for start in range(0, len(self.jobs), self.chunk):
                if self.stop.is_set():
                    break
                batch = self.jobs[start : start + self.chunk]
                futures = [
                    await producer.send(self.settings.jobs_topic, orjson.dumps(j), key=j["id"].encode())
                    for j in batch
                ]
                await asyncio.gather(*futures)
                self.sent += batch
                self.chunks += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.interval_s)
        finally:
            await producer.stop()


def outcome_ids_in(follower: OutcomeFollower, partitions: set[int]) -> set[str]:
    """Ids with a result whose input came from one of these partitions."""
    return {
        jid
        for jid, recs in follower.results.items()
        if any(r["source"]["partition"] in partitions for r in recs)
    }
