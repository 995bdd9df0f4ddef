"""A stopping instance hands its running work over and is SIGKILLed before it finishes it: the
new owner, never told the work was finished, does it itself at the hand-over's deadline.

Two `promptbus run` processes share a group; every answer takes ANSWER_MS, so when `a` gets
SIGTERM it has requests running. It publishes its hand-over, leaves the group (its log says
so) and is SIGKILLed at once, before any "finished" record. `b` takes every partition, parks
what `a` handed over, and runs it once the deadline passes. Nothing is lost, nothing is
dead-lettered, and `b`'s log names the parked records it did itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from consumer.testing.harness import (
    create_topics,
    mixed_jobs,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.process import ServiceProcess, logs_of, split_between
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

pytestmark = pytest.mark.integration

JOBS = 120
PARTITIONS = 4
ANSWER_MS = 2500
HANDOVER_TIMEOUT_S = 4.0
#: after the jobs are produced, so that `a` has admitted its share and sent requests
ADMIT_S = 1.0
JOIN_WAIT_S = 60.0
FINISH_WAIT_S = 120.0
#: what each process logs: the stop's hand-over, and the new owner doing parked records itself
HANDED_OVER = "stopping: handed over"
REDONE_HERE = "parked records not finished by their old owner: doing them here"


def _log_has(service: ServiceProcess, line: str) -> bool:
    return service.log_path.exists() and line in service.log_path.read_text(errors="replace")


async def test_a_hand_over_whose_old_owner_is_killed_is_done_by_the_new_owner_at_its_deadline(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(
        kafka_bootstrap,
        partitions=PARTITIONS,
        PROMPTBUS_HANDOVER_TIMEOUT_S=HANDOVER_TIMEOUT_S,
        PROMPTBUS_SHUTDOWN_TIMEOUT_S=30,
    )
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = mixed_jobs(JOBS)
    ids = {j["id"] for j in jobs}
    all_partitions = set(range(PARTITIONS))

    with run_simulator(SimulatorConfig(latency_ms=ANSWER_MS, seed=49)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=5, timeout_s=15)
        a = ServiceProcess(env, tiers, tmp_path, name="a")
        b = ServiceProcess(env, tiers, tmp_path, name="b")
        services = [a, b]
        try:
            async with OutcomeFollower(settings) as follower:
                a.start()
                b.start()

                shared = await follower.wait(
                    lambda: split_between([a, b], all_partitions), timeout_s=JOIN_WAIT_S
                )
                assert shared, logs_of(services)
                await produce(settings, jobs)
                await asyncio.sleep(ADMIT_S)
                assert follower.records == 0, "answers came before the stop: not mid-flight (tune ANSWER_MS)"

                assert a.proc is not None
                a.proc.terminate()
                handed_over = await follower.wait(lambda: _log_has(a, HANDED_OVER), timeout_s=JOIN_WAIT_S)
                assert handed_over, logs_of([a])
                a.kill()
                written_by_a = follower.records

                assert await follower.wait(lambda: b.assignment() == all_partitions, timeout_s=JOIN_WAIT_S), (
                    f"b did not take every partition\n{logs_of(services)}"
                )
                assert await follower.wait_for_ids(ids, timeout_s=FINISH_WAIT_S), (
                    f"{len(ids - follower.ids())} ids without outcome\n{logs_of(services)}"
                )
                assert _log_has(b, REDONE_HERE), (
                    f"b never did parked records itself: the hand-over was not read or not parked\n"
                    f"{logs_of([b])}"
                )
        finally:
            for s in services:
                s.ensure_stopped()

    outcomes = await read_outcomes(settings)
    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == ids, f"lost: {sorted(ids - set(outcomes.results))[:5]}"
    for j in jobs:
        expected = answer_for(j["variables"]["text"])
        assert all(r["output"] == expected for r in outcomes.results[j["id"]]), j["id"]
    print(
        f"hand-over, old owner SIGKILLed: {len(jobs)} jobs, {written_by_a} outcomes written by a "
        f"before the kill, {outcomes.duplicate_count()} duplicates"
    )
