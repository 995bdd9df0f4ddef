"""Fallback tiers and mode auto on a real broker and simulator processes.

The primary tier's simulator is SIGKILLed for a minute in the middle of a stream of jobs:
its held jobs and the new ones go to the backup tier (its own simulator) once the circuit has
been open `after_s`; when the primary is back, new jobs go to it again. Jobs that refuse a
fallback are held through the outage and answered by the primary.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer.localmodel import free_port
from consumer.testing.harness import (
    InProcessService,
    KafkaBus,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for
from tests.reliability.support import JobStream
from tests.service.harness import job, start_simulator

ROOT = Path(__file__).resolve().parents[2]


def _two_tiers(main_url: str, backup_url: str, **fallback: Any) -> dict[str, Any]:
    tiers = tier_file_dict(main_url, batching=False)
    small = tiers["tiers"]["small"]
    small["limiter"] = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 8}
    small["retry"] = {
        "max_attempts": 6, "backoff_initial_s": 0.05, "backoff_max_s": 0.5,
        "circuit_probe_s": 0.5, "circuit_probe_max_s": 2.0, "quota_cooldown_s": 5.0,
    }
    tiers["tiers"]["backup"] = {**small, "base_url": backup_url, "model": "sim-backup"}
    small["fallback"] = {"tier": "backup", **fallback}
    return tiers


def _at(result: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(result["completed_at"].replace("Z", "+00:00"))


@pytest.mark.slow
@pytest.mark.integration
async def test_a_primary_down_for_60_s_falls_back_then_answers_again(kafka_bootstrap: str) -> None:
    # every 40th job refuses a fallback: it is held through the outage, answered by the primary
    jobs = [job(i, batch=False, **({"fallback": False} if i % 40 == 0 else {})) for i in range(4000)]
    refusing = {j["id"] for j in jobs if j.get("fallback") is False}
    bus = KafkaBus(kafka_bootstrap, partitions=4)
    main_port, backup_port = free_port(), free_port()
    procs = [start_simulator(main_port, "latency_ms=20"), start_simulator(backup_port, "latency_ms=20")]
    try:
        tiers = _two_tiers(
            f"http://127.0.0.1:{main_port}/v1", f"http://127.0.0.1:{backup_port}/v1",
            after_s=5, on=["outage"],
        )
        async with bus.service(tiers) as service:
            stream = JobStream(bus.settings, jobs, chunk=20, interval_s=0.45)
            producing = asyncio.create_task(stream.run())
            for _ in range(600):  # bounded: until a quarter is answered
                if len((await bus.outcomes()).results) >= 1000:
                    break
                await asyncio.sleep(0.1)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(timeout=30)
            killed_at = datetime.now(UTC)
            await asyncio.sleep(60)
            during = service.stats_snapshot()["tiers"]
            procs[0] = start_simulator(main_port, "latency_ms=20")
            back_at = datetime.now(UTC)
            await asyncio.wait_for(producing, timeout=120)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=180)
            stats = service.stats_snapshot()["tiers"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    dead = [d["error"]["kind"] for ds in outcomes.dead.values() for d in ds]
    results = {jid: rs[0] for jid, rs in outcomes.results.items()}
    by_tier = {t: sum(1 for r in results.values() if r["tier"] == t) for t in ("small", "backup")}
    print(f"\nfallback outage test: {len(results)} results ({by_tier}), {len(dead)} dead letters; "
          f"backup answered {stats['backup'].get('fallback_from.small', 0)} for small")
    assert dead == []
    assert set(results) == {j["id"] for j in jobs}
    assert by_tier["small"] > 0 and by_tier["backup"] > 0
    for r in results.values():
        assert r["fallback_from"] == ("small" if r["tier"] == "backup" else None), r
        assert r["mode"] == "online"
    for j in jobs[:50]:
        assert results[j["id"]]["output"] == answer_for(j["variables"]["text"])
    assert stats["backup"]["fallback_from.small"] == by_tier["backup"]
    assert during["small"]["circuit_open"] == 1
    # the primary answers again once it is back
    assert any(r["tier"] == "small" and _at(r) > back_at for r in results.values())
    # fallback: false jobs: never the backup; those read during the outage waited for the primary
    assert all(results[i]["tier"] == "small" for i in refusing)
    assert any(_at(results[i]) > back_at for i in refusing)
    assert all(r["tier"] == "backup" or not (killed_at + timedelta(seconds=8) < _at(r) < back_at)
               for r in results.values())


@pytest.mark.integration
async def test_an_exhausted_quota_on_the_primary_sends_its_jobs_to_the_backup(kafka_bootstrap: str) -> None:
    bus = KafkaBus(kafka_bootstrap, partitions=2)
    async with (
        SimulatorServer(SimulatorConfig(seed=1, billing_rate=1.0)) as main_url,
        SimulatorServer(SimulatorConfig(seed=2)) as backup_url,
    ):
        tiers = _two_tiers(main_url + "/v1", backup_url + "/v1", on=["quota_exhausted"])
        jobs = [job(i, batch=False) for i in range(200)]
        async with bus.service(tiers) as service:
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
            stats = service.stats_snapshot()["tiers"]
    assert outcomes.dead == {}
    assert set(outcomes.results) == {j["id"] for j in jobs}
    for rs in outcomes.results.values():
        (r,) = rs
        assert r["tier"] == "backup" and r["fallback_from"] == "small" and r["model"] == "sim-backup"
    assert stats["backup"]["fallback_from.small"] == len(jobs)


@pytest.mark.integration
async def test_mode_auto_goes_offline_when_the_deadline_allows_and_online_when_not(
    kafka_bootstrap: str,
) -> None:
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=2))
    os.environ["PB_TEST_AUTO_KEY"] = "k"
    far = (datetime.now(UTC) + timedelta(hours=48)).isoformat()
    near = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    later = [job(i, batch=False, mode="auto", deadline=far) for i in range(20)]
    soon = [job(100 + i, batch=False, mode="auto", deadline=near) for i in range(20)]
    try:
        async with SimulatorServer(SimulatorConfig(seed=4, batch_delay_s=1.0)) as base_url:
            tiers = tier_file_dict(
                base_url + "/v1",
                provider="openai",
                api_key_env="PB_TEST_AUTO_KEY",
                offline={"enabled": True, "poll_s": 0.3, "collect_s": 0.3},
                pricing={"input_per_mtok": 1.0, "output_per_mtok": 2.0, "batch_discount": 0.5},
            )
            bus = KafkaBus(kafka_bootstrap, partitions=2)
            bus.settings = settings
            async with InProcessService(settings, tiers) as service:
                await bus.produce(later + soon)
                outcomes = await bus.wait_for_outcomes({j["id"] for j in later + soon}, timeout_s=90)
                stats = service.stats_snapshot()["tiers"]["small"]
    finally:
        del os.environ["PB_TEST_AUTO_KEY"]
    assert outcomes.dead == {}
    for j in later + soon:
        (r,) = outcomes.results[j["id"]]
        assert r["mode"] == ("offline" if j in later else "online")
        assert _at(r) <= datetime.fromisoformat(j["deadline"])
        assert r["output"] == answer_for(j["variables"]["text"])
    assert stats["auto_offline"] == len(later) and stats["auto_online"] == len(soon)
    assert stats["offline_saved_usd"] > 0


BASE = {"provider": "openai", "model": "m"}


@pytest.mark.parametrize(
    ("tiers", "key", "reason"),
    [
        ({"a": {**BASE, "fallback": {"tier": "nope"}}}, "tiers.a.fallback.tier", "'nope' is not configured"),
        (
            {"a": {**BASE, "fallback": {"tier": "b"}}, "b": {**BASE, "fallback": {"tier": "a"}}},
            "tiers.a.fallback.tier",
            "fallback cycle: a -> b -> a",
        ),
        (
            {
                "a": {
                    **BASE, "default_mode": "offline", "offline": {"enabled": True}, "fallback": {"tier": "b"}
                },
                "b": BASE,
            },
            "tiers.a.fallback.tier",
            "cannot take this tier's jobs",
        ),
    ],
)
def test_check_config_refuses_bad_fallbacks_in_one_line(
    tmp_path: Path, tiers: dict[str, Any], key: str, reason: str
) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"tiers": tiers}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "consumer.cli", "check-config", "--config", str(path)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert key in lines[0] and reason in lines[0], lines[0]
