"""HTTP outcomes -> the core error taxonomy. One mapping serves every adapter (online and batch).

    status / exception                                   error class
    402; 429 + insufficient_quota / billing codes,
        or a spend / credit / usage-limit message         QuotaExhausted
    400 + "credit balance is too low" (Anthropic)         QuotaExhausted
    other 429                                             RateLimited (hint from the headers)
    503, 529                                              Overloaded
    other 5xx, 409                                        ServerError
    408; a transport's TimeoutError (connect, a free
        connection, no answer data in time)              RequestTimeout
    a transport's ConnectionError or other OSError
        (refused, reset, closed mid-answer, an answer
        that is not HTTP)                                 ConnectionFailed
    401, 403                                              AuthFailed
    other 4xx (400, 404, 413, 422, ...)                   Rejected
    2xx whose body is not the provider's format           MalformedResponse (raised by the adapters)

Messages carry the provider name, the status and the provider's error type/code/message
(truncated, with anything that looks like a key redacted) — never request headers. Callers
raise the mapped error outside their `except` block, so nothing chains back to a transport
exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    Overloaded,
    ProviderError,
    QuotaExhausted,
    RateLimited,
    RateLimitHint,
    Rejected,
    RequestTimeout,
    ServerError,
)
from consumer.providers.ratelimit import parse_rate_limit_headers

#: longest provider message copied into our error messages
MAX_MESSAGE_CHARS = 300

#: OpenAI error codes/types that mean "no money left", not "too fast"
QUOTA_CODES = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "access_terminated"}
)
#: OpenAI's quota text; Anthropic's spend-limit / credit-balance / usage-limit texts
_QUOTA_MESSAGE = re.compile(
    r"exceeded your current quota|credit balance|spend(?:ing)? limit|usage limit",
    re.IGNORECASE,
)
#: things shaped like API keys that a provider might echo back (OpenAI's 401 shows a masked key)
_KEYLIKE = re.compile(r"\b(?:sk|pk|key|api)[-_][A-Za-z0-9_\-*.]{4,}")


def redact(text: str, secret: str | None = None) -> str:
    """Remove `secret` and anything key-shaped from `text`."""
    if secret:
        text = text.replace(secret, "[redacted]")
    return _KEYLIKE.sub("[redacted]", text)


def _truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_details(body: Any) -> tuple[str | None, str | None, str]:
    """(type, code, message) from any provider's error body.

    Understands OpenAI `{"error": {type, code, message}}`, Anthropic
    `{"type": "error", "error": {type, message}}`, vLLM `{"object": "error", type, code, message}`,
    TGI `{"error": "...", "error_type": "..."}` and plain text.
    """
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        return None, None, body
    if not isinstance(body, Mapping):
        return None, None, ""
    err = body.get("error")
    if isinstance(err, Mapping):
        etype, code, message = err.get("type"), err.get("code"), err.get("message")
    elif isinstance(err, str):
        etype, code, message = body.get("error_type") or body.get("type"), body.get("code"), err
    else:
        etype, code, message = body.get("type"), body.get("code"), body.get("message") or body.get("detail")
    if etype == "error":  # Anthropic's envelope type, not the error's
        etype = None
    return (
        str(etype) if etype is not None else None,
        str(code) if code is not None else None,
        str(message) if message is not None else "",
    )


def is_quota_error(status_code: int, etype: str | None, code: str | None, message: str) -> bool:
    """True when the provider says the account is out of money/quota (not just too fast)."""
    if status_code == 402:  # Payment Required
        return True
    if status_code == 429:
        return etype in QUOTA_CODES or code in QUOTA_CODES or bool(_QUOTA_MESSAGE.search(message))
    # Anthropic answers a prepaid account without credit with 400 "credit balance is too low"
    return status_code == 400 and "credit balance" in message.lower()


def error_for_status(
    provider: str,
    status_code: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
    *,
    now_s: float,
    secret: str | None = None,
) -> ProviderError:
    """A non-2xx answer -> the error to raise. Pure: `now_s` is the wall clock (for HTTP-dates)."""
    etype, code, raw_message = error_details(body)
    described = "/".join(x for x in (etype, code) if x)
    text = _truncate(redact(raw_message, secret))
    message = (
        f"{provider} HTTP {status_code}"
        + (f" {described}" if described else "")
        + (f": {text}" if text else "")
    )
    hint = parse_rate_limit_headers(headers, now_s=now_s) if headers else RateLimitHint()
    kw: dict[str, Any] = {"status_code": status_code, "provider": provider, "hint": hint}
    cls: type[ProviderError]
    if is_quota_error(status_code, etype, code, raw_message):
        cls = QuotaExhausted
    elif status_code == 429:
        cls = RateLimited
    elif status_code in (503, 529):
        cls = Overloaded
    elif status_code >= 500 or status_code == 409:
        # 409 Conflict (OpenAI: a lock timeout) is transient; DESIGN.md keeps it out of provider_rejected
        cls = ServerError
    elif status_code == 408:
        cls = RequestTimeout
    elif status_code in (401, 403):
        cls = AuthFailed
    else:
        cls = Rejected
    return cls(message, **kw)


def error_for_exception(provider: str, exc: BaseException, *, secret: str | None = None) -> ProviderError:
    """A transport failure (TimeoutError, ConnectionError or another OSError) -> RequestTimeout
    or ConnectionFailed. The message is the exception's text only (redacted, truncated): never
    a header, never a key."""
    detail = _truncate(redact(str(exc) or type(exc).__name__, secret))
    if isinstance(exc, TimeoutError):
        return RequestTimeout(f"{provider}: timed out ({type(exc).__name__}): {detail}", provider=provider)
    return ConnectionFailed(f"{provider}: {type(exc).__name__}: {detail}", provider=provider)
