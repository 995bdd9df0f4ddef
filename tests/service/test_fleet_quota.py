"""Three instances of one group on the real broker share one fleet quota against the simulator,
which enforces the same rate: the provider never refuses a request (the instances together stay
within the quota), they split it between them, and every job is answered."""

from __future__ import annotations

import contextlib

import pytest

from consumer.testing.harness import KafkaBus, job, tier_file_dict
from consumer.testing.simulator import SimulatorConfig, SimulatorServer

pytestmark = pytest.mark.integration

INSTANCES = 3
JOBS = 240
#: the quota and the provider's rate: 20 requests a second
REQUESTS_PER_MINUTE = 1200


async def test_three_instances_share_one_quota_and_the_provider_refuses_nothing(kafka_bootstrap: str) -> None:
    bus = KafkaBus(kafka_bootstrap, partitions=6)
    # the provider's bucket refills at the quota's rate and holds 2 s of it: a request over the
    # rate for longer than that burst is refused with a 429
    provider = SimulatorConfig(
        seed=7, latency_ms=20, capacity=8, rpm=REQUESTS_PER_MINUTE // 30, rate_window_s=2.0
    )
    jobs = [job(i, batch=False) for i in range(JOBS)]
    server = SimulatorServer(provider)
    async with server as base_url:
        tiers = tier_file_dict(base_url + "/v1", batching=False, quota="key")
        tiers["quotas"] = {"key": {"requests_per_minute": REQUESTS_PER_MINUTE}}
        async with contextlib.AsyncExitStack() as stack:
            services = [await stack.enter_async_context(bus.service(tiers)) for _ in range(INSTANCES)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=120)
            shares = [svc.stats_snapshot()["quotas"]["key"] for svc in services]
        counters = server.sim.stats_.snapshot()
    assert outcomes.ids() == {j["id"] for j in jobs}, "every job was answered"
    assert dict(outcomes.dead) == {}
    assert counters["status_429"] == 0, "together the instances stayed within the provider's rate"
    assert counters["requests"] >= JOBS
    assert all(s["instances_live"] == INSTANCES for s in shares), shares
    assert sum(s["fraction"] for s in shares) <= 1.0 + 1e-9
    assert all(s["fraction"] < 1.0 for s in shares), "each had a share, none the whole quota"
