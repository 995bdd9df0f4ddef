"""The fault proxy itself: a real Toxiproxy server in front of a real TCP echo server; each
toxic the fault tests use does what they rely on."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer.testing.toxiproxy import Link, run_toxiproxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@contextlib.contextmanager
def _echo_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _echo(link: Link, payload: bytes = b"ping", timeout_s: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", link.listen_port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_toxics_and_cuts_act_on_the_link_and_reset_clears_them(tmp_path: Path) -> None:
    with _echo_server() as port, run_toxiproxy(tmp_path) as toxi:
        link = toxi.proxy("echo", upstream_port=port)
        assert toxi.links() == ["echo"]
        assert _echo(link) == b"ping", "through the proxy"
        # timeout 0: the answer is swallowed, the connection stays open (half-open)
        with link.toxic("stall", "timeout", timeout=0):
            assert link.toxics() == ["stall"]
            with pytest.raises(TimeoutError):
                _echo(link, timeout_s=0.5)
        assert link.toxics() == []
        assert _echo(link) == b"ping", "flows again once the toxic is gone"
        # a reset: the peer's RST, not an answer
        with link.toxic("rst", "reset_peer", timeout=0), pytest.raises(ConnectionResetError):
            _echo(link)
        with link.cut(), pytest.raises(ConnectionRefusedError):
            _echo(link)
        assert _echo(link) == b"ping", "back after the cut"
        link.add_toxic("stall", "timeout", timeout=0)
        link.set_enabled(False)
        toxi.reset()
        assert link.toxics() == [] and _echo(link) == b"ping"
