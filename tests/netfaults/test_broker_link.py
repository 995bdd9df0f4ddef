"""Network faults between promptbus and its broker (a private 1-node broker whose advertised
listener is a Toxiproxy port, so every connection the service makes crosses the proxy), on a
steady stream; every job's outcome read back id by id through the direct listener.

Besides the end state (`assert_nothing_lost`) each test checks what the fault must make happen:
work going on under latency, the client's unreachable-broker warning and the instance still
running through a partition, no commit read ahead of its outcome while the producer's link
is half-open.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from consumer.testing.netcluster import ProxiedKafka
from consumer.testing.netfaults import FAULTS, FaultReport, NetRig, fault_tiers, run_fault
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from consumer.testing.toxiproxy import Toxiproxy
from tests.netfaults.test_provider_link import assert_nothing_lost

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _broker_fault(
    toxi: Toxiproxy, cluster: ProxiedKafka, fault: str, *, jobs: int, provider_ms: float = 20, **env: Any
) -> FaultReport:
    """`fault` on the broker links; the provider (answers in `provider_ms`) behind a clean proxy."""
    async with SimulatorServer(SimulatorConfig(seed=54, latency_ms=provider_ms)) as base_url:
        link = toxi.proxy(f"provider-{uuid.uuid4().hex[:8]}", upstream_port=int(base_url.rsplit(":", 1)[1]))
        rig = NetRig(link, cluster)
        try:
            return await run_fault(rig, FAULTS[fault], fault_tiers(rig), jobs=jobs, **env)
        finally:
            toxi.call("DELETE", f"/proxies/{link.name}")


async def test_broker_latency_slows_work_but_loses_nothing(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka
) -> None:
    report = await _broker_fault(toxi, proxied_broker, "broker_latency", jobs=2500)
    assert_nothing_lost(report)
    # 300 ms on every broker answer: fetches, produces and commits go on, slower
    assert report.during > 0
    assert report.at_end_of_fault["commits"] > report.before["commits"]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_brokers_unreachable_for_20_s_the_instance_waits_and_resumes(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka, caplog: pytest.LogCaptureFixture, guarantee: str
) -> None:
    """Every broker connection refused for 20 s (longer than the session): nothing is
    dead-lettered, the instance does not exit, its clients meet refused connections at the
    proxy and no outcome is written while it lasts, and intake resumes once it ends."""
    caplog.set_level(logging.ERROR, logger="aiokafka")
    report = await _broker_fault(
        toxi, proxied_broker, "brokers_down", jobs=2000, PROMPTBUS_PROCESSING_GUARANTEE=guarantee
    )
    assert_nothing_lost(report, exactly_once=guarantee == "exactly_once")
    assert report.running_after_fault, "the instance does not exit while the brokers are away"
    assert report.written_during == 0, "no outcome can be written with every broker unreachable"
    refused = [
        r for r in caplog.records if r.name.startswith("aiokafka") and "Connect call failed" in r.getMessage()
    ]
    assert refused, "the service's clients were refused at the proxy"
    assert report.after["items_in"] > report.at_end_of_fault["items_in"], "intake resumed"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_half_open_broker_links_while_outcomes_are_in_flight(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka, guarantee: str
) -> None:
    """The broker's answers swallowed, the connections left open, while the producer has
    outcomes in flight: none is lost, and no commit read during the fault or the recovery
    covers an input whose outcome was not written yet (`assert_nothing_lost` checks both)."""
    report = await _broker_fault(
        toxi, proxied_broker, "broker_half_open", jobs=1500, provider_ms=300,
        PROMPTBUS_PROCESSING_GUARANTEE=guarantee,
    )
    assert_nothing_lost(report, exactly_once=guarantee == "exactly_once")
    # 300 ms answers at 100 jobs/s: the fault meets some 30 jobs whose outcomes are on the way
    assert report.in_flight > 0, "the fault met work in flight"
    assert report.written_during == 0, "nothing got through the swallowed link"
