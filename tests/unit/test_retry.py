"""Retry delays from provider hints or jittered backoff; error -> dead-letter kind."""

from __future__ import annotations

import random

import pytest

from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    ErrorKind,
    JobError,
    MalformedResponse,
    Overloaded,
    ProviderError,
    QuotaExhausted,
    RateLimited,
    RateLimitHint,
    Rejected,
    RequestTimeout,
    ServerError,
)
from consumer.core.retry import (
    JITTER_FRACTION,
    MAX_HINTED_DELAY_S,
    RetryPolicy,
    backoff_s,
    error_kind_for,
    retry_delay_s,
)

POLICY = RetryPolicy(max_attempts=5, backoff_initial_s=0.5, backoff_max_s=8.0)


def test_retry_after_comes_first() -> None:
    hint = RateLimitHint(retry_after_s=3.5, remaining_requests=0, reset_requests_s=20)
    assert retry_delay_s(1, hint, POLICY, random.Random(0)) == 3.5
    assert retry_delay_s(1, RateLimitHint(retry_after_s=0), POLICY, random.Random(0)) == 0


def test_reset_hints_when_a_budget_is_spent() -> None:
    spent_tokens = RateLimitHint(
        remaining_requests=10, reset_requests_s=1, remaining_tokens=0, reset_tokens_s=6
    )
    assert retry_delay_s(1, spent_tokens, POLICY, random.Random(0)) == 6
    both = RateLimitHint(remaining_requests=0, reset_requests_s=2, remaining_tokens=0, reset_tokens_s=6)
    assert retry_delay_s(1, both, POLICY, random.Random(0)) == 6
    unknown_remaining = RateLimitHint(reset_requests_s=4)
    assert retry_delay_s(1, unknown_remaining, POLICY, random.Random(0)) == 4


def test_reset_of_a_budget_with_room_is_ignored() -> None:
    hint = RateLimitHint(remaining_requests=5, reset_requests_s=30)
    delay = retry_delay_s(1, hint, POLICY, random.Random(0))
    assert 0.25 <= delay <= 0.5


def test_hints_are_capped() -> None:
    rng = random.Random()
    assert retry_delay_s(1, RateLimitHint(retry_after_s=86_400), POLICY, rng) == MAX_HINTED_DELAY_S
    assert retry_delay_s(1, RateLimitHint(reset_tokens_s=86_400), POLICY, rng) == MAX_HINTED_DELAY_S


def test_backoff_grows_exponentially_with_equal_jitter_and_a_cap() -> None:
    rng = random.Random(42)
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 8.0), (500, 8.0)]:
        for _ in range(50):
            delay = retry_delay_s(attempt, None, POLICY, rng)
            assert base * (1 - JITTER_FRACTION) <= delay <= base
    # jitter actually spreads the delays
    assert len({round(backoff_s(3, POLICY, rng), 6) for _ in range(20)}) > 10


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    assert [backoff_s(a, POLICY, random.Random(1)) for a in (1, 2, 3)] == [
        backoff_s(a, POLICY, random.Random(1)) for a in (1, 2, 3)
    ]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (AuthFailed("401"), ErrorKind.AUTH_FAILED),
        (QuotaExhausted("q"), ErrorKind.QUOTA_EXHAUSTED),
        (Rejected("400"), ErrorKind.PROVIDER_REJECTED),
        (ProviderError("odd, permanent"), ErrorKind.PROVIDER_REJECTED),
        (RateLimited("429"), ErrorKind.RETRIES_EXHAUSTED),
        (Overloaded("529"), ErrorKind.RETRIES_EXHAUSTED),
        (ServerError("500"), ErrorKind.RETRIES_EXHAUSTED),
        (RequestTimeout("408"), ErrorKind.RETRIES_EXHAUSTED),
        (ConnectionFailed("reset"), ErrorKind.RETRIES_EXHAUSTED),
        (MalformedResponse("bad"), ErrorKind.RETRIES_EXHAUSTED),
        (JobError(ErrorKind.TEMPLATE_ERROR, "missing variable 'x'"), ErrorKind.TEMPLATE_ERROR),
    ],
)
def test_error_kind_for(error: ProviderError | JobError, kind: ErrorKind) -> None:
    assert error_kind_for(error) is kind


def test_policy_from_config() -> None:
    from consumer.settings import RetryConfig

    policy = RetryPolicy.from_config(RetryConfig(max_attempts=2, backoff_initial_s=1, quota_cooldown_s=5))
    assert policy == RetryPolicy(max_attempts=2, backoff_initial_s=1, backoff_max_s=30, quota_cooldown_s=5,
                                 quota_max_wait_s=600)


def test_policy_fields_are_retry_settings() -> None:
    """`from_config` is the one builder and reads every policy field from the settings."""
    from dataclasses import fields

    from consumer.settings import RetryConfig

    assert {f.name for f in fields(RetryPolicy)} <= set(RetryConfig.model_fields)
