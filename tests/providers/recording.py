"""The provider tests' recording server: a real HTTP server on 127.0.0.1 that records requests
and answers from a script, transport failures it acts out, and a secret that must never leak.

Each `Recorder` is an aiohttp.web server on a random port, served from one background thread
(its own event loop), so a recorder can be built in plain code and its script is ordinary
synchronous Python. `close_all()` (the provider tests' autouse fixture) closes every recorder
and every client it handed out at the end of each test.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from aiohttp import web
from multidict import CIMultiDictProxy
from yarl import URL

from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.providers.factory import make_http_client
from consumer.providers.transport import HttpTransport
from consumer.settings import TierConfig
from consumer.testing.ports import free_port

#: a key shaped unlike anything the redaction regex knows, so a leak cannot be hidden by it
SECRET = "zq7TOPSECRETVALUE91x"
#: how long a hanging handler sleeps: far past the short client timeouts the tests use, and
#: bounded, so a server always ends (the handler is cancelled when the client hangs up)
HANG_S = 10.0

T = TypeVar("T")


@dataclass(frozen=True)
class Reply:
    """An HTTP answer the recording server sends."""

    status: int = 200
    content: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


class Behaviour(enum.Enum):
    """Transport failures the recording server acts out instead of answering."""

    #: sleep past the client's timeout (the client sees a read timeout)
    HANG = "hang"
    #: close the connection without an answer (the client sees the server disconnect)
    DROP = "drop"
    #: answer bytes that are not HTTP (aiohttp's error then carries the request, our headers)
    GARBAGE = "garbage"
    #: send the headers and part of the promised body, then close (a truncated payload)
    TRUNCATE = "truncate"


@dataclass(frozen=True)
class SentRequest:
    """One request as the server received it."""

    method: str
    url: URL
    headers: CIMultiDictProxy[str]
    content: bytes
    #: the client's (host, port): the same for requests sent on one kept-alive connection
    peer: Any = None


Script = Callable[[SentRequest], "Reply | Behaviour"]


class _ServerLoop:
    """One event loop in a daemon thread that serves every recorder of the test session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="recorder-servers", daemon=True)
        thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the server loop and wait (bounded) for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the server loop; await it from another loop without blocking that loop."""
        return await asyncio.wait_for(
            asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop)), 30
        )


_SERVER_LOOP: _ServerLoop | None = None
#: recorders and sessions made during the current test (closed by `_close_recorders`)
_LIVE: list[Recorder] = []
_SESSIONS: list[HttpTransport] = []
_SOCKETS: list[socket.socket] = []


def _server_loop() -> _ServerLoop:
    global _SERVER_LOOP
    if _SERVER_LOOP is None:
        _SERVER_LOOP = _ServerLoop()
    return _SERVER_LOOP


class Recorder:
    """A real HTTP server on 127.0.0.1 (random port): records each request, answers from `respond`.

    `respond` returns a `Reply` or a `Behaviour`; an exception it raises becomes a 500 (and fails
    no test by itself: the assertions are on what the adapters do).
    """

    def __init__(self, respond: Script) -> None:
        self.respond = respond
        self.requests: list[SentRequest] = []
        app = web.Application(client_max_size=512 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a hanging handler ends when the client gives up
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        self.port = _server_loop().run(self._start())
        _LIVE.append(self)

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        sent = SentRequest(request.method, request.url, request.headers, await request.read(), peer)
        self.requests.append(sent)
        answer = self.respond(sent)
        transport = request.transport
        if answer is Behaviour.HANG:
            await asyncio.sleep(HANG_S)
            answer = Reply(200, b"{}")
        elif answer is Behaviour.DROP or transport is None:
            if transport is not None:
                transport.close()
            raise asyncio.CancelledError  # nothing more to send on this connection
        elif answer is Behaviour.GARBAGE:
            transport.write(b"HTTP/1.1 2OO NOT-HTTP\r\n\r\n")
            transport.close()
            raise asyncio.CancelledError
        elif answer is Behaviour.TRUNCATE:
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"choices\":")
            transport.close()
            raise asyncio.CancelledError
        assert isinstance(answer, Reply)
        return web.Response(status=answer.status, body=answer.content, headers=dict(answer.headers))

    def json(self, index: int = -1) -> Any:
        """The JSON body of a recorded request."""
        return orjson.loads(self.requests[index].content)

    def client(self, timeout_s: float = 10.0) -> HttpTransport:
        """A transport as the factory builds it (call inside the test's event loop)."""
        return client_session(timeout_s)

    async def aclose(self) -> None:
        """Stop serving (bounded)."""
        await _server_loop().run_async(self._runner.cleanup())


def client_session(timeout_s: float = 10.0) -> HttpTransport:
    """`make_http_client` for a tier with `timeout_s`; closed at the end of the test."""
    session = make_http_client(TierConfig(provider="openai", model="m", timeout_s=timeout_s))
    _SESSIONS.append(session)
    return session


def reply(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    """A JSON answer (`body` bytes are sent as they are)."""
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return Reply(status, content, {"content-type": "application/json", **(headers or {})})


def recorder(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> Recorder:
    """A server that answers every request the same way."""
    return Recorder(lambda _req: reply(status, body, headers))


def behaving(behaviour: Behaviour) -> Recorder:
    """A server that acts out `behaviour` on every request."""
    return Recorder(lambda _req: behaviour)


def closed_port_url() -> str:
    """`http://127.0.0.1:PORT` where nothing listens (the port was just bound and released)."""
    return f"http://127.0.0.1:{free_port()}"


def unaccepting_url() -> str:
    """`http://127.0.0.1:PORT` whose listener never accepts and whose backlog is full: a new
    connection's SYN goes unanswered, so connecting times out (closed at the end of the test)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    _SOCKETS.append(listener)
    for _ in range(3):  # fill the accept queue (Linux keeps backlog + 1)
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        _SOCKETS.append(filler)
    return f"http://127.0.0.1:{port}"


def make_request(text: str = "Classify:\nhello", **kw: Any) -> CompletionRequest:
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", text))
    return CompletionRequest(messages=messages, model="m-1", **kw)


async def close_all() -> None:
    """Close every client, recorder and socket handed out since the last call."""
    sessions, recorders = list(_SESSIONS), list(_LIVE)
    _SESSIONS.clear()
    _LIVE.clear()
    for session in sessions:
        await session.close()
    for rec in recorders:
        await rec.aclose()
    for sock in _SOCKETS:
        sock.close()
    _SOCKETS.clear()
