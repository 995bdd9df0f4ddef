"""SIGKILL the service process mid-run three times.

A real `promptbus run` subprocess, a real broker, the simulator over real HTTP in a background
thread (so it outlives every service process). Batched and unbatched jobs mixed, on 4
partitions; the tier is held to 2 concurrent requests so the backlog lasts across the kills.
After each restart the test waits until the new process has published outcomes of its own
before the next kill, and checks that the kill lands mid-run (some ids still open).

- at_least_once: ~1,500 jobs with provider faults (5xx, hangs past the timeout, dropped
  connections: retried jobs finish late and hold their partition's watermark back). Every id
  gets >= 1 result, each the simulator's answer to that job's own input; duplicates are at
  most 5% of the jobs, because each commit carries the offsets completed above the watermark
  and a new owner skips them.
- exactly_once: a read_committed reader sees exactly one outcome per id.

And the mechanism on its own, on a bare `KafkaIntake`: what a commit's metadata names is
skipped by the next owner and carried on by its commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from consumer.core.offsets import CommitPoint, DoneOffsets, decode_done, encode_done
from consumer.kafka.connection import client_kwargs
from consumer.kafka.intake import KafkaIntake
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings
from consumer.testing.harness import (
    create_topics,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.reliability.support import (
    OutcomeFollower,
    duplicate_count,
    logs_of,
    mixed_jobs,
    stop_gracefully,
)
from tests.service.harness import ServiceProcess, job

pytestmark = pytest.mark.integration

KILLS = 3
#: a restart waits out the killed member's session (10 s) before the group rebalances
RESTART_WAIT_S = 60.0
FINISH_WAIT_S = 180.0
SHUTDOWN_WAIT_S = 40.0
#: at_least_once after the kills: duplicate outcomes at most this share of the jobs
MAX_DUPLICATE_SHARE = 0.05


@dataclass(frozen=True)
class CrashShape:
    """How many jobs, and how many outcomes before the first kill and between later kills."""

    jobs: int
    first_kill_after: int
    new_before_kill: int


#: the exactly_once case: no faults, its duplicates are hidden by transactions anyway
SMALL = CrashShape(jobs=600, first_kill_after=60, new_before_kill=25)
#: the at_least_once case, as measured: ~1,500 jobs, provider faults, 3 kills
FAULTY = CrashShape(jobs=1500, first_kill_after=200, new_before_kill=100)

#: 5xx, hangs past the tier's 1 s timeout and dropped connections: the jobs they hit are
#: retried and finish late, so completions pile up above their partition's watermark
FAULTS = SimulatorConfig(
    latency_ms=40, jitter_ms=10, seed=5, error_rate=0.05, hang_rate=0.02, hang_s=30, drop_rate=0.02
)

#: enough attempts that no job runs out of them under FAULTS (every id must end as a result)
FAULT_RETRY = {"max_attempts": 10, "backoff_initial_s": 0.05, "backoff_max_s": 0.5}


def slow_tier(base_url: str, **tier: Any) -> dict[str, Any]:
    """2 concurrent requests at most, 5 items per batched request: the backlog lasts seconds."""
    tiers = tier_file_dict(base_url + "/v1", max_items=5, **tier)
    tiers["tiers"]["small"]["limiter"] = {"algorithm": "fixed", "initial": 2, "min": 1, "max": 2}
    return tiers


async def run_with_kills(
    settings: Settings,
    env: dict[str, str],
    tiers: dict[str, Any],
    workdir: Path,
    follower: OutcomeFollower,
    shape: CrashShape,
    jobs: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[int]]:
    """Produce the jobs (default: `shape.jobs` mixed batched and unbatched ones), run the
    service, SIGKILL + restart it KILLS times, wait for every id.

    Returns the jobs and the outcome count at each kill (the service is stopped).
    """
    jobs = jobs if jobs is not None else mixed_jobs(shape.jobs)
    ids = {j["id"] for j in jobs}
    service = ServiceProcess(env, tiers, workdir)
    at_kill: list[int] = []
    try:
        await produce(settings, jobs)
        service.start()
        target = shape.first_kill_after
        for n in range(KILLS):

            def progressed(t: int = target) -> bool:
                return follower.records >= t or not service.alive()

            await follower.wait(progressed, timeout_s=RESTART_WAIT_S)
            assert service.alive(), f"service exited on its own\n{logs_of([service])}"
            assert follower.records >= target, (
                f"kill {n + 1}: only {follower.records} outcomes (< {target})\n{logs_of([service])}"
            )
            service.kill()
            at_kill.append(follower.records)
            open_ids = len(ids - follower.ids())
            assert open_ids > 0, f"kill {n + 1} came after the run ended: tune the pacing"
            print(f"kill {n + 1}: {follower.records} outcomes seen, {open_ids} ids still open")
            service.start()
            target = follower.records + shape.new_before_kill
        ok = await follower.wait(lambda: ids <= follower.ids(), timeout_s=FINISH_WAIT_S)
        missing = sorted(ids - follower.ids())
        assert ok, f"{len(missing)} ids without outcome, e.g. {missing[:5]}\n{logs_of([service])}"
        code, took_s = await stop_gracefully(service, SHUTDOWN_WAIT_S)
        assert code == 0, f"exit code {code} on SIGTERM\n{logs_of([service])}"
        print(f"final SIGTERM: exit {code} after {took_s:.1f} s")
    finally:
        service.ensure_stopped()
    return jobs, at_kill


async def test_at_least_once_survives_three_kills_with_few_duplicates(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=4, guarantee="at_least_once")
    settings = settings_from_env(env)
    await create_topics(settings)
    with run_simulator(FAULTS) as base_url:
        tiers = slow_tier(base_url, timeout_s=1.0, retry=FAULT_RETRY)
        async with OutcomeFollower(settings) as follower:
            jobs, at_kill = await run_with_kills(settings, env, tiers, tmp_path, follower, FAULTY)
    outcomes = await read_outcomes(settings)

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}, "a job was lost"
    for j in jobs:
        expected = answer_for(j["variables"]["text"])
        for r in outcomes.results[j["id"]]:
            assert r["output"] == expected, (j["id"], r)
    dups = duplicate_count(outcomes.results)
    total = sum(len(v) for v in outcomes.results.values())
    share = dups / len(jobs)
    print(
        f"at_least_once, {KILLS} SIGKILLs: {len(jobs)} jobs, {total} results, {dups} duplicates "
        f"({share:.1%} of the jobs; {len(outcomes.duplicates())} ids answered more than once); "
        f"outcomes at kills {at_kill}"
    )
    assert share <= MAX_DUPLICATE_SHARE, f"{dups} duplicates: {share:.1%} of {len(jobs)} jobs"


async def test_exactly_once_survives_three_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(kafka_bootstrap, partitions=4, guarantee="exactly_once")
    settings = settings_from_env(env)
    await create_topics(settings)
    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=6)) as base_url:
        async with OutcomeFollower(settings, isolation_level="read_uncommitted") as uncommitted:
            async with OutcomeFollower(settings) as follower:
                jobs, at_kill = await run_with_kills(
                    settings, env, slow_tier(base_url), tmp_path, follower, SMALL
                )
    outcomes = await read_outcomes(settings)  # read_committed, after the last process stopped

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}, "a job was lost"
    assert outcomes.duplicates() == {}, f"duplicates visible to read_committed: {outcomes.duplicates()}"
    assert follower.records == len(jobs), "the live read_committed reader saw a duplicate"
    for j in jobs:
        (r,) = outcomes.results[j["id"]]
        assert r["output"] == answer_for(j["variables"]["text"]), j["id"]
    aborted = uncommitted.records - follower.records
    print(
        f"exactly_once, {KILLS} SIGKILLs: {len(jobs)} jobs, {len(jobs)} committed outcomes, 0 duplicates; "
        f"read_uncommitted saw {uncommitted.records} ({aborted} from aborted transactions); "
        f"outcomes at kills {at_kill}"
    )


class _Handler:
    """Rebalance callbacks for a bare intake: nothing to do."""

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
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
