"""One node of three cut off for 20 s while it leads the jobs partition the test watches: its
client links and its controller's links to and from the other two controllers go down
together, the controllers fence it and its leaderships move; the service carries on through
the other two nodes and loses nothing.

The cluster is a private 3-node one on free ports behind Toxiproxy (`proxied_kafka(nodes=3)`),
never the shared 3-node fixture's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from consumer.kafka.admin import ensure_topics
from consumer.testing.cluster import partition_state
from consumer.testing.netcluster import ProxiedKafka, proxied_kafka
from consumer.testing.netfaults import FAULTS, NetRig, fault_tiers, rig_settings, run_fault
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from consumer.testing.toxiproxy import Toxiproxy
from tests.netfaults.test_provider_link import assert_nothing_lost

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: jobs partitions: their leaders spread over the three nodes
PARTITIONS = 6


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
        settings, direct = rig_settings(base, partitions=PARTITIONS, PROMPTBUS_TOPIC_REPLICATION=3)
        await ensure_topics(direct)
        # the node to cut leads a jobs partition and is not the active controller (cutting the
        # controller itself is a different case: the quorum elects another one first)
        controller = await asyncio.to_thread(cluster3.kafka.active_controller)
        leaders = {p: (await partition_state(direct.kafka_bootstrap_servers, direct.jobs_topic, p))[0]
                   for p in range(PARTITIONS)}
        partition, leader = next((p, n) for p, n in sorted(leaders.items()) if n not in (controller, -1))
        rig = NetRig(link, cluster3, node=leader)
        # asked of the other two nodes (their direct listeners): the cut-off one still
        # believes it leads
        others = ",".join(
            address for n, address in enumerate(cluster3.direct.split(","), start=1) if n != leader
        )

        async def leader_now() -> int:
            return (await partition_state(others, direct.jobs_topic, partition))[0]

        report = await run_fault(
            rig, FAULTS["node_cut"], fault_tiers(rig), jobs=2500, settings=(settings, direct),
            probe=leader_now,
        )
    assert_nothing_lost(report)
    assert report.probe not in (leader, -1), f"partition {partition} of node {leader}: {report.probe}"
    assert report.during > 0, "work went on through the other two nodes"
