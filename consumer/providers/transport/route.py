"""Where a connection goes: straight to the origin, or through an HTTP proxy.

A `ProxyPolicy` is resolved once when a deployment's transport is built (never per request):
the tier's `proxy:` setting wins; without one, the proxy variables (`HTTPS_PROXY`,
`HTTP_PROXY`, `NO_PROXY`, upper or lower case) as `urllib.request.getproxies` and
`proxy_bypass_environment` read them, captured at build time. The transport asks the policy
once per origin and remembers the answer.

Through a proxy an https origin is reached with a CONNECT tunnel and TLS inside it (the
provider's certificate and host name are checked as on a direct connection); an http origin
gets absolute-form requests sent to the proxy. A proxy's basic-auth user and password become
one `proxy-authorization` header value, which, like an API key, is never shown: a route is
shown as `http://host:port` only.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

from consumer.core.proxy import NO_PROXY_SETTING, ProxyRoute, parse_proxy_url

__all__ = ["NO_PROXY_SETTING", "ProxyPolicy", "ProxyRoute", "parse_proxy_url"]


class ProxyPolicy:
    """Which proxy, if any, serves an origin: `route_for((scheme, host, port))`.

    setting: the tier's `proxy:` (a URL, `none`, or None: the environment's, as captured in
    `environ_proxies`, `urllib.request.getproxies()` when not given).
    """

    def __init__(self, setting: str | None, environ_proxies: Mapping[str, str] | None = None) -> None:
        self._fixed: ProxyRoute | None = None
        self._direct = setting is not None and setting.strip().lower() == NO_PROXY_SETTING
        self._env: dict[str, str] = {}
        if setting is not None and not self._direct:
            self._fixed = parse_proxy_url(setting)
        elif setting is None:
            self._env = dict(urllib.request.getproxies() if environ_proxies is None else environ_proxies)

    @property
    def may_proxy(self) -> bool:
        """False when no origin can go through a proxy (the direct fast path)."""
        return not self._direct and (self._fixed is not None or "http" in self._env or "https" in self._env)

    def route_for(self, origin: tuple[str, str, int]) -> ProxyRoute | None:
        """The proxy for `origin`, or None to connect directly."""
        if self._direct:
            return None
        if self._fixed is not None:
            return self._fixed
        scheme, host, port = origin
        url = self._env.get(scheme)
        if not url:
            return None
        shown = f"[{host}]" if ":" in host else host
        bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # posix, untyped
        if bypass(f"{shown}:{port}", self._env):
            return None
        return parse_proxy_url(url)
