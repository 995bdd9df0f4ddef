"""Fallback tiers and mode auto on a real broker and simulator processes.

The primary tier's simulator is SIGKILLed in the middle of a stream of jobs: its held jobs and
the new ones go to the backup tier (its own simulator) once the circuit has been open
`after_s`; when the primary is back, new jobs go to it again. Jobs that refuse a fallback are
held through the outage and answered by the primary. The outage lasts until the backup has
answered `BACKUP_ANSWERS` jobs for the primary: events and counts, not a clock.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer.testing.harness import (
    InProcessService,
    JobStream,
    KafkaBus,
    job,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.ports import free_port
from consumer.testing.process import run_cli, start_simulator
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

#: the stream: JOBS jobs, CHUNK every CHUNK_INTERVAL_S; every REFUSING_EVERY-th refuses a fallback
JOBS = 1200
CHUNK = 20
CHUNK_INTERVAL_S = 0.45
REFUSING_EVERY = 40
#: results before the primary is killed, and the backup's answers for it before it is back
KILL_AFTER_RESULTS = 200
BACKUP_ANSWERS = 100
WAIT_S = 120.0


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
async def test_a_primary_down_falls_back_then_answers_again(kafka_bootstrap: str) -> None:
    jobs = [
        job(i, batch=False, **({"fallback": False} if i % REFUSING_EVERY == 0 else {})) for i in range(JOBS)
    ]
    refusing = {j["id"] for j in jobs if j.get("fallback") is False}
    bus = KafkaBus(kafka_bootstrap, partitions=4)
    main_port, backup_port = free_port(), free_port()
    procs = [start_simulator(main_port, "latency_ms=20"), start_simulator(backup_port, "latency_ms=20")]
    try:
        tiers = _two_tiers(
            f"http://127.0.0.1:{main_port}/v1", f"http://127.0.0.1:{backup_port}/v1",
            after_s=2, on=["outage"],
        )
        async with bus.service(tiers) as service, OutcomeFollower(bus.settings) as follower:
            stream = JobStream(bus.settings, jobs, chunk=CHUNK, interval_s=CHUNK_INTERVAL_S)
            producing = asyncio.create_task(stream.run())

            def tiers_now() -> dict[str, Any]:
                return dict(service.stats_snapshot()["tiers"])

            def answered_for_small() -> int:
                return int(tiers_now()["backup"].get("fallback_from.small", 0))

            results_in = await follower.wait(
                lambda: len(follower.results()) >= KILL_AFTER_RESULTS, timeout_s=WAIT_S
            )
            assert results_in, f"only {follower.records} outcomes"
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(timeout=30)
            sent_at_kill = len(stream.sent)
            # the fallback takes over once the circuit has been open after_s ...
            assert await follower.wait(lambda: answered_for_small() > 0, timeout_s=WAIT_S), tiers_now()
            read_at_fallback = follower.records
            # ... and the backup answers for the primary until it is back
            more = answered_for_small() + BACKUP_ANSWERS
            assert await follower.wait(lambda: answered_for_small() >= more, timeout_s=WAIT_S), tiers_now()
            during = tiers_now()
            sent_before_back = len(stream.sent)
            read_before_back = follower.records
            procs[0] = start_simulator(main_port, "latency_ms=20")
            await asyncio.wait_for(producing, timeout=WAIT_S)
            assert await follower.wait_for_ids({j["id"] for j in jobs}, timeout_s=WAIT_S)
            await follower.settle()
            stats = tiers_now()
        outcomes = await bus.outcomes()
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
    assert sent_at_kill < sent_before_back < len(jobs), "the outage was in the middle of the stream"
    assert by_tier["small"] > 0 and by_tier["backup"] > 0
    for r in results.values():
        assert r["fallback_from"] == ("small" if r["tier"] == "backup" else None), r
        assert r["model"] == ("sim-backup" if r["tier"] == "backup" else "sim-model"), r
        assert r["mode"] == "online"
    for j in jobs:
        assert results[j["id"]]["output"] == answer_for(j["variables"]["text"])
    assert stats["backup"]["fallback_from.small"] == by_tier["backup"]
    assert during["small"]["circuit_open"] == 1
    # while the fallback was in effect and the primary down, every answer read was the backup's
    read_while_down = follower.outcomes[read_at_fallback:read_before_back]
    assert read_while_down and all(o.tier == "backup" for o in read_while_down), [
        o for o in read_while_down if o.tier != "backup"
    ]
    # the primary answers again once it is back: jobs produced after that went to it
    produced_after_back = [j["id"] for j in jobs[sent_before_back:]]
    assert any(results[jid]["tier"] == "small" for jid in produced_after_back)
    # fallback: false jobs: never the backup; those produced during the outage waited for the primary
    assert all(results[i]["tier"] == "small" for i in refusing)
    held = refusing & {j["id"] for j in jobs[sent_at_kill:sent_before_back]}
    assert held, "no refusing job was produced during the outage"


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
    done = run_cli("check-config", "--config", str(path), timeout_s=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert key in lines[0] and reason in lines[0], lines[0]
