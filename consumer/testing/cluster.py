"""The local Kafka cluster of `deploy/kafka-local/kafka` for tests and benchmarks.

`LocalKafka(home, nodes, ports)` runs the script in its own state dir (`KAFKA_LOCAL_HOME`) and
on its own ports, so a test cluster, the soak's cluster and a private broker never touch the
1-node broker other tests share. Node `n` is Kafka broker id `n`. Every script call is bounded.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumer.testing.paths import KAFKA_SCRIPT

__all__ = [
    "QUICK_SESSION_S",
    "SCRIPT_TIMEOUT_S",
    "LocalKafka",
    "broker_config",
    "create_topic_on",
    "group_min_session_timeout_s",
    "partition_state",
    "quick_session_s",
]

log = logging.getLogger(__name__)

#: a first start on a fresh machine fetches the jars, then formats and boots the nodes
SCRIPT_TIMEOUT_S = 600.0
#: the consumer-group session of tests that SIGKILL or freeze a service and wait for the group
#: to give its partitions to another member: seconds, not the service's default 10 s
QUICK_SESSION_S = 3.0


@dataclass
class LocalKafka:
    """One cluster run by `deploy/kafka-local/kafka` in its own state dir.

    ports: (first broker port, first controller port); None: the script's defaults (9092 for
    one node, 19092 for three). proxy_port: the first port of the block of the proxied layout
    (`KAFKA_LOCAL_PROXY_PORT`, see `consumer.testing.netcluster`; `proxy_paths` proxied listeners
    per node); None: none. security: "plaintext" or "sasl_ssl"; acl: with sasl_ssl, the
    broker's authorizer refuses what no ACL allows (`kafka start --acl`); users: more SCRAM
    users beside admin and promptbus (`user_env`). heap: the JVM heap flags
    of each node (None: the script's default). `started_here` tells whether `start` had to
    start it (and so whether its owner should stop it); `client_env` holds the client settings
    `start` printed before the bootstrap servers (empty for plaintext).
    """

    home: Path
    nodes: int = 1
    ports: tuple[int, int] | None = None
    security: str = "plaintext"
    acl: bool = False
    users: tuple[str, ...] = ()
    heap: str | None = None
    proxy_port: int | None = None
    proxy_paths: int = 1
    bootstrap: str = ""
    started_here: bool = False
    client_env: dict[str, str] = field(default_factory=dict)
    _env: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._env = {**os.environ, "KAFKA_LOCAL_HOME": str(self.home)}
        if self.ports is not None:
            self._env["KAFKA_LOCAL_BROKER_PORT"] = str(self.ports[0])
            self._env["KAFKA_LOCAL_CONTROLLER_PORT"] = str(self.ports[1])
        if self.heap is not None:
            self._env["KAFKA_LOCAL_HEAP"] = self.heap
        if self.proxy_port is not None:
            self._env["KAFKA_LOCAL_PROXY_PORT"] = str(self.proxy_port)
            self._env["KAFKA_LOCAL_PROXY_PATHS"] = str(self.proxy_paths)

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
        """True when every node of the cluster in `home` runs."""
        return self._run("status", check=False).returncode == 0

    def start(self) -> str:
        """Start the cluster (a no-op when it runs) and return its bootstrap servers."""
        already_running = self.is_running()
        extra = ["--acl"] if self.acl else []
        if self.users:
            extra += ["--users", ",".join(self.users)]
        proc = self._run("start", "--nodes", str(self.nodes), "--security", self.security, *extra)
        lines = proc.stdout.strip().splitlines()
        self.bootstrap = lines[-1]
        self.client_env = dict(line.split("=", 1) for line in lines[:-1] if "=" in line)
        self.started_here = not already_running
        log.info(
            "local Kafka (%d node(s)) at %s, started here: %s", self.nodes, self.bootstrap, self.started_here
        )
        return self.bootstrap

    def user_env(self, user: str) -> dict[str, str]:
        """The client settings of `user` (admin, or one of `users`): `client_env` with its name
        and its password (from the state dir's security files)."""
        password = (self.home / "security" / f"{user}.password").read_text().strip()
        return {
            **self.client_env,
            "PROMPTBUS_KAFKA__SASL_USERNAME": user,
            "PROMPTBUS_KAFKA__SASL_PASSWORD": password,
        }

    def proxies(self) -> list[tuple[str, int, int]]:
        """(name, listen port, upstream port) of every proxy the proxied layout needs."""
        lines = self._run("proxies", "--nodes", str(self.nodes)).stdout.split("\n")
        rows = [line.split() for line in lines if line.strip()]
        return [(name, int(listen), int(upstream)) for name, listen, upstream in rows]

    def active_controller(self) -> int:
        """Node id of the active controller (the KRaft quorum leader)."""
        return int(self._run("controller").stdout.strip())

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after a bound)."""
        self._run("stop")

    def clean(self) -> None:
        """Stop the cluster and delete its state dir."""
        self._run("clean", check=False)

    def kill(self, node: int) -> None:
        """SIGKILL node `node` (broker id `node`) and wait until it is gone."""
        self._run("kill", str(node))

    def restart(self, node: int) -> None:
        """Start node `node` again on its data dir; returns when all brokers answer."""
        self._run("restart", str(node))

    async def leader_of(self, topic: str, partition: int) -> int:
        """Broker id (= node number) leading `topic`/`partition`; -1 while there is none."""
        leader, _isr = await partition_state(self.bootstrap, topic, partition)
        return leader

    async def isr_of(self, topic: str, partition: int) -> list[int]:
        """Broker ids in the in-sync replica set of `topic`/`partition`."""
        _leader, isr = await partition_state(self.bootstrap, topic, partition)
        return isr

    async def create_topic(
        self, name: str, partitions: int = 1, rf: int = 3, configs: dict[str, str] | None = None
    ) -> str:
        """Create `name` on this cluster (replication factor 3 by default)."""
        return await create_topic_on(self.bootstrap, name, partitions, rf, configs)


async def create_topic_on(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    rf: int = 1,
    configs: dict[str, Any] | None = None,
) -> str:
    """Create topic `name` with `partitions` partitions and replication factor `rf`."""
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

    `(-1, [])` while the broker asked does not know the partition yet: right after
    `create_topics` the new topic reaches each broker's metadata cache a moment later, so
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


async def broker_config(bootstrap: str, name: str) -> str:
    """The value of broker config `name` (e.g. `group.min.session.timeout.ms`) on the first
    broker at `bootstrap`, as the broker reports it."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        node = (await admin.describe_cluster())["brokers"][0]["node_id"]
        answers = await admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(node))])
    finally:
        await admin.close()
    for answer in answers:
        for *_, entries in answer.resources:
            for entry_name, value, *_ in entries:
                if entry_name == name:
                    return str(value)
    raise RuntimeError(f"broker {node} at {bootstrap} did not report {name}")


async def group_min_session_timeout_s(bootstrap: str) -> float:
    """The shortest consumer-group session the brokers at `bootstrap` accept."""
    return int(await broker_config(bootstrap, "group.min.session.timeout.ms")) / 1000.0


async def quick_session_s(bootstrap: str) -> float:
    """QUICK_SESSION_S, or the brokers' shortest session when that is longer."""
    return max(QUICK_SESSION_S, await group_min_session_timeout_s(bootstrap))
