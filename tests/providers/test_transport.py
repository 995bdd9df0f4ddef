"""The keep-alive transport against a raw TCP server on 127.0.0.1 that writes exact bytes.

Each case runs on both event loops the service may run on (asyncio's and uvloop), since the
transport is an asyncio Protocol driven by the loop's own transports.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from consumer.providers.transport import HttpResponse, KeepAliveTransport, parse_target
from consumer.runtime import eventloop

LOOPS = ["asyncio", "uvloop"]

#: what the server does with one request: (request bytes, its writer) -> bytes to write, then
#: whether to close (the writer lets an answer trickle out before that)
Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[tuple[bytes, bool]]]


class RawServer:
    """A TCP server answering each request with the bytes `answer` returns; counts connections."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def url(self, path: str = "/v1/chat/completions") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                data, close = await self.answer(head + body, writer)
                writer.write(data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def ok(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def transport(timeout_s: float = 2.0, limit: int = 4, keepalive_s: float = 4.0) -> KeepAliveTransport:
    return KeepAliveTransport(
        limit=limit, timeout_s=timeout_s, connect_timeout_s=1.0, keepalive_s=keepalive_s
    )


def chunked(payload: bytes, size: int) -> bytes:
    chunks = (payload[i : i + size] for i in range(0, len(payload), size))
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def run(loop: str, case: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await case()

    return eventloop.run(main(), loop)  # type: ignore[arg-type]


async def post(t: KeepAliveTransport, server: RawServer, body: bytes = b'{"a":1}') -> HttpResponse:
    return await t.request("POST", parse_target(server.url()), {"content-type": "application/json"}, body)


@pytest.mark.parametrize("loop", LOOPS)
def test_requests_in_a_row_reuse_one_connection_and_send_what_was_asked(loop: str) -> None:
    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return ok(b'{"ok":true}', "X-Request-Id: r1"), False

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport()
            for _ in range(3):
                reply = await post(t, server)
                assert (reply.status, reply.body) == (200, b'{"ok":true}')
                assert reply.headers["x-request-id"] == "r1"  # names lower-cased
            await t.close()
            assert server.connections == 1 and len(server.requests) == 3
            head, _, body = server.requests[0].partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
            assert f"host: 127.0.0.1:{server.port}".encode() in lines
            assert b"content-type: application/json" in lines and b"content-length: 7" in lines
            assert body == b'{"a":1}'

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_chunked_gzip_and_deflate_answers_are_read_whole(loop: str) -> None:
    payload = b'{"choices":[' + b'{"x":1},' * 500 + b'{"x":2}]}'
    answers = iter(
        [
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(payload, 300),
            ok(gzip.compress(payload), "content-encoding: gzip"),
            ok(zlib.compress(payload), "content-encoding: deflate"),
        ]
    )

    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return next(answers), False

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport()
            for _ in range(3):
                assert (await post(t, server)).body == payload
            await t.close()
            assert server.connections == 1

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_without_a_length_ends_where_the_server_closes(loop: str) -> None:
    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil-close", True

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport()
            assert (await post(t, server)).body == b"until-close"
            assert (await post(t, server)).body == b"until-close"
            await t.close()
            assert server.connections == 2  # never reused after the server closed it

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_connection_close_is_not_reused(loop: str) -> None:
    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return ok(b"{}", "connection: close"), True

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport()
            for _ in range(2):
                assert (await post(t, server)).status == 200
            await t.close()
            assert server.connections == 2
            assert t.open_connections == 0

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_through_a_proxy_that_closes_after_each_answer_no_request_fails(loop: str) -> None:
    # as tinyproxy does: an answer with a length and no `Connection: close`, then the close
    from consumer.providers.transport.route import ProxyPolicy

    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return ok(b'{"n":1}'), True

    async def case() -> tuple[list[int], int, int, list[bytes]]:
        async with RawServer(answer) as proxy:  # the "proxy" answers absolute-form requests itself
            t = KeepAliveTransport(
                limit=4,
                timeout_s=2.0,
                connect_timeout_s=1.0,
                keepalive_s=4.0,
                proxy=ProxyPolicy(f"http://127.0.0.1:{proxy.port}"),
            )
            statuses = []
            for _ in range(5):
                target = parse_target("http://provider.test:8080/v1/chat/completions")
                statuses.append((await t.request("POST", target, {}, b"{}")).status)
            opened = t.open_connections
            await t.close()
            return statuses, proxy.connections, opened, proxy.requests

    statuses, connections, opened, requests = run(loop, case)
    assert statuses == [200] * 5
    assert connections >= 5 and opened == 0
    assert all(
        r.startswith(b"POST http://provider.test:8080/v1/chat/completions HTTP/1.1\r\n") for r in requests
    )
    assert len(requests) <= 6, "at most one request sent twice: the one that met the first close"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_direct_connection_closed_without_an_answer_is_not_resent(loop: str) -> None:
    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return ok(b'{"n":1}'), True

    async def case() -> tuple[int, int]:
        async with RawServer(answer) as server:
            t = transport()
            failures = 0
            for _ in range(5):
                try:
                    await post(t, server)
                except ConnectionError:
                    failures += 1
            await t.close()
            return failures, len(server.requests)

    failures, sent = run(loop, case)
    assert sent + failures >= 5 and sent <= 5, "one request per call: the core decides retries"


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_cut_short_is_a_connection_error_and_the_next_request_works(loop: str) -> None:
    cut = b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"choices":'
    answers = iter([(cut, True), (ok(b"{}"), False)])

    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return next(answers)

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport()
            with pytest.raises(ConnectionError, match="closed the connection"):
                await post(t, server)
            assert (await post(t, server)).status == 200
            await t.close()
            assert server.connections == 2

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_bytes_that_are_not_http_are_a_connection_error(loop: str) -> None:
    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return b"HTTP/1.1 2OO NOT-HTTP\r\n\r\n", True

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport()
            with pytest.raises(ConnectionError, match="not HTTP"):
                await post(t, server)
            await t.close()

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_that_stops_coming_times_out_and_its_connection_is_dropped(loop: str) -> None:
    answered = asyncio.Event()

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        if b"slow" in request:
            await answered.wait()  # never set: the client gives up first
        return ok(b"{}"), False

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport(timeout_s=0.3)
            with pytest.raises(TimeoutError, match="no answer data"):
                await post(t, server, b"slow")
            assert t.open_connections == 0
            assert (await post(t, server, b"fast")).status == 200
            await t.close()
            assert server.connections == 2

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_refused_connect_is_a_connection_error(loop: str) -> None:
    async def case() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        t = transport()
        with pytest.raises(ConnectionError):
            await t.request("GET", parse_target(f"http://127.0.0.1:{port}/"), {}, None)
        assert t.open_connections == 0
        await t.close()

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_at_the_limit_a_request_waits_for_a_free_connection_then_times_out(loop: str) -> None:
    async def case() -> None:
        release = asyncio.Event()

        async def answer(request: bytes, writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
            if b"first" not in request:
                return ok(b"{}"), False
            # the answer keeps flowing (each byte restarts the read timeout) until released
            body = b" " * 200
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
            sent = 0
            while not release.is_set() and sent < len(body) - 1:
                writer.write(body[sent : sent + 1])
                sent += 1
                await asyncio.sleep(0.05)
            return body[sent:], False

        async with RawServer(answer) as server:
            t = transport(timeout_s=0.3, limit=1)
            first = asyncio.ensure_future(post(t, server, b"first"))
            await asyncio.sleep(0)
            with pytest.raises(TimeoutError, match="no free connection"):
                await post(t, server)  # the one connection is busy until the first answer
            release.set()
            assert (await first).body == b" " * 200
            assert (await post(t, server)).status == 200  # the freed connection serves it
            await t.close()
            assert server.connections == 1

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_idle_past_keepalive_is_closed_not_reused(loop: str) -> None:
    async def answer(_request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        return ok(b"{}"), False

    async def case() -> None:
        async with RawServer(answer) as server:
            t = transport(keepalive_s=0.0)
            for _ in range(2):
                assert (await post(t, server)).status == 200
            await t.close()
            assert server.connections == 2

    run(loop, case)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_request_drops_its_connection(loop: str) -> None:
    async def case() -> None:
        arrived = asyncio.Event()

        async def answer(request: bytes, _writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
            if b"slow" in request:
                arrived.set()
                await asyncio.sleep(30)
            return ok(b"{}"), False

        async with RawServer(answer) as server:
            t = transport()
            task = asyncio.ensure_future(post(t, server, b"slow"))
            await asyncio.wait_for(arrived.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert t.open_connections == 0  # its answer may still come: never reused
            assert (await post(t, server)).status == 200
            await t.close()

    run(loop, case)


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async def case() -> None:
        t = transport()
        with pytest.raises(ValueError, match="line break"):
            await t.request("GET", parse_target("http://127.0.0.1:9/"), {"x-a": "1\r\nx-b: 2"}, None)
        assert t.open_connections == 0
        await t.close()

    run("asyncio", case)


def test_targets_parse_once_and_name_their_origin() -> None:
    target = parse_target("https://api.example.test/v1/batches?limit=2")
    assert target.origin == ("https", "api.example.test", 443)
    assert (target.path, target.host_header) == ("/v1/batches?limit=2", "api.example.test")
    assert parse_target("http://127.0.0.1:8080/v1").host_header == "127.0.0.1:8080"
    for bad in ("ftp://x/", "http:///nohost", "not a url"):
        with pytest.raises(ValueError):
            parse_target(bad)
