"""A broker dies under the running service (3-node cluster, RF 3, min ISR 2).

The service (a real `promptbus run` process) works through ~600 jobs on the 3-node local
cluster. Mid-run the broker that coordinates the service's consumer group is SIGKILLed (it
also leads some job and result partitions, and under exactly_once may coordinate
transactions); the service must carry on with two brokers, and the node is restarted before
the end. Nothing is lost; under exactly_once a read_committed reader sees one outcome per id.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from consumer.kafka.connection import client_kwargs
from consumer.settings import Settings
from consumer.testing.cluster import LocalKafka
from consumer.testing.harness import (
    create_topics,
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

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

JOBS = 600
KILL_AFTER_OUTCOMES = 100
#: outcomes that must appear while the node is down, before it is restarted
WHILE_DOWN_OUTCOMES = 100
WAIT_S = 120.0
SHUTDOWN_WAIT_S = 40.0


async def group_coordinator(settings: Settings) -> int:
    """Broker id coordinating the service's consumer group."""
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        return int(await admin.find_coordinator(settings.group_id))
    finally:
        await admin.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_service_survives_a_broker_sigkill(
    kafka_cluster: LocalKafka, tmp_path: Path, guarantee: str
) -> None:
    env = service_env(
        kafka_cluster.bootstrap, partitions=4, guarantee=guarantee, PROMPTBUS_TOPIC_REPLICATION=3
    )
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = mixed_jobs(JOBS)
    ids = {j["id"] for j in jobs}
    killed: int | None = None
    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=13)) as base_url:
        service = ServiceProcess(env, slow_tier(base_url), tmp_path)
        try:
            async with OutcomeFollower(settings) as follower:
                await produce(settings, jobs)
                service.start()
                assert await follower.wait(
                    lambda: follower.records >= KILL_AFTER_OUTCOMES, timeout_s=WAIT_S
                ), f"only {follower.records} outcomes\n{logs_of([service])}"
                killed = await group_coordinator(settings)
                await asyncio.to_thread(kafka_cluster.kill, killed)
                at_kill = follower.records
                assert len(ids - follower.ids()) > 0, "the kill came after the run ended"
                print(f"killed broker {killed} (group coordinator) after {at_kill} outcomes")

                assert await follower.wait(
                    lambda: follower.records >= at_kill + WHILE_DOWN_OUTCOMES or not service.alive(),
                    timeout_s=WAIT_S,
                ), f"no progress with broker {killed} down: {follower.records}\n{logs_of([service])}"
                assert service.alive(), f"the service died\n{logs_of([service])}"
                await asyncio.to_thread(kafka_cluster.restart, killed)
                killed = None

                assert await follower.wait_for_ids(ids, timeout_s=WAIT_S), (
                    f"{len(ids - follower.ids())} ids without outcome\n{logs_of([service])}"
                )
                code = await stop_gracefully(service, SHUTDOWN_WAIT_S)
                assert code == 0, f"exit code {code} on SIGTERM\n{logs_of([service])}"
        finally:
            service.ensure_stopped()
            if killed is not None:
                await asyncio.to_thread(kafka_cluster.restart, killed)

    outcomes = await read_outcomes(settings)
    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == ids, f"lost: {sorted(ids - set(outcomes.results))[:5]}"
    for j in jobs:
        expected = answer_for(j["variables"]["text"])
        assert all(r["output"] == expected for r in outcomes.results[j["id"]]), j["id"]
    dups = outcomes.duplicate_count()
    if guarantee == "exactly_once":
        assert dups == 0, f"duplicates visible to read_committed: {outcomes.duplicates()}"
    print(f"{guarantee}, broker SIGKILL + restart: {JOBS} jobs, {dups} duplicates")
