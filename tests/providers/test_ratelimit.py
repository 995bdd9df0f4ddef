"""Rate-limit header parsing: pure functions of headers and now_s."""

from __future__ import annotations

from email.utils import formatdate

import pytest
from multidict import CIMultiDict

from consumer.providers.ratelimit import (
    MAX_HINT_S,
    format_duration,
    parse_duration_s,
    parse_rate_limit_headers,
    parse_retry_after_s,
    parse_rfc3339_delay_s,
)

NOW_S = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5s", 0.5),
        ("2", 2.0),
        ("1.5", 1.5),
        ("250us", 0.00025),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "s1", "1s junk"])
def test_bad_durations_are_none(text: str) -> None:
    assert parse_duration_s(text) is None


def test_format_duration_round_trips() -> None:
    for seconds in (0.02, 0.5, 1.0, 59.0, 360.0, 3723.5):
        assert parse_duration_s(format_duration(seconds)) == pytest.approx(seconds, abs=1e-3)


def test_retry_after_seconds_and_http_date() -> None:
    assert parse_retry_after_s("7", now_s=NOW_S) == 7.0
    date = formatdate(NOW_S + 30, usegmt=True)
    assert parse_retry_after_s(date, now_s=NOW_S) == pytest.approx(30.0)
    # a date in the past means "now", never a negative wait
    assert parse_retry_after_s(formatdate(NOW_S - 100, usegmt=True), now_s=NOW_S) == 0.0
    assert parse_retry_after_s("not a date", now_s=NOW_S) is None


def test_rfc3339() -> None:
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(NOW_S + 12.5, UTC).isoformat().replace("+00:00", "Z")
    assert parse_rfc3339_delay_s(when, now_s=NOW_S) == pytest.approx(12.5)
    assert parse_rfc3339_delay_s("2020-01-01T00:00:00", now_s=NOW_S) is None  # no zone: ignored
    assert parse_rfc3339_delay_s("garbage", now_s=NOW_S) is None


def test_retry_after_ms_wins() -> None:
    hint = parse_rate_limit_headers({"Retry-After": "5", "retry-after-ms": "1500"}, now_s=NOW_S)
    assert hint.retry_after_s == pytest.approx(1.5)


def test_openai_headers() -> None:
    headers = CIMultiDict(  # aiohttp's header type; names in any case
        {
            "X-RateLimit-Limit-Requests": "60",
            "x-ratelimit-limit-tokens": "150000",
            "X-RateLimit-Remaining-Requests": "59",
            "x-ratelimit-remaining-tokens": "149000",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "6m0s",
            "retry-after": "2",
        }
    )
    hint = parse_rate_limit_headers(headers, now_s=NOW_S)
    assert hint.retry_after_s == 2.0
    assert hint.remaining_requests == 59
    assert hint.remaining_tokens == 149000
    assert hint.reset_requests_s == 1.0
    assert hint.reset_tokens_s == 360.0
    assert (hint.limit_requests, hint.limit_tokens) == (60, 150000)


def test_anthropic_headers() -> None:
    from datetime import UTC, datetime

    def at(offset_s: float) -> str:
        return datetime.fromtimestamp(NOW_S + offset_s, UTC).isoformat().replace("+00:00", "Z")

    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-requests-remaining": "3",
        "anthropic-ratelimit-requests-reset": at(4),
        "anthropic-ratelimit-input-tokens-remaining": "1000",
        "anthropic-ratelimit-input-tokens-reset": at(9),
        "retry-after": formatdate(NOW_S + 4, usegmt=True),
    }
    hint = parse_rate_limit_headers(headers, now_s=NOW_S)
    assert hint.remaining_requests == 3
    assert hint.remaining_tokens == 1000
    assert hint.reset_requests_s == pytest.approx(4.0)
    assert hint.reset_tokens_s == pytest.approx(9.0)
    assert hint.retry_after_s == pytest.approx(4.0)
    assert (hint.limit_requests, hint.limit_tokens) == (50, 40000)


def test_garbage_is_ignored() -> None:
    hint = parse_rate_limit_headers(
        {"retry-after": "later", "x-ratelimit-remaining-requests": "many", "x-ratelimit-reset-tokens": "?"},
        now_s=NOW_S,
    )
    assert hint.retry_after_s is None
    assert hint.remaining_requests is None
    assert hint.reset_tokens_s is None


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e400", "9" * 400])
def test_numbers_that_are_not_finite_are_ignored(text: str) -> None:
    # int(float("inf")) raised OverflowError out of the parser, failing a good 2xx answer
    headers = {
        "retry-after": text,
        "x-ratelimit-remaining-requests": text,
        "x-ratelimit-limit-tokens": text,
        "x-ratelimit-reset-requests": text,
    }
    hint = parse_rate_limit_headers(headers, now_s=NOW_S)
    assert hint.retry_after_s is None
    assert hint.remaining_requests is None and hint.limit_tokens is None
    assert hint.reset_requests_s is None
    assert parse_rate_limit_headers({"retry-after-ms": text}, now_s=NOW_S).retry_after_s is None


def test_waits_and_resets_are_clamped_to_a_day() -> None:
    far = formatdate(NOW_S + 10 * MAX_HINT_S, usegmt=True)
    hint = parse_rate_limit_headers(
        {
            "retry-after": far,
            "x-ratelimit-reset-requests": "1e308",
            "anthropic-ratelimit-tokens-reset": "9999-12-31T23:59:59Z",
        },
        now_s=NOW_S,
    )
    assert hint.retry_after_s == hint.reset_requests_s == hint.reset_tokens_s == MAX_HINT_S
    assert parse_duration_s("100000h") == MAX_HINT_S
    assert parse_retry_after_s("5", now_s=NOW_S) == 5.0
