"""The service end to end, in-process: real broker, simulator over real HTTP."""

from __future__ import annotations

import pytest

from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for
from tests.service.harness import (
    InProcessService,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)

pytestmark = pytest.mark.integration


async def test_thousand_mixed_jobs_each_get_their_own_answer(kafka_bootstrap: str) -> None:
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=4))
    async with SimulatorServer(SimulatorConfig(latency_ms=5, jitter_ms=3, seed=1)) as base_url:
        service = InProcessService(settings, tier_file_dict(base_url + "/v1", max_items=10))
        async with service:
            jobs = [job(i, batch=(i % 3 != 0)) for i in range(1000)]
            await produce(settings, jobs)
            outcomes = await wait_for_outcomes(settings, {j["id"] for j in jobs}, timeout_s=120)
        stats = service.stats_snapshot()

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}
    assert outcomes.duplicates() == {}
    for j in jobs:
        (result,) = outcomes.results[j["id"]]
        assert result["output"] == answer_for(j["variables"]["text"]), j["id"]
        assert result["source"]["topic"] == settings.jobs_topic
    batched = [r[0] for r in outcomes.results.values() if r[0]["batch"] is not None]
    assert batched, "no job was answered from a batched request"
    assert all(r["batch"]["size"] > 1 for r in batched)
    tier = stats["tiers"]["small"]
    assert tier["requests_saved"] > 0
    assert tier["provider_requests"] < len(jobs)
