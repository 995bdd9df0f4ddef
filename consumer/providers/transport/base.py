"""The HTTP edge every provider adapter sends through: one request in, one response out.

`HttpTransport` is the Protocol; `KeepAliveTransport` (`pool.py`) is the real one. An adapter
never sees sockets: it hands over a method, a parsed `HttpTarget`, headers and body bytes, and
gets an `HttpResponse` back, or one of two exceptions that `errormap.error_for_exception`
turns into the error taxonomy:

    TimeoutError      connect, a free connection or the answer did not come in time
    ConnectionError   refused, reset, closed mid-answer, or an answer that is not HTTP

Nothing here follows redirects: a key is only ever sent to the URL the adapter built. A proxy
(`route.py`) only carries the bytes: HTTPS goes through it as a CONNECT tunnel with TLS to the
provider inside, so the proxy never sees the key unless it re-signs TLS with a CA the tier's
`tls.ca_file` trusts.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

#: ports a scheme implies
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class HttpTarget:
    """A parsed absolute http(s) URL: where to connect, and the request line's target.

    origin: (scheme, host, port), the key of a connection pool; host_header: the `Host`
    header's value (the port only when it is not the scheme's default).
    """

    scheme: str
    host: str
    port: int
    path: str
    host_header: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"


@functools.lru_cache(maxsize=256)
def parse_target(url: str) -> HttpTarget:
    """`url` as an HttpTarget; ValueError when it is not an http(s) URL with a host.

    Adapters call a few fixed URLs over and over (the chat path), so parses are remembered.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"not an http(s) URL with a host: {url!r}")
    port = parts.port if parts.port is not None else DEFAULT_PORTS[scheme]
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return HttpTarget(scheme, host, port, path, host_header)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete answer: status, headers (names lower-cased; a repeated header keeps its last
    value), body (decoded from gzip or deflate when the server encoded it)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class HttpTransport(Protocol):
    """Sends one request and reads its whole answer (or raises TimeoutError / ConnectionError)."""

    async def request(
        self, method: str, target: HttpTarget, headers: Mapping[str, str], body: bytes | None
    ) -> HttpResponse: ...

    async def close(self) -> None:
        """Close every connection; the transport takes no more requests (idempotent)."""
        ...
