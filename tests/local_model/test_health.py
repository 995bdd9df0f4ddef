"""The local server's health check (`GET {base_url}/models`), against a stdlib HTTP server."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from consumer import localmodel

ROUTES: dict[str, tuple[int, bytes]] = {
    "/v1/models": (200, b'{"object": "list", "data": [{"id": "a"}, {"id": "b"}]}'),
    "/junk/models": (200, b"<html>not json</html>"),
    "/empty/models": (200, b"{}"),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = ROUTES.get(self.path, (404, b'{"error": "no route"}'))
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass


@pytest.fixture
def origin() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_models_listed(origin: str) -> None:
    assert localmodel.served_models(origin + "/v1") == ("a", "b")
    assert localmodel.served_models(origin + "/empty") == ()


def test_no_answer_is_none(origin: str) -> None:
    assert localmodel.served_models(origin + "/nothing") is None  # 404
    assert localmodel.served_models(origin + "/junk") is None  # 200, not JSON
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert localmodel.served_models(closed + "/v1", timeout_s=1.0) is None  # refused


def test_a_proxy_in_the_environment_is_not_used(origin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_proxy = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert localmodel.served_models(origin + "/v1") == ("a", "b")
