"""Retry decisions: how long to wait before trying again, and which dead-letter kind ends a job.

Pure functions of our own error classes (`consumer.core.errors`) and an injected rng, in
the spirit of openai-python's `_calculate_retry_timeout`:

1. the provider said when (`Retry-After` / `retry-after-ms`) -> that, capped;
2. else a rate-limit budget is empty and says when it refills -> that, capped;
3. else capped exponential backoff with jitter:
   ``min(backoff_max_s, backoff_initial_s * 2 ** (attempt - 1)) * (1 - JITTER_FRACTION * u)``
   with ``u`` uniform in [0, 1) ("equal jitter": never less than half the base delay, so
   retries spread out but still back off).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from consumer.core.errors import (
    AuthFailed,
    ErrorKind,
    JobError,
    ProviderError,
    QuotaExhausted,
    RateLimitHint,
    Rejected,
)

__all__ = [
    "JITTER_FRACTION",
    "MAX_HINTED_DELAY_S",
    "RetryPolicy",
    "backoff_s",
    "error_kind_for",
    "retry_delay_s",
]

#: Backoff delays are reduced by up to this fraction at random.
JITTER_FRACTION = 0.5
#: A provider hint longer than this is not trusted as is (a misread HTTP date, a daily quota).
MAX_HINTED_DELAY_S = 600.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A tier's retry settings (`TierConfig.retry`).

    max_attempts: provider requests per request (the first one included).
    quota_cooldown_s: how long the tier pauses when the provider says the quota is spent.
    quota_max_wait_s: after this much pausing for one request, its members fail
        `quota_exhausted`.
    """

    max_attempts: int = 5
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    quota_cooldown_s: float = 60.0
    quota_max_wait_s: float = 600.0

    @classmethod
    def from_config(cls, retry: Any) -> RetryPolicy:
        """The policy of a tier's `consumer.settings.RetryConfig` (or anything with the same
        fields): the one place a RetryPolicy is built from settings. Every field of the policy
        is read, so a field added here must exist in the settings too."""
        return cls(**{f.name: getattr(retry, f.name) for f in fields(cls)})


def _hinted_delay_s(hint: RateLimitHint) -> float | None:
    if hint.retry_after_s is not None and hint.retry_after_s >= 0:
        return min(hint.retry_after_s, MAX_HINTED_DELAY_S)
    resets = []
    # A reset time matters only for a budget that is spent (or whose remainder is unknown).
    if hint.reset_requests_s is not None and hint.remaining_requests in (None, 0):
        resets.append(hint.reset_requests_s)
    if hint.reset_tokens_s is not None and hint.remaining_tokens in (None, 0):
        resets.append(hint.reset_tokens_s)
    resets = [r for r in resets if r >= 0]
    if resets:
        return min(max(resets), MAX_HINTED_DELAY_S)
    return None


def backoff_s(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Capped exponential backoff with equal jitter after failed attempt number `attempt` (1-based)."""
    exponent = max(0, attempt - 1)
    # 2**exponent overflows floats only for absurd attempts; cap the exponent first.
    base_s = min(policy.backoff_max_s, policy.backoff_initial_s * 2.0 ** min(exponent, 60))
    return base_s * (1.0 - JITTER_FRACTION * rng.random())


def retry_delay_s(attempt: int, hint: RateLimitHint | None, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before retrying after failed attempt number `attempt` (1-based)."""
    if hint is not None:
        hinted = _hinted_delay_s(hint)
        if hinted is not None:
            return hinted
    return backoff_s(attempt, policy, rng)


def error_kind_for(error: ProviderError | JobError) -> ErrorKind:
    """The dead-letter kind for a job that ends with `error`.

    Retryable provider errors end as `retries_exhausted` (they are only final once the
    attempts are used up); permanent ones name their cause.
    """
    if isinstance(error, JobError):
        return error.kind
    if isinstance(error, AuthFailed):
        return ErrorKind.AUTH_FAILED
    if isinstance(error, QuotaExhausted):
        return ErrorKind.QUOTA_EXHAUSTED
    if isinstance(error, Rejected) or not error.retryable:
        return ErrorKind.PROVIDER_REJECTED
    return ErrorKind.RETRIES_EXHAUSTED
