"""A configured tier at run time: its provider, limiter, retry policy, window limits and stats."""

from __future__ import annotations

from dataclasses import dataclass, replace

from consumer.core.adaptive import AdaptiveBatchSize, AdaptiveSizes
from consumer.core.limit import limit_for
from consumer.core.retry import RetryPolicy
from consumer.core.window import BatchKey, WindowLimits
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
    #: the adaptive batch size of each batch key of this tier
    sizes: AdaptiveSizes[BatchKey]

    def limits_for(self, key: BatchKey, now_s: float) -> WindowLimits:
        """The window limits for a key: max_items follows the key's adaptive batch size."""
        size = self.sizes.size_at(key, now_s)
        if size == self.window_limits.max_items:
            return self.window_limits
        return replace(self.window_limits, max_items=size)

    def current_batch_size(self) -> int:
        """The largest current adaptive size over this tier's keys (max_items before any answer)."""
        sizes = self.sizes.snapshot().values()
        return max(sizes, default=self.config.batching.initial_items or self.config.batching.max_items)

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
            sizes=AdaptiveSizes(
                lambda _key: AdaptiveBatchSize(
                    b.initial_items or b.max_items, b.max_items, min_agreement=b.min_agreement
                )
            ),
        )
