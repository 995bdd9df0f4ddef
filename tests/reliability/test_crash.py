"""SIGKILL the service process mid-run three times: with two lanes (one consumer group on both
topics), and with embed jobs.

A real `promptbus run` subprocess, a real broker, the simulator over real HTTP in a background
thread (so it outlives every service process). The tier is held to 2 concurrent requests so
the backlog lasts across the kills; each kill comes once the running process has written
outcomes of its own and lands mid-run (some ids still open), and the last process exits 0 on
SIGTERM. The session is short (`quick_session_s`), so a restart gets the partitions within
seconds.

- Two lanes, bulk jobs (batched and unbatched mixed, 4 partitions) on the jobs topic and
  interactive ones on a lane of their own. exactly_once (one run, checked by two tests): a
  read_committed reader sees exactly one outcome per id, each the simulator's answer to its
  own input, in its own lane. at_least_once: nothing is lost in either lane, every copy right.
- Embed jobs windowed into array requests under provider faults (5xx, hangs past the timeout,
  dropped connections): nothing lost, every vector its own input's.
- 1,500 chat jobs under provider faults with the duplicate bound: `test_kill_loop.py`.

And the mechanism on its own, on a bare `KafkaIntake`: what a commit's metadata names is
skipped by the next owner and carried on by its commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from consumer.core.offsets import CommitPoint, DoneOffsets, decode_done, encode_done
from consumer.kafka.admin import ensure_topics
from consumer.kafka.connection import client_kwargs
from consumer.kafka.intake import KafkaIntake
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.testing.cluster import quick_session_s
from consumer.testing.faultrun import KillLog, kill_and_restart
from consumer.testing.harness import (
    Outcomes,
    create_topics,
    job,
    mixed_jobs,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    slow_tier,
)
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.process import ServiceProcess, logs_of, stop_gracefully
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from consumer.testing.simulator.embeddings import embedding_vector

pytestmark = pytest.mark.integration

KILLS = 3
FINISH_WAIT_S = 180.0
SHUTDOWN_WAIT_S = 40.0
BULK_JOBS = 600
INTERACTIVE_JOBS = 100
EMBED_JOBS = 1500
#: outcomes each process writes before it is killed
LANES_KILL_AFTER = 40
EMBED_KILL_AFTER = 150

#: 5xx, hangs past the tier's 1 s timeout and dropped connections: the jobs they hit are
#: retried and finish late, so completions pile up above their partition's watermark
FAULTS = SimulatorConfig(
    latency_ms=40, jitter_ms=10, seed=5, error_rate=0.05, hang_rate=0.02, hang_s=30, drop_rate=0.02
)
#: enough attempts that no job runs out of them under FAULTS (every id must end as a result)
FAULT_RETRY = {"max_attempts": 10, "backoff_initial_s": 0.05, "backoff_max_s": 0.5}


async def run_with_kills(
    env: dict[str, str],
    tiers: dict[str, Any],
    workdir: Path,
    follower: OutcomeFollower,
    ids: set[str],
    kill_after: int,
) -> KillLog:
    """Run the service on what was produced, SIGKILL + restart it KILLS times (each once it
    wrote `kill_after` outcomes of its own), wait for every id, stop it with SIGTERM."""
    settings = settings_from_env(env)
    service = ServiceProcess(env, tiers, workdir)
    try:
        service.start()
        kills = await kill_and_restart(
            service, follower, settings, ids, kills=KILLS, after_outcomes=kill_after
        )
        print(f"kills: {kills.written} outcomes written by each killed process, {kills.open_ids} ids open")
        assert all(kills.alive), f"the service exited on its own\n{logs_of([service])}"
        assert all(n >= kill_after for n in kills.written), (kills.written, logs_of([service]))
        assert all(n > 0 for n in kills.open_ids), f"a kill came after the run ended: {kills.open_ids}"
        ok = await follower.wait_for_ids(ids, timeout_s=FINISH_WAIT_S)
        missing = sorted(ids - follower.ids())
        assert ok, f"{len(missing)} ids without outcome, e.g. {missing[:5]}\n{logs_of([service])}"
        code = await stop_gracefully(service, SHUTDOWN_WAIT_S)
        assert code == 0, f"exit code {code} on SIGTERM\n{logs_of([service])}"
    finally:
        service.ensure_stopped()
    await follower.settle()
    return kills


async def crash_env(bootstrap: str, guarantee: str) -> dict[str, str]:
    session_s = await quick_session_s(bootstrap)
    return service_env(bootstrap, partitions=4, guarantee=guarantee, PROMPTBUS_SESSION_TIMEOUT_S=session_s)


# ================================================================== two lanes
@dataclass(frozen=True)
class LanesRun:
    """What one two-lane run through three kills left."""

    bulk: list[dict[str, Any]]
    interactive: list[dict[str, Any]]
    interactive_topic: str
    jobs_topic: str
    outcomes: Outcomes
    #: records the live read_committed reader saw, and a read_uncommitted one
    committed_records: int
    uncommitted_records: int
    kills: KillLog


async def two_lanes_through_kills(bootstrap: str, workdir: Path, guarantee: str) -> LanesRun:
    """Bulk jobs on the jobs topic, interactive ones on a lane of their own, three kills."""
    env = await crash_env(bootstrap, guarantee)
    settings = settings_from_env(env)
    interactive_topic = settings.jobs_topic + ".interactive"
    await ensure_topics(settings, lane_topics=[interactive_topic])
    bulk = mixed_jobs(BULK_JOBS)
    interactive = [{**job(i, batch=i % 2 == 0), "id": f"int-{i}"} for i in range(INTERACTIVE_JOBS)]
    await produce(settings.model_copy(update={"jobs_topic": interactive_topic}), interactive)
    await produce(settings, bulk)
    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=7)) as base_url:
        tiers = slow_tier(base_url)
        tiers["lanes"] = {
            "interactive": {"topic": interactive_topic, "max_wait_ms": 50},
            "bulk": {"topic": settings.jobs_topic, "min_share": 0.1},
        }
        ids = {j["id"] for j in bulk + interactive}
        async with (
            OutcomeFollower(settings, isolation_level="read_uncommitted") as uncommitted,
            OutcomeFollower(settings) as follower,
        ):
            kills = await run_with_kills(env, tiers, workdir, follower, ids, LANES_KILL_AFTER)
            await uncommitted.settle()
    outcomes = await read_outcomes(settings)  # read_committed, after the last process stopped
    return LanesRun(
        bulk, interactive, interactive_topic, settings.jobs_topic, outcomes,
        follower.records, uncommitted.records, kills,
    )


def assert_every_answer_its_own(run: LanesRun) -> None:
    """No dead letter, every id answered, each copy the simulator's answer to its own input
    in its own lane."""
    assert not run.outcomes.dead, list(run.outcomes.dead.items())[:3]
    assert set(run.outcomes.results) == {j["id"] for j in run.bulk + run.interactive}, "a job was lost"
    for j in run.bulk + run.interactive:
        lane = "interactive" if j["id"].startswith("int-") else "bulk"
        topic = run.interactive_topic if lane == "interactive" else run.jobs_topic
        for r in run.outcomes.results[j["id"]]:
            assert r["output"] == answer_for(j["variables"]["text"]), j["id"]
            assert (r["lane"], r["source"]["topic"]) == (lane, topic), r


@pytest.fixture(scope="module")
def exactly_once_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanesRun]:
    """One exactly_once run through three kills, shared by the two tests that check it."""
    workdir = tmp_path_factory.mktemp("exactly-once")
    yield asyncio.run(two_lanes_through_kills(kafka_bootstrap, workdir, "exactly_once"))


def test_exactly_once_survives_three_kills(exactly_once_run: LanesRun) -> None:
    run = exactly_once_run
    assert_every_answer_its_own(run)
    duplicates = run.outcomes.duplicates()
    assert duplicates == {}, f"duplicates visible to read_committed: {duplicates}"
    jobs = len(run.bulk) + len(run.interactive)
    assert run.committed_records == jobs, "the live read_committed reader saw a duplicate"
    print(
        f"exactly_once, {KILLS} SIGKILLs: {jobs} jobs, {jobs} committed outcomes, 0 duplicates; "
        f"read_uncommitted saw {run.uncommitted_records} "
        f"({run.uncommitted_records - run.committed_records} from aborted transactions)"
    )


def test_two_lanes_survive_three_kills_exactly_once(exactly_once_run: LanesRun) -> None:
    """Both lanes' jobs answered once each, in their own lane, through the same three kills."""
    run = exactly_once_run
    assert_every_answer_its_own(run)
    assert len(run.kills.snapshots) == KILLS
    for j in run.interactive:
        (r,) = run.outcomes.results[j["id"]]
        assert r["lane"] == "interactive" and r["output"] == answer_for(j["variables"]["text"])


async def test_two_lanes_survive_three_kills_at_least_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = await two_lanes_through_kills(kafka_bootstrap, tmp_path, "at_least_once")
    assert_every_answer_its_own(run)
    print(
        f"at_least_once, two lanes, {KILLS} SIGKILLs: {len(run.bulk) + len(run.interactive)} jobs, "
        f"{run.outcomes.duplicate_count()} duplicates"
    )


# ================================================================== embed jobs
async def test_embed_jobs_survive_three_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = await crash_env(kafka_bootstrap, "at_least_once")
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = [
        {"id": f"emb-{i}", "tier": "small", "kind": "embed", "input": f"embed text number {i}"}
        for i in range(EMBED_JOBS)
    ]
    await produce(settings, jobs)
    with run_simulator(FAULTS) as base_url:
        tiers = slow_tier(base_url, timeout_s=1.0, retry=FAULT_RETRY)
        async with OutcomeFollower(settings) as follower:
            await run_with_kills(env, tiers, tmp_path, follower, {j["id"] for j in jobs}, EMBED_KILL_AFTER)
    outcomes = await read_outcomes(settings)

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}, "a job was lost"
    for j in jobs:
        want = embedding_vector(j["input"], "sim-model")
        for r in outcomes.results[j["id"]]:
            assert r["embedding"] == want and r["output"] is None, j["id"]
    # at_least_once redoes what a kill left uncommitted; each redo is the same vector (above).
    # The duplicate bound is the offsets mechanism's, held by test_kill_loop.py
    dups = outcomes.duplicate_count()
    print(f"embed, at_least_once, {KILLS} SIGKILLs: {len(jobs)} jobs, {dups} duplicates")


# ================================================================== the mechanism
class _Handler:
    """Rebalance callbacks for a bare intake: nothing to do."""

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        pass

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        pass

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        pass


async def _read_offsets(settings: Settings, expected: int) -> tuple[list[int], int]:
    """A fresh intake of the group reads what it is given (bounded): offsets, records skipped."""
    intake = KafkaIntake(settings, client_id="test-skip")
    await intake.start(_Handler())
    try:
        offsets: list[int] = []
        for _ in range(100):
            offsets += [r.source.offset for r in await intake.poll(0.2, 500)]
            if len(offsets) >= expected:
                break
        return offsets, intake.skipped_done
    finally:
        await intake.stop()


async def _committed_metadata(settings: Settings, tp: TopicPartition) -> tuple[int, str]:
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(settings.group_id, partitions=[tp])
    finally:
        await admin.close()
    return committed[tp].offset, committed[tp].metadata


async def test_a_new_owner_skips_what_the_committed_metadata_names(kafka_bootstrap: str) -> None:
    """The mechanism under the duplicate bound: a commit at 2 naming 3, 5 and 6 as finished
    makes the next owner read 2, 4, 7 only; its own commit at 4 names 5 and 6 again (a second
    crash does not redo them either); metadata written for another offset is not used."""
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=1))
    await create_topics(settings)
    await produce(settings, [job(i, batch=False) for i in range(8)])
    tp = TopicPartition(settings.jobs_topic, 0)

    first = KafkaIntake(settings, client_id="test-skip")
    await first.start(_Handler())
    try:
        for _ in range(100):
            if len(await first.poll(0.2, 500)) or first.assignment():
                break
        await first.commit({tp: CommitPoint(2, DoneOffsets.of([3, 5, 6]))})
    finally:
        await first.stop()
    offset, metadata = await _committed_metadata(settings, tp)
    assert offset == 2 and list(decode_done(2, metadata).done) == [3, 5, 6]

    offsets, skipped = await _read_offsets(settings, expected=3)
    assert offsets == [2, 4, 7] and skipped == 3

    second = KafkaIntake(settings, client_id="test-skip")
    await second.start(_Handler())
    try:
        for _ in range(100):
            if await second.poll(0.2, 500):
                break
        await second.commit({tp: 4})  # nothing of its own finished above 4
    finally:
        await second.stop()
    offset, metadata = await _committed_metadata(settings, tp)
    assert offset == 4 and list(decode_done(4, metadata).done) == [5, 6], "the carried offsets were lost"

    consumer = AIOKafkaConsumer(
        group_id=settings.group_id, enable_auto_commit=False, **client_kwargs(settings)
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(2, encode_done(4, DoneOffsets.of([5, 6])))})
    finally:
        await consumer.stop()
    offsets, skipped = await _read_offsets(settings, expected=6)
    assert offsets == [2, 3, 4, 5, 6, 7] and skipped == 0, "metadata of another offset was used"
