"""A configured tier at run time: its provider, limiter, retry policy, window limits and stats."""

from __future__ import annotations

from dataclasses import dataclass

from consumer.core.limit import limit_for
from consumer.core.retry import RetryPolicy
from consumer.core.window import WindowLimits
from consumer.providers.base import CompletionProvider
from consumer.runtime.limiter import AsyncLimiter
from consumer.runtime.stats import TierStats
from consumer.settings import TierConfig


@dataclass
class TierRuntime:
    name: str
    config: TierConfig
    provider: CompletionProvider
    limiter: AsyncLimiter
    retry_policy: RetryPolicy
    window_limits: WindowLimits
    stats: TierStats

    @classmethod
    def build(
        cls, name: str, config: TierConfig, provider: CompletionProvider, stats: TierStats
    ) -> TierRuntime:
        b, r = config.batching, config.retry
        return cls(
            name=name,
            config=config,
            provider=provider,
            limiter=AsyncLimiter(limit_for(config.limiter)),
            retry_policy=RetryPolicy(
                max_attempts=r.max_attempts,
                backoff_initial_s=r.backoff_initial_s,
                backoff_max_s=r.backoff_max_s,
                quota_cooldown_s=r.quota_cooldown_s,
                quota_max_wait_s=r.quota_max_wait_s,
            ),
            window_limits=WindowLimits.from_config(b),
            stats=stats,
        )
