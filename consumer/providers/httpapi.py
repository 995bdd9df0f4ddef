"""The one HTTP call path every adapter uses: send, time, map failures, decode JSON.

Adapters (online and batch) are `HttpAdapter`s set up from their `ProviderApi` (structured
modes, auth, answer format); each holds a `ProviderHttp`, which owns nothing but the injected
`HttpTransport` (`consumer.providers.transport`), the base URL, the auth headers (built from a
`SecretStr` at call time, never stored as plain text on the object, or from a rotating
`KeySource`, `consumer.providers.keys`, asked before each request and once more after a 401)
and the provider name used in errors.

The transport is the keep-alive one of `consumer.providers.transport.pool`: the service's
throughput is bound by client CPU per request, and a general-purpose client's machinery around
each call costs several times the call itself (see `factory.make_http_client`). Redirects are
not followed (a 3xx is an error like any other non-2xx), so a key is only ever sent to the URL
we built.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Required, TypedDict

import orjson
from pydantic import SecretStr

from consumer.core.completion import Completion, CompletionRequest, Usage
from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    MalformedResponse,
    ProviderError,
    RateLimitHint,
    Rejected,
    RequestTimeout,
)
from consumer.providers.errormap import error_for_exception, error_for_status, redact
from consumer.providers.keys import ApiKey, KeySource, KeyUnavailable
from consumer.providers.ratelimit import parse_rate_limit_headers
from consumer.providers.structured import StructuredMode
from consumer.providers.transport import HttpResponse, HttpTarget, HttpTransport, form_body, parse_target

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A 2xx answer: raw content, decoded JSON (when asked), request id and wall time.

    `headers`: names lower-cased.
    """

    status_code: int
    content: bytes
    headers: Mapping[str, str]
    latency_ms: float
    json: Any = None

    @property
    def rate_limit(self) -> RateLimitHint | None:
        """The rate-limit budget the provider announced in this answer's headers, if any."""
        if not any("ratelimit" in name or name.startswith("retry-after") for name in self.headers):
            return None  # most answers of servers without limits: nothing to parse
        hint = parse_rate_limit_headers(self.headers, now_s=time.time())
        return hint if hint != _NO_HINT else None

    @property
    def request_id(self) -> str | None:
        """The provider's request id header, when sent."""
        return self.headers.get("x-request-id") or self.headers.get("request-id")


#: a hint that says nothing
_NO_HINT = RateLimitHint()


def is_http_url(url: str) -> bool:
    """True for an http(s) URL with a host."""
    try:
        parse_target(url)
    except (ValueError, TypeError):
        return False
    return True


class ProviderHttp:
    """Sends requests for one provider and raises only `consumer.core.errors` classes."""

    def __init__(
        self,
        transport: HttpTransport,
        *,
        base_url: str,
        provider: str,
        api_key: ApiKey,
        auth_headers: Callable[[str], Mapping[str, str]],
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.transport = transport
        self.base_url = base_url.rstrip("/")
        if not is_http_url(self.base_url):
            raise ValueError(f"base_url must be an http(s) URL with a host, got {self.base_url!r}")
        self.provider = provider
        self._api_key = api_key if isinstance(api_key, SecretStr) else None
        self._keys: KeySource | None = None if api_key is None or isinstance(api_key, SecretStr) else api_key
        self._auth_headers = auth_headers
        self._extra_headers = dict(extra_headers or {})

    def __repr__(self) -> str:
        return f"ProviderHttp(provider={self.provider!r}, base_url={self.base_url!r})"

    def _secret(self) -> str | None:
        return self._api_key.get_secret_value() if self._api_key is not None else None

    def _headers(self, secret: str | None) -> dict[str, str]:
        headers = dict(self._extra_headers)
        if secret:
            headers.update(self._auth_headers(secret))
        return headers

    async def _current_secret(self) -> str | None:
        if self._keys is None:
            return self._secret()
        try:
            return await self._keys.key()
        except KeyUnavailable as exc:
            raise ConnectionFailed(f"{self.provider}: {exc}", provider=self.provider) from None

    def url(self, path: str) -> str:
        """`path` joined to the base URL; absolute URLs pass through."""
        if path.startswith(("http://", "https://")):
            return path
        return self.base_url + "/" + path.lstrip("/")

    def same_origin(self, url: str) -> bool:
        """True when `url` is on the base URL's scheme/host/port (so our key may be sent there)."""
        try:
            return parse_target(self.base_url).origin == parse_target(url).origin
        except ValueError:
            return False

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        files: Mapping[str, tuple[str, bytes, str]] | None = None,
        data: Mapping[str, str] | None = None,
        decode_json: bool = True,
    ) -> HttpReply:
        """One HTTP call. Non-2xx and transport failures raise ProviderError subclasses;
        a 2xx that is not JSON (when `decode_json`) raises MalformedResponse.

        json_body: sent as `application/json` (orjson).
        files / data: a form: `data` fields, then `files` as `{field: (filename, content,
        content_type)}` (multipart when there are files, else urlencoded).
        """
        url = self.url(path)
        secret = self._secret() if self._keys is None else await self._current_secret()
        headers = self._headers(secret)
        payload: bytes | None = None
        if json_body is not None:
            try:
                payload = orjson.dumps(json_body)
            except TypeError as exc:  # orjson.JSONEncodeError: an option value JSON cannot carry
                raise Rejected(
                    f"{self.provider}: request is not JSON-serializable: {exc}", provider=self.provider
                ) from None
            headers["content-type"] = "application/json"
        elif files is not None or data is not None:
            headers["content-type"], payload = form_body(data, files)
        started = time.perf_counter()
        target = parse_target(url)
        failure: ProviderError | None = None
        try:  # inline, not through _send: one coroutine less on every request
            response = await self.transport.request(method, target, headers, payload)
        except (TimeoutError, OSError) as exc:  # ConnectionError is an OSError
            failure = error_for_exception(self.provider, exc, secret=secret)
        if failure is not None:  # raised outside the handler: the transport's error is not chained
            log.debug("%s %s failed: %s", method, url, failure.message)
            raise failure
        if response.status == 401 and self._keys is not None and secret:
            # a rotated key: the source may have a newer one (the file changed, the command's
            # next token); one more try with it, else the 401 stands
            try:
                fresh = await self._keys.renewed(secret)
            except KeyUnavailable as exc:
                raise ConnectionFailed(f"{self.provider}: {exc}", provider=self.provider) from None
            if fresh is not None:
                secret = fresh
                headers.update(self._auth_headers(fresh))
                response = await self._send(method, url, target, headers, payload, secret)
        latency_ms = (time.perf_counter() - started) * 1000.0
        status_code, body, reply_headers = response.status, response.body, response.headers
        log.debug("%s %s -> %d in %.1f ms", method, url, status_code, latency_ms)
        if not 200 <= status_code < 300:
            raise self.error_for(status_code, body, reply_headers, secret=secret)
        decoded: Any = None
        if decode_json:
            try:
                decoded = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise self.malformed(f"HTTP {status_code} body is not JSON") from None
        return HttpReply(status_code, body, reply_headers, latency_ms, decoded)

    async def _send(
        self,
        method: str,
        url: str,
        target: HttpTarget,
        headers: dict[str, str],
        payload: bytes | None,
        secret: str | None,
    ) -> HttpResponse:
        try:
            return await self.transport.request(method, target, headers, payload)
        except (TimeoutError, OSError) as exc:  # ConnectionError is an OSError
            failure = error_for_exception(self.provider, exc, secret=secret)
        log.debug("%s %s failed: %s", method, url, failure.message)
        raise failure

    def error_for(
        self, status_code: int, body: Any, headers: Mapping[str, str] | None, *, secret: str | None = None
    ) -> ProviderError:
        """Map one non-2xx answer (also used for per-item statuses inside batch result files);
        `secret`: the key the request was sent with (default: the static key)."""
        parsed: Any = body
        if isinstance(body, (bytes, bytearray)):
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = bytes(body).decode("utf-8", "replace")
        return error_for_status(
            self.provider, status_code, parsed, headers, now_s=time.time(), secret=secret or self._secret()
        )

    def malformed(self, what: str) -> MalformedResponse:
        """A 2xx whose body is not the provider's format."""
        return MalformedResponse(f"{self.provider}: {redact(what, self._secret())}", provider=self.provider)


class HttpFactory(Protocol):
    """Builds one adapter's `ProviderHttp`: the provider's base URL rule and auth headers."""

    def __call__(
        self, transport: HttpTransport, *, base_url: str, api_key: ApiKey, name: str
    ) -> ProviderHttp: ...


#: what reading an answer body that is not the provider's format raises (then MalformedResponse)
_NOT_AN_ANSWER = (KeyError, IndexError, TypeError, ValueError, AttributeError)


@dataclass(frozen=True, slots=True)
class ProviderApi:
    """What sets one provider API's adapters apart, online and batch alike.

    structured_modes: the `structured_mode` values its adapters accept (any other is a ValueError).
    http: builds an adapter's HTTP path (base URL rule, auth headers).
    answer: what an answer body is called in errors ("chat completion", "message").
    read: `read(payload, request, structured_mode)` -> (answer text, finish reason) of one answer
        body, online or a Batch API result; raises KeyError, TypeError and the like when the body
        is not one.
    usage: `usage(body["usage"])` -> Usage: the answer's token counts as the provider
        reports them (prompt cache reads and writes included, see `Usage`).
    """

    structured_modes: tuple[str, ...]
    http: HttpFactory
    answer: str
    read: Callable[[Any, CompletionRequest, StructuredMode], tuple[str, str]]
    usage: Callable[[Mapping[str, Any]], Usage]


class AdapterOptions(TypedDict, total=False):
    """The keyword arguments every HTTP adapter takes (`HttpAdapter.__init__`); an adapter with
    more takes these as `**adapter: Unpack[AdapterOptions]` beside its own."""

    base_url: Required[str]
    api_key: ApiKey
    name: str
    structured_mode: StructuredMode
    owns_client: bool


class HttpAdapter:
    """What every HTTP adapter, online or batch, sets up and closes the same way.

    transport: injected (timeouts and pool limits come from the tier).
    base_url: the provider's API root, as its adapter documents it.
    api_key: sent as the provider's auth header; None sends none.
    name: the provider name in errors and stats (default: the class's `default_name`).
    structured_mode: how an answer schema is enforced, one of `api.structured_modes`
        (default: the class's `default_structured_mode`).
    owns_client: `aclose()` closes the transport (the factory hands each adapter its own).

    Subclasses set `api` (their provider API) and the two defaults; `read_answer` reads an
    answer body with the API's reader.
    """

    api: ClassVar[ProviderApi]
    default_name: ClassVar[str]
    default_structured_mode: ClassVar[StructuredMode]
    name: str
    structured_mode: StructuredMode
    owns_client: bool
    http: ProviderHttp

    def __init__(
        self,
        transport: HttpTransport,
        *,
        base_url: str,
        api_key: ApiKey = None,
        name: str | None = None,
        structured_mode: StructuredMode | None = None,
        owns_client: bool = True,
    ) -> None:
        mode = structured_mode if structured_mode is not None else self.default_structured_mode
        if mode not in self.api.structured_modes:
            modes = self.api.structured_modes
            raise ValueError(f"{type(self).__name__}: structured_mode must be one of {modes}")
        self.name = name if name is not None else self.default_name
        self.structured_mode = mode
        self.owns_client = owns_client
        self.http = self.api.http(transport, base_url=base_url, api_key=api_key, name=self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.http.base_url!r})"

    def read_answer(
        self,
        payload: Any,
        request: CompletionRequest,
        *,
        request_id: str | None = None,
        latency_ms: float = 0.0,
        rate_limit: RateLimitHint | None = None,
    ) -> Completion:
        """One answer body (online, or a Batch API result) as the Completion of `request`;
        MalformedResponse when it is not the provider's format. `rate_limit`: the budget an
        online answer's headers announced.

        The model and id are the body's when it has them, else the request's model and
        `request_id` (an online answer's request id header wins over the body's id).
        """
        api = self.api
        try:
            text, finish_reason = api.read(payload, request, self.structured_mode)
            usage_raw = payload.get("usage") or {}
            usage = api.usage(usage_raw if isinstance(usage_raw, Mapping) else {})
            model = str(payload.get("model") or request.model)
            body_id = str(payload["id"]) if payload.get("id") else None
        except _NOT_AN_ANSWER as exc:
            raise MalformedResponse(
                f"{self.name}: 2xx body is not a {api.answer} ({type(exc).__name__})", provider=self.name
            ) from None
        return Completion(
            text=text,
            finish_reason=finish_reason,
            usage=usage,
            provider=self.name,
            model=model,
            request_id=request_id or body_id,
            latency_ms=latency_ms,
            response_id=body_id,
            rate_limit=rate_limit,
        )

    async def aclose(self) -> None:
        """Close the transport when this adapter owns it (idempotent)."""
        if self.owns_client:
            await self.http.transport.close()


class HttpCompletionProvider(HttpAdapter):
    """What every HTTP chat adapter shares: one POST, parse, attach the rate-limit budget.

    Subclasses set `api`, the endpoint `path`, and implement `build_body` (the JSON they send);
    the answer is read by `read_answer`.
    """

    path: str
    #: a listing that costs nothing: OpenAI, Anthropic and OpenAI-compatible servers all serve it
    models_path = "/models"

    def build_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The JSON body this adapter sends for `request`."""
        raise NotImplementedError

    async def complete(self, request: CompletionRequest) -> Completion:
        """One call; raises only consumer.core.errors classes."""
        reply = await self.http.request("POST", self.path, json_body=self.build_body(request))
        return self.read_answer(
            reply.json,
            request,
            request_id=reply.request_id,
            latency_ms=reply.latency_ms,
            rate_limit=reply.rate_limit,
        )

    async def check_reachable(self) -> str:
        """GET the models listing; any answer but an auth refusal means the provider is there.

        A server without the listing (404 and the like) still answered, so only a transport
        failure, a timeout or an auth refusal raises.
        """
        url = self.http.url(self.models_path)
        try:
            await self.http.request("GET", self.models_path, decode_json=False)
        except (ConnectionFailed, RequestTimeout, AuthFailed):
            raise
        except ProviderError:
            pass
        return url
