"""`KeepAliveTransport`: HTTP/1.1 over pooled keep-alive connections, parsed by httptools.

A provider call is one small JSON POST and one JSON answer, tens of thousands of times a
minute; what a general-purpose client does around each (request and response objects, header
multidicts, stream readers, tracing hooks, cookie jars) costs several times the socket work
itself. This transport does only what those calls need:

- a connection is an `asyncio.Protocol` whose bytes go straight into an
  `httptools.HttpResponseParser` (the C parser uvicorn serves with); one request at a time per
  connection, the answer's body collected whole (Content-Length, chunked, or until the server
  closes);
- connections are kept per (proxy, origin), the origin being (scheme, host, port), and reused
  most-recent first; at most
  `limit` are open in all; a connection idle longer than `keepalive_s` is closed rather than
  reused (below the 5 s idle timeout of common servers, so a request never races the
  server's close); one the server closes leaves the pool;
- timeouts: `connect_timeout_s` for the TCP (and TLS) connect, `timeout_s` for a free
  connection, and `timeout_s` between two reads of the answer (a provider that stops sending
  for that long timed out; a long answer that keeps flowing does not);
- a pooled connection to an HTTP proxy (plain-http origin) that closes before a byte of its
  answer came is retried once on a new connection, and that proxy's connections are no longer
  pooled (tinyproxy closes after every answer without saying so); nowhere else does the
  transport resend;
- a connection whose request did not end cleanly (timeout, cancellation, a parse error, the
  server saying `Connection: close`) is closed, never reused;
- answers encoded with gzip or deflate are decoded;
- through a proxy (`route.py`, resolved per origin once and remembered): https origins over a
  CONNECT tunnel with TLS to the provider inside it, http origins as absolute-form requests;
  a proxy that refuses (407, 403, 502 ...) is a ConnectionError naming the transport's `name`
  (the tier and deployment) and the proxy, as is a certificate that fails verification.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import zlib
from collections.abc import Mapping
from typing import Any, cast

import httptools

from consumer.providers.transport.base import HttpResponse, HttpTarget
from consumer.providers.transport.route import ProxyPolicy, ProxyRoute
from consumer.providers.transport.tls import describe_tls_error

#: sent with every request (aiohttp and httpx announce themselves the same way)
USER_AGENT = "promptbus"
#: encodings an answer may come in (decoded here)
ACCEPT_ENCODING = "gzip, deflate"
#: the longest proxy answer to a CONNECT read before it counts as not HTTP
MAX_TUNNEL_HEAD = 16384

#: a pool key: the proxy (None: direct) and the origin (scheme, host, port)
PoolKey = tuple[ProxyRoute | None, tuple[str, str, int]]


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request's bytes out, its answer parsed as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: PoolKey) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since_s = 0.0
        self.reused = False  # taken from the pool for this request
        self.answer_started = False  # a byte of this request's answer came
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, dict[str, str], bytes, bool]] | None = None
        self._headers: dict[str, str] = {}
        self._chunks: list[bytes] = []
        self._headers_done = False
        self._framed = False  # the answer says where its body ends (length or chunked)
        self._timeout_s = 0.0
        self._last_data_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not subclasses of asyncio.Transport)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            self.close()  # bytes nobody asked for: the connection's state is unknown
            return
        self._last_data_s = self.loop.time()
        self.answer_started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"the answer is not HTTP ({exc})"))

    def eof_received(self) -> bool:
        self._end_unframed()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end_unframed()
        reason = f": {exc}" if exc is not None else ""
        self._fail(ConnectionError(f"the server closed the connection before the answer ended{reason}"))

    # ------------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._framed = "content-length" in self._headers or "chunked" in self._headers.get(
            "transfer-encoding", ""
        )

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self._resolve(self._parser.should_keep_alive())

    # ------------------------------------------------------------------ one request
    async def roundtrip(self, data: bytes, timeout_s: float) -> tuple[int, dict[str, str], bytes, bool]:
        """Send `data` (a whole request) and wait for the whole answer: (status, headers,
        body, whether the connection may be reused)."""
        assert self.transport is not None and self._waiter is None
        waiter = self._waiter = self.loop.create_future()
        self.answer_started = False
        self._headers, self._chunks = {}, []
        self._headers_done = self._framed = False
        self._timeout_s = timeout_s
        self._last_data_s = self.loop.time()
        self._timer = self.loop.call_at(self._last_data_s + timeout_s, self._check_timeout)
        self.transport.write(data)
        try:
            return await waiter
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._waiter = None

    def _check_timeout(self) -> None:
        due_s = self._last_data_s + self._timeout_s
        if self.loop.time() < due_s:
            self._timer = self.loop.call_at(due_s, self._check_timeout)
            return
        self._timer = None
        self._fail(TimeoutError(f"no answer data for {self._timeout_s:g} s"))

    def _resolve(self, keep_alive: bool) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        waiter.set_result((self._parser.get_status_code(), self._headers, body, keep_alive))

    def _end_unframed(self) -> None:
        # an answer without a length ends where the server closes the connection
        if self._headers_done and not self._framed:
            self._resolve(False)

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class KeepAliveTransport:
    """HTTP/1.1 with a pool of keep-alive connections (see the module docstring).

    limit: connections open at once over every origin; timeout_s: the longest wait for a
    free connection and between two reads of an answer; connect_timeout_s: the TCP (and TLS)
    connect; keepalive_s: the longest a connection idles before it is closed instead of reused;
    proxy: which origins go through which proxy (None: every one directly); ssl_context: the
    TLS of https origins (None: the system's defaults); name: who owns the transport, named in
    proxy and TLS errors (`tier small deployment eu`).
    """

    def __init__(
        self,
        *,
        limit: int,
        timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float,
        proxy: ProxyPolicy | None = None,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "",
    ) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.name = name
        self._proxy = proxy if proxy is not None and proxy.may_proxy else None
        self._keys: dict[tuple[str, str, int], PoolKey] = {}
        self._idle: dict[PoolKey, list[_Connection]] = {}
        #: keys whose server or proxy closes after every answer: their connections are not pooled
        self._one_shot: set[PoolKey] = set()
        self._opened = 0  # connections open or opening
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._ssl: ssl.SSLContext | None = ssl_context
        self._closed = False
        self._heads: dict[tuple[str, HttpTarget], bytes] = {}

    @property
    def open_connections(self) -> int:
        """Connections open now, in use or idle."""
        return self._opened

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._closed

    async def request(
        self, method: str, target: HttpTarget, headers: Mapping[str, str], body: bytes | None
    ) -> HttpResponse:
        """One request and its whole answer; TimeoutError or ConnectionError when it fails."""
        key = self._keys.get(target.origin)
        if key is None:
            route = self._proxy.route_for(target.origin) if self._proxy is not None else None
            key = self._keys[target.origin] = (route, target.origin)
        data = self._encode(method, target, headers, body, key[0])
        conn = await self._acquire(key, target)
        reuse = False
        try:  # the one exchange of almost every request, inline (no coroutine of its own)
            status, answer_headers, content, reuse = await conn.roundtrip(data, self.timeout_s)
        except ConnectionError:
            self._release(conn, reuse=False)
            if not conn.reused or conn.answer_started or key[0] is None or target.scheme != "http":
                raise
            # a pooled connection to an HTTP proxy that closed it after the last answer without
            # saying so (tinyproxy does, for absolute-form requests): once more, on a new one,
            # and that proxy's connections are not pooled from now on. Nowhere else: a server
            # that closes without answering may have had the request, and retries are the
            # core's to decide
            self._one_shot.add(key)
            conn = await self._acquire(key, target, reuse=False)
            status, answer_headers, content = await self._exchange(conn, data)
        except BaseException:
            self._release(conn, reuse=False)
            raise
        else:
            self._release(conn, reuse=reuse)
        if status == 407 and key[0] is not None and target.scheme == "http":
            # only a proxy answers 407: the provider never saw the request
            refusal = self._proxy_refusal(key[0], target, "407 Proxy Authentication Required")
            raise ConnectionError(refusal)
        encoding = answer_headers.get("content-encoding")
        if encoding:
            content = _decoded(content, encoding)
        return HttpResponse(status, answer_headers, content)

    async def _exchange(self, conn: _Connection, data: bytes) -> tuple[int, dict[str, str], bytes]:
        reuse = False
        try:
            status, answer_headers, content, reuse = await conn.roundtrip(data, self.timeout_s)
        finally:
            self._release(conn, reuse=reuse)
        return status, answer_headers, content

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionError("the transport is closed"))

    # ------------------------------------------------------------------ the request's bytes
    def _encode(
        self,
        method: str,
        target: HttpTarget,
        headers: Mapping[str, str],
        body: bytes | None,
        route: ProxyRoute | None,
    ) -> bytes:
        head = self._heads.get((method, target))
        if head is None:
            line = f"{method} {target.path} HTTP/1.1\r\n"
            if route is not None and target.scheme == "http":  # absolute-form, to the proxy
                line = f"{method} {target.url} HTTP/1.1\r\n"
                if route.authorization:
                    line += f"proxy-authorization: {route.authorization}\r\n"
            head = self._heads[(method, target)] = (
                f"{line}host: {target.host_header}\r\n"
                f"user-agent: {USER_AGENT}\r\naccept: */*\r\naccept-encoding: {ACCEPT_ENCODING}\r\n"
            ).encode("latin-1")
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"request header {name!r} holds a line break")
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        size = len(body) if body is not None else 0
        if body is None and method in ("GET", "HEAD"):
            return head + lines.encode("latin-1") + b"\r\n"
        parts = [head, lines.encode("latin-1"), b"content-length: %d\r\n\r\n" % size]
        if body:
            parts.append(body)
        return b"".join(parts)

    # ------------------------------------------------------------------ the pool
    async def _acquire(self, key: PoolKey, target: HttpTarget, *, reuse: bool = True) -> _Connection:
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self.timeout_s
        while True:
            if self._closed:
                raise ConnectionError("the transport is closed")
            conn = self._reusable(key, loop.time()) if reuse else None
            if conn is not None:
                conn.reused = True
                return conn
            if self._opened < self.limit or self._close_idle_elsewhere(key):
                return await self._connect(loop, key, target)
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline_s):
                    await waiter
            except TimeoutError:
                raise TimeoutError(
                    f"no free connection within {self.timeout_s:g} s ({self.limit} in use)"
                ) from None
            finally:
                if not waiter.done():
                    waiter.cancel()

    def _reusable(self, key: PoolKey, now_s: float) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and now_s - conn.idle_since_s < self.keepalive_s:
                return conn
            self._discard(conn)
        return None

    def _close_idle_elsewhere(self, key: PoolKey) -> bool:
        """Make room for a connection to `key` by closing the longest-idle one of another
        key (True when one was closed)."""
        oldest: _Connection | None = None
        for other, idle in self._idle.items():
            if other != key and idle and (oldest is None or idle[0].idle_since_s < oldest.idle_since_s):
                oldest = idle[0]
        if oldest is None:
            return False
        self._idle[oldest.key].remove(oldest)
        self._discard(oldest)
        return True

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, key: PoolKey, target: HttpTarget
    ) -> _Connection:
        self._opened += 1
        conn = _Connection(loop, key)
        route = key[0]
        tls: Any = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if route is None:
                    await loop.create_connection(
                        lambda: conn,
                        target.host,
                        target.port,
                        ssl=tls,
                        server_hostname=target.host if tls else None,
                    )
                elif tls is None:
                    await loop.create_connection(lambda: conn, route.host, route.port)
                else:
                    await self._tunnel(loop, conn, route, target, tls)
        except TimeoutError:
            self._opened -= 1
            self._wake()
            via = f" through proxy {route.shown}" if route is not None else ""
            raise TimeoutError(
                f"{self._who}connect to {target.host}:{target.port}{via} took longer than "
                f"{self.connect_timeout_s:g} s"
            ) from None
        except ssl.SSLError as exc:
            self._opened -= 1
            self._wake()
            raise ConnectionError(self._who + describe_tls_error(exc, target.host, target.port)) from None
        except BaseException:
            self._opened -= 1
            self._wake()
            raise
        return conn

    @property
    def _who(self) -> str:
        return f"{self.name}: " if self.name else ""

    def _proxy_refusal(self, route: ProxyRoute, target: HttpTarget, status: str) -> str:
        return f"{self._who}proxy {route.shown} refused {target.host}:{target.port}: {status}"

    async def _tunnel(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Connection,
        route: ProxyRoute,
        target: HttpTarget,
        tls: ssl.SSLContext,
    ) -> None:
        """A CONNECT tunnel through `route` to the target, then TLS to the provider inside it
        (its certificate and host name checked); `conn` speaks over the TLS transport."""
        opener = _TunnelOpener(loop)
        raw, _ = await loop.create_connection(lambda: opener, route.host, route.port)
        try:
            host = f"[{target.host}]" if ":" in target.host else target.host
            authority = f"{host}:{target.port}"
            auth = f"proxy-authorization: {route.authorization}\r\n" if route.authorization else ""
            raw.write(f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n{auth}\r\n".encode("latin-1"))
            status = await opener.answer
            if not status.startswith(("HTTP/1.1 200", "HTTP/1.0 200")):
                raise ConnectionError(self._proxy_refusal(route, target, status[9:].strip() or status))
            secured = await loop.start_tls(raw, conn, tls, server_hostname=target.host)
        except BaseException:
            raw.close()
            raise
        if secured is None:
            raise ConnectionError(f"{self._who}the tunnel through {route.shown} closed during TLS")
        conn.connection_made(secured)

    def _release(self, conn: _Connection, *, reuse: bool) -> None:
        if reuse and not conn.closed and not self._closed and conn.key not in self._one_shot:
            conn.idle_since_s = conn.loop.time()
            self._idle.setdefault(conn.key, []).append(conn)
            self._wake()
            return
        self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._opened -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _TunnelOpener(asyncio.Protocol):
    """Reads a proxy's answer to CONNECT: `answer` resolves to its status line (ConnectionError
    when the proxy closes first or sends more than a head)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answer: asyncio.Future[str] = loop.create_future()
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end >= 0:
            self.answer.set_result(self._buffer[: self._buffer.find(b"\r\n")].decode("latin-1"))
        elif len(self._buffer) > MAX_TUNNEL_HEAD:
            self.answer.set_exception(ConnectionError("the proxy's answer to CONNECT is not HTTP"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(
                ConnectionError("the proxy closed the connection before answering CONNECT")
            )


def _decoded(content: bytes, encoding: str) -> bytes:
    """An answer body decoded from its Content-Encoding; ConnectionError for one not offered."""
    encoding = encoding.strip().lower()
    try:
        if encoding == "gzip":
            return zlib.decompress(content, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            try:
                return zlib.decompress(content)
            except zlib.error:
                return zlib.decompress(content, -zlib.MAX_WBITS)  # raw deflate, as some servers send
    except zlib.error as exc:
        raise ConnectionError(f"the answer's {encoding} body does not decode ({exc})") from None
    if encoding == "identity":
        return content
    raise ConnectionError(f"the answer is encoded with {encoding!r}, which was not offered")
