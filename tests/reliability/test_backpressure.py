"""Backpressure: partitions pause once max_inflight jobs are in flight and resume below it.

In-process service (so the test can sample `stats_snapshot()` while it runs), a real broker,
and a slow simulator over real HTTP (2 requests served at once, ~50 ms each): far more jobs
arrive than `PROMPTBUS_MAX_INFLIGHT` allows. Every job still completes, partitions were
paused on the way (seen in the stats gauge and in the pipeline's pause log lines), and they
are resumed at the end; the sampled in-flight count never exceeds max_inflight (a poll takes
at most the room left under it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import pytest

from consumer.testing.harness import (
    InProcessService,
    create_topics,
    mixed_jobs,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

pytestmark = pytest.mark.integration

JOBS = 200
MAX_INFLIGHT = 20
SAMPLE_INTERVAL_S = 0.01
FINISH_WAIT_S = 120.0
#: the lane gate's INFO lines when it pauses and resumes the partitions
PAUSE_LOG = "backpressure: "
RESUME_LOG = "backpressure released"


@dataclass
class BackpressureRun:
    """What one run measured: outcomes, stats samples and the pipeline's pause/resume logs."""

    jobs: list[dict[str, Any]]
    results: dict[str, list[dict[str, Any]]]
    dead: dict[Any, list[dict[str, Any]]]
    peak_inflight: int
    peak_paused: int
    samples: int
    pauses: int
    resumes: int
    final: dict[str, Any]


async def run_backpressure(
    kafka_bootstrap: str,
    caplog: pytest.LogCaptureFixture,
    *,
    max_inflight: int = MAX_INFLIGHT,
    jobs_n: int = JOBS,
) -> BackpressureRun:
    """Run jobs_n jobs through an in-process service with max_inflight; sample stats."""
    caplog.set_level(logging.INFO, logger="consumer.runtime.backpressure")
    env = service_env(kafka_bootstrap, partitions=4, PROMPTBUS_MAX_INFLIGHT=max_inflight)
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = mixed_jobs(jobs_n)
    ids = {j["id"] for j in jobs}
    peak_inflight = peak_paused = samples = 0

    with run_simulator(SimulatorConfig(latency_ms=50, capacity=2, seed=9)) as base_url:
        service = InProcessService(settings, tier_file_dict(base_url + "/v1", max_items=5))
        async with service, OutcomeFollower(settings) as follower:
            await produce(settings, jobs)
            deadline = time.monotonic() + FINISH_WAIT_S
            while time.monotonic() < deadline and not ids <= follower.ids():
                follower.check_alive()
                snap = service.stats_snapshot()
                peak_inflight = max(peak_inflight, snap["inflight"])
                peak_paused = max(peak_paused, snap["paused_partitions"])
                samples += 1
                await asyncio.sleep(SAMPLE_INTERVAL_S)

            # the gauges are refreshed once per poll round (<= 50 ms): give it a few rounds
            def settled() -> bool:
                snap = service.stats_snapshot()
                return snap["paused_partitions"] == 0 and snap["inflight"] == 0

            await follower.wait(settled, timeout_s=5)
            final = service.stats_snapshot()

    outcomes = await read_outcomes(settings)
    messages = [r.getMessage() for r in caplog.records if r.name == "consumer.runtime.backpressure"]
    return BackpressureRun(
        jobs=jobs,
        results=outcomes.results,
        dead=outcomes.dead,
        peak_inflight=peak_inflight,
        peak_paused=peak_paused,
        samples=samples,
        pauses=sum(1 for m in messages if m.startswith(PAUSE_LOG)),
        resumes=sum(1 for m in messages if m.startswith(RESUME_LOG)),
        final=final,
    )


async def test_small_max_inflight_pauses_stays_bounded_and_every_job_completes(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = await run_backpressure(kafka_bootstrap, caplog)
    ids = {j["id"] for j in run.jobs}
    assert set(run.results) == ids, f"{len(ids - set(run.results))} jobs without result"
    assert not run.dead, list(run.dead.items())[:3]
    for j in run.jobs:
        assert all(r["output"] == answer_for(j["variables"]["text"]) for r in run.results[j["id"]])
    assert run.peak_paused > 0, f"no paused partition seen in {run.samples} stats samples"
    assert run.pauses >= 1, "the pipeline never logged a pause"
    assert run.resumes >= 1, "the pipeline never logged a resume"
    assert run.final["paused_partitions"] == 0, "partitions still paused after every job completed"
    assert run.final["inflight"] == 0, run.final
    # a poll takes at most the room left under max_inflight, so the bound holds exactly
    assert run.peak_inflight <= MAX_INFLIGHT, f"peak in-flight {run.peak_inflight} > {MAX_INFLIGHT}"
    print(
        f"backpressure: max_inflight {MAX_INFLIGHT}, {JOBS} jobs all answered; {run.pauses} pauses, "
        f"{run.resumes} resumes; peak in-flight {run.peak_inflight}, peak paused partitions "
        f"{run.peak_paused} ({run.samples} samples)"
    )


@pytest.mark.parametrize("max_inflight", [1, 3])
async def test_a_max_inflight_of_one_or_three_still_completes_every_job(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture, max_inflight: int
) -> None:
    # a pause/resume threshold equal to the limit once made the poll loop spin without awaiting
    run = await run_backpressure(kafka_bootstrap, caplog, max_inflight=max_inflight, jobs_n=24)
    assert set(run.results) == {j["id"] for j in run.jobs}
    assert not run.dead, list(run.dead.items())[:3]
    assert run.peak_inflight <= max_inflight, f"peak in-flight {run.peak_inflight} > {max_inflight}"
    assert run.final["inflight"] == 0 and run.final["paused_partitions"] == 0, run.final
