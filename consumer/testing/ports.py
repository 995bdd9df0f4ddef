"""Free loopback ports for servers a test or benchmark starts (simulators, metrics, brokers)."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["RESERVED_PORTS", "free_port", "free_ports"]

#: ports the repository's fixed brokers use: the 1-node broker (9092/9093), the test cluster
#: (19092-19094 / 19192-19194) and the soak's cluster (29092-29094 / 29192-29194)
RESERVED_PORTS = frozenset(
    {9092, 9093, *range(19092, 19095), *range(19192, 19195), *range(29092, 29095), *range(29192, 29195)}
)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` right now, none of `RESERVED_PORTS`.

    Each is bound (port 0) until all are found, so the kernel never hands out one twice; they
    are released on return, and a server started right after takes them.
    """
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        while len(ports) < count:
            sock = held.enter_context(socket.socket())
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in RESERVED_PORTS:
                ports.append(port)
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One port free on `host` right now (see `free_ports`)."""
    return free_ports(1, host)[0]
