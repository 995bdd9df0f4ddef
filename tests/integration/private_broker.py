"""A private local broker for one test module: its own state dir under `.local/`, free ports,
plaintext or SASL_SSL, deleted at the end.

`private_broker(...)` starts `deploy/kafka-local/kafka` in a fresh `KAFKA_LOCAL_HOME` on two
free loopback ports (never the shared broker's 9092/9093 nor the cluster's), so a test may
kill, restart or misconfigure it without touching the broker other tests use. Every script
call is bounded (`SCRIPT_TIMEOUT_S` of the shared fixtures).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.conftest import REPO_DIR, LocalKafka

#: ports other brokers of this repo use (the shared 1-node broker, the 3-node cluster)
RESERVED_PORTS = frozenset({9092, 9093, *range(19092, 19095), *range(19192, 19195)})


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free right now (bound to port 0, then released)."""
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in RESERVED_PORTS:
                ports.append(port)
    return ports


@dataclass
class PrivateKafka(LocalKafka):
    """A `LocalKafka` started with `--security` that also knows the client settings it printed."""

    security: str = "plaintext"
    #: the env lines `start` printed before its last line (empty for plaintext)
    client_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> str:
        """Start the broker; return its bootstrap servers and keep the printed client settings."""
        proc = self._run("start", "--nodes", str(self.nodes), "--security", self.security)
        lines = proc.stdout.strip().splitlines()
        self.bootstrap = lines[-1]
        self.client_env = dict(line.split("=", 1) for line in lines[:-1] if "=" in line)
        self.started_here = True
        return self.bootstrap

    def clean(self) -> None:
        """Stop the broker and delete its state dir."""
        self._run("clean", check=False)
        shutil.rmtree(self.home, ignore_errors=True)


@contextlib.contextmanager
def private_broker(name: str, *, security: str = "plaintext") -> Iterator[PrivateKafka]:
    """`with private_broker("outage") as kafka:` a fresh 1-node broker, cleaned up at the end."""
    home = REPO_DIR / ".local" / f"kafka-{name}-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    broker_port, controller_port = free_ports(2)
    kafka = PrivateKafka(home, nodes=1, ports=(broker_port, controller_port), security=security)
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.clean()
