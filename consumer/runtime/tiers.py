"""A configured tier at run time: its provider, limiter, retry policy, window limits and stats."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from consumer.core.adaptive import AdaptivePackSize, AdaptiveSizes
from consumer.core.circuit import CircuitBreaker
from consumer.core.dedupe import DedupeTable
from consumer.core.embed import embed_limits, embed_pack_key, embed_window_limits
from consumer.core.fallback import FallbackRule, QuotaWatch, TierCondition
from consumer.core.limit import limit_for
from consumer.core.retry import RetryPolicy
from consumer.core.routing import ModePolicy
from consumer.core.tenants import DEFAULT_TENANT, TenantPolicies
from consumer.core.window import PackKey, WindowLimits
from consumer.providers.base import CompletionProvider
from consumer.runtime.evidence import RememberedEvidence
from consumer.runtime.limiter import AsyncLimiter
from consumer.runtime.quotas import FleetQuota
from consumer.runtime.stats import TierStats
from consumer.settings import BatchingConfig, TierConfig

#: distinct embed option sets whose window keys are kept for reuse
EMBED_KEYS_KEPT = 4096
#: providers that bill per token: batching saves the prompt prefix repeated per job
PER_TOKEN_PROVIDERS = frozenset({"openai", "anthropic"})


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
    sizes: AdaptiveSizes[PackKey]
    #: holds the tier's requests while its provider is down
    circuit: CircuitBreaker = field(default_factory=CircuitBreaker)
    #: identical deterministic requests in flight and answered recently (`dedupe: true`)
    dedupe: DedupeTable[Any, Any] | None = None
    #: the provider's quota, exhausted for a cool-down after it says so (`fallback.quota_exhausted`)
    quota: QuotaWatch = field(default_factory=QuotaWatch)
    #: the window limits of each adaptive size in use (one value per size, not one per job)
    _limits_by_size: dict[int, WindowLimits] = field(default_factory=dict, init=False, repr=False)
    #: the embed window key of each (job options, mode) seen
    _embed_keys: dict[tuple[str, str, str], PackKey] = field(default_factory=dict, init=False, repr=False)

    @cached_property
    def fallback(self) -> FallbackRule | None:
        """The tier that answers this one's jobs while it is down (`fallback:`), if any."""
        return self.config.fallback.rule() if self.config.fallback is not None else None

    @cached_property
    def modes(self) -> ModePolicy:
        """How this tier's jobs choose online or offline (`default_mode`, `mode: auto`)."""
        return self.config.mode_policy()

    def condition(self, now_s: float) -> TierCondition:
        """What the tier's own answers say now, for the fallback decision."""
        return TierCondition(
            self.circuit.open, self.circuit.outage_s(now_s), self.quota.exhausted(now_s)
        )

    @cached_property
    def embed_window_limits(self) -> WindowLimits | None:
        """The limits of this tier's embed windows (bounded by what one provider request
        takes); None when it does not window embed jobs (`batching.enabled` false, or a
        provider without embeddings): an embed job goes alone."""
        limits = embed_limits(self.config.provider)
        if not self.config.batching.enabled or limits is None:
            return None
        return embed_window_limits(self.window_limits, limits)

    def embed_window(
        self, options_key: str, options: dict[str, Any], mode: str, tenant: str = DEFAULT_TENANT
    ) -> tuple[PackKey, WindowLimits] | None:
        """The window an embed job of these options (`options_key`: the job's own, canonical;
        `options`: merged over this tier's) and of `tenant` waits in, and its limits; None: it
        goes alone. The key of each option set and tenant is made once."""
        limits = self.embed_window_limits
        if limits is None:
            return None
        key = self._embed_keys.get((options_key, mode, tenant))
        if key is None:
            key = embed_pack_key(self.name, options, mode, tenant)
            if len(self._embed_keys) < EMBED_KEYS_KEPT:
                self._embed_keys[(options_key, mode, tenant)] = key
        return key, limits

    def limits_for(self, key: PackKey, now_s: float) -> WindowLimits:
        """The window limits for a job routed to `key`'s window: max_items follows the key's
        adaptive batch size (asked once per job, as `AdaptivePackSize.size_at` wants)."""
        # a learnt request budget means the provider is paid in requests: batching saves them
        request_limited = bool(self.limiter.pacer.rate_per_s)
        size = self.sizes.size_at(key, now_s, request_limited=request_limited)
        if size == self.window_limits.max_items:
            return self.window_limits
        limits = self._limits_by_size.get(size)
        if limits is None:
            limits = self._limits_by_size[size] = replace(self.window_limits, max_items=size)
        return limits

    def refresh_gauges(self, now_s: float) -> None:
        """Copy the limiter's state into the tier's stats (read by snapshots and /metrics)."""
        limiter, stats = self.limiter, self.stats
        stats.limit = limiter.limit
        stats.inflight = limiter.inflight
        stats.paused_s = round(limiter.paused_for_s, 3)
        stats.budget_requests_per_s = round(limiter.pacer.rate_per_s or 0.0, 2)
        stats.budget_tokens_per_s = round(limiter.tokens.rate_per_s or 0.0, 1)
        stats.circuit_open = int(self.circuit.open)
        stats.outage_s = round(self.circuit.outage_s(now_s), 1)
        stats.circuit_opened = self.circuit.opened_count

    def current_batch_size(self) -> int:
        """The largest current adaptive size over this tier's keys (the trusted size before
        any job); also refreshes `stats.batch_size_reason`, which says why."""
        self.stats.batch_size_reason = self.sizes.explain()
        sizes = self.sizes.snapshot().values()
        return max(sizes, default=trusted_items(self.config.batching))

    @classmethod
    def build(
        cls,
        name: str,
        config: TierConfig,
        provider: CompletionProvider,
        stats: TierStats,
        remembered: RememberedEvidence | None = None,
        fleet_quota: FleetQuota | None = None,
        *,
        tenants: TenantPolicies | None = None,
    ) -> TierRuntime:
        """remembered: what earlier runs measured; each new batch key starts from it;
        fleet_quota: the quota the tier names (`quota:`), shared with every tier naming it;
        tenants: their weights share the limiter's slots within a lane (None: every tenant
        weighs 1)."""
        b, r = config.batching, config.retry

        def new_size(key: PackKey) -> AdaptivePackSize:
            tracker = adaptive_size_for(config)
            if remembered is not None:
                remembered.restore(name, config, key, tracker)
            return tracker

        return cls(
            name=name,
            config=config,
            provider=provider,
            limiter=AsyncLimiter(
                limit_for(config.limiter),
                quota=fleet_quota,
                weight_of=tenants.weight if tenants is not None else None,
            ),
            retry_policy=RetryPolicy.from_config(r),
            window_limits=WindowLimits.from_config(b),
            stats=stats,
            sizes=AdaptiveSizes(new_size),
            dedupe=DedupeTable(config.dedupe_window_s) if config.dedupe else None,
            circuit=CircuitBreaker(
                failures=r.circuit_failures, probe_s=r.circuit_probe_s, probe_max_s=r.circuit_probe_max_s
            ),
        )


def trusted_items(batching: BatchingConfig) -> int:
    """The batch size a tier's configuration vouches for without measurement: initial_items,
    else max_items when agreement is not measured (verify_fraction 0), else 1."""
    if batching.initial_items is not None:
        return batching.initial_items
    return batching.max_items if batching.verify_fraction == 0 else 1


def adaptive_size_for(config: TierConfig) -> AdaptivePackSize:
    """A new key's adaptive batch size, from the tier's `batching` settings and provider."""
    b = config.batching
    per_token = b.charges == "tokens" or (b.charges == "auto" and config.provider in PER_TOKEN_PROVIDERS)
    return AdaptivePackSize(
        b.max_items,
        trusted=trusted_items(b),
        measure_agreement=b.verify_fraction > 0,
        min_agreement=b.min_agreement,
        confidence=b.agreement_confidence,
        probe_fraction=b.probe_fraction,
        per_token=per_token,
    )
