"""Shared fixtures: a real Kafka broker, unique topic names, topic creation, the 3-node cluster,
the short consumer-group session of SIGKILL tests; hypothesis profiles; xdist grouping.

Tests find a broker in this order (DESIGN.md, "Local development"):

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (``make test`` sets it after starting the local broker);
2. testcontainers' Kafka when a Docker engine answers;
3. the local broker from ``deploy/kafka-local/kafka`` (Java 17+ and Maven; no Docker).

The fixtures are lazy: a broker starts only when a test asks for ``kafka_bootstrap`` (or
``kafka_cluster``), so unit and provider tests never wait for one. A fixture stops only what
its own test run started, and only once no other worker of the run still uses it.

The test tools themselves (the cluster, the outcome follower, processes, ports) live in
``consumer/testing/``; nothing imports this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from consumer.testing.cluster import LocalKafka, create_topic_on, quick_session_s
from consumer.testing.paths import REPO_ROOT

log = logging.getLogger(__name__)

# the 1-node broker shares its state dir with `make broker-start`; the 3-node cluster has its own
SINGLE_NODE_HOME = Path(os.environ.get("KAFKA_LOCAL_HOME", REPO_ROOT / ".local" / "kafka"))
CLUSTER_HOME = REPO_ROOT / ".local" / "kafka-cluster"
# explicit, so that port overrides meant for the 1-node broker never move the cluster onto it
CLUSTER_PORTS = (
    int(os.environ.get("KAFKA_CLUSTER_BROKER_PORT", "19092")),
    int(os.environ.get("KAFKA_CLUSTER_CONTROLLER_PORT", "19192")),
)
DOCKER_PING_TIMEOUT_S = 3.0

# Hypothesis: "ci" has no per-example deadline (a shared 2-core machine makes any example slow
# now and then; a deadline there fails a test for the machine's load, not for the code).
# HYPOTHESIS_PROFILE picks one; else "ci" when CI is set, else "dev" (the library's defaults).
settings.register_profile("dev")
settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

#: session fixtures that own a server: the tests using one run on one xdist worker, so it
#: starts once and is never used by two workers at a time
ONE_WORKER_FIXTURES = frozenset({"kafka_cluster", "local_server", "embed_server"})
#: folders whose tests run one after another on one worker: each local-model test starts a
#: llama.cpp server that takes the machine's cores while it loads and answers
ONE_WORKER_FOLDERS = {"tests/local_model/": "local_model"}


def _xdist_group(item: pytest.Item) -> str | None:
    """The xdist group a test belongs to (see `pytest_collection_modifyitems`); None: any worker."""
    for folder, group in ONE_WORKER_FOLDERS.items():
        if item.nodeid.startswith(folder):
            return group
    info = getattr(item, "_fixtureinfo", None)
    for name, fixture_defs in sorted((info.name2fixturedefs if info is not None else {}).items()):
        if name in ONE_WORKER_FIXTURES:
            return name
        if fixture_defs and fixture_defs[-1].scope == "module":
            return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`): the tests of a fixture that owns a server
    (ONE_WORKER_FIXTURES, or any module-scoped fixture) or of a ONE_WORKER_FOLDERS folder
    share one worker; the rest are spread over the workers."""
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _run_id(config: pytest.Config) -> str:
    """One id for the whole test run: every xdist worker gets the controller's."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return str(workerinput["testrunuid"])
    if not hasattr(config, "_promptbus_run_id"):
        config._promptbus_run_id = uuid.uuid4().hex  # type: ignore[attr-defined]
    return str(config._promptbus_run_id)  # type: ignore[attr-defined]


@contextlib.contextmanager
def shared_start(kafka: LocalKafka, run_id: str) -> Iterator[LocalKafka]:
    """Start `kafka` for this session (the script's own lock makes concurrent starts one);
    at the end, stop it when this test run started it and no other session still uses it.

    Each session holds a shared lock on `<home>/.pytest-users` while it uses the cluster; the
    one that ends last gets it exclusively and stops the cluster if the marker says this run
    started it (a cluster started by hand, or by another run, is left running).
    """
    kafka.home.mkdir(parents=True, exist_ok=True)
    marker = kafka.home / ".pytest-started-by"
    with (kafka.home / ".pytest-users").open("a") as users:
        fcntl.flock(users, fcntl.LOCK_SH)
        kafka.start()
        if kafka.started_here:
            marker.write_text(run_id)
        try:
            yield kafka
        finally:
            fcntl.flock(users, fcntl.LOCK_UN)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("local Kafka in %s: still in use by another session", kafka.home)
            else:
                if marker.exists() and marker.read_text() == run_id:
                    kafka.stop()
                    marker.unlink()


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
def kafka_bootstrap(pytestconfig: pytest.Config) -> Iterator[str]:
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
    with shared_start(LocalKafka(SINGLE_NODE_HOME, nodes=1), _run_id(pytestconfig)) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def schema_registry_url() -> str:
    """A real Confluent-compatible Schema Registry: SCHEMA_REGISTRY_URL (make test starts
    Apicurio and sets it), else the local one `deploy/schema-registry/registry` starts (once;
    a second start finds it running and only prints its URL)."""
    from_env = os.environ.get("SCHEMA_REGISTRY_URL")
    if from_env:
        return from_env
    script = REPO_ROOT / "deploy" / "schema-registry" / "registry"
    done = subprocess.run([str(script), "start"], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        pytest.fail(f"the local Schema Registry did not start: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def kafka_cluster(pytestconfig: pytest.Config) -> Iterator[LocalKafka]:
    """The 3-node local cluster (RF 3, min ISR 2), in its own state dir and on its own ports."""
    cluster = LocalKafka(CLUSTER_HOME, nodes=3, ports=CLUSTER_PORTS)
    with shared_start(cluster, _run_id(pytestconfig)):
        yield cluster


@pytest.fixture
async def short_session_s(kafka_bootstrap: str) -> float:
    """`PROMPTBUS_SESSION_TIMEOUT_S` for tests that SIGKILL or freeze a service: the group moves
    its partitions on within seconds (`consumer.testing.cluster.quick_session_s`)."""
    return await quick_session_s(kafka_bootstrap)


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
