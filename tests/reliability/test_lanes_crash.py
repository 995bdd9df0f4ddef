"""SIGKILL the service three times mid-run with two lanes: one consumer group on both topics.

As `test_crash.py`, with interactive jobs on a second lane's topic beside the bulk jobs on the
jobs topic: nothing is lost in either lane (at_least_once), and under exactly_once a
read_committed reader sees exactly one outcome per id, each carrying its lane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from consumer.kafka.admin import ensure_topics
from consumer.testing.harness import produce, read_outcomes, service_env, settings_from_env
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.reliability.support import OutcomeFollower, duplicate_count
from tests.reliability.test_crash import SMALL, run_with_kills, slow_tier
from tests.service.harness import job

pytestmark = pytest.mark.integration

INTERACTIVE_JOBS = 100


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_two_lanes_survive_three_kills(kafka_bootstrap: str, tmp_path: Path, guarantee: str) -> None:
    env = service_env(kafka_bootstrap, partitions=4, guarantee=guarantee)
    settings = settings_from_env(env)
    interactive_topic = settings.jobs_topic + ".interactive"
    await ensure_topics(settings, lane_topics=[interactive_topic])
    interactive = [{**job(i, batch=i % 2 == 0), "id": f"int-{i}"} for i in range(INTERACTIVE_JOBS)]
    await produce(settings.model_copy(update={"jobs_topic": interactive_topic}), interactive)
    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=7)) as base_url:
        tiers: dict[str, Any] = slow_tier(base_url)
        tiers["lanes"] = {
            "interactive": {"topic": interactive_topic, "max_wait_ms": 50},
            "bulk": {"topic": settings.jobs_topic, "min_share": 0.1},
        }
        async with OutcomeFollower(settings) as follower:
            bulk, at_kill = await run_with_kills(settings, env, tiers, tmp_path, follower, SMALL)
    outcomes = await read_outcomes(settings)

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    every = bulk + interactive
    assert set(outcomes.results) == {j["id"] for j in every}, "a job was lost"
    for j in every:
        lane = "interactive" if j["id"].startswith("int-") else "bulk"
        for r in outcomes.results[j["id"]]:
            assert r["output"] == answer_for(j["variables"]["text"]), j["id"]
            assert r["lane"] == lane and r["source"]["topic"] == (
                interactive_topic if lane == "interactive" else settings.jobs_topic
            )
    dups = duplicate_count(outcomes.results)
    print(
        f"{guarantee}, two lanes, 3 SIGKILLs: {len(every)} jobs, {dups} duplicates; "
        f"outcomes at kills {at_kill}"
    )
    if guarantee == "exactly_once":
        assert outcomes.duplicates() == {}, f"duplicates visible to read_committed: {outcomes.duplicates()}"
        assert follower.records == len(every), "the live read_committed reader saw a duplicate"
