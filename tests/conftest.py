"""Shared fixtures: a real Kafka broker, unique topic names, topic creation, the 3-node cluster.

Tests find a broker in this order (DESIGN.md, "Local development"):

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (``make test`` sets it after starting the local broker);
2. testcontainers' Kafka when a Docker engine answers;
3. the local broker from ``deploy/kafka-local/kafka`` (Java 17+ and Maven; no Docker).

The fixtures are lazy: a broker starts only when a test asks for ``kafka_bootstrap`` (or
``kafka_cluster``), so unit and provider tests never wait for one. A fixture stops only what
it started itself.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

log = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parent.parent
KAFKA_SCRIPT = REPO_DIR / "deploy" / "kafka-local" / "kafka"
# the 1-node broker shares its state dir with `make broker-start`; the 3-node cluster has its own
SINGLE_NODE_HOME = Path(os.environ.get("KAFKA_LOCAL_HOME", REPO_DIR / ".local" / "kafka"))
CLUSTER_HOME = REPO_DIR / ".local" / "kafka-cluster"
# explicit, so that port overrides meant for the 1-node broker never move the cluster onto it
CLUSTER_PORTS = (
    int(os.environ.get("KAFKA_CLUSTER_BROKER_PORT", "19092")),
    int(os.environ.get("KAFKA_CLUSTER_CONTROLLER_PORT", "19192")),
)
# first start on a fresh machine fetches the jars, then formats and boots the nodes
SCRIPT_TIMEOUT_S = 600.0
DOCKER_PING_TIMEOUT_S = 3.0


@dataclass
class LocalKafka:
    """One cluster run by ``deploy/kafka-local/kafka`` in its own state dir.

    Node ``n`` is Kafka broker id ``n``. ``started_here`` tells whether :meth:`start` had to
    start it (and so whether the fixture that owns it should stop it).
    """

    home: Path
    nodes: int
    ports: tuple[int, int] | None = None  # (first broker port, first controller port)
    bootstrap: str = ""
    started_here: bool = False
    _env: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._env = {**os.environ, "KAFKA_LOCAL_HOME": str(self.home)}
        if self.ports is not None:
            self._env["KAFKA_LOCAL_BROKER_PORT"] = str(self.ports[0])
            self._env["KAFKA_LOCAL_CONTROLLER_PORT"] = str(self.ports[1])

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(KAFKA_SCRIPT), *args],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{KAFKA_SCRIPT.name} {' '.join(args)} failed with exit code {proc.returncode}:\n"
                f"{proc.stderr[-4000:]}"
            )
        return proc

    def is_running(self) -> bool:
        """True when every node of the cluster in ``home`` runs."""
        return self._run("status", check=False).returncode == 0

    def start(self) -> str:
        """Start the cluster (a no-op when it runs) and return its bootstrap servers."""
        already_running = self.is_running()
        proc = self._run("start", "--nodes", str(self.nodes))
        self.bootstrap = proc.stdout.strip().splitlines()[-1]
        self.started_here = not already_running
        log.info(
            "local Kafka (%d node(s)) at %s, started here: %s", self.nodes, self.bootstrap, self.started_here
        )
        return self.bootstrap

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after a bound)."""
        self._run("stop")

    def kill(self, node: int) -> None:
        """SIGKILL node ``node`` (broker id ``node``) and wait until it is gone."""
        self._run("kill", str(node))

    def restart(self, node: int) -> None:
        """Start node ``node`` again on its data dir; returns when all brokers answer."""
        self._run("restart", str(node))

    async def leader_of(self, topic: str, partition: int) -> int:
        """Broker id (= node number) leading ``topic``/``partition``; -1 while there is none."""
        leader, _isr = await partition_state(self.bootstrap, topic, partition)
        return leader

    async def isr_of(self, topic: str, partition: int) -> list[int]:
        """Broker ids in the in-sync replica set of ``topic``/``partition``."""
        _leader, isr = await partition_state(self.bootstrap, topic, partition)
        return isr

    async def create_topic(
        self, name: str, partitions: int = 1, rf: int = 3, configs: dict[str, str] | None = None
    ) -> str:
        """Create ``name`` on this cluster (replication factor 3 by default)."""
        return await create_topic_on(self.bootstrap, name, partitions, rf, configs)


async def create_topic_on(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    rf: int = 1,
    configs: dict[str, str] | None = None,
) -> str:
    """Create topic ``name`` with ``partitions`` partitions and replication factor ``rf``."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=rf, topic_configs=configs or {})]
        )
        for topic, error_code, *rest in response.topic_errors:
            if error_code != 0:
                raise RuntimeError(f"creating topic {topic!r} failed: error {error_code} {rest}")
    finally:
        await admin.close()
    return name


async def partition_state(bootstrap: str, topic: str, partition: int) -> tuple[int, list[int]]:
    """(leader id, ISR ids) of one partition, from a fresh metadata request.

    ``(-1, [])`` while the broker asked does not know the partition yet: right after
    ``create_topics`` the new topic reaches each broker's metadata cache a moment later, so
    callers poll (bounded) instead of failing on the first answer.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = await admin.describe_topics([topic])
    finally:
        await admin.close()
    for meta in topics:
        if meta["topic"] != topic:
            continue
        for part in meta["partitions"]:
            if part["partition"] == partition:
                return int(part["leader"]), sorted(int(b) for b in part["isr"])
    return -1, []


def _docker_answers() -> bool:
    """True when a Docker engine answers a ping within a few seconds."""
    try:
        import docker

        client = docker.from_env(timeout=int(DOCKER_PING_TIMEOUT_S))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no engine: all mean "no Docker"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker for this test session (see module doc)."""
    from_env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if from_env:
        yield from_env
        return
    if _docker_answers():
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers before the "community" split
            from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as container:
            yield container.get_bootstrap_server()
        return
    broker = LocalKafka(SINGLE_NODE_HOME, nodes=1)
    bootstrap = broker.start()
    try:
        yield bootstrap
    finally:
        if broker.started_here:
            broker.stop()


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalKafka]:
    """The 3-node local cluster (RF 3, min ISR 2), in its own state dir and on its own ports."""
    cluster = LocalKafka(CLUSTER_HOME, nodes=3, ports=CLUSTER_PORTS)
    cluster.start()
    try:
        yield cluster
    finally:
        if cluster.started_here:
            cluster.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test run: ``t-<test name>-<8 hex>``."""
    # Kafka allows [a-zA-Z0-9._-]; parametrized test ids carry brackets and other characters
    test = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:120]
    return f"t-{test}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def create_topic(kafka_bootstrap: str) -> Callable[..., Awaitable[str]]:
    """``await create_topic(name, partitions=1, rf=1, configs=None)`` on the session broker."""

    async def create(
        name: str, partitions: int = 1, rf: int = 1, configs: dict[str, Any] | None = None
    ) -> str:
        return await create_topic_on(kafka_bootstrap, name, partitions, rf, configs)

    return create


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.integration)])
def make_bus(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """`make_bus(partitions=N, **PROMPTBUS_env)`: a fresh bus (topics, group) of this run's
    kind. A test that takes it runs twice, on the in-memory Kafka edges (no broker) and on
    the real broker: the same test code."""
    from consumer.testing.harness import KafkaBus, MemoryBus

    if request.param == "memory":
        return lambda **kwargs: MemoryBus(**kwargs)
    bootstrap: Any = request.getfixturevalue("kafka_bootstrap")
    return lambda **kwargs: KafkaBus(bootstrap, **kwargs)
