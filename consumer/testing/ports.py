"""Free loopback ports for servers a test or benchmark starts (simulators, metrics, brokers)."""

from __future__ import annotations

import contextlib
import random
import socket

__all__ = ["RESERVED_PORTS", "free_port", "free_port_block", "free_ports"]

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


#: where `free_port_block` looks: above the fixed brokers' ports, below the kernel's ephemeral
#: range (ports the kernel hands out for outgoing connections and port 0 start at 32768)
BLOCK_RANGE = (20000, 32000)


def free_port_block(count: int, host: str = "127.0.0.1", *, seed: int | None = None) -> int:
    """The first of `count` consecutive ports all free on `host` right now, none reserved: for
    a server that numbers its ports from a first one (a local cluster's nodes and proxies).

    Random bases in BLOCK_RANGE are tried until every port of one binds; they are released on
    return, like `free_ports`."""
    rng = random.Random(seed)
    for _ in range(200):
        base = rng.randrange(BLOCK_RANGE[0], BLOCK_RANGE[1] - count)
        if any(port in RESERVED_PORTS for port in range(base, base + count)):
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind((host, port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {BLOCK_RANGE}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port free on `host` right now (see `free_ports`)."""
    return free_ports(1, host)[0]
