"""A provider outage holds work: nothing is dead-lettered because the provider is down.

The provider is a real `promptbus simulate` process SIGKILLed mid-run, or a port nothing
listens on (connections refused), over real HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumer.localmodel import free_port
from consumer.testing.harness import KafkaBus, tier_file_dict
from consumer.testing.simulator import answer_for
from tests.service.harness import job, start_simulator

pytestmark = pytest.mark.slow


@contextmanager
def _simulator(port: int, faults: str = "latency_ms=20") -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [start_simulator(port, faults)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.mark.integration
async def test_provider_killed_for_20_s_mid_backlog_loses_and_dead_letters_nothing(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = [job(i, batch=False) for i in range(4000)]
    bus = KafkaBus(kafka_bootstrap, partitions=4)
    port = free_port()
    caplog.set_level(logging.INFO, logger="consumer.runtime.plans")
    caplog.set_level(logging.INFO, logger="consumer.runtime.prober")  # a listing closes the circuit
    with _simulator(port) as procs:
        tiers = tier_file_dict(f"http://127.0.0.1:{port}/v1", batching=False)
        tiers["tiers"]["small"]["limiter"] = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 8}
        async with bus.service(tiers) as service:
            await bus.produce(jobs)
            for _ in range(600):  # bounded: until a quarter is answered
                if len((await bus.outcomes()).results) >= 1000:
                    break
                await asyncio.sleep(0.1)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(timeout=30)
            await asyncio.sleep(20)
            during = service.stats_snapshot()["tiers"]["small"]
            procs.append(start_simulator(port, "latency_ms=20"))
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=240)
        stats = service.stats_snapshot()["tiers"]["small"]
    dead = [d["error"]["kind"] for ds in outcomes.dead.values() for d in ds]
    print(f"\noutage test: {len(outcomes.results)} results, {len(dead)} dead letters, "
          f"{stats['held_requests']} requests held, circuit opened {stats['circuit_opened']}x")
    assert dead == []
    assert set(outcomes.results) == {j["id"] for j in jobs}
    for j in jobs[:50]:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
    assert during["circuit_open"] == 1 and during["outage_s"] > 10
    assert stats["circuit_open"] == 0 and stats["circuit_opened"] >= 1 and stats["held_requests"] > 0
    opened = [r for r in caplog.records if "circuit open" in r.getMessage()]
    closed = [r for r in caplog.records if "circuit closed" in r.getMessage()]
    assert len(opened) == 1 and opened[0].levelname == "WARNING"
    assert f"127.0.0.1:{port}" in opened[0].getMessage()
    assert len(closed) == 1 and closed[0].levelname == "INFO"


async def test_held_jobs_still_meet_their_deadlines_and_a_stop_drains_in_time(
    make_bus: Callable[..., Any],
) -> None:
    """The provider down for good: jobs with a deadline end deadline_exceeded when it passes;
    the others are held; a stop drains within shutdown_timeout_s and commits nothing held."""
    bus = make_bus(partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="2")
    tiers = tier_file_dict(f"http://127.0.0.1:{free_port()}/v1", batching=False)
    tiers["tiers"]["small"]["retry"] = {"backoff_initial_s": 0.05, "backoff_max_s": 0.2}
    soon = datetime.now(UTC) + timedelta(seconds=4)
    timed = [job(i, batch=False, deadline=soon.isoformat()) for i in range(5)]
    held = [job(100 + i, batch=False) for i in range(5)]
    service = bus.service(tiers)
    async with service:
        await bus.produce(timed + held)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in timed}, timeout_s=60)
        assert service.stats_snapshot()["tiers"]["small"]["circuit_open"] == 1
        stopping = time.monotonic()
    stop_s = time.monotonic() - stopping
    for j in timed:
        (dead,) = outcomes.dead[j["id"]]
        assert dead["error"]["kind"] == "deadline_exceeded"
        failed_at = datetime.fromisoformat(dead["failed_at"].replace("Z", "+00:00"))
        assert failed_at >= soon - timedelta(milliseconds=50)
    after = await bus.outcomes()
    assert not any(j["id"] in after.ids() for j in held), "held jobs are never dead-lettered by the outage"
    assert stop_s < 2 + 8, "the drain is bounded by shutdown_timeout_s (plus the sink's flush)"
    # the jobs with deadlines came first: they ended, the held ones stay uncommitted
    assert await bus.committed(0) == len(timed)


async def test_a_tier_whose_provider_is_down_does_not_stop_another_until_max_inflight(
    make_bus: Callable[..., Any],
) -> None:
    from consumer.testing.simulator import SimulatorConfig, SimulatorServer

    # the held jobs keep the drain waiting to its bound: keep it short
    bus = make_bus(partitions=1, PROMPTBUS_MAX_INFLIGHT="40", PROMPTBUS_SHUTDOWN_TIMEOUT_S="1")
    async with SimulatorServer(SimulatorConfig(seed=1)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", batching=False)
        dead_url = f"http://127.0.0.1:{free_port()}/v1"
        tiers["tiers"]["down"] = {**tiers["tiers"]["small"], "base_url": dead_url}
        service = bus.service(tiers)
        async with service:
            down = [job(i, batch=False, tier="down") for i in range(20)]
            up = [job(100 + i, batch=False) for i in range(20)]
            await bus.produce(down + up)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in up}, timeout_s=60)
            assert set(outcomes.results) == {j["id"] for j in up}, "the other tier flows"
            # now the held jobs fill max_inflight: the partition pauses, the other tier waits
            more_down = [job(200 + i, batch=False, tier="down") for i in range(40)]
            later_up = [job(300 + i, batch=False) for i in range(5)]
            await bus.produce(more_down + later_up)
            for _ in range(100):  # bounded
                snap = service.stats_snapshot()
                if snap["paused_partitions"] == 1:
                    break
                await asyncio.sleep(0.1)
            final = await bus.outcomes()
    assert snap["paused_partitions"] == 1 and snap["inflight"] >= 40
    assert snap["tiers"]["down"]["circuit_open"] == 1 and snap["tiers"]["small"]["circuit_open"] == 0
    assert not final.dead, "nothing is dead-lettered because a provider is down"
    assert not any(j["id"] in final.ids() for j in later_up), "behind the held jobs (head-of-line)"


async def test_an_outage_longer_than_max_outage_s_dead_letters_the_held_jobs(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    tiers = tier_file_dict(f"http://127.0.0.1:{free_port()}/v1", batching=False)
    tiers["tiers"]["small"]["retry"] = {"backoff_initial_s": 0.05, "backoff_max_s": 0.2, "max_outage_s": 2}
    jobs = [job(i, batch=False) for i in range(6)]
    async with bus.service(tiers):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    for j in jobs:
        (dead,) = outcomes.dead[j["id"]]
        assert dead["error"]["kind"] == "retries_exhausted"
        assert dead["error"]["message"].startswith("provider unreachable for 2 s")
        assert dead["attempts"] < 5, "held requests did not use up the attempts"


async def test_while_the_circuit_is_open_only_one_probe_at_a_time_goes_out(
    make_bus: Callable[..., Any],
) -> None:
    """A provider that refuses every connection: after the run of failures that opens the
    circuit, no request is sent; its model listing probes it, spaced by the growing wait."""
    from consumer.core.errors import ConnectionFailed
    from consumer.providers.fake import FakeProvider

    sent: list[float] = []

    def refuse(_request: Any) -> Exception:
        sent.append(time.monotonic())
        return ConnectionFailed("connection refused")

    bus = make_bus(partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="1")
    tiers = tier_file_dict("http://127.0.0.1:9/v1", batching=False)
    small = tiers["tiers"]["small"]
    small["limiter"] = {"algorithm": "fixed", "initial": 8, "min": 1, "max": 8}
    small["retry"] = {"backoff_initial_s": 0.01, "backoff_max_s": 0.01, "circuit_failures": 3,
                      "circuit_probe_s": 0.5, "circuit_probe_max_s": 1.0}
    provider = FakeProvider(refuse, name="small", unreachable=ConnectionFailed("connection refused"))
    service = bus.service(tiers, providers={"small": provider})
    async with service:
        await bus.produce([job(i, batch=False) for i in range(50)])
        for _ in range(100):  # bounded: until the circuit opened
            if service.stats_snapshot()["tiers"]["small"]["circuit_open"]:
                break
            await asyncio.sleep(0.05)
        opened_at = time.monotonic()
        before, checks_before = len(sent), len(provider.checked_at)
        await asyncio.sleep(3.2)
        probes = [t - opened_at for t in provider.checked_at[checks_before:]]
        requests_sent = sent[before:]
        stats = service.stats_snapshot()["tiers"]["small"]
    assert stats["circuit_open"] == 1 and stats["circuit_opened"] == 1
    # probes after 0.5 s, then every 1 s (the cap): 3 or 4 in 3.2 s, never a burst
    assert 2 <= len(probes) <= 4, probes
    assert all(b - a >= 0.4 for a, b in itertools.pairwise(probes)), probes
    assert requests_sent == [], "no job request goes to a circuit its listing probes"
    assert not (await bus.outcomes()).dead


@pytest.mark.integration
async def test_sigterm_drains_a_process_holding_jobs_within_its_bound(
    kafka_bootstrap: str, tmp_path: Any
) -> None:
    """`promptbus run` with its provider down for good: SIGTERM ends it within
    shutdown_timeout_s (it abandons the held requests), exit 0, nothing of them committed."""
    from tests.reliability.support import stop_gracefully
    from tests.service.harness import ServiceProcess

    bus = KafkaBus(kafka_bootstrap, partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="3")
    tiers = tier_file_dict(f"http://127.0.0.1:{free_port()}/v1", batching=False)
    service = ServiceProcess(bus.env, tiers, tmp_path)
    service.start()
    try:
        await bus.produce([job(i, batch=False) for i in range(10)])
        for _ in range(300):  # bounded: until the circuit opened (its WARNING)
            if "circuit open" in service.log_tail(200):
                break
            await asyncio.sleep(0.1)
        assert "circuit open" in service.log_tail(200), service.log_tail()
        code, took_s = await stop_gracefully(service, timeout_s=60)
    finally:
        service.ensure_stopped()
    assert code == 0, service.log_tail()
    assert took_s < 3 + 10, f"drain took {took_s:.1f} s"  # the bound plus the sink's final flush
    assert "abandoned" in service.log_tail(200)
    assert await bus.committed(0) in (-1, 0), "no held job was committed"
    assert not (await bus.outcomes()).ids()
