"""SIGKILL the service three times while it embeds: nothing lost, every vector its own input's.

The same run as `test_crash.py` (a real `promptbus run` subprocess, the broker, the simulator
with faults in a background thread), with embed jobs windowed into array requests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.testing.harness import create_topics, read_outcomes, service_env, settings_from_env
from consumer.testing.simulator import run_simulator
from consumer.testing.simulator.embeddings import embedding_vector
from tests.reliability.support import OutcomeFollower, duplicate_count
from tests.reliability.test_crash import (
    FAULT_RETRY,
    FAULTS,
    FAULTY,
    KILLS,
    run_with_kills,
    slow_tier,
)

pytestmark = pytest.mark.integration


async def test_embed_jobs_survive_three_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(kafka_bootstrap, partitions=4, guarantee="at_least_once")
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = [
        {"id": f"emb-{i}", "tier": "small", "kind": "embed", "input": f"embed text number {i}"}
        for i in range(FAULTY.jobs)
    ]
    with run_simulator(FAULTS) as base_url:
        tiers = slow_tier(base_url, timeout_s=1.0, retry=FAULT_RETRY)
        async with OutcomeFollower(settings) as follower:
            await run_with_kills(settings, env, tiers, tmp_path, follower, FAULTY, jobs)
    outcomes = await read_outcomes(settings)

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}, "a job was lost"
    for j in jobs:
        want = embedding_vector(j["input"], "sim-model")
        for r in outcomes.results[j["id"]]:
            assert r["embedding"] == want and r["output"] is None, j["id"]
    # at_least_once redoes what a kill left uncommitted; each redo is the same vector (above).
    # The duplicate bound is the offsets mechanism's, held by test_crash.py
    dups = duplicate_count(outcomes.results)
    print(f"embed, at_least_once, {KILLS} SIGKILLs: {len(jobs)} jobs, {dups} duplicates")
