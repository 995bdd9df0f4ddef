"""One node of three cut off for 20 s while it leads the jobs partition the test watches: its
client links and its controller's links to and from the other two controllers go down
together, the controllers fence it and its leaderships move; the service carries on through
the other two nodes and loses nothing.

The cluster is a private 3-node one on free ports behind Toxiproxy (`proxied_kafka(nodes=3)`),
never the shared 3-node fixture's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from consumer.kafka.admin import ensure_topics
from consumer.testing.cluster import partition_state
from consumer.testing.netcluster import ProxiedKafka, proxied_kafka
from consumer.testing.netfaults import FAULTS, NetRig, rig_settings, run_fault
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from consumer.testing.toxiproxy import Toxiproxy
from tests.netfaults.test_provider_link import assert_nothing_lost, fault_tiers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster3(toxi: Toxiproxy) -> Iterator[ProxiedKafka]:
    with proxied_kafka("netfaults3", toxi, nodes=3) as cluster:
        yield cluster


async def test_a_node_cut_off_moves_its_leaderships_and_nothing_is_lost(
    toxi: Toxiproxy, cluster3: ProxiedKafka
) -> None:
    async with SimulatorServer(SimulatorConfig(seed=54, latency_ms=20)) as base_url:
        link = toxi.proxy(f"provider-{uuid.uuid4().hex[:8]}", upstream_port=int(base_url.rsplit(":", 1)[1]))
        base = NetRig(link, cluster3)
        settings, direct = rig_settings(base, PROMPTBUS_TOPIC_REPLICATION=3)
        await ensure_topics(direct)
        leader, isr = await partition_state(direct.kafka_bootstrap_servers, direct.jobs_topic, 0)
        assert leader in (1, 2, 3) and len(isr) == 3
        rig = NetRig(link, cluster3, node=leader)
        # asked of the other two nodes: the cut-off one still believes it leads
        others = ",".join(
            f"127.0.0.1:{cluster3.kafka.ports[0] + n - 1}" for n in (1, 2, 3) if n != leader  # type: ignore[index]
        )

        async def leader_now() -> int:
            return (await partition_state(others, direct.jobs_topic, 0))[0]

        report = await run_fault(
            rig, FAULTS["node_cut"], fault_tiers(rig), jobs=2500, settings=(settings, direct), probe=leader_now
        )
    assert_nothing_lost(report)
    assert report.probe not in (leader, -1), f"the leadership of node {leader} moved (now {report.probe})"
    assert report.during > 0, "work went on through the other two nodes"
