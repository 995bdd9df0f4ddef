"""A provider outage holds work: nothing is dead-lettered because the provider is down.

The provider is a real `promptbus simulate` process SIGKILLed mid-run, or a port nothing
listens on (connections refused), over real HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumer.testing.harness import KafkaBus, Outcomes, job, tier_file_dict
from consumer.testing.ports import free_port
from consumer.testing.process import ServiceProcess, simulator_processes, start_simulator, stop_gracefully
from consumer.testing.simulator import answer_for

pytestmark = pytest.mark.slow

#: the outage test's backlog, and how much of it is answered before the provider is killed
BACKLOG = 2000
ANSWERED_BEFORE_KILL = 500
#: attempts a job may spend (the tier's `retry.max_attempts`): the outage lasts longer than
#: that many failed requests after the circuit opened, so without the circuit every held job
#: would have been dead-lettered `retries_exhausted`
MAX_ATTEMPTS = 6
#: probes the circuit test waits for
PROBES = 3
#: the drain of `promptbus run` on SIGTERM, and the log line of requests it gave up on
ABANDONED = "shutdown: abandoned {} unfinished requests"


@pytest.mark.integration
async def test_provider_killed_mid_backlog_loses_and_dead_letters_nothing(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The simulator process SIGKILLed with most of a backlog still to answer, and started again
    once the outage has outlasted more failed requests than a job has attempts."""
    jobs = [job(i, batch=False) for i in range(BACKLOG)]
    bus = KafkaBus(kafka_bootstrap, partitions=4)
    port = free_port()
    caplog.set_level(logging.INFO, logger="consumer.runtime.plans")
    caplog.set_level(logging.INFO, logger="consumer.runtime.prober")  # a listing closes the circuit
    with simulator_processes([port], "latency_ms=20") as procs:
        tiers = tier_file_dict(f"http://127.0.0.1:{port}/v1", batching=False)
        small = tiers["tiers"]["small"]
        small["limiter"] = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 8}
        small["retry"] = {
            "max_attempts": MAX_ATTEMPTS, "backoff_initial_s": 0.05, "backoff_max_s": 0.2,
            "circuit_probe_s": 0.2, "circuit_probe_max_s": 0.5,
        }
        async with bus.service(tiers) as service:
            await bus.produce(jobs)
            answered = Outcomes()
            for _ in range(600):  # bounded: until a quarter is answered
                answered = await bus.outcomes()
                if len(answered.results) >= ANSWERED_BEFORE_KILL:
                    break
                await asyncio.sleep(0.1)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(timeout=30)

            def tier() -> dict[str, Any]:
                return dict(service.stats_snapshot()["tiers"]["small"])

            assert await _wait_until(lambda: tier()["circuit_open"] == 1, timeout_s=60), tier()
            probes_at_open = tier()["circuit_probes"]
            # the probes (its model listing) fail one after another: the outage outlasts any
            # job's attempts
            assert await _wait_until(
                lambda: tier()["circuit_probes"] >= probes_at_open + MAX_ATTEMPTS, timeout_s=60
            ), tier()
            during = tier()
            procs.append(start_simulator(port, "latency_ms=20"))
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=240)
        stats = service.stats_snapshot()["tiers"]["small"]
    dead = [d["error"]["kind"] for ds in outcomes.dead.values() for d in ds]
    print(f"\noutage test: {len(outcomes.results)} results, {len(dead)} dead letters, "
          f"{stats['held_requests']} requests held, circuit opened {stats['circuit_opened']}x")
    assert dead == []
    assert set(outcomes.results) == {j["id"] for j in jobs}
    assert len(answered.results) < len(jobs), "the provider was killed mid-backlog"
    for j in jobs[:50]:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
    assert during["circuit_open"] == 1 and during["held_requests"] > 0
    assert stats["circuit_open"] == 0 and stats["circuit_opened"] >= 1 and stats["held_requests"] > 0
    opened = [r for r in caplog.records if "circuit open" in r.getMessage()]
    closed = [r for r in caplog.records if "circuit closed" in r.getMessage()]
    assert len(opened) == 1 and opened[0].levelname == "WARNING"
    assert f"127.0.0.1:{port}" in opened[0].getMessage()
    assert len(closed) == 1 and closed[0].levelname == "INFO"


async def _wait_until(condition: Callable[[], bool], *, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll `condition` (bounded); True once it held."""
    for _ in range(max(1, int(timeout_s / poll_s))):
        if condition():
            return True
        await asyncio.sleep(poll_s)
    return condition()


async def test_held_jobs_still_meet_their_deadlines_and_a_stop_drains_in_time(
    make_bus: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The provider down for good: jobs with a deadline end deadline_exceeded when it passes;
    the others are held; a stop gives up on them after shutdown_timeout_s (they are abandoned,
    not waited for) and commits nothing held."""
    bus = make_bus(partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="1")
    tiers = tier_file_dict(f"http://127.0.0.1:{free_port()}/v1", batching=False)
    # the first refused connection opens the circuit: every job is held long before a deadline
    tiers["tiers"]["small"]["retry"] = {
        "backoff_initial_s": 0.05, "backoff_max_s": 0.2, "circuit_failures": 1
    }
    held = [job(100 + i, batch=False) for i in range(5)]
    service = bus.service(tiers)
    caplog.set_level(logging.WARNING, logger="consumer.runtime.pipeline")
    async with service:
        soon = datetime.now(UTC) + timedelta(seconds=2)
        timed = [job(i, batch=False, deadline=soon.isoformat()) for i in range(5)]
        await bus.produce(timed + held)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in timed}, timeout_s=60)
        assert service.stats_snapshot()["tiers"]["small"]["circuit_open"] == 1
    for j in timed:
        (dead,) = outcomes.dead[j["id"]]
        assert dead["error"]["kind"] == "deadline_exceeded"
        failed_at = datetime.fromisoformat(dead["failed_at"].replace("Z", "+00:00"))
        assert failed_at >= soon - timedelta(milliseconds=50), "dead-lettered before its deadline"
    after = await bus.outcomes()
    assert not any(j["id"] in after.ids() for j in held), "held jobs are never dead-lettered by the outage"
    # the drain waited its bound, then gave up on the held requests, one per held job
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(ABANDONED.format(len(held))) for m in messages), messages
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
            # a result is readable a moment before its ack frees its record: wait for the acks,
            # so that what is in flight next is the held jobs alone
            for _ in range(100):  # bounded
                if service.stats_snapshot()["inflight"] == len(down):
                    break
                await asyncio.sleep(0.05)
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
    assert snap["paused_partitions"] == 1 and snap["inflight"] == 40, "paused at max_inflight, by held jobs"
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
    circuit, no job request is sent; the probes are its model listings, each only after the
    one before failed (never a burst), and they keep coming (how the wait between them grows
    is the circuit's: tests/unit/test_circuit.py, on a fake clock)."""
    from consumer.core.errors import ConnectionFailed
    from consumer.providers.fake import FakeProvider

    order = itertools.count()
    #: per request, and per listing: (sequence number when it went out, when it failed)
    requests: list[list[int]] = []
    listings: list[list[int]] = []

    async def refused(spans: list[list[int]]) -> Exception:
        span = [next(order), -1]
        spans.append(span)
        await asyncio.sleep(0.05)  # a refused connect takes a moment: a burst would overlap
        span[1] = next(order)
        return ConnectionFailed("connection refused")

    async def refuse(_request: Any) -> Exception:
        return await refused(requests)

    class Refusing(FakeProvider):
        async def check_reachable(self) -> str:
            raise await refused(listings)

    bus = make_bus(partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="1")
    tiers = tier_file_dict("http://127.0.0.1:9/v1", batching=False)
    small = tiers["tiers"]["small"]
    small["limiter"] = {"algorithm": "fixed", "initial": 8, "min": 1, "max": 8}
    small["retry"] = {"backoff_initial_s": 0.01, "backoff_max_s": 0.01, "circuit_failures": 3,
                      "circuit_probe_s": 0.2, "circuit_probe_max_s": 0.4}
    service = bus.service(tiers, providers={"small": Refusing(refuse, name="small")})
    async with service:
        await bus.produce([job(i, batch=False) for i in range(50)])
        assert await _wait_until(
            lambda: service.stats_snapshot()["tiers"]["small"]["circuit_open"] == 1, timeout_s=30
        )
        opened_at = next(order)
        assert await _wait_until(
            lambda: sum(1 for r in listings if r[0] > opened_at) >= PROBES, timeout_s=60
        )
        stats = service.stats_snapshot()["tiers"]["small"]
    probes = [r for r in listings if r[0] > opened_at]
    assert stats["circuit_open"] == 1 and stats["circuit_opened"] == 1
    assert len(requests) >= 3, "the circuit opened after its run of failures"
    # requests that were granted their slot before it opened may still go; none after
    assert not [r for r in requests if r[0] > probes[0][0]], "no job request goes while its listing probes"
    # one at a time: each probe went out after the one before it had failed
    for earlier, later in itertools.pairwise(probes):
        assert earlier[1] != -1 and later[0] > earlier[1], probes
    assert not (await bus.outcomes()).dead


@pytest.mark.integration
async def test_sigterm_drains_a_process_holding_jobs_within_its_bound(
    kafka_bootstrap: str, tmp_path: Any
) -> None:
    """`promptbus run` with its provider down for good: SIGTERM ends it after
    shutdown_timeout_s, giving up on the held requests (one per job), exit 0, nothing of them
    committed."""
    jobs = 10
    bus = KafkaBus(kafka_bootstrap, partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="2")
    tiers = tier_file_dict(f"http://127.0.0.1:{free_port()}/v1", batching=False)
    service = ServiceProcess(bus.env, tiers, tmp_path)
    service.start()
    try:
        await bus.produce([job(i, batch=False) for i in range(jobs)])
        for _ in range(300):  # bounded: until the circuit opened (its WARNING)
            if "circuit open" in service.log_tail(200):
                break
            await asyncio.sleep(0.1)
        assert "circuit open" in service.log_tail(200), service.log_tail()
        # SIGKILL (exit -9) if the drain did not end by itself well after its bound
        code = await stop_gracefully(service, timeout_s=60)
    finally:
        service.ensure_stopped()
    assert code == 0, service.log_tail()
    assert ABANDONED.format(jobs) in service.log_tail(200), service.log_tail()
    assert await bus.committed(0) in (-1, 0), "no held job was committed"
    assert not (await bus.outcomes()).ids()
