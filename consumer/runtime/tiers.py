"""A configured tier at run time: its provider, limiter, retry policy, window limits and stats."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from consumer.core.adaptive import AdaptivePackSize, AdaptiveSizes
from consumer.core.circuit import Admit, CircuitBreaker
from consumer.core.dedupe import DedupeTable
from consumer.core.deployments import DEFAULT_DEPLOYMENT
from consumer.core.embed import embed_limits, embed_pack_key, embed_window_limits
from consumer.core.fallback import FallbackRule, QuotaWatch, TierCondition
from consumer.core.limit import limit_for
from consumer.core.retry import RetryPolicy
from consumer.core.routing import ModePolicy
from consumer.core.tenants import DEFAULT_TENANT, TenantPolicies
from consumer.core.window import PackKey, WindowLimits
from consumer.providers.base import CompletionProvider
from consumer.runtime.deployments import Deployment
from consumer.runtime.evidence import RememberedEvidence
from consumer.runtime.limiter import AsyncLimiter, Gate
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
    #: the endpoints serving the tier, each request sent through one (`consumer.runtime.deployments`);
    #: empty at construction: the tier's own provider, limiter, circuit and quota are its one
    deployments: tuple[Deployment, ...] = ()
    #: the window limits of each adaptive size in use (one value per size, not one per job)
    _limits_by_size: dict[int, WindowLimits] = field(default_factory=dict, init=False, repr=False)
    #: set (and replaced) whenever a deployment's circuit changes: held requests look again
    _circuit_changed: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        self.stats.size_reason = self.sizes.explain
        if not self.deployments:
            gate = self.limiter.gates[0]
            own = Deployment(
                None, self.config, self.provider, gate, self.circuit, self.quota,
                self.stats.deployment(DEFAULT_DEPLOYMENT),
            )
            self.deployments = (own,)

    @property
    def circuit_change(self) -> asyncio.Event:
        """Set when a deployment's circuit changes next (a new event after each change)."""
        return self._circuit_changed

    def circuit_changed(self) -> None:
        """A deployment's circuit opened or closed, or its quota ran out: wake what waits on it
        (held requests, and the limiter's waiters, which may go to it now or must leave a
        deployment that is down)."""
        self._circuit_changed.set()
        self._circuit_changed = asyncio.Event()
        self.limiter.wake()

    def admit(self, now_s: float) -> tuple[Admit, float, Deployment | None]:
        """May a request of this tier go now? PROBE (it is the probe of the open circuit named,
        whose probe is due: one probed by requests, not by its listing, which is
        `CircuitProber`'s), SEND (some deployment is up: its circuit closed and its quota not
        exhausted), or WAIT (with how long until a probe could go or a quota's cool-down ends)."""
        up = False
        wait_s = float("inf")
        for deployment in self.deployments:
            circuit = deployment.circuit
            if not circuit.open:
                if deployment.quota.exhausted(now_s):  # out of quota: down until its cool-down ends
                    wait_s = min(wait_s, deployment.quota.left_s(now_s))
                else:
                    up = True
            elif not circuit.listing_probes and circuit.probe_due(now_s):
                circuit.admit(now_s)  # granted to this request
                return Admit.PROBE, 0.0, deployment
            else:
                wait_s = min(wait_s, circuit.probe_wait_s(now_s))
        if up:
            return Admit.SEND, 0.0, None
        return Admit.WAIT, max(wait_s, 0.01), None

    def any_up(self, now_s: float) -> bool:
        """True when some deployment can take a request (its circuit closed, its quota not
        exhausted)."""
        return any(not d.circuit.open and not d.quota.exhausted(now_s) for d in self.deployments)

    def job_probe_due(self, now_s: float) -> bool:
        """True when every deployment is down and one of them is to be probed by a request
        now (not by its listing): a new job may go as that probe."""
        return all(d.circuit.open for d in self.deployments) and any(
            not d.circuit.listing_probes and d.circuit.probe_due(now_s) for d in self.deployments
        )

    def outage_s(self, now_s: float) -> float:
        """How long every deployment has been down (0: some deployment's circuit is closed)."""
        return min(d.circuit.outage_s(now_s) for d in self.deployments)
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
        deployments = self.deployments
        if len(deployments) == 1:
            d = deployments[0]
            return TierCondition(d.circuit.open, d.circuit.outage_s(now_s), d.quota.exhausted(now_s))
        # the tier is in trouble only when every deployment is: each down or out of quota
        opened = [d.circuit.open for d in deployments]
        exhausted = [d.quota.exhausted(now_s) for d in deployments]
        if not all(o or e for o, e in zip(opened, exhausted, strict=True)):
            return TierCondition()
        outage_s = min((d.circuit.outage_s(now_s) for d in deployments if d.circuit.open), default=0.0)
        return TierCondition(any(opened) and not any(exhausted), outage_s, any(exhausted))

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
        size = self.sizes.size_at(key, now_s, request_limited=self.limiter.request_limited)
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
        stats.circuit_open = int(all(d.circuit.open for d in self.deployments))
        stats.outage_s = round(self.outage_s(now_s), 1)
        stats.circuit_opened = sum(d.circuit.opened_count for d in self.deployments)
        reasons = limiter.limit_reasons()
        # the tier's: what holds most of its deployments (the first of them on a tie)
        stats.limit_reason = max(reasons, key=reasons.count)
        for deployment, reason in zip(self.deployments, reasons, strict=True):
            deployment.refresh_gauges(reason)

    def current_batch_size(self) -> int:
        """The largest current adaptive size over this tier's keys (the trusted size before
        any job); `stats.size_reason` says why."""
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
        deployments: Sequence[tuple[CompletionProvider, FleetQuota | None]] | None = None,
        tenants: TenantPolicies | None = None,
    ) -> TierRuntime:
        """remembered: what earlier runs measured; each new batch key starts from it;
        fleet_quota: the quota the tier names (`quota:`), shared with every tier naming it;
        deployments: per entry of `config.deployment_configs`, its provider and fleet quota
        (None: `provider` and `fleet_quota` are the tier's own one deployment); tenants: their
        weights share the limiter's slots within a lane (None: every tenant weighs 1)."""
        b, r = config.batching, config.retry
        if deployments is None:
            deployments = [(provider, fleet_quota)]
        parts = []
        for (dep_name, _where, weight, dep_config), (dep_provider, dep_quota) in zip(
            config.deployment_configs(name), deployments, strict=True
        ):
            circuit = CircuitBreaker(
                failures=r.circuit_failures, probe_s=r.circuit_probe_s, probe_max_s=r.circuit_probe_max_s
            )
            watch = QuotaWatch()
            gate = Gate(
                limit_for(dep_config.limiter, dep_config.provider),
                quota=dep_quota,
                weight=weight,
                up=_up(circuit, watch),
            )
            label = dep_name if dep_name is not None else DEFAULT_DEPLOYMENT
            own_stats = stats.deployment(label)
            parts.append(Deployment(dep_name, dep_config, dep_provider, gate, circuit, watch, own_stats))

        def new_size(key: PackKey) -> AdaptivePackSize:
            tracker = adaptive_size_for(config)
            if remembered is not None:
                remembered.restore(name, config, key, tracker)
            return tracker

        return cls(
            name=name,
            config=config,
            provider=parts[0].provider,
            limiter=AsyncLimiter(
                gates=[d.gate for d in parts], weight_of=tenants.weight if tenants is not None else None
            ),
            retry_policy=RetryPolicy.from_config(r),
            window_limits=WindowLimits.from_config(b),
            stats=stats,
            sizes=AdaptiveSizes(new_size),
            dedupe=DedupeTable(config.dedupe_window_s) if config.dedupe else None,
            circuit=parts[0].circuit,
            quota=parts[0].quota,
            deployments=tuple(parts),
        )


def _up(circuit: CircuitBreaker, quota: QuotaWatch) -> Callable[[], bool]:
    """A gate's `up`: its deployment's circuit is closed and its provider quota not exhausted
    (on the limiter's clock)."""

    def up() -> bool:
        return not circuit.open and not quota.exhausted(time.monotonic())

    return up


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
