"""A private local Kafka cluster behind a fault proxy: every link a promptbus client (and, with
three nodes, a controller) uses crosses Toxiproxy, so a test can slow, stall or cut it.

    with run_toxiproxy(tmp) as toxi, proxied_kafka("faults", toxi, nodes=1) as cluster:
        cluster.direct       # bootstrap of the direct listeners: the test's own clients
        cluster.proxied()    # bootstrap through path 1's proxies: the service under test
        with cut(cluster.broker_links()):   # every broker unreachable
            ...

The layout is `deploy/kafka-local/kafka`'s (KAFKA_LOCAL_PROXY_PORT, `kafka proxies`): the
script names the proxies, this module creates them in Toxiproxy before the nodes start. The
state dir is a fresh one under `.local/` and every port is free, never the shared broker's or
the 3-node fixture's; the cluster is deleted at exit.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from consumer.testing.cluster import LocalKafka
from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_port_block
from consumer.testing.toxiproxy import Link, Toxiproxy

__all__ = ["ProxiedKafka", "cut", "proxied_kafka", "toxics"]

#: JVM heap of each node: three nodes, a simulator and the service share 2 cores
HEAP = "-Xms128m -Xmx512m"


@dataclass(frozen=True)
class ProxiedKafka:
    """A running proxied cluster: its script handle and its proxies by name."""

    kafka: LocalKafka
    links: dict[str, Link]

    @property
    def direct(self) -> str:
        """Bootstrap servers of the direct listeners (no proxy on the way)."""
        return self.kafka.bootstrap

    def proxied(self, path: int = 1) -> str:
        """Bootstrap servers through path `path`'s proxies."""
        return ",".join(link.address for link in self.broker_links(path))

    def broker_links(self, path: int = 1) -> list[Link]:
        """The client links of every node on one path."""
        prefix = "broker-" if path == 1 else f"broker{path}-"
        return [self.links[f"{prefix}{n}"] for n in range(1, self.kafka.nodes + 1)]

    def node_links(self, node: int) -> list[Link]:
        """Every link of node `node`: its client links on every path and its controller's links
        to and from the other controllers (cut together, the node is partitioned away)."""
        return [
            link
            for name, link in sorted(self.links.items())
            if name.endswith(f"-{node}")
            or (name.startswith("controller-") and name.split("-")[1] == str(node))
        ]


@contextlib.contextmanager
def cut(links: Iterable[Link]) -> Iterator[None]:
    """`with cut(links)`: each link down (connections closed, new ones refused) for the block."""
    with contextlib.ExitStack() as stack:
        for link in links:
            stack.enter_context(link.cut())
        yield


@contextlib.contextmanager
def toxics(links: Iterable[Link], name: str, kind: str, **kwargs: float | str) -> Iterator[None]:
    """`with toxics(links, "slow", "latency", latency=300)`: the toxic on each link for the block."""
    with contextlib.ExitStack() as stack:
        for link in links:
            stack.enter_context(link.toxic(name, kind, **kwargs))
        yield


@contextlib.contextmanager
def proxied_kafka(name: str, toxi: Toxiproxy, *, nodes: int = 1, paths: int = 1) -> Iterator[ProxiedKafka]:
    """A fresh `nodes`-node cluster whose client links (`paths` independent sets of them) and
    controller links cross `toxi`; cleaned up at exit."""
    home = REPO_ROOT / ".local" / f"kafka-{name}-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    # one block: broker ports, controller ports, then the proxied layout's 2*paths*N + N*N
    base = free_port_block(2 * nodes + 2 * paths * nodes + nodes * nodes)
    kafka = LocalKafka(
        home,
        nodes=nodes,
        ports=(base, base + nodes),
        heap=HEAP,
        proxy_port=base + 2 * nodes,
        proxy_paths=paths,
    )
    links: dict[str, Link] = {}
    try:
        for proxy_name, listen, upstream in kafka.proxies():
            links[proxy_name] = toxi.proxy(proxy_name, upstream_port=upstream, listen_port=listen)
        kafka.start()
        yield ProxiedKafka(kafka, links)
    finally:
        kafka.clean()
        for proxy_name in links:
            with contextlib.suppress(Exception):
                toxi.call("DELETE", f"/proxies/{proxy_name}")
        shutil.rmtree(home, ignore_errors=True)
