"""Fuzz target `ratelimit`: `ratelimit.parse_rate_limit_headers` and its value parsers.

Contract (`consumer.providers.ratelimit` module doc): never raises (a hint is advice, never
a reason to fail a call). Waits and resets are None or finite seconds in [0, MAX_HINT_S];
limits and remainders are None or ints. Header values are any str aiohttp hands over (it
decodes bytes that are not UTF-8 to lone surrogates).
"""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from consumer.core.errors import RateLimitHint
from consumer.providers.ratelimit import (
    MAX_HINT_S,
    parse_duration_s,
    parse_rate_limit_headers,
    parse_retry_after_s,
    parse_rfc3339_delay_s,
)
from tests.fuzz._harness import awkward, fuzz_settings, mutated, run_budget, text_of

NOW_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z
WAITS = ("retry_after_s", "reset_requests_s", "reset_tokens_s")
COUNTS = ("remaining_requests", "remaining_tokens", "limit_requests", "limit_tokens")
#: every header name the parser reads
NAMES = (
    "retry-after-ms",
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
)


def _wait_ok(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= MAX_HINT_S)


def check_headers(headers: dict[str, str], now_s: float = NOW_S) -> RateLimitHint:
    """The hint of `headers`, checked against the contract (each value parser checked too)."""
    hint = parse_rate_limit_headers(headers, now_s=now_s)
    assert isinstance(hint, RateLimitHint)
    for name in WAITS:
        assert _wait_ok(getattr(hint, name)), name
    for name in COUNTS:
        value = getattr(hint, name)
        assert value is None or isinstance(value, int), name
    for value in headers.values():
        check_value(value, now_s)
    return hint


def check_value(value: str, now_s: float = NOW_S) -> None:
    """Each value parser on one header value."""
    assert _wait_ok(parse_duration_s(value))
    assert _wait_ok(parse_retry_after_s(value, now_s=now_s))
    assert _wait_ok(parse_rfc3339_delay_s(value, now_s=now_s))


def fuzz_one(data: bytes) -> None:
    """First byte: which header; the rest: its value (invalid UTF-8 as aiohttp decodes it)."""
    if data:
        check_headers({NAMES[data[0] % len(NAMES)]: text_of(data[1:], errors="surrogateescape")})


#: values as OpenAI and Anthropic send them, and the forms RFC 9110 allows
SEED_HEADERS = {
    "retry-after-ms": "1500",
    "retry-after": "Wed, 21 Oct 2026 07:28:00 GMT",
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-reset-requests": "6m0s",
    "x-ratelimit-reset-tokens": "1h2m3.5s",
    "anthropic-ratelimit-tokens-remaining": "80000",
    "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:30Z",
    "anthropic-ratelimit-tokens-reset": "2026-01-01T00:01:00.5+00:00",
}
SEED_VALUES = [*SEED_HEADERS.values(), "2", "0.5", "20ms", "Sunday, 06-Nov-94 08:49:37 GMT", "inf", "nan"]
SEEDS = [bytes([NAMES.index(name)]) + value.encode() for name, value in SEED_HEADERS.items()]

values = st.one_of(mutated(SEED_VALUES, surrogates=True), awkward(surrogates=True, max_pieces=12))


@fuzz_settings
@given(data=st.binary(max_size=80))
@example(data=b"\x01 21 Oct 2026 07:" + b"9" * 83 + b"28:00 GOT")  # atheris: a minute past a C long
def _raw_bytes(data: bytes) -> None:
    fuzz_one(data)


@fuzz_settings
@given(headers=st.dictionaries(st.sampled_from(NAMES).map(str.title), values, max_size=6))
def _mutated_headers(headers: dict[str, str]) -> None:
    check_headers(headers)


@fuzz_settings
@given(value=values, now_s=st.one_of(st.just(NOW_S), st.floats(0, 1e10), st.floats()))
@example(value="Mon, 01 Jan 99999999999999999999 00:00:00 GMT", now_s=NOW_S)  # a year past C long
@example(value="9" * 400 + "h", now_s=NOW_S)
@example(value="0001-01-01T00:00:00+23:59", now_s=NOW_S)
def _values(value: str, now_s: float) -> None:
    check_value(value, now_s)


def test_raw_bytes() -> None:
    run_budget(_raw_bytes)


def test_mutated_headers() -> None:
    run_budget(_mutated_headers)


def test_values() -> None:
    run_budget(_values)


def test_seeds_are_realistic() -> None:
    """The seed headers give a full hint (mutations start from values the parser reads)."""
    hint = check_headers(SEED_HEADERS)
    assert hint.retry_after_s == 1.5 and hint.reset_requests_s == 360.0 and hint.remaining_tokens == 80000
