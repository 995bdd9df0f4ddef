"""Fault runs against a real broker: `promptbus run` processes that are SIGKILLed and restarted,
an outcome recorder that keeps each outcome's position, and the kill loop the reliability test
and `bench/kill_loop.py` share.

`run_kill_loop(bootstrap, KillLoopShape())` produces the jobs, runs the simulator with faults in
a background thread, starts a service process, SIGKILLs it at the shape's times (each restart
a second later), waits (bounded) until every job has an outcome, stops the last process with
SIGTERM and returns the counts. Right after each kill it reads the group's committed offsets
(with their metadata) and the end of the outcome topics, so every duplicate is attributed to
a cause (`attribute_duplicates`):

- `acked_uncommitted`: the first copy was produced before a kill, and the commit in force at
  the kill neither passed its input offset nor named it in the metadata;
- `metadata_full`: the same, on a partition whose metadata was at the size limit (what did
  not fit was left out);
- `committed_redone`: the commit at the kill covered it, and it was done again anyway;
- `same_process`: both copies came from one process (a resend, or one job answered twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from consumer.core.offsets import METADATA_MAX_CHARS, DoneOffsets, decode_done
from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import read_latest, topic_partitions
from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.testing.harness import job, produce, service_env, settings_from_env
from consumer.testing.process import ServiceProcess
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

#: metadata at least this long is taken as cut at the limit (the encoder leaves out the rest)
METADATA_FULL_CHARS = METADATA_MAX_CHARS - 64


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc; 0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    """Open file descriptors of a process (Linux /proc; 0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def latest_stats(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each instance's latest stats snapshot from the stats topic, by instance name."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in (await read_latest(settings, settings.stats_topic)).items():
        with contextlib.suppress(Exception):
            out[key.decode()] = orjson.loads(value)
    return out


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


@dataclass
class OutcomeRecorder:
    """Every result and dead letter of one run's topics as they arrive, with their positions."""

    settings: Settings
    outcomes: list[Outcome] = field(default_factory=list)
    _consumer: AIOKafkaConsumer | None = None
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OutcomeRecorder:
        tps = []
        for topic in (self.settings.results_topic, self.settings.dlq_topic):
            tps += [TopicPartition(topic, p) for p in await topic_partitions(self.settings, topic)]
        self._consumer = AIOKafkaConsumer(
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            **client_kwargs(self.settings),
        )
        await self._consumer.start()
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._follow(), name="outcome-recorder")
        return self

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for tp, recs in batches.items():
                dead = tp.topic == self.settings.dlq_topic
                for r in recs:
                    if r.value is None:
                        continue
                    with contextlib.suppress(Exception):
                        v = orjson.loads(r.value)
                        src = v.get("source") or {}
                        self.outcomes.append(
                            Outcome(
                                dead,
                                tp.partition,
                                r.offset,
                                v.get("id"),
                                int(src.get("partition", -1)),
                                int(src.get("offset", -1)),
                                # a dead letter's kind in place of an output
                                (v.get("error") or {}).get("kind") if dead else v.get("output"),
                                r.timestamp,
                            )
                        )

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    def ids(self) -> set[Any]:
        return {o.job_id for o in self.outcomes}

    async def wait_for_count(self, count: int, timeout_s: float) -> bool:
        """True once `count` outcomes were read (polled, bounded)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.outcomes) >= count:
                return True
            await asyncio.sleep(0.05)
        return False

    async def wait_for_dead(self, matches: Callable[[Outcome], bool], count: int, timeout_s: float) -> bool:
        """True once `count` dead letters that `matches` were read (polled, bounded)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sum(1 for o in self.outcomes if o.dead and matches(o)) >= count:
                return True
            await asyncio.sleep(0.1)
        return False

    async def wait(self, expected: set[Any], timeout_s: float) -> bool:
        """True once every expected id has an outcome (polled, bounded)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._task is not None and self._task.done():
                self._task.result()
            if expected <= self.ids():
                return True
            await asyncio.sleep(0.1)
        return expected <= self.ids()


@dataclass(frozen=True)
class KillSnapshot:
    """Read right after a SIGKILL: the group's commits and the end of the outcome topics."""

    #: jobs partition -> (committed offset, offsets named finished in its metadata, metadata chars)
    committed: dict[int, tuple[int, DoneOffsets, int]]
    #: (dead?, outcome partition) -> end offset: outcomes below it were produced before the kill
    ends: dict[tuple[bool, int], int]
    #: when the kill was (ms since the epoch)
    at_ms: int = 0

    def covers(self, partition: int, offset: int) -> bool:
        """Whether the commit in force at the kill passed or named this input offset."""
        entry = self.committed.get(partition)
        return entry is not None and (offset < entry[0] or offset in entry[1])

    def metadata_full(self, partition: int) -> bool:
        entry = self.committed.get(partition)
        return entry is not None and entry[2] >= METADATA_FULL_CHARS


async def kill_snapshot(settings: Settings) -> KillSnapshot:
    """What the group had committed and how far the outcome topics reach, now."""
    at_ms = int(time.time() * 1000)
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.group_id)
    finally:
        await admin.close()
    committed: dict[int, tuple[int, DoneOffsets, int]] = {}
    for tp, meta in offsets.items():
        if tp.topic == settings.jobs_topic and meta.offset >= 0:
            text = meta.metadata or ""
            committed[tp.partition] = (meta.offset, decode_done(meta.offset, text).done, len(text))
    consumer = AIOKafkaConsumer(**client_kwargs(settings))
    await consumer.start()
    try:
        ends: dict[tuple[bool, int], int] = {}
        for dead, topic in ((False, settings.results_topic), (True, settings.dlq_topic)):
            tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
            for tp, end in (await consumer.end_offsets(tps)).items():
                ends[(dead, tp.partition)] = end
    finally:
        await consumer.stop()
    return KillSnapshot(committed, ends, at_ms)


def era_of(outcome: Outcome, snapshots: Sequence[KillSnapshot]) -> int:
    """Index of the process (0 = first) that produced an outcome: the first kill it precedes."""
    for i, snap in enumerate(snapshots):
        if outcome.offset < snap.ends.get((outcome.dead, outcome.partition), 0):
            return i
    return len(snapshots)


def attribute_duplicates(
    outcomes: Sequence[Outcome], snapshots: Sequence[KillSnapshot], ages_ms: list[int] | None = None
) -> Counter[str]:
    """Each outcome beyond a job's first, counted under the cause that made it (module docstring).

    ages_ms: filled with how long before its kill each `acked_uncommitted` first copy was written.
    """
    by_id: dict[Any, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_id[o.job_id].append(o)
    causes: Counter[str] = Counter()
    for copies in by_id.values():
        eras = sorted((era_of(o, snapshots), o) for o in copies)
        for (prev_era, prev), (era, _) in itertools.pairwise(eras):
            if era == prev_era:
                causes["same_process"] += 1
                continue
            snap = snapshots[prev_era]
            if snap.covers(prev.source_partition, prev.source_offset):
                causes["committed_redone"] += 1
            elif snap.metadata_full(prev.source_partition):
                causes["metadata_full"] += 1
            else:
                causes["acked_uncommitted"] += 1
                if ages_ms is not None:
                    ages_ms.append(snap.at_ms - prev.timestamp_ms)
    return causes


#: 20-50 ms answers; 500s, 429s, malformed batched answers, hangs past the 1.5 s timeout
KILL_LOOP_FAULTS = SimulatorConfig(
    seed=7,
    latency_ms=35,
    jitter_ms=15,
    error_rate=0.04,
    shared_429_rate=0.04,
    malformed_rate=0.04,
    hang_rate=0.02,
    hang_s=5.0,
)


@dataclass(frozen=True)
class KillLoopShape:
    """The run: jobs, tier, provider faults and kill times (seconds from the first start)."""

    jobs: int = 1500
    partitions: int = 4
    batch_every: int = 2
    kill_at_s: tuple[float, ...] = (4.0, 9.0, 14.0)
    restart_after_s: float = 1.0
    max_items: int = 16
    timeout_s: float = 1.5
    max_attempts: int = 8
    finish_wait_s: float = 240.0
    #: > 0: a restarted process is killed only after this many new outcomes (so every kill
    #: hits a process at work, not one still waiting to join), `kill_at_s[i]` seconds apart
    #: at the least
    kill_after_outcomes: int = 0
    simulator: SimulatorConfig = field(default_factory=lambda: KILL_LOOP_FAULTS)


def kill_loop_tiers(base_url: str, shape: KillLoopShape) -> dict[str, Any]:
    """One tier on the simulator: batching 16/50 ms/500 ms, AIMD 4..32, 1.5 s timeout, 8 attempts."""
    return {
        "tiers": {
            "small": {
                "provider": "openai_compat",
                "base_url": base_url + "/v1",
                "model": "sim-model",
                "timeout_s": shape.timeout_s,
                "batching": {
                    "enabled": True,
                    "max_items": shape.max_items,
                    "window_ms": 50,
                    "max_wait_ms": 500,
                },
                "limiter": {"algorithm": "aimd", "initial": 4, "min": 1, "max": 32},
                "retry": {
                    "max_attempts": shape.max_attempts,
                    "backoff_initial_s": 0.05,
                    "backoff_max_s": 1.0,
                },
            }
        }
    }


async def run_kill_loop(bootstrap: str, shape: KillLoopShape, workdir: Path) -> dict[str, Any]:
    """The kill loop (module docstring); returns jobs, outcomes, duplicates, lost, wrong, causes."""
    env = service_env(bootstrap, partitions=shape.partitions, PROMPTBUS_STATS_INTERVAL_S=1)
    settings = settings_from_env(env)
    await ensure_topics(settings)
    jobs = [job(i, batch=i % shape.batch_every != 0) for i in range(shape.jobs)]
    expected = {j["id"]: answer_for(j["variables"]["text"]) for j in jobs}
    snapshots: list[KillSnapshot] = []
    with run_simulator(shape.simulator) as base_url:
        service = ServiceProcess(env, kill_loop_tiers(base_url, shape), workdir)
        async with OutcomeRecorder(settings) as recorder:
            await produce(settings, jobs)
            try:
                t0 = time.monotonic()
                service.start()
                for at_s in shape.kill_at_s:
                    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
                    if shape.kill_after_outcomes and snapshots:
                        await recorder.wait_for_count(len(recorder.outcomes) + shape.kill_after_outcomes, 60)
                    service.kill()
                    snapshots.append(await kill_snapshot(settings))
                    await asyncio.sleep(max(0.0, t0 + at_s + shape.restart_after_s - time.monotonic()))
                    service.start()
                finished = await recorder.wait(set(expected), shape.finish_wait_s)
                took_s = time.monotonic() - t0
                exit_code = service.terminate(30)
            finally:
                service.kill()
            await asyncio.sleep(0.5)  # the last outcomes reach the recorder
            outcomes = list(recorder.outcomes)
    seen = {o.job_id for o in outcomes}
    wrong = sum(1 for o in outcomes if not o.dead and o.output != expected.get(o.job_id))
    ages_ms: list[int] = []
    causes = attribute_duplicates(outcomes, snapshots, ages_ms)
    ages_ms.sort()
    return {
        "jobs": len(jobs),
        "outcomes": len(outcomes),
        "duplicates": len(outcomes) - len(seen),
        "duplicate_share": round((len(outcomes) - len(seen)) / len(jobs), 4),
        "lost": len(set(expected) - seen),
        "wrong": wrong,
        "dead_letters": sum(1 for o in outcomes if o.dead),
        "finished": finished,
        "took_s": round(took_s, 1),
        "exit_code": exit_code,
        "kills": len(snapshots),
        "causes": dict(sorted(causes.items())),
        # how long before the kill the outcomes it redid were written (median, max)
        "acked_uncommitted_age_ms": [ages_ms[len(ages_ms) // 2], ages_ms[-1]] if ages_ms else [],
        "metadata_chars_max": max((c[2] for s in snapshots for c in s.committed.values()), default=0),
        "outcomes_at_kill": [sum(v for (dead, _), v in s.ends.items() if not dead) for s in snapshots],
        "log": str(service.log_path),
    }
