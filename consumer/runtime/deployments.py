"""A tier's deployments at run time, and the part that probes their open circuits.

A `Deployment` is one endpoint serving a tier (`tiers.NAME.deployments[i]`; a tier without
`deployments` is its own one deployment, named None): its provider adapter (and so its own
connection pool), its gate in the tier's limiter (`consumer.runtime.limiter.Gate`: its
concurrency limit, the mirrors of its budgets, its pause and fleet quota), its circuit and
its provider-quota watch. Every request of a tier goes through one of them: the limiter
names which when it grants the slot. Their open circuits are probed by
`consumer.runtime.prober.CircuitProber`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consumer.core.circuit import CircuitBreaker
from consumer.core.deployments import DEFAULT_DEPLOYMENT
from consumer.core.fallback import QuotaWatch
from consumer.providers.base import CompletionProvider
from consumer.runtime.limiter import Gate
from consumer.runtime.stats import DeploymentStats
from consumer.settings import TierConfig


@dataclass
class Deployment:
    """One endpoint of a tier. name: its configured name (None: the tier's own); config: the
    tier's configuration with the deployment's own keys over it."""

    name: str | None
    config: TierConfig
    provider: CompletionProvider
    gate: Gate
    circuit: CircuitBreaker
    #: the provider's own quota, exhausted for a cool-down after it says so
    quota: QuotaWatch = field(default_factory=QuotaWatch)
    stats: DeploymentStats = field(default_factory=DeploymentStats)

    @property
    def label(self) -> str:
        """Its name in metrics and stats (`default` for a tier's own)."""
        return self.name if self.name is not None else DEFAULT_DEPLOYMENT

    def where(self, tier: str) -> str:
        """How logs name it: `tier NAME`, or `tier NAME deployment DEPLOYMENT`."""
        return f"tier {tier}" if self.name is None else f"tier {tier} deployment {self.name}"

    def refresh_gauges(self, limit_reason: str) -> None:
        """Copy its gate's state into its stats; `limit_reason`: why its limit is where it is."""
        gate, stats = self.gate, self.stats
        stats.limit = gate.limit
        stats.limit_reason = limit_reason
        stats.inflight = gate.inflight
        stats.circuit_open = int(self.circuit.open)
        stats.circuit_opened = self.circuit.opened_count
        stats.budget_requests_per_s = round(gate.pacer.rate_per_s or 0.0, 2)
