"""The simulator's rate limits are token buckets with the providers' header semantics.

Called in-process (`SimulatorApp._rate_headers(kind, now_s, tokens)`), no HTTP: the
monotonic time is passed in, so every figure is exact.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from consumer.providers.ratelimit import parse_duration_s, parse_rate_limit_headers
from consumer.testing.simulator import SimulatorApp, SimulatorConfig


def test_the_request_bucket_starts_full_and_refills_continuously() -> None:
    app = SimulatorApp(SimulatorConfig(rpm=10, rate_window_s=1.0))
    for i in range(10):
        headers, wait_s = app._rate_headers("openai", 100.0, 5)
        assert wait_s is None
        assert headers["x-ratelimit-limit-requests"] == "10"
        assert headers["x-ratelimit-remaining-requests"] == str(9 - i), "remaining after this request"
        # reset: until the bucket is full again, 100 ms per request taken
        assert parse_duration_s(headers["x-ratelimit-reset-requests"]) == pytest.approx(0.1 * (i + 1))
    headers, wait_s = app._rate_headers("openai", 100.0, 5)
    assert wait_s == pytest.approx(0.1), "one request fits after 1/rate"
    assert headers["retry-after-ms"] == "100" and headers["retry-after"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # a refused request is not counted: 40 ms later, 60 ms to go
    _, wait_s = app._rate_headers("openai", 100.04, 5)
    assert wait_s == pytest.approx(0.06)
    headers, wait_s = app._rate_headers("openai", 100.1, 5)
    assert wait_s is None and headers["x-ratelimit-remaining-requests"] == "0"
    # 0.55 s later: 5.5 requests back, one taken: 4.5 left (4 announced), 0.55 s to full
    headers, wait_s = app._rate_headers("openai", 100.65, 5)
    assert wait_s is None
    assert headers["x-ratelimit-remaining-requests"] == "4"
    assert parse_duration_s(headers["x-ratelimit-reset-requests"]) == pytest.approx(0.55)


def test_the_token_bucket_refuses_what_does_not_fit() -> None:
    app = SimulatorApp(SimulatorConfig(tpm=100, rate_window_s=10.0))  # 10 tokens/s
    for _ in range(3):
        assert app._rate_headers("openai", 0.0, 30)[1] is None
    headers, wait_s = app._rate_headers("openai", 0.0, 30)
    assert wait_s == pytest.approx(2.0), "10 left, 20 more needed at 10/s"
    assert headers["x-ratelimit-remaining-tokens"] == "10"
    assert parse_duration_s(headers["x-ratelimit-reset-tokens"]) == pytest.approx(9.0)
    assert app.limited_by == "tokens"
    # larger than the whole limit: never fits; told the time until the bucket is full
    _, wait_s = app._rate_headers("openai", 0.0, 500)
    assert wait_s == pytest.approx(9.0)


def test_anthropic_headers_carry_the_full_time_as_rfc3339() -> None:
    app = SimulatorApp(SimulatorConfig(rpm=60, rate_window_s=60.0))  # 1 request/s
    for _ in range(60):
        headers, _ = app._rate_headers("anthropic", 5.0, 1)
    assert headers["anthropic-ratelimit-requests-limit"] == "60"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset_at = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00"))
    hint = parse_rate_limit_headers(headers, now_s=reset_at.timestamp() - 60.0)
    assert hint.remaining_requests == 0 and hint.reset_requests_s == pytest.approx(60.0)
    headers, wait_s = app._rate_headers("anthropic", 5.0, 1)
    assert wait_s == pytest.approx(1.0)
    assert headers["retry-after"] == "1" and "retry-after-ms" not in headers


def test_no_limits_no_headers() -> None:
    app = SimulatorApp(SimulatorConfig())
    assert app._rate_headers("openai", 0.0, 10) == ({}, None)
