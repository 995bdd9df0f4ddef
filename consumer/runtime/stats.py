"""Service counters: the one source for `promptbus stats`, Prometheus `/metrics` and OTel metrics.

Plain in-memory bookkeeping (no I/O). `snapshot()` is what an instance publishes to the
compacted stats topic (key: instance id); `merge_snapshots` is what `promptbus stats` shows.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from consumer.core.adaptive import AgreementStats
from consumer.core.histogram import Histogram, histogram_from_dict, merge_histograms, quantile
from consumer.core.jobs import checked_json_object
from consumer.core.lag import PartitionLag
from consumer.runtime.latency import JOB_LATENCY, OFFLINE_JOB_LATENCY, LatencyHistograms

#: a tier's stats key of the jobs it answered for tier NAME: "fallback_from.NAME"
FALLBACK_PREFIX = "fallback_from."


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
    # gauges
    limit: int = 0
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
    #: why the batch size is what it is (`AdaptiveSizes.explain`), "" before any batch key
    batch_size_reason: str = ""

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

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "fallback_jobs"}
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
        if ok:
            self.results += 1
        else:
            self.dead_letters += 1
        self.latency_s_total += latency_s
        self.latency_s_max = max(self.latency_s_max, latency_s)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        ended = self.results + self.dead_letters
        d["latency_s_mean"] = round(self.latency_s_total / ended, 6) if ended else 0.0
        return d


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
    inflight: int = 0
    paused_partitions: int = 0
    tiers: dict[str, TierStats] = field(default_factory=dict)
    lanes: dict[str, LaneStats] = field(default_factory=dict)
    #: batched answers compared with the same job asked alone, per tier and batch size
    agreement: AgreementStats = field(default_factory=AgreementStats)
    #: latency histograms (job, queue wait, provider request)
    latency: LatencyHistograms = field(default_factory=LatencyHistograms)
    #: per owned (topic, partition): records not committed, age of the oldest read of them
    lag: dict[tuple[str, int], PartitionLag] = field(default_factory=dict)

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
            "inflight": self.inflight,
            "paused_partitions": self.paused_partitions,
            "tiers": {name: ts.as_dict() for name, ts in sorted(self.tiers.items())},
            "lanes": {name: ls.as_dict() for name, ls in sorted(self.lanes.items())},
            "agreement": self.agreement.as_dict(),
            "histograms": self.latency.snapshot(),
            "lag": [
                {"topic": topic, "partition": partition, "records": v.records, "oldest_age_s": v.oldest_age_s}
                for (topic, partition), v in sorted(self.lag.items())
            ],
        }


#: counters add up across instances; gauges are shown for live instances only: summed for what
#: each instance has of its own, the largest live value for what they share (a tier's batch
#: size, its API key's budgets)
_OWN_GAUGES = {"limit", "inflight", "paused_s"}
_SHARED_GAUGES = {"batch_size", "budget_requests_per_s", "budget_tokens_per_s", "circuit_open", "outage_s"}
#: text that goes with a shared gauge: taken from the live instance that has its largest value
_GAUGE_TEXTS = {"batch_size_reason": "batch_size"}
#: a lane's gauges are each instance's own (summed over live instances); its largest latency is
#: the largest of any instance; its mean is worked out from the sums
_LANE_GAUGES = {"inflight", "paused"}


class _AgreementCount(BaseModel):
    compared: int = 0
    agreed: int = 0


class _PartitionLag(BaseModel):
    topic: str
    partition: int
    records: int = 0
    oldest_age_s: float = 0.0


class _Snapshot(BaseModel):
    """The fields `merge_snapshots` reads, with their types (others are kept as they are)."""

    updated_at: float = 0.0
    group: str = ""
    items_in: int = 0
    results: int = 0
    dropped_late: int = 0
    skipped_done: int = 0
    inflight: int = 0
    dead_letters: dict[str, int] = {}
    tiers: dict[str, dict[str, float | str]] = {}
    lanes: dict[str, dict[str, float]] = {}
    agreement: dict[str, dict[str, _AgreementCount]] = {}
    histograms: dict[str, list[dict[str, Any]]] = {}
    lag: list[_PartitionLag] = []


def read_snapshot(value: bytes) -> dict[str, Any]:
    """A stats-topic record, checked to be a snapshot `merge_snapshots` can add up.

    Raises ValueError naming what is wrong (the topic may hold what another tool wrote).
    """
    return checked_json_object(value, _Snapshot, what="stats snapshot")


def group_of(snapshot: dict[str, Any]) -> str:
    """The consumer group a snapshot's instance served ("" when its instance did not say)."""
    group = snapshot.get("group", "")
    return group if isinstance(group, str) else ""


def by_group(snapshots: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The snapshots per consumer group, groups in name order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for snap in snapshots:
        groups.setdefault(group_of(snap), []).append(snap)
    return dict(sorted(groups.items()))


def merge_snapshots(snapshots: list[dict[str, Any]], *, now_s: float, live_within_s: float) -> dict[str, Any]:
    """Sum counters over every instance snapshot ever published; gauges from live instances.

    Each process run publishes under its own instance id, so lifetime totals are the sum.
    """
    total: dict[str, Any] = {
        "instances_live": 0,
        "instances_seen": len(snapshots),
        "items_in": 0,
        "results": 0,
        "dead_letters": Counter(),
        "dropped_late": 0,
        "skipped_done": 0,
        "inflight": 0,
        "tiers": {},
        "lanes": {},
        "agreement": {},
        "lag_records": 0,
        "lag_partitions": 0,
        "oldest_uncommitted_age_s": 0.0,
    }
    live_snapshots = []
    for snap in snapshots:
        live = now_s - float(snap.get("updated_at", 0)) <= live_within_s
        total["instances_live"] += int(live)
        for key in ("items_in", "results", "dropped_late", "skipped_done"):
            total[key] += int(snap.get(key, 0))
        if live:
            live_snapshots.append(snap)
            total["inflight"] += int(snap.get("inflight", 0))
            for part in snap.get("lag", []):
                total["lag_records"] += int(part.get("records", 0))
                total["lag_partitions"] += 1
                age_s = float(part.get("oldest_age_s", 0.0))
                total["oldest_uncommitted_age_s"] = max(total["oldest_uncommitted_age_s"], age_s)
        total["dead_letters"].update(snap.get("dead_letters", {}))
        for name, ts in snap.get("tiers", {}).items():
            agg = total["tiers"].setdefault(name, {})
            for text_key, gauge in _GAUGE_TEXTS.items():
                # before the gauge itself is merged: compare with the largest value so far
                if text_key in ts and (
                    text_key not in agg or (live and ts.get(gauge, 0) >= agg.get(gauge, 0))
                ):
                    agg[text_key] = ts[text_key] if live else ""
            for k, v in ts.items():
                if k in _GAUGE_TEXTS:
                    continue
                if k in _SHARED_GAUGES:
                    agg[k] = max(agg.get(k, 0), v) if live else agg.get(k, 0)
                elif k in _OWN_GAUGES:
                    if live:
                        agg[k] = agg.get(k, 0) + v
                    else:
                        agg.setdefault(k, 0)
                else:
                    agg[k] = agg.get(k, 0) + v
        for name, ls in snap.get("lanes", {}).items():
            _merge_lane(total["lanes"].setdefault(name, {}), ls, live=live)
        for name, per_size in snap.get("agreement", {}).items():
            tier_agreement = total["agreement"].setdefault(name, {})
            for size, count in per_size.items():
                agg_count = tier_agreement.setdefault(size, {"compared": 0, "agreed": 0})
                agg_count["compared"] += int(count.get("compared", 0))
                agg_count["agreed"] += int(count.get("agreed", 0))
    for per_size in total["agreement"].values():
        for count in per_size.values():
            count["rate"] = round(count["agreed"] / count["compared"], 4) if count["compared"] else None
    for agg in total["lanes"].values():
        ended = agg.get("results", 0) + agg.get("dead_letters", 0)
        agg["latency_s_mean"] = round(agg.get("latency_s_total", 0.0) / ended, 6) if ended else 0.0
    total["dead_letters"] = dict(total["dead_letters"])
    total["job_latency"] = latency_percentiles(live_snapshots, JOB_LATENCY.name)
    total["offline_job_latency"] = latency_percentiles(live_snapshots, OFFLINE_JOB_LATENCY.name)
    total["lane_job_latency"] = latency_percentiles(live_snapshots, JOB_LATENCY.name, "lane")
    return total


def _merge_lane(agg: dict[str, float], ls: dict[str, float], *, live: bool) -> None:
    for k, v in ls.items():
        if k == "latency_s_mean":
            continue
        if k == "latency_s_max":
            agg[k] = max(agg.get(k, 0.0), v)
        elif k in _LANE_GAUGES:
            agg[k] = agg.get(k, 0) + (v if live else 0)
        else:
            agg[k] = agg.get(k, 0) + v


def format_lanes(merged: dict[str, Any]) -> list[str]:
    """`promptbus stats` lines of the merged snapshot's lanes, one per lane."""
    return [
        f"lane {name}: results={ls.get('results', 0)} dead_letters={ls.get('dead_letters', 0)} "
        f"latency_mean={ls.get('latency_s_mean', 0.0):.3f}s latency_max={ls.get('latency_s_max', 0.0):.3f}s "
        f"in_flight={ls.get('inflight', 0)} paused={ls.get('paused', 0)}"
        for name, ls in sorted(merged.get("lanes", {}).items())
    ]


#: the job latency quantiles `promptbus stats` shows
QUANTILES = (0.5, 0.95, 0.99)


def histograms_by(snapshots: list[dict[str, Any]], family: str, label: str = "tier") -> dict[str, Histogram]:
    """Per value of `label` (a tier, a lane): one histogram of `family` over every snapshot and
    every other label (merged by bucket). A series whose bounds differ from the first one seen
    for its value (written by another promptbus version) is left out."""
    by_value: dict[str, list[Histogram]] = {}
    for snap in snapshots:
        for series in snap.get("histograms", {}).get(family, []):
            value = str(series.get("labels", {}).get(label, ""))
            try:
                h = histogram_from_dict(series)
            except ValueError:
                continue
            parts = by_value.setdefault(value, [])
            if not parts or parts[0].bounds == h.bounds:
                parts.append(h)
    merged = {value: merge_histograms(parts) for value, parts in by_value.items()}
    return {value: h for value, h in sorted(merged.items()) if h is not None}


def latency_percentiles(
    snapshots: list[dict[str, Any]], family: str, label: str = "tier"
) -> dict[str, dict[str, Any]]:
    """Per tier (or lane: `label`): jobs observed and the p50 / p95 / p99 latency in seconds
    (None without jobs)."""
    out: dict[str, dict[str, Any]] = {}
    for value, h in histograms_by(snapshots, family, label).items():
        entry: dict[str, Any] = {"jobs": h.count}
        for q in QUANTILES:
            quantile_s = quantile(h, q)
            entry[f"p{round(q * 100)}_s"] = None if quantile_s is None else round(quantile_s, 4)
        out[value] = entry
    return out


def routing_lines(name: str, tier: dict[str, Any]) -> list[str]:
    """`promptbus stats` lines of a merged tier: the jobs it answered for other tiers, and
    its `mode: auto` jobs' split and what offline saved (none when there is nothing to say)."""
    lines = []
    answered_for = {
        k.removeprefix(FALLBACK_PREFIX): v for k, v in tier.items() if k.startswith(FALLBACK_PREFIX)
    }
    if answered_for:
        parts = ", ".join(f"{n} for {source}" for source, n in sorted(answered_for.items()))
        lines.append(f"tier {name} fallback: answered {parts}")
    online, offline = int(tier.get("auto_online", 0)), int(tier.get("auto_offline", 0))
    if online or offline:
        saved = float(tier.get("offline_saved_usd", 0.0))
        lines.append(f"tier {name} mode auto: {offline} offline, {online} online; offline saved ${saved:.4f}")
    return lines
