"""Deployments and fallback tiers under a real outage: simulator processes SIGKILLed and
started again on the same port, over real HTTP and the real broker.

- A tier with a fallback tier: its provider killed mid-run (its jobs move to the backup, and
  are all answered), then started again. Its circuit closes on its own listing probe, with
  no job left to carry one; the jobs produced after that are all answered by the primary.
- A tier of three deployments: one killed mid-run. Every job is answered, none
  dead-lettered, none by the dead one after its death; started again, it takes its share.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest

from consumer.testing.harness import JobStream, KafkaBus, job, tier_file_dict
from consumer.testing.ports import free_port
from consumer.testing.process import simulator_processes, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FAULTS = "latency_ms=20"
RETRY = {
    "max_attempts": 6, "backoff_initial_s": 0.05, "backoff_max_s": 0.5,
    "circuit_probe_s": 0.5, "circuit_probe_max_s": 2.0,
}
#: after a restart, how long the primary's circuit may take to close (the issue measured its
#: new jobs 20 s after the restart)
RECOVERY_BOUND_S = 20.0


def _kill(proc: subprocess.Popen[bytes]) -> datetime:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return datetime.now(UTC)


def _at(result: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(result["completed_at"].replace("Z", "+00:00"))


async def _until(check: Any, bound_s: float, step_s: float = 0.1) -> bool:
    """Poll `check()` until true, at most `bound_s` (bounded)."""
    for _ in range(int(bound_s / step_s)):
        if check():
            return True
        await asyncio.sleep(step_s)
    return bool(check())


async def test_a_primary_back_after_an_outage_takes_every_new_job_before_any_arrives(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="consumer.runtime.prober")
    bus = KafkaBus(kafka_bootstrap, partitions=4)
    main_port, backup_port = free_port(), free_port()
    first = [job(i, batch=False) for i in range(600)]
    later = [job(10_000 + i, batch=False) for i in range(200)]
    with simulator_processes([main_port, backup_port], FAULTS) as procs:
        tiers = tier_file_dict(f"http://127.0.0.1:{main_port}/v1", batching=False, retry=RETRY)
        small = tiers["tiers"]["small"]
        small["limiter"] = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 8}
        tiers["tiers"]["backup"] = {**small, "base_url": f"http://127.0.0.1:{backup_port}/v1", "model": "b"}
        small["fallback"] = {"tier": "backup", "after_s": 2, "on": ["outage"]}
        async with bus.service(tiers) as service:
            stream = JobStream(bus.settings, first, chunk=20, interval_s=0.2)
            producing = asyncio.create_task(stream.run())

            def tiers_now() -> dict[str, Any]:
                snapshot: dict[str, Any] = service.stats_snapshot()["tiers"]
                return snapshot

            assert await _until(lambda: tiers_now()["small"]["provider_requests"] >= 100, 60)
            _kill(procs[0])
            # the backup answers for the primary (its jobs moved)
            assert await _until(lambda: tiers_now()["backup"].get("fallback_from.small", 0) >= 50, 60)
            # every job so far answered: no job is left to carry a probe to the primary
            await asyncio.wait_for(producing, timeout=120)
            await bus.wait_for_outcomes({j["id"] for j in first}, timeout_s=180)
            procs[0] = start_simulator(main_port, FAULTS)
            back_at = datetime.now(UTC)
            closed = await _until(lambda: tiers_now()["small"]["circuit_open"] == 0, RECOVERY_BOUND_S)
            closed_at = datetime.now(UTC)
            await bus.produce(later)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in first + later}, timeout_s=180)
    results = {jid: rs[0] for jid, rs in outcomes.results.items()}
    by_primary = sum(1 for j in later if results[j["id"]]["tier"] == "small")
    print(
        f"\nfallback recovery: circuit {'closed' if closed else 'still open'} "
        f"{(closed_at - back_at).total_seconds():.1f} s after the restart; {by_primary} of the "
        f"{len(later)} later jobs answered by the primary"
    )
    assert not outcomes.dead
    assert set(results) == {j["id"] for j in first + later}
    assert closed, f"the primary's circuit did not close within {RECOVERY_BOUND_S:.0f} s of its restart"
    # it closed on its own listing probe: no job carried it (the later ones came after)
    closes = [r for r in caplog.records if "circuit closed" in r.getMessage()]
    assert closes and closes[0].name == "consumer.runtime.prober", [r.getMessage() for r in closes]
    assert by_primary == len(later)


async def test_a_deployment_killed_mid_run_gets_nothing_until_it_is_back_then_its_share(
    kafka_bootstrap: str,
) -> None:
    bus = KafkaBus(kafka_bootstrap, partitions=4)
    ports = [free_port() for _ in range(3)]
    jobs = [job(i, batch=False) for i in range(1500)]
    later = [job(10_000 + i, batch=False) for i in range(600)]
    with simulator_processes(ports, FAULTS) as procs:
        tiers = tier_file_dict(f"http://127.0.0.1:{ports[0]}/v1", batching=False, retry=RETRY)
        small = tiers["tiers"]["small"]
        small["limiter"] = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 8}
        small["deployments"] = [
            {"name": name, "base_url": f"http://127.0.0.1:{port}/v1"}
            for name, port in zip(("a", "b", "c"), ports, strict=True)
        ]
        async with bus.service(tiers) as service:

            def deployments() -> dict[str, Any]:
                snapshot: dict[str, Any] = service.stats_snapshot()["deployments"]
                return snapshot

            stream = JobStream(bus.settings, jobs, chunk=20, interval_s=0.1)
            producing = asyncio.create_task(stream.run())
            assert await _until(lambda: deployments()["small/c"]["provider_requests"] >= 100, 60)
            _kill(procs[2])
            # from when the service sees c down (answers c sent before its death may still be
            # written a moment after it, on a busy loop)
            assert await _until(lambda: deployments()["small/c"]["circuit_open"] == 1, 60)
            down_at = datetime.now(UTC)
            await asyncio.wait_for(producing, timeout=120)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=180)
            during = deployments()
            procs[2] = start_simulator(ports[2], FAULTS)
            back_at = datetime.now(UTC)
            assert await _until(lambda: deployments()["small/c"]["circuit_open"] == 0, RECOVERY_BOUND_S)
            await bus.produce(later)
            after = await bus.wait_for_outcomes({j["id"] for j in later}, timeout_s=180)
    results = {jid: rs[0] for jid, rs in outcomes.results.items()}
    assert not outcomes.dead and not after.dead
    assert set(results) >= {j["id"] for j in jobs}
    assert during["small/c"]["circuit_open"] == 1
    # nothing answered by c between the service seeing it down and its restart
    assert not [r for r in results.values() if r["deployment"] == "c" and down_at < _at(r) < back_at]
    shares = {d: sum(1 for j in later if after.results[j["id"]][0]["deployment"] == d) for d in "abc"}
    print(f"\ndeployment killed: the later jobs by deployment {shares}")
    assert shares["c"] >= len(later) // 6, shares
