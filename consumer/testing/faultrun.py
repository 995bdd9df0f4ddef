"""Fault runs against a real broker: what a SIGKILL left (the group's commits and the outcome
topics' ends), the duplicates it caused and why, and the kill loop the reliability test and
`bench/kill_loop.py` share.

`run_kill_loop(bootstrap, KillLoopShape())` produces the jobs, runs the simulator with faults in
a background thread, starts a service process, SIGKILLs it each time it has written
`kill_after_outcomes` outcomes of its own (or at the shape's times), restarts it a second
later, waits (bounded) until every job has an outcome, stops the last process with SIGTERM and
returns the counts. Right after each kill it reads the group's committed offsets
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
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from consumer.core.offsets import METADATA_MAX_CHARS, DoneOffsets, decode_done
from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import read_latest, topic_partitions
from consumer.kafka.connection import client_kwargs
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.testing.harness import job, produce, service_env, settings_from_env, tier_file_dict
from consumer.testing.outcomes import Outcome, OutcomeFollower
from consumer.testing.process import ServiceProcess, stop_gracefully
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

#: metadata at least this long is taken as cut at the limit (the encoder leaves out the rest)
METADATA_FULL_CHARS = METADATA_MAX_CHARS - 64


async def latest_stats(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each instance's latest stats snapshot from the stats topic, by instance name."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in (await read_latest(settings, settings.stats_topic)).items():
        with contextlib.suppress(Exception):
            out[key.decode()] = orjson.loads(value)
    return out


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
    """Index of the process (0 = first) that produced an outcome: the first kill it precedes.

    An outcome precedes a kill when it was in the topic as the kill was noted, or when its
    process created it before the kill (its timestamp): a produce request the process sent
    just before it died may reach the log a moment after the kill was noted.
    """
    for i, snap in enumerate(snapshots):
        if outcome.offset < snap.ends.get((outcome.dead, outcome.partition), 0):
            return i
        if outcome.timestamp_ms and outcome.timestamp_ms < snap.at_ms:
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
        eras = sorted(((era_of(o, snapshots), o) for o in copies), key=lambda pair: pair[0])
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
#: AIMD from 4 up to 32 requests in flight
KILL_LOOP_LIMITER = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 32}
#: how long a restarted process may take to write its `kill_after_outcomes`
KILL_WAIT_S = 120.0


@dataclass(frozen=True)
class KillLoopShape:
    """The run: jobs, tier, provider faults and when the kills come.

    kill_after_outcomes > 0: `kills` kills, each once the running process has written this many
    outcomes of its own (so every kill hits a process at work, however long its group join
    took); 0: one kill at each of `kill_at_s` (seconds from the first start).
    """

    jobs: int = 1500
    partitions: int = 4
    batch_every: int = 2
    kills: int = 3
    kill_after_outcomes: int = 100
    kill_at_s: tuple[float, ...] = (4.0, 9.0, 14.0)
    restart_after_s: float = 1.0
    max_items: int = 16
    timeout_s: float = 1.5
    max_attempts: int = 8
    finish_wait_s: float = 240.0
    #: the service's consumer-group session (None: the service's default)
    session_timeout_s: float | None = None
    simulator: SimulatorConfig = field(default_factory=lambda: KILL_LOOP_FAULTS)


def kill_loop_tiers(base_url: str, shape: KillLoopShape) -> dict[str, Any]:
    """One tier on the simulator: batching 16/50 ms/500 ms, AIMD 4..32, 1.5 s timeout, 8 attempts."""
    return tier_file_dict(
        base_url + "/v1",
        max_items=shape.max_items,
        limiter=KILL_LOOP_LIMITER,
        timeout_s=shape.timeout_s,
        retry={"max_attempts": shape.max_attempts, "backoff_initial_s": 0.05, "backoff_max_s": 1.0},
    )


@dataclass
class KillLog:
    """What each kill of `kill_and_restart` hit, in kill order."""

    #: the group's commits and the outcome topics' ends right after each kill
    snapshots: list[KillSnapshot] = field(default_factory=list)
    #: outcomes the killed process had written of its own
    written: list[int] = field(default_factory=list)
    #: ids without an outcome at the kill (as far as the follower had read)
    open_ids: list[int] = field(default_factory=list)
    #: whether the process still ran when it was due to be killed
    alive: list[bool] = field(default_factory=list)


def written_since_last_kill(follower: OutcomeFollower, snapshots: Sequence[KillSnapshot]) -> int:
    """Outcomes written by the process started after the last kill (all, before the first)."""
    return sum(1 for o in follower.outcomes if era_of(o, snapshots) == len(snapshots))


async def kill_and_restart(
    service: ServiceProcess,
    follower: OutcomeFollower,
    settings: Settings,
    ids: set[Any],
    *,
    kills: int,
    after_outcomes: int,
    kill_at: Sequence[float] = (),
    restart_after_s: float = 1.0,
) -> KillLog:
    """SIGKILL the running `service` `kills` times, each once it has written `after_outcomes`
    outcomes of its own (bounded by KILL_WAIT_S; 0: at the monotonic times `kill_at`), and
    start it again `restart_after_s` later. Returns what each kill hit."""
    log = KillLog()
    times = list(kill_at) if not after_outcomes else [0.0] * kills
    for due_at in times:
        if after_outcomes:
            await follower.wait(
                lambda: written_since_last_kill(follower, log.snapshots) >= after_outcomes
                or not service.alive(),
                timeout_s=KILL_WAIT_S,
            )
        else:
            await asyncio.sleep(max(0.0, due_at - time.monotonic()))
        log.alive.append(service.alive())
        service.kill()
        log.written.append(written_since_last_kill(follower, log.snapshots))
        log.snapshots.append(await kill_snapshot(settings))
        log.open_ids.append(len(ids - follower.ids()))
        await asyncio.sleep(restart_after_s)
        service.start()
    return log


async def run_kill_loop(bootstrap: str, shape: KillLoopShape, workdir: Path) -> dict[str, Any]:
    """The kill loop (module docstring); returns jobs, outcomes, duplicates, lost, wrong, causes,
    and per kill: the outcomes the killed process had written and the ids still open."""
    session = shape.session_timeout_s
    extra: dict[str, Any] = {} if session is None else {"PROMPTBUS_SESSION_TIMEOUT_S": session}
    env = service_env(bootstrap, partitions=shape.partitions, PROMPTBUS_STATS_INTERVAL_S=1, **extra)
    settings = settings_from_env(env)
    await ensure_topics(settings)
    jobs = [job(i, batch=i % shape.batch_every != 0) for i in range(shape.jobs)]
    expected = {j["id"]: answer_for(j["variables"]["text"]) for j in jobs}
    with run_simulator(shape.simulator) as base_url:
        service = ServiceProcess(env, kill_loop_tiers(base_url, shape), workdir)
        async with OutcomeFollower(settings) as follower:
            await produce(settings, jobs)
            try:
                t0 = time.monotonic()
                service.start()
                kills = await kill_and_restart(
                    service,
                    follower,
                    settings,
                    set(expected),
                    kills=shape.kills,
                    after_outcomes=shape.kill_after_outcomes,
                    kill_at=[t0 + at_s for at_s in shape.kill_at_s],
                    restart_after_s=shape.restart_after_s,
                )
                finished = await follower.wait_for_ids(expected, timeout_s=shape.finish_wait_s)
                took_s = time.monotonic() - t0
                exit_code = await stop_gracefully(service, 30)
            finally:
                service.kill()
            await follower.settle()
            outcomes = list(follower.outcomes)
    return _kill_loop_report(shape, expected, outcomes, kills) | {
        "finished": finished,
        "took_s": round(took_s, 1),
        "exit_code": exit_code,
        "log": str(service.log_path),
    }


def _kill_loop_report(
    shape: KillLoopShape, expected: dict[str, str], outcomes: list[Outcome], kills: KillLog
) -> dict[str, Any]:
    snapshots = kills.snapshots
    seen = {o.job_id for o in outcomes}
    wrong = sum(1 for o in outcomes if not o.dead and o.output != expected.get(o.job_id))
    ages_ms: list[int] = []
    causes = attribute_duplicates(outcomes, snapshots, ages_ms)
    ages_ms.sort()
    by_process = Counter(era_of(o, snapshots) for o in outcomes)
    return {
        "jobs": len(expected),
        "outcomes": len(outcomes),
        "duplicates": len(outcomes) - len(seen),
        "duplicate_share": round((len(outcomes) - len(seen)) / len(expected), 4),
        "lost": len(set(expected) - seen),
        "wrong": wrong,
        "dead_letters": sum(1 for o in outcomes if o.dead),
        "kills": len(snapshots),
        "kill_after_outcomes": shape.kill_after_outcomes,
        "causes": dict(sorted(causes.items())),
        # how long before the kill the outcomes it redid were written (median, max)
        "acked_uncommitted_age_ms": [ages_ms[len(ages_ms) // 2], ages_ms[-1]] if ages_ms else [],
        "metadata_chars_max": max((c[2] for s in snapshots for c in s.committed.values()), default=0),
        "outcomes_at_kill": [sum(v for (dead, _), v in s.ends.items() if not dead) for s in snapshots],
        # outcomes each process wrote before it was killed (the last one: until the end)
        "outcomes_by_process": [by_process.get(i, 0) for i in range(len(snapshots) + 1)],
        "open_at_kill": kills.open_ids,
        "alive_at_kill": kills.alive,
    }
