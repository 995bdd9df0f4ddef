"""Network faults between promptbus and its provider, injected by a real Toxiproxy between the
service and the simulator, on a steady stream through a real (proxied) broker; every job's
outcome read back id by id.

Each test checks the end state (`assert_nothing_lost`: 0 lost, 0 good jobs dead-lettered,
duplicates within the bound, every answer the right one, no offset committed ahead of its
outcome, work flowing again within the session + 5 s of the fault's end) and what the fault
must make happen on the way (a retry counted, a circuit opened, work going on while it lasts).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import pytest

from consumer.testing.netcluster import ProxiedKafka
from consumer.testing.netfaults import FAULTS, FaultReport, NetRig, fault_tiers, run_fault, run_schedule
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from consumer.testing.toxiproxy import Toxiproxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: duplicates allowed under at_least_once, as a share of the jobs
DUPLICATE_SHARE = 0.02


@contextlib.asynccontextmanager
async def provider_rig(toxi: Toxiproxy, cluster: ProxiedKafka) -> AsyncIterator[NetRig]:
    """The simulator (20 ms answers) behind a new proxy of `toxi`."""
    async with SimulatorServer(SimulatorConfig(seed=54, latency_ms=20)) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        link = toxi.proxy(f"provider-{uuid.uuid4().hex[:8]}", upstream_port=port)
        try:
            yield NetRig(link, cluster)
        finally:
            toxi.call("DELETE", f"/proxies/{link.name}")


def assert_nothing_lost(report: FaultReport, *, exactly_once: bool = False) -> None:
    """The run's end state: every job answered once (duplicates within the bound), rightly,
    none dead-lettered, no commit read ahead of its outcome; and for a fault's own report,
    work flowing again after it (`assert_flowing_again`)."""
    print(f"\n{report.summary()}")
    assert report.finished and report.lost == 0, report.summary()
    assert report.dead == 0 and report.wrong == 0, report.summary()
    bound = 0 if exactly_once else int(DUPLICATE_SHARE * report.jobs)
    assert report.duplicates <= bound, report.summary()
    assert report.snapshots > 0 and report.ahead == [], report.ahead[:10]
    if report.fault != "all":
        assert_flowing_again(report)


def assert_flowing_again(report: FaultReport) -> None:
    """The instance ran through the fault and results came within the session + 5 s after it."""
    assert report.running_after_fault, f"{report.fault}: the service exited"
    assert report.flowing_again, f"{report.fault}: no results within the session + 5 s after it ended"


def tier_delta(report: FaultReport, key: str, *, until: str = "at_end_of_fault") -> float:
    """How much a tier counter grew from the fault's start to `until` (at its end, or after)."""
    end = getattr(report, until)["tiers"]["small"][key]
    return float(end - report.before["tiers"]["small"][key])


async def test_provider_latency_slows_work_but_loses_nothing(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka
) -> None:
    async with provider_rig(toxi, proxied_broker) as rig:
        report = await run_fault(rig, FAULTS["provider_latency"], fault_tiers(rig), jobs=2500)
    assert_nothing_lost(report)
    # 500 ms is within the 2 s timeout: answers keep coming through the fault, none retried
    assert report.during > 0
    assert tier_delta(report, "circuit_opened") == 0 and tier_delta(report, "retries") == 0


async def test_half_open_provider_connections_time_out_and_are_retried(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """Two half-open links, one after the other on one stream: the answers swallowed whole
    (Toxiproxy's `timeout` toxic), then answers that stop early in their body (status 200
    read, the rest held back). Each request ends at its timeout (nothing waits for ever),
    the run of timeouts opens the circuit, the requests are held and sent again, and the first
    answer after the fault closes it."""
    caplog.set_level(logging.WARNING, logger="consumer.runtime.provider_calls")
    async with provider_rig(toxi, proxied_broker) as rig:
        run = await run_schedule(
            rig,
            [(0.0, FAULTS["provider_half_open"]), (2.0, FAULTS["provider_stalled_body"])],
            fault_tiers(rig),
            jobs=3500,
        )
    for report in run.faults:
        assert_flowing_again(report)
        assert report.written_during == 0, f"{report.fault}: no answer crossed the half-open link"
        # the timeouts are outage failures: they open the circuit, and the timed-out requests
        # are held and sent again (as held requests, which spend none of their attempts)
        assert tier_delta(report, "provider_errors") > 0, report.fault
        assert tier_delta(report, "circuit_opened") >= 1 and tier_delta(report, "held_requests") > 0
    assert_nothing_lost(run.totals)
    assert run.totals.after["tiers"]["small"]["circuit_open"] == 0, "closed once answers came back"
    assert any("timed out" in r.getMessage() and "circuit open" in r.getMessage() for r in caplog.records)


async def test_provider_resets_mid_response_are_retried(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka
) -> None:
    async with provider_rig(toxi, proxied_broker) as rig:
        report = await run_fault(rig, FAULTS["provider_reset"], fault_tiers(rig), jobs=1500)
    assert_nothing_lost(report)
    assert tier_delta(report, "provider_errors") > 0 and tier_delta(report, "retries") > 0


async def test_provider_trickle_still_delivers_batched_answers(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka
) -> None:
    """10 KB/s per connection: batched answers (10 jobs a request) arrive slowly but whole."""
    async with provider_rig(toxi, proxied_broker) as rig:
        report = await run_fault(rig, FAULTS["provider_trickle"], fault_tiers(rig), jobs=2000, batch_every=10)
    assert_nothing_lost(report)
    assert report.during > 0 and tier_delta(report, "batched_requests") > 0


async def test_provider_unreachable_for_30_s_holds_the_jobs(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka
) -> None:
    """Connections refused for 30 s, longer than a job's attempts last: the circuit opens, the
    jobs are held (none dead-lettered) and answered once the provider is back."""
    async with provider_rig(toxi, proxied_broker) as rig:
        report = await run_fault(rig, FAULTS["provider_down"], fault_tiers(rig), jobs=2500)
    assert_nothing_lost(report)
    end = report.at_end_of_fault["tiers"]["small"]
    assert end["circuit_open"] == 1 and tier_delta(report, "circuit_opened") == 1
    assert tier_delta(report, "held_requests") > 0 and tier_delta(report, "circuit_probes") > 0
    assert report.after["tiers"]["small"]["circuit_open"] == 0
