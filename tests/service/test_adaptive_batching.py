"""The adaptive batch size end to end: real broker, simulator over real HTTP, real pipeline.

The simulator is a faithful model: a job's batched answer is the answer it gets alone. A tier
that verifies (`verify_fraction` > 0) trusts nothing beyond ordinary requests at first; its
probes and their verification must prove each size in turn, until it batches at max_items
and saves requests.
"""

from __future__ import annotations

import pytest

from consumer.testing.harness import (
    InProcessService,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

pytestmark = pytest.mark.integration

WAVES = 12
PER_WAVE = 50


async def test_a_faithful_model_proves_its_way_to_max_items(kafka_bootstrap: str) -> None:
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=1))
    async with SimulatorServer(SimulatorConfig(latency_ms=2, seed=3)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=8)
        tiers["tiers"]["small"]["batching"].update({"verify_fraction": 0.5, "probe_fraction": 0.2})
        service = InProcessService(settings, tiers)
        sizes_seen: list[int] = []
        async with service:
            jobs = [job(i, batch=True) for i in range(WAVES * PER_WAVE)]
            for wave in range(WAVES):  # waves: later jobs are routed after earlier evidence
                await produce(settings, jobs[wave * PER_WAVE : (wave + 1) * PER_WAVE])
                ids = {j["id"] for j in jobs[: (wave + 1) * PER_WAVE]}
                outcomes = await wait_for_outcomes(settings, ids, timeout_s=60)
                # verification requests end after the results
                assert await service.wait_idle(), "the service kept running requests"
                sizes_seen.append(service.stats_snapshot()["tiers"]["small"]["batch_size"])
            stats = service.stats_snapshot()

        # a new instance of the group starts from what the first one measured
        restarted = InProcessService(settings, tiers)
        async with restarted:
            more = [job(i, batch=True) for i in range(len(jobs), len(jobs) + PER_WAVE)]
            await produce(settings, more)
            again = await wait_for_outcomes(settings, {j["id"] for j in jobs + more}, timeout_s=60)
            assert await restarted.wait_idle(), "the service kept running requests"
            after_restart = restarted.stats_snapshot()["tiers"]["small"]

    assert set(outcomes.results) == {j["id"] for j in jobs} and outcomes.duplicates() == {}
    for j in jobs:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
    assert sizes_seen[0] < 8, "nothing is trusted before it is measured"
    assert sizes_seen == sorted(sizes_seen), f"a faithful model never loses a size: {sizes_seen}"
    tier = stats["tiers"]["small"]
    assert tier["batch_size"] == 8, tier["batch_size_reason"]
    assert tier["batch_size_reason"].startswith("size 8: agreement 100% of ")
    assert tier["batch_size_reason"].endswith("(max_items)")
    assert tier["verify_compared"] == tier["verify_agreed"] > 0
    assert tier["requests_saved"] > 0
    assert tier["provider_requests"] - tier["verify_requests"] < len(jobs) * 0.75

    assert set(again.results) == {j["id"] for j in jobs + more} and again.duplicates() == {}
    assert after_restart["batch_size"] == 8, after_restart["batch_size_reason"]
    # at size 8 from its first job: ~50 / 8 requests besides verification, not ~50 at size 1
    assert after_restart["provider_requests"] - after_restart["verify_requests"] <= PER_WAVE / 8 + 3
