"""SIGKILL the service process mid-run three times (issue 5, "Tests").

A real `promptbus run` subprocess, a real broker, the simulator over real HTTP in a background
thread (so it outlives every service process). ~600 jobs, batched and unbatched mixed, on 4
partitions; the tier is held to 2 concurrent requests of ~20 ms so the backlog lasts across
the kills. After each restart the test waits until the new process has published outcomes of
its own before the next kill, and checks that the kill lands mid-run (some ids still open).

- at_least_once: every id gets >= 1 result, each the simulator's answer to that job's own
  input; duplicates are counted and printed.
- exactly_once: a read_committed reader sees exactly one outcome per id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from consumer.settings import Settings
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.reliability.support import (
    OutcomeFollower,
    duplicate_count,
    logs_of,
    mixed_jobs,
    stop_gracefully,
)
from tests.service.harness import (
    ServiceProcess,
    create_topics,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
)

pytestmark = pytest.mark.integration

JOBS = 600
KILLS = 3
#: outcomes before the first kill, and new outcomes from each restarted process before the next
FIRST_KILL_AFTER = 60
NEW_BEFORE_KILL = 25
#: a restart waits out the killed member's session (10 s) before the group rebalances
RESTART_WAIT_S = 60.0
FINISH_WAIT_S = 120.0
SHUTDOWN_WAIT_S = 40.0


def slow_tier(base_url: str) -> dict[str, Any]:
    """2 concurrent requests at most, 5 items per batched request: the backlog lasts seconds."""
    tiers = tier_file_dict(base_url + "/v1", max_items=5)
    tiers["tiers"]["small"]["limiter"] = {"algorithm": "fixed", "initial": 2, "min": 1, "max": 2}
    return tiers


async def run_with_kills(
    settings: Settings, env: dict[str, str], base_url: str, workdir: Path, follower: OutcomeFollower
) -> tuple[list[dict[str, Any]], list[int]]:
    """Produce the jobs, run the service, SIGKILL + restart it KILLS times, wait for every id.

    Returns the jobs, the outcome count at each kill, and the (stopped) service.
    """
    jobs = mixed_jobs(JOBS)
    ids = {j["id"] for j in jobs}
    service = ServiceProcess(env, slow_tier(base_url), workdir)
    at_kill: list[int] = []
    try:
        await produce(settings, jobs)
        service.start()
        target = FIRST_KILL_AFTER
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
            target = follower.records + NEW_BEFORE_KILL
        ok = await follower.wait(lambda: ids <= follower.ids(), timeout_s=FINISH_WAIT_S)
        missing = sorted(ids - follower.ids())
        assert ok, f"{len(missing)} ids without outcome, e.g. {missing[:5]}\n{logs_of([service])}"
        code, took_s = await stop_gracefully(service, SHUTDOWN_WAIT_S)
        assert code == 0, f"exit code {code} on SIGTERM\n{logs_of([service])}"
        print(f"final SIGTERM: exit {code} after {took_s:.1f} s")
    finally:
        service.ensure_stopped()
    return jobs, at_kill


async def test_at_least_once_survives_three_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(kafka_bootstrap, partitions=4, guarantee="at_least_once")
    settings = settings_from_env(env)
    await create_topics(settings)
    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=5)) as base_url:
        async with OutcomeFollower(settings) as follower:
            jobs, at_kill = await run_with_kills(settings, env, base_url, tmp_path, follower)
    outcomes = await read_outcomes(settings)

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}, "a job was lost"
    for j in jobs:
        expected = answer_for(j["variables"]["text"])
        for r in outcomes.results[j["id"]]:
            assert r["output"] == expected, (j["id"], r)
    dups = duplicate_count(outcomes.results)
    total = sum(len(v) for v in outcomes.results.values())
    print(
        f"at_least_once, {KILLS} SIGKILLs: {len(jobs)} jobs, {total} results, {dups} duplicates "
        f"({len(outcomes.duplicates())} ids answered more than once); outcomes at kills {at_kill}"
    )


async def test_exactly_once_survives_three_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(kafka_bootstrap, partitions=4, guarantee="exactly_once")
    settings = settings_from_env(env)
    await create_topics(settings)
    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=6)) as base_url:
        async with OutcomeFollower(settings, isolation_level="read_uncommitted") as uncommitted:
            async with OutcomeFollower(settings) as follower:
                jobs, at_kill = await run_with_kills(settings, env, base_url, tmp_path, follower)
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
