"""A private local broker for one test module: its own state dir under `.local/`, free ports,
plaintext or SASL_SSL, deleted at the end.

`private_broker(...)` starts `deploy/kafka-local/kafka` in a fresh `KAFKA_LOCAL_HOME` on two
free loopback ports (never the shared broker's nor the clusters'), so a test may kill, restart
or misconfigure it without touching the broker other tests use. Every script call is bounded
(`consumer.testing.cluster.SCRIPT_TIMEOUT_S`).
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator

from consumer.testing.cluster import LocalKafka
from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_ports


@contextlib.contextmanager
def private_broker(
    name: str, *, security: str = "plaintext", acl: bool = False, users: tuple[str, ...] = ()
) -> Iterator[LocalKafka]:
    """`with private_broker("outage") as kafka:` a fresh 1-node broker, cleaned up at the end
    (`kafka.client_env`: the client settings its start printed, for SASL_SSL; `acl`, `users`:
    its authorizer and more users, as `LocalKafka`'s)."""
    home = REPO_ROOT / ".local" / f"kafka-{name}-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    broker_port, controller_port = free_ports(2)
    kafka = LocalKafka(
        home, nodes=1, ports=(broker_port, controller_port), security=security, acl=acl, users=users
    )
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.clean()
        shutil.rmtree(home, ignore_errors=True)
