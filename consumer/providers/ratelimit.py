"""Rate-limit headers -> `RateLimitHint`: pure functions of the headers and `now_s`.

Understood headers (names are case-insensitive):

    retry-after-ms                          milliseconds (OpenAI); wins over retry-after
    retry-after                             seconds ("2", "0.5") or an HTTP-date
    x-ratelimit-limit-requests/-tokens      OpenAI, integers
    x-ratelimit-remaining-requests/-tokens  OpenAI, integers
    x-ratelimit-reset-requests/-tokens      OpenAI, Go-style durations: "1s", "6m0s", "20ms", "1h2m3.5s"
    anthropic-ratelimit-requests-limit      Anthropic, integers
    anthropic-ratelimit-tokens-limit        (falls back to -input-tokens-limit)
    anthropic-ratelimit-requests-remaining  Anthropic, integers
    anthropic-ratelimit-tokens-remaining    (falls back to -input-tokens-remaining)
    anthropic-ratelimit-requests-reset      Anthropic, RFC 3339 timestamps
    anthropic-ratelimit-tokens-reset        (falls back to -input-tokens-reset)

Unparseable values are ignored (a hint is advice, never a reason to fail a call), and so are
non-finite numbers ("inf", "nan"); waits and resets are clamped to `MAX_HINT_S`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from consumer.core.errors import RateLimitHint

#: the longest wait or reset a hint may announce: a day (daily quotas reset within one). A
#: larger value is taken as a day, so a broken header cannot hold a tier back for ever.
MAX_HINT_S = 86_400.0

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _seconds(value: float) -> float | None:
    """A wait in seconds as a hint may give it: non-negative, at most MAX_HINT_S; None: NaN."""
    if math.isnan(value):
        return None
    return min(max(0.0, value), MAX_HINT_S)


def _number(text: str) -> float | None:
    """`text` as a finite float; None when it is not a number or not finite."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _bare_seconds(value: str) -> tuple[str, float | None]:
    """The stripped header value, and its seconds when it is a bare number (both forms allow it)."""
    text = value.strip()
    number = _number(text) if text else None
    return text, (_seconds(number) if number is not None else None)


def parse_duration_s(value: str) -> float | None:
    """A Go-style duration ("6m0s", "20ms", "1.5s") or bare seconds ("2") -> seconds; None if unparseable."""
    text, bare = _bare_seconds(value)
    if bare is not None or not text:
        return bare
    pos = 0
    total_s = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total_s += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(text):
        return None
    return _seconds(total_s)


def parse_retry_after_s(value: str, *, now_s: float) -> float | None:
    """Retry-After: delta seconds or an HTTP-date (RFC 9110) -> seconds from `now_s` (>= 0)."""
    text, bare = _bare_seconds(value)
    if bare is not None or not text:
        return bare
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):  # Overflow: a year past a C long
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=UTC)
    return _seconds(when.timestamp() - now_s)


def parse_rfc3339_delay_s(value: str, *, now_s: float) -> float | None:
    """An RFC 3339 timestamp -> seconds from `now_s` until then (>= 0); None if unparseable."""
    text = value.strip()
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return _seconds(when.timestamp() - now_s)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    number = _number(value.strip())
    return int(number) if number is not None else None


def _first(headers: Mapping[str, str], names: Iterable[str]) -> str | None:
    for name in names:
        if name in headers:
            return headers[name]
    return None


def parse_rate_limit_headers(headers: Mapping[str, str], *, now_s: float) -> RateLimitHint:
    """Every rate-limit header we know (OpenAI, Anthropic, generic Retry-After) -> one hint.

    `now_s` is the current wall-clock time (epoch seconds), needed for HTTP-dates and RFC 3339
    reset times.
    """
    h = {k.lower(): v for k, v in headers.items()}

    retry_after_s: float | None = None
    if "retry-after-ms" in h:
        ms = parse_duration_s(h["retry-after-ms"])
        retry_after_s = ms / 1000.0 if ms is not None else None
    if retry_after_s is None and "retry-after" in h:
        retry_after_s = parse_retry_after_s(h["retry-after"], now_s=now_s)

    remaining_requests = _int(
        _first(h, ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"))
    )
    remaining_tokens = _int(
        _first(
            h,
            (
                "x-ratelimit-remaining-tokens",
                "anthropic-ratelimit-tokens-remaining",
                "anthropic-ratelimit-input-tokens-remaining",
            ),
        )
    )

    limit_requests = _int(_first(h, ("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit")))
    limit_tokens = _int(
        _first(
            h,
            (
                "x-ratelimit-limit-tokens",
                "anthropic-ratelimit-tokens-limit",
                "anthropic-ratelimit-input-tokens-limit",
            ),
        )
    )

    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None
    if "x-ratelimit-reset-requests" in h:
        reset_requests_s = parse_duration_s(h["x-ratelimit-reset-requests"])
    elif "anthropic-ratelimit-requests-reset" in h:
        reset_requests_s = parse_rfc3339_delay_s(h["anthropic-ratelimit-requests-reset"], now_s=now_s)
    if "x-ratelimit-reset-tokens" in h:
        reset_tokens_s = parse_duration_s(h["x-ratelimit-reset-tokens"])
    else:
        raw = _first(h, ("anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-input-tokens-reset"))
        if raw is not None:
            reset_tokens_s = parse_rfc3339_delay_s(raw, now_s=now_s)

    return RateLimitHint(
        retry_after_s=retry_after_s,
        remaining_requests=remaining_requests,
        remaining_tokens=remaining_tokens,
        reset_requests_s=reset_requests_s,
        reset_tokens_s=reset_tokens_s,
        limit_requests=limit_requests,
        limit_tokens=limit_tokens,
    )


def format_duration(seconds: float) -> str:
    """Seconds -> an OpenAI-style duration ("20ms", "1s", "6m0s"); the simulator sends these."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, secs = divmod(seconds, 60.0)
    if minutes < 1:
        return f"{secs:g}s"
    hours, minutes = divmod(int(minutes), 60)
    prefix = f"{hours}h" if hours else ""
    return f"{prefix}{minutes}m{round(secs, 3):g}s"
