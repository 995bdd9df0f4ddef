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
from consumer.core.jobs import checked_json_object


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

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["requests_saved"] = self.requests_saved
        return d


@dataclass
class ServiceStats:
    """Everything `promptbus stats` shows, for one instance."""

    instance: str
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
    #: batched answers compared with the same job asked alone, per tier and batch size
    agreement: AgreementStats = field(default_factory=AgreementStats)

    def tier(self, name: str) -> TierStats:
        ts = self.tiers.get(name)
        if ts is None:
            ts = self.tiers[name] = TierStats()
        return ts

    def snapshot(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
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
            "agreement": self.agreement.as_dict(),
        }


#: counters add up across instances; gauges are shown for live instances only: summed for what
#: each instance has of its own, the largest live value for what they share (a tier's batch
#: size, its API key's budgets)
_OWN_GAUGES = {"limit", "inflight", "paused_s"}
_SHARED_GAUGES = {"batch_size", "budget_requests_per_s", "budget_tokens_per_s", "circuit_open", "outage_s"}
#: text that goes with a shared gauge: taken from the live instance that has its largest value
_GAUGE_TEXTS = {"batch_size_reason": "batch_size"}


class _AgreementCount(BaseModel):
    compared: int = 0
    agreed: int = 0


class _Snapshot(BaseModel):
    """The fields `merge_snapshots` reads, with their types (others are kept as they are)."""

    updated_at: float = 0.0
    items_in: int = 0
    results: int = 0
    dropped_late: int = 0
    skipped_done: int = 0
    inflight: int = 0
    dead_letters: dict[str, int] = {}
    tiers: dict[str, dict[str, float | str]] = {}
    agreement: dict[str, dict[str, _AgreementCount]] = {}


def read_snapshot(value: bytes) -> dict[str, Any]:
    """A stats-topic record, checked to be a snapshot `merge_snapshots` can add up.

    Raises ValueError naming what is wrong (the topic may hold what another tool wrote).
    """
    return checked_json_object(value, _Snapshot, what="stats snapshot")


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
        "agreement": {},
    }
    for snap in snapshots:
        live = now_s - float(snap.get("updated_at", 0)) <= live_within_s
        total["instances_live"] += int(live)
        for key in ("items_in", "results", "dropped_late", "skipped_done"):
            total[key] += int(snap.get(key, 0))
        if live:
            total["inflight"] += int(snap.get("inflight", 0))
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
        for name, per_size in snap.get("agreement", {}).items():
            tier_agreement = total["agreement"].setdefault(name, {})
            for size, count in per_size.items():
                agg_count = tier_agreement.setdefault(size, {"compared": 0, "agreed": 0})
                agg_count["compared"] += int(count.get("compared", 0))
                agg_count["agreed"] += int(count.get("agreed", 0))
    for per_size in total["agreement"].values():
        for count in per_size.values():
            count["rate"] = round(count["agreed"] / count["compared"], 4) if count["compared"] else None
    total["dead_letters"] = dict(total["dead_letters"])
    return total
