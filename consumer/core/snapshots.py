"""Stats snapshots: the record each instance publishes to the compacted stats topic, checked
when read back (`read_snapshot`) and merged across instances (`merge_snapshots`), which is
what `promptbus stats` shows.

Each process run publishes under its own instance id, so lifetime totals are the sum of every
snapshot ever published. Counters add up; gauges are read from live instances only (updated
within `live_within_s`): summed for what each instance has of its own (its concurrency limit,
its in-flight requests), the largest live value for what the instances share (a tier's batch
size, its API key's budgets, a tenant's budget and the group's spend against it). Latency
percentiles come from the live instances' histograms, merged bucket by bucket
(`consumer.core.histogram`). A tier's deployment (`TIER/NAME`) merges as a tier does. A fleet
quota shows how the live instances split it: each one's share and demand, and their sums.
Pure: the caller passes `now_s`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from consumer.core.histogram import Histogram, histogram_from_dict, merge_histograms, quantile
from consumer.core.jobs import checked_json_object

__all__ = [
    "FALLBACK_PREFIX",
    "JOB_LATENCY_FAMILY",
    "OFFLINE_JOB_LATENCY_FAMILY",
    "QUANTILES",
    "by_group",
    "group_of",
    "histograms_by",
    "latency_percentiles",
    "merge_snapshots",
    "read_snapshot",
    "with_group_lag",
]

#: a tier's stats key of the jobs it answered for tier NAME: "fallback_from.NAME"
FALLBACK_PREFIX = "fallback_from."
#: the histogram families whose percentiles a merge shows (`consumer.runtime.latency` names
#: its families by these)
JOB_LATENCY_FAMILY = "job_latency_seconds"
OFFLINE_JOB_LATENCY_FAMILY = "offline_job_latency_seconds"
#: the job latency quantiles `promptbus stats` shows
QUANTILES = (0.5, 0.95, 0.99)

#: a tier's gauges each instance has of its own: summed over live instances
_OWN_GAUGES = {"limit", "inflight", "paused_s"}
#: a tier's gauges the instances share: the largest live value
_SHARED_GAUGES = {
    "batch_size",
    "budget_requests_per_s",
    "budget_tokens_per_s",
    "circuit_open",
    "outage_s",
    "tls_unverified",
}
#: text that goes with a shared gauge: taken from the live instance that has its largest value
_GAUGE_TEXTS = {"batch_size_reason": "batch_size"}
#: a source's gauge: the records an instance holds while the registry is unreachable
_SOURCE_GAUGE = "held"
#: why an instance's limit is where it is: merged as `limit_reasons`, reason -> live instances
_LIMIT_REASON = "limit_reason"
#: a lane's gauges are each instance's own (summed over live instances); its largest latency is
#: the largest of any instance; its mean is worked out from the sums
_LANE_GAUGES = {"inflight", "paused"}
#: a tenant's gauges: each instance's own held jobs (summed over live instances); the day's
#: budget and the group's spend against it, which every instance knows alike (the largest
#: live value: the most recent)
_TENANT_OWN_GAUGES = {"held"}
_TENANT_SHARED_GAUGES = {"budget_usd", "spent_usd", "budget_tokens", "spent_tokens"}
#: the instance counters that add up across every snapshot
_COUNTERS = ("items_in", "results", "dropped_late", "skipped_done")


class _AgreementCount(BaseModel):
    compared: int = 0
    agreed: int = 0


class _PartitionLag(BaseModel):
    topic: str
    partition: int
    records: int = 0
    oldest_age_s: float = 0.0


class _QuotaShare(BaseModel):
    figures_per_minute: dict[str, int] = {}
    fraction: float = 0.0
    share_per_minute: dict[str, float] = {}
    demand: int = 0
    reserved_tokens: float = 0.0


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
    tenants: dict[str, dict[str, float]] = {}
    agreement: dict[str, dict[str, _AgreementCount]] = {}
    histograms: dict[str, list[dict[str, Any]]] = {}
    lag: list[_PartitionLag] = []
    instance: str = ""
    quotas: dict[str, _QuotaShare] = {}
    sources: dict[str, dict[str, int | dict[str, int]]] = {}


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
    """Sum counters over every instance snapshot ever published; gauges from live instances."""
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
        "tenants": {},
        "agreement": {},
        "lag_records": 0,
        "lag_partitions": 0,
        "oldest_uncommitted_age_s": 0.0,
        "quotas": {},
        "deployments": {},
        "sources": {},
    }
    live_snapshots = []
    for snap in snapshots:
        live = now_s - float(snap.get("updated_at", 0)) <= live_within_s
        total["instances_live"] += int(live)
        for key in _COUNTERS:
            total[key] += int(snap.get(key, 0))
        if live:
            live_snapshots.append(snap)
            total["inflight"] += int(snap.get("inflight", 0))
            _add_lag(total, snap.get("lag", []))
            _add_quotas(total["quotas"], str(snap.get("instance", "")), snap.get("quotas", {}))
        total["dead_letters"].update(snap.get("dead_letters", {}))
        for name, ts in snap.get("tiers", {}).items():
            _merge_tier(total["tiers"].setdefault(name, {}), ts, live=live)
        for name, ls in snap.get("lanes", {}).items():
            _merge_lane(total["lanes"].setdefault(name, {}), ls, live=live)
        for name, ds in snap.get("deployments", {}).items():  # "TIER/NAME": a tier's by its rules
            _merge_tier(total["deployments"].setdefault(name, {}), ds, live=live)
        for name, tenant in snap.get("tenants", {}).items():
            _merge_tenant(total["tenants"].setdefault(name, {}), tenant, live=live)
        for name, per_size in snap.get("agreement", {}).items():
            _add_agreement(total["agreement"].setdefault(name, {}), per_size)
        for name, source in snap.get("sources", {}).items():
            _merge_source(total["sources"].setdefault(name, {}), source, live=live)
    for per_size in total["agreement"].values():
        for count in per_size.values():
            count["rate"] = round(count["agreed"] / count["compared"], 4) if count["compared"] else None
    for agg in total["lanes"].values():
        ended = agg.get("results", 0) + agg.get("dead_letters", 0)
        agg["latency_s_mean"] = round(agg.get("latency_s_total", 0.0) / ended, 6) if ended else 0.0
    total["dead_letters"] = dict(total["dead_letters"])
    total["job_latency"] = latency_percentiles(live_snapshots, JOB_LATENCY_FAMILY)
    total["offline_job_latency"] = latency_percentiles(live_snapshots, OFFLINE_JOB_LATENCY_FAMILY)
    total["lane_job_latency"] = latency_percentiles(live_snapshots, JOB_LATENCY_FAMILY, "lane")
    return total


def with_group_lag(
    merged: dict[str, Any], *, records: int, partitions: int, unread: int = 0
) -> dict[str, Any]:
    """`merged` with its group's lag as the broker counts it (committed offsets against log
    ends). The oldest uncommitted age is the live instances' figure, as old as their last
    refresh: beside a lag of 0 records nothing is uncommitted, so it is 0; while `unread`
    lagging partitions have no live instance reading them, no age is known (None)."""
    age_s = merged.get("oldest_uncommitted_age_s", 0.0) if records else 0.0
    return {
        **merged,
        "lag_records": records,
        "lag_partitions": partitions,
        "oldest_uncommitted_age_s": None if records and unread else age_s,
        "lag_partitions_unread": unread,
    }


def live_partitions(
    snapshots: Iterable[Mapping[str, Any]], *, now_s: float, live_within_s: float
) -> set[tuple[str, int]]:
    """The (topic, partition)s the live instances among `snapshots` read (their lag entries):
    the topics a group reads, and the partitions whose oldest uncommitted age is known."""
    return {
        (str(part.get("topic")), int(part.get("partition", 0)))
        for snap in snapshots
        if now_s - float(snap.get("updated_at", 0)) <= live_within_s
        for part in snap.get("lag", [])
    }


def _add_lag(total: dict[str, Any], partitions: list[dict[str, Any]]) -> None:
    """A live instance's owned partitions: their records add up, the oldest age is the largest."""
    for part in partitions:
        total["lag_records"] += int(part.get("records", 0))
        total["lag_partitions"] += 1
        age_s = float(part.get("oldest_age_s", 0.0))
        total["oldest_uncommitted_age_s"] = max(total["oldest_uncommitted_age_s"], age_s)


def _add_quotas(total: dict[str, Any], instance: str, quotas: dict[str, dict[str, Any]]) -> None:
    """A live instance's shares of the fleet quotas: its own line in each quota's split, and
    its share, demand and reserved tokens added to the quota's sums."""
    for name, q in quotas.items():
        agg = total.setdefault(name, {"figures_per_minute": {}, "fraction": 0.0, "demand": 0})
        agg.setdefault("reserved_tokens", 0.0)
        agg.setdefault("instances", {})
        agg["figures_per_minute"] = q.get("figures_per_minute") or agg["figures_per_minute"]
        fraction, demand = float(q.get("fraction", 0.0)), int(q.get("demand", 0))
        agg["fraction"] = round(agg["fraction"] + fraction, 4)
        agg["demand"] += demand
        agg["reserved_tokens"] += float(q.get("reserved_tokens", 0.0))
        agg["instances"][instance] = {
            "fraction": fraction,
            "demand": demand,
            "share_per_minute": dict(q.get("share_per_minute", {})),
        }


def _merge_tier(agg: dict[str, Any], ts: dict[str, Any], *, live: bool) -> None:
    for text_key, gauge in _GAUGE_TEXTS.items():
        # before the gauge itself is merged: compare with the largest value so far
        if text_key in ts and (text_key not in agg or (live and ts.get(gauge, 0) >= agg.get(gauge, 0))):
            agg[text_key] = ts[text_key] if live else ""
    for k, v in ts.items():
        if k in _GAUGE_TEXTS:
            continue
        if k == _LIMIT_REASON:
            if live and v:  # each live instance's own: how many give each reason
                reasons = agg.setdefault("limit_reasons", {})
                reasons[v] = reasons.get(v, 0) + 1
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


def _merge_source(agg: dict[str, Any], ss: dict[str, Any], *, live: bool) -> None:
    """A source's counters add up over every snapshot, its dead letters by kind; the records it
    holds (waiting for the registry) are each live instance's own."""
    for k, v in ss.items():
        if k == "dead_letters":
            kinds = agg.setdefault(k, {})
            for kind, n in dict(v).items():
                kinds[kind] = kinds.get(kind, 0) + int(n)
        elif k == _SOURCE_GAUGE:
            agg[k] = agg.get(k, 0) + (int(v) if live else 0)
        else:
            agg[k] = agg.get(k, 0) + int(v)


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


def _merge_tenant(agg: dict[str, float], ts: dict[str, float], *, live: bool) -> None:
    for k, v in ts.items():
        if k in _TENANT_SHARED_GAUGES:
            agg[k] = max(agg.get(k, 0), v) if live else agg.get(k, 0)
        elif k in _TENANT_OWN_GAUGES:
            agg[k] = agg.get(k, 0) + (v if live else 0)
        else:
            agg[k] = agg.get(k, 0) + v


def _add_agreement(agg: dict[str, dict[str, Any]], per_size: dict[str, dict[str, Any]]) -> None:
    for size, count in per_size.items():
        agg_count = agg.setdefault(size, {"compared": 0, "agreed": 0})
        agg_count["compared"] += int(count.get("compared", 0))
        agg_count["agreed"] += int(count.get("agreed", 0))


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
