"""An HTTP proxy as a value: `ProxyRoute`, parsed from a proxy URL by `parse_proxy_url`.

The tier file's `proxy:` is checked with it when settings load, and the transport connects by
it (`consumer.providers.transport.route`). A basic-auth user and password become one
`proxy-authorization` value, which, like an API key, is never shown: a route is shown as
`http://host:port` only, and a URL that does not parse is refused without being repeated.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

#: the `proxy:` value that means: connect directly, whatever the environment says
NO_PROXY_SETTING = "none"


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """An HTTP proxy: its address, and the `proxy-authorization` value (None: no credentials).

    `shown` (`http://host:port`) is what errors and logs may name; the credentials never are.
    """

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def parse_proxy_url(url: str) -> ProxyRoute:
    """An `http://[user:password@]host[:port]` proxy URL as a route; ValueError otherwise (the
    message never repeats the URL, which may carry a password)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme.lower() != "http":
        raise ValueError(f"a proxy URL must be http:// (got a {parts.scheme}:// one)")
    try:
        port = parts.port or 80
    except ValueError:
        raise ValueError("the proxy URL's port is not a number") from None
    if not parts.hostname:
        raise ValueError("the proxy URL has no host")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return ProxyRoute(parts.hostname, port, authorization)
