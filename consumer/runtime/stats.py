"""Service counters: the one source for `promptbus stats`, Prometheus `/metrics` and OTel metrics.

Plain in-memory bookkeeping (no I/O). `snapshot()` is what an instance publishes to the
compacted stats topic (key: instance id); `consumer.core.snapshots` reads and merges those
records, which is what `promptbus stats` shows.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumer.core.adaptive import AgreementStats
from consumer.core.deployments import DEFAULT_DEPLOYMENT
from consumer.core.lag import PartitionLag
from consumer.core.snapshots import FALLBACK_PREFIX
from consumer.runtime.latency import LatencyHistograms


@dataclass
class DeploymentStats:
    """Counters and gauges of one deployment of a tier (`tiers.NAME.deployments`): what
    `promptbus stats` prints per deployment and `/metrics` labels `deployment`."""

    provider_requests: int = 0
    rate_limited: int = 0
    provider_errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    circuit_opened: int = 0
    listing_probes: int = 0
    # gauges
    limit: int = 0
    #: why the limit is where it is (`consumer.core.limit.LimitReason`)
    limit_reason: str = ""
    inflight: int = 0
    circuit_open: int = 0
    budget_requests_per_s: float = 0.0


    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class TierStats:
    """Counters and gauges of one tier."""

    items: int = 0
    provider_requests: int = 0
    batched_requests: int = 0
    items_in_batched_plans: int = 0
    requests_for_batched_plans: int = 0
    reasks: int = 0
    splits: int = 0
    retries: int = 0
    rate_limited: int = 0
    provider_errors: int = 0
    verify_requests: int = 0
    verify_agreed: int = 0
    verify_compared: int = 0
    #: times the tier's circuit opened (its provider unreachable), requests held through it
    circuit_opened: int = 0
    held_requests: int = 0
    #: model listings sent as the probe of an open circuit (`consumer.runtime.prober`)
    circuit_probes: int = 0
    #: tokens of every answered provider request, as the providers counted them (input
    #: counts cached and cache-written tokens too), and their cost at the tier's `pricing`
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    #: the saving of batching (`consumer.core.cost.BatchSaving`): tokens of answered batched
    #: requests and what their members would have used asked alone, estimated ...
    batched_tokens: int = 0
    alone_tokens_estimate: int = 0
    #: ... and, measured on the verify_fraction sample, a verified job's share of its batched
    #: request against the tokens of the same job asked alone
    verify_batched_tokens: int = 0
    verify_alone_tokens: int = 0
    #: jobs answered by another job's identical request (dedupe) instead of their own
    deduped: int = 0
    #: `mode: auto` jobs of this tier by the way they went, and what offline jobs saved
    #: against the same tokens online at the tier's pricing
    auto_online: int = 0
    auto_offline: int = 0
    offline_saved_usd: float = 0.0
    #: jobs this tier answered for another (its fallback), by the tier they asked for
    fallback_jobs: Counter[str] = field(default_factory=Counter)
    #: per deployment (its metrics label: `default` for the tier's own one)
    deployments: dict[str, DeploymentStats] = field(default_factory=dict)
    # gauges
    limit: int = 0
    #: why the limit is where it is (`consumer.core.limit.LimitReason`)
    limit_reason: str = ""
    inflight: int = 0
    batch_size: int = 0
    paused_s: float = 0.0
    #: the refill rates of the provider's request and token budgets, as the limiter learnt
    #: them from rate-limit headers (0: not known or not announced)
    budget_requests_per_s: float = 0.0
    budget_tokens_per_s: float = 0.0
    #: 1 while the tier's circuit is open; for how long its provider has been unreachable
    circuit_open: int = 0
    outage_s: float = 0.0
    #: 1 when a deployment of the tier has `tls.verify: false` (its certificates unchecked)
    tls_unverified: int = 0
    #: says why the batch size is what it is (`AdaptiveSizes.explain`; "" before any batch
    #: key): the snapshot's `batch_size_reason`, made when a snapshot asks (the text changes
    #: with every answer and only a snapshot reads it); None: no reason to give
    size_reason: Callable[[], str] | None = field(default=None, repr=False, compare=False)

    @property
    def requests_saved(self) -> int:
        """Ordinary requests that would have been sent minus requests sent (DESIGN rule 9)."""
        return self.items_in_batched_plans - self.requests_for_batched_plans

    def count_auto(self, mode: str) -> None:
        """One `mode: auto` job routed `mode` (online | offline)."""
        if mode == "offline":
            self.auto_offline += 1
        else:
            self.auto_online += 1

    def deployment(self, label: str) -> DeploymentStats:
        ds = self.deployments.get(label)
        if ds is None:
            ds = self.deployments[label] = DeploymentStats()
        return ds

    def as_dict(self) -> dict[str, Any]:
        nested = ("fallback_jobs", "deployments", "size_reason")
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in nested}
        d["batch_size_reason"] = self.size_reason() if self.size_reason is not None else ""
        d["requests_saved"] = self.requests_saved
        # flat, so snapshots add up like every other counter
        for source, n in sorted(self.fallback_jobs.items()):
            d[f"{FALLBACK_PREFIX}{source}"] = n
        return d


@dataclass
class LaneStats:
    """Counters and gauges of one lane (`consumer.core.lanes`): its jobs' outcomes, their
    latency from read to outcome, and its backpressure."""

    results: int = 0
    dead_letters: int = 0
    #: seconds from read to outcome, summed over the lane's results and dead letters
    latency_s_total: float = 0.0
    #: the longest of them since start
    latency_s_max: float = 0.0
    # gauges
    inflight: int = 0
    #: 1 while the lane's partitions are paused by its in-flight bound
    paused: int = 0

    def ended(self, latency_s: float, *, ok: bool) -> None:
        """One of the lane's jobs has its outcome."""
        self.ended_all((latency_s,), ok=ok)

    def ended_all(self, latencies_s: Sequence[float], *, ok: bool) -> None:
        """Jobs of the lane with these latencies have their outcomes (all results, or all
        dead letters)."""
        if not latencies_s:
            return
        if ok:
            self.results += len(latencies_s)
        else:
            self.dead_letters += len(latencies_s)
        self.latency_s_total += sum(latencies_s)
        longest = max(latencies_s)
        if longest > self.latency_s_max:
            self.latency_s_max = longest

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        ended = self.results + self.dead_letters
        d["latency_s_mean"] = round(self.latency_s_total / ended, 6) if ended else 0.0
        return d


@dataclass
class TenantStats:
    """Counters and gauges of one tenant account (`consumer.core.tenants`: a named tenant,
    `default` or `other`): its jobs' outcomes, the tokens and cost of its answered requests,
    its held jobs and, with a budget, the day's budget and the group's spend against it."""

    results: int = 0
    dead_letters: int = 0
    #: of its dead letters, the jobs whose tenant claim its bound topics refused (`tenant_mismatch`):
    #: on a bound tenant's account, jobs its own topics carried claiming another tenant
    mismatched: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    # gauges
    #: jobs waiting for budget (`on_exhausted: hold`)
    held: int = 0
    #: the day's budgets (0: none) and the group's spend today against them, as this instance
    #: knows it (every instance's leases included)
    budget_usd: float = 0.0
    spent_usd: float = 0.0
    budget_tokens: int = 0
    spent_tokens: int = 0

    def ended(self, *, ok: bool, jobs: int = 1) -> None:
        """`jobs` of the account's jobs have their outcomes."""
        if ok:
            self.results += jobs
        else:
            self.dead_letters += jobs

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class QuotaStats:
    """One fleet quota on this instance (`consumer.runtime.quotas`): the quota's figures, this
    instance's share of it, its demand and the tokens its requests in flight hold."""

    #: the quota's figures, per minute, by kind (requests, tokens, input_tokens, output_tokens)
    figures_per_minute: dict[str, int] = field(default_factory=dict)
    # gauges
    #: this instance's share: a fraction of the quota, and what it allows per minute by kind
    fraction: float = 0.0
    share_per_minute: dict[str, float] = field(default_factory=dict)
    #: requests waiting and in flight on the tiers that name the quota
    demand: int = 0
    #: tokens reserved by this instance's requests in flight (settled when they end)
    reserved_tokens: float = 0.0
    #: live instances sharing the quota as this instance last read the board
    instances_live: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class SourceStats:
    """Counters of one source: what `promptbus stats` prints per source and `/metrics` labels
    `source`."""

    records_in: int = 0
    enriched: int = 0
    skipped_unchanged: int = 0
    tombstones: int = 0
    stale_dropped: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    #: gauge: records waiting for their schema (the registry unreachable)
    held: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "dead_letters"}
        out["dead_letters"] = dict(self.dead_letters)
        return out


def budget_left(budget: float, spent: float) -> float:
    """What a budget has left (0 once spent; 0 also for no budget: callers check `budget`)."""
    return max(budget - spent, 0.0)


@dataclass
class ServiceStats:
    """Everything `promptbus stats` shows, for one instance."""

    instance: str
    #: the consumer group the instance serves: `promptbus stats` shows one group at a time
    group: str = ""
    started_at_s: float = field(default_factory=time.time)
    items_in: int = 0
    results: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    dropped_late: int = 0
    #: input offset commits made (at_least_once) or transactions committed (exactly_once)
    commits: int = 0
    #: records skipped because an earlier owner of their partition had finished them
    skipped_done: int = 0
    #: rebalances this instance went through (each revokes every partition: eager protocol)
    rebalances: int = 0
    #: partitions those rebalances moved to another member (their waiting work abandoned,
    #: or their work in flight handed over: `consumer.core.handover`)
    partitions_lost: int = 0
    #: records of partitions handed to this instance that their old owner finished (counted
    #: done, no outcome written here; not in items_in)
    handover_completed: int = 0
    #: records of partitions handed to this instance that their old owner did not finish by
    #: the hand-over's deadline (done here: in items_in)
    handover_redone: int = 0
    #: records of partitions handed to this instance waiting for their old owner's outcome now
    handover_parked: int = 0
    inflight: int = 0
    paused_partitions: int = 0
    tiers: dict[str, TierStats] = field(default_factory=dict)
    lanes: dict[str, LaneStats] = field(default_factory=dict)
    #: per tenant account (`consumer.core.tenants`)
    tenants: dict[str, TenantStats] = field(default_factory=dict)
    #: this instance's share of each fleet quota (`quotas:` of the tier file), by name
    quotas: dict[str, QuotaStats] = field(default_factory=dict)
    #: batched answers compared with the same job asked alone, per tier and batch size
    agreement: AgreementStats = field(default_factory=AgreementStats)
    #: latency histograms (job, queue wait, provider request)
    latency: LatencyHistograms = field(default_factory=LatencyHistograms)
    #: per owned (topic, partition): records not committed, age of the oldest read of them
    lag: dict[tuple[str, int], PartitionLag] = field(default_factory=dict)
    #: per source (`sources:` of the tier file), by name
    sources: dict[str, SourceStats] = field(default_factory=dict)

    def tier(self, name: str) -> TierStats:
        ts = self.tiers.get(name)
        if ts is None:
            ts = self.tiers[name] = TierStats()
        return ts

    def lane(self, name: str) -> LaneStats:
        ls = self.lanes.get(name)
        if ls is None:
            ls = self.lanes[name] = LaneStats()
        return ls

    def source(self, name: str) -> SourceStats:
        found = self.sources.get(name)
        if found is None:
            found = self.sources[name] = SourceStats()
        return found

    def tenant(self, account: str) -> TenantStats:
        found = self.tenants.get(account)
        if found is None:
            found = self.tenants[account] = TenantStats()
        return found

    def snapshot(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "group": self.group,
            "started_at": self.started_at_s,
            "updated_at": time.time(),
            "items_in": self.items_in,
            "results": self.results,
            "dead_letters": dict(self.dead_letters),
            "dropped_late": self.dropped_late,
            "commits": self.commits,
            "skipped_done": self.skipped_done,
            "rebalances": self.rebalances,
            "partitions_lost": self.partitions_lost,
            "handover_completed": self.handover_completed,
            "handover_redone": self.handover_redone,
            "handover_parked": self.handover_parked,
            "inflight": self.inflight,
            "paused_partitions": self.paused_partitions,
            "tiers": {name: ts.as_dict() for name, ts in sorted(self.tiers.items())},
            "lanes": {name: ls.as_dict() for name, ls in sorted(self.lanes.items())},
            "tenants": {name: ts.as_dict() for name, ts in sorted(self.tenants.items())},
            "quotas": {name: qs.as_dict() for name, qs in sorted(self.quotas.items())},
            "sources": {name: ss.as_dict() for name, ss in sorted(self.sources.items())},
            # the deployments of tiers that configure them ("TIER/NAME"); a tier's own one is the tier
            "deployments": {
                f"{tier}/{label}": ds.as_dict()
                for tier, ts in sorted(self.tiers.items())
                for label, ds in sorted(ts.deployments.items())
                if label != DEFAULT_DEPLOYMENT
            },
            "agreement": self.agreement.as_dict(),
            "histograms": self.latency.snapshot(),
            "lag": [
                {"topic": topic, "partition": partition, "records": v.records, "oldest_age_s": v.oldest_age_s}
                for (topic, partition), v in sorted(self.lag.items())
            ],
        }
