"""Prometheus `/metrics`, `/healthz`, `/readyz`, served in the service's own event loop, and
the same numbers as OpenTelemetry instruments (`register_otel_metrics`).

Both read `ServiceStats` when they are collected, so counters have one source of truth.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from consumer.core.deployments import DEFAULT_DEPLOYMENT
from consumer.core.errors import ConfigError
from consumer.core.limit import LIMIT_REASONS
from consumer.runtime.latency import HISTOGRAMS
from consumer.runtime.stats import ServiceStats, budget_left

log = logging.getLogger(__name__)

_TIER_COUNTERS = {
    "items": "Jobs routed to the tier",
    "provider_requests": "Provider requests sent",
    "batched_requests": "Provider requests that carried more than one job",
    "requests_saved": "Ordinary requests that would have been sent minus requests sent",
    "reasks": "Requests re-asking single jobs missing from a batched answer",
    "splits": "Requests re-sent as halves after a malformed, truncated or rejected batch",
    "retries": "Requests re-sent after a retryable error",
    "rate_limited": "429 responses",
    "provider_errors": "Provider requests that failed",
    "verify_requests": "Extra single requests sent to verify batched answers",
    "circuit_opened": "Times the tier's circuit opened (its provider unreachable)",
    "held_requests": "Requests held through a provider outage instead of failing",
    "circuit_probes": "Model listings sent as the probe of an open circuit (connections refused)",
    "input_tokens": "Prompt tokens of answered requests, as the provider counted them (cached ones included)",
    "output_tokens": "Output tokens of answered requests",
    "cached_input_tokens": "Prompt tokens read from the provider's prompt cache",
    "cache_write_tokens": "Prompt tokens written to the provider's prompt cache",
    "cost_usd": "Cost of answered requests at the tier's pricing (0 without pricing)",
    "batched_tokens": "Tokens of answered batched requests",
    "alone_tokens_estimate": "Tokens the members of batched requests would have used asked alone (estimate)",
    "verify_batched_tokens": "Verified jobs' shares of their batched requests' tokens",
    "verify_alone_tokens": "Tokens of the same verified jobs asked alone",
    "deduped": "Jobs answered by another job's identical request (dedupe)",
    "auto_online": "Jobs with mode auto that went online",
    "auto_offline": "Jobs with mode auto that went offline (the provider's Batch API)",
    "offline_saved_usd": "What offline jobs saved against the same tokens online, at the tier's pricing",
}
_TIER_GAUGES = {
    "limit": "Current concurrency limit",
    "inflight": "Provider requests in flight",
    "batch_size": "Current adaptive batch size",
    "paused_s": "Seconds left in a quota pause",
    "budget_requests_per_s": "Refill rate of the provider's request budget, from its headers (0: none)",
    "budget_tokens_per_s": "Refill rate of the provider's token budget, from its headers (0: none)",
    "circuit_open": "1 while the tier's circuit is open: its provider is unreachable and its jobs are held",
    "outage_s": "Seconds the tier's provider has been unreachable (0 while its circuit is closed)",
    "tls_unverified": "1 when a deployment of the tier has tls.verify false (certificates not checked)",
}

#: the tier figures labelled by deployment too (`tiers.NAME.deployments`; a tier without them
#: is its own one deployment, `default`)
_BY_DEPLOYMENT = frozenset(
    {
        "rate_limited", "input_tokens", "output_tokens", "limit", "inflight", "budget_requests_per_s",
        "circuit_open",
    }
)

Samples = Callable[[ServiceStats], Iterable[tuple[tuple[str, ...], float]]]


@dataclass(frozen=True, slots=True)
class _Metric:
    """One metric, for both exporters: `path` ("tier", "limit") is `promptbus_tier_limit` in
    Prometheus and `promptbus.tier.limit` in OpenTelemetry; `samples` reads its values (one
    per combination of `labels`) from the stats when collected."""

    path: tuple[str, ...]
    help: str
    counter: bool
    labels: tuple[str, ...]
    samples: Samples


def _total(attribute: str) -> Samples:
    return lambda s: [((), getattr(s, attribute))]


def _per_tier(field: str) -> Samples:
    return lambda s: [((tier,), getattr(ts, field)) for tier, ts in sorted(s.tiers.items())]


def _per_deployment(field: str, *, counter: bool) -> Samples:
    """A tier figure per (tier, deployment): a tier's named deployments each with its own
    value, and under `default` the tier's own (a tier without deployments), or what no
    deployment counted (a counter's offline batches)."""

    def samples(s: ServiceStats) -> list[tuple[tuple[str, ...], float]]:
        out: list[tuple[tuple[str, ...], float]] = []
        for tier, ts in sorted(s.tiers.items()):
            named = sorted((label, ds) for label, ds in ts.deployments.items() if label != DEFAULT_DEPLOYMENT)
            if not named:
                out.append(((tier, DEFAULT_DEPLOYMENT), getattr(ts, field)))
                continue
            out += [((tier, label), getattr(ds, field)) for label, ds in named]
            rest = getattr(ts, field) - sum(getattr(ds, field) for _, ds in named)
            if counter and rest > 0:
                out.append(((tier, DEFAULT_DEPLOYMENT), rest))
        return out

    return samples


def _limit_reasons(s: ServiceStats) -> list[tuple[tuple[str, ...], float]]:
    """Per (tier, deployment), one sample per limit reason: 1 for the current one."""
    out: list[tuple[tuple[str, ...], float]] = []
    for tier, ts in sorted(s.tiers.items()):
        for label, ds in sorted(ts.deployments.items()):
            out += [((tier, label, reason), float(ds.limit_reason == reason)) for reason in LIMIT_REASONS]
    return out


def _tier_metric(name: str, text: str, counter: bool) -> _Metric:
    if name in _BY_DEPLOYMENT:
        samples = _per_deployment(name, counter=counter)
        return _Metric(("tier", name), text, counter, ("tier", "deployment"), samples)
    return _Metric(("tier", name), text, counter, ("tier",), _per_tier(name))


def _per(group: str, field: str) -> Samples:
    """One sample per member of `group` (the stats' `lanes`, `tenants`): its `field`."""
    return lambda s: [((name,), getattr(st, field)) for name, st in sorted(getattr(s, group).items())]


def _each(group: str, parts: tuple[tuple[str, str], ...]) -> Samples:
    """Per member of `group` and per (label value, field) of `parts`: one sample."""
    return lambda s: [
        ((name, label), getattr(st, field))
        for name, st in sorted(getattr(s, group).items())
        for label, field in parts
    ]


#: a lane's or a tenant's jobs by outcome
_OUTCOMES = (("result", "results"), ("dead_letter", "dead_letters"))


#: a source's records by what became of them (`consumer.runtime.sources`)
_SOURCE_OUTCOMES = (
    ("in", "records_in"),
    ("enriched", "enriched"),
    ("skipped_unchanged", "skipped_unchanged"),
    ("tombstone", "tombstones"),
    ("stale_dropped", "stale_dropped"),
)

#: per source (`sources:` of the tier file)
SOURCE_METRICS: tuple[_Metric, ...] = (
    _Metric(
        ("source", "records"),
        "Records of the source: read (in), written back enriched, written with the key's last answer "
        "(skipped_unchanged), tombstones written, stale answers dropped",
        True,
        ("source", "outcome"),
        _each("sources", _SOURCE_OUTCOMES),
    ),
    _Metric(
        ("source", "dead_letters"),
        "Records of the source dead-lettered, by kind",
        True,
        ("source", "kind"),
        lambda s: [
            ((name, kind), n)
            for name, st in sorted(s.sources.items())
            for kind, n in sorted(st.dead_letters.items())
        ],
    ),
    _Metric(
        ("source", "held"),
        "Records of the source waiting for their schema (the registry unreachable)",
        False,
        ("source",),
        _per("sources", "held"),
    ),
)

#: per lane (`consumer.core.lanes`), beside the per-tier figures
LANE_METRICS: tuple[_Metric, ...] = (
    _Metric(
        ("lane", "jobs"),
        "Jobs of the lane with an outcome",
        True,
        ("lane", "outcome"),
        _each("lanes", _OUTCOMES),
    ),
    _Metric(
        ("lane", "latency_seconds"),
        "Seconds from read to outcome, summed over the lane's jobs (over lane_jobs_total: the mean)",
        True,
        ("lane",),
        _per("lanes", "latency_s_total"),
    ),
    _Metric(
        ("lane", "inflight"),
        "Input records of the lane not yet committable",
        False,
        ("lane",),
        _per("lanes", "inflight"),
    ),
    _Metric(
        ("lane", "paused"),
        "1 while the lane's partitions are paused by its max_inflight",
        False,
        ("lane",),
        _per("lanes", "paused"),
    ),
)


def _tenant_budget(budget: str, spent: str | None = None) -> Samples:
    """The day's budget (`spent` None) or what it has left, of the accounts a budget limits."""

    def samples(s: ServiceStats) -> list[tuple[tuple[str, ...], float]]:
        out: list[tuple[tuple[str, ...], float]] = []
        for tenant, ts in sorted(s.tenants.items()):
            total = getattr(ts, budget)
            if total:
                out.append(((tenant,), total if spent is None else budget_left(total, getattr(ts, spent))))
        return out

    return samples


#: per tenant account (`consumer.core.tenants`): a named tenant, `default` or `other`
TENANT_METRICS: tuple[_Metric, ...] = (
    _Metric(
        ("tenant", "jobs"),
        "Jobs of the tenant with an outcome (tenants the tier file does not name: other)",
        True,
        ("tenant", "outcome"),
        _each("tenants", _OUTCOMES),
    ),
    _Metric(
        ("tenant", "tokens"),
        "Tokens of the tenant's answered requests, by kind (input, output)",
        True,
        ("tenant", "kind"),
        _each("tenants", (("input", "input_tokens"), ("output", "output_tokens"))),
    ),
    _Metric(
        ("tenant", "cost_usd"),
        "Cost of the tenant's answered requests at the tiers' pricing",
        True,
        ("tenant",),
        _per("tenants", "cost_usd"),
    ),
    _Metric(
        ("tenant", "budget_usd"),
        "The tenant's USD budget for the UTC day (tenants with one)",
        False,
        ("tenant",),
        _tenant_budget("budget_usd"),
    ),
    _Metric(
        ("tenant", "budget_remaining_usd"),
        "What the tenant's USD budget has left today, every instance's spend and leases counted",
        False,
        ("tenant",),
        _tenant_budget("budget_usd", "spent_usd"),
    ),
    _Metric(
        ("tenant", "budget_tokens"),
        "The tenant's token budget for the UTC day (tenants with one)",
        False,
        ("tenant",),
        _tenant_budget("budget_tokens"),
    ),
    _Metric(
        ("tenant", "budget_remaining_tokens"),
        "What the tenant's token budget has left today, every instance's spend and leases counted",
        False,
        ("tenant",),
        _tenant_budget("budget_tokens", "spent_tokens"),
    ),
    _Metric(
        ("tenant", "held"),
        "Jobs of the tenant held until its budget allows them (on_exhausted: hold)",
        False,
        ("tenant",),
        _per("tenants", "held"),
    ),
)


def _quota_shares(s: ServiceStats) -> list[tuple[tuple[str, ...], float]]:
    return [
        ((name, kind), per_minute)
        for name, qs in sorted(s.quotas.items())
        for kind, per_minute in sorted(qs.share_per_minute.items())
    ]


def _per_quota(field: str) -> Samples:
    return lambda s: [((name,), getattr(qs, field)) for name, qs in sorted(s.quotas.items())]


#: per fleet quota (`quotas:` of the tier file): this instance's share and what it holds
QUOTA_METRICS: tuple[_Metric, ...] = (
    _Metric(
        ("quota", "share"),
        "This instance's share of the quota per minute, by kind: requests, tokens, input_tokens, "
        "output_tokens",
        False,
        ("quota", "kind"),
        _quota_shares,
    ),
    _Metric(
        ("quota", "demand"),
        "Requests waiting and in flight on the tiers that name the quota (what its share follows)",
        False,
        ("quota",),
        _per_quota("demand"),
    ),
    _Metric(
        ("quota", "reserved_tokens"),
        "Tokens this instance's requests in flight hold of the quota (settled to their usage when answered)",
        False,
        ("quota",),
        _per_quota("reserved_tokens"),
    ),
)


def _agreement(field: str) -> Samples:
    return lambda s: [
        ((tier, str(size)), getattr(count, field))
        for tier, per_size in sorted(s.agreement.snapshot().items())
        for size, count in per_size.items()
    ]


METRICS: tuple[_Metric, ...] = (
    _Metric(("items_in",), "Input records read", True, (), _total("items_in")),
    _Metric(("results",), "Results published", True, (), _total("results")),
    _Metric(
        ("dead_letters",),
        "Dead letters published",
        True,
        ("kind",),
        lambda s: [((kind,), n) for kind, n in sorted(s.dead_letters.items())],
    ),
    _Metric(("inflight_items",), "Input records not yet committable", False, (), _total("inflight")),
    _Metric(
        ("paused_partitions",), "Partitions paused by backpressure", False, (), _total("paused_partitions")
    ),
    *(_tier_metric(name, text, True) for name, text in _TIER_COUNTERS.items()),
    _Metric(
        ("tier", "fallback_jobs"),
        "Jobs the tier answered for another tier (its fallback), by the tier they asked for",
        True,
        ("tier", "from"),
        lambda s: [
            ((tier, source), n)
            for tier, ts in sorted(s.tiers.items())
            for source, n in sorted(ts.fallback_jobs.items())
        ],
    ),
    _Metric(
        ("tier", "verify_compared"),
        "Batched answers compared with the job asked alone",
        True,
        ("tier", "size"),
        _agreement("compared"),
    ),
    _Metric(
        ("tier", "verify_agreed"),
        "Compared batched answers that agreed",
        True,
        ("tier", "size"),
        _agreement("agreed"),
    ),
    *(_tier_metric(name, text, False) for name, text in _TIER_GAUGES.items()),
    _Metric(
        ("tier", "limit_reason"),
        "1 for the reason the deployment's concurrency limit is where it is, 0 for the others: "
        + ", ".join(LIMIT_REASONS),
        False,
        ("tier", "deployment", "reason"),
        _limit_reasons,
    ),
    *LANE_METRICS,
    *SOURCE_METRICS,
    *TENANT_METRICS,
    *QUOTA_METRICS,
    _Metric(
        ("consumer_lag_records",),
        "Log end offset minus the group's committed offset, per partition this instance owns",
        False,
        ("topic", "partition"),
        lambda s: [((t, str(p)), v.records) for (t, p), v in sorted(s.lag.items())],
    ),
    _Metric(
        ("oldest_uncommitted_age_seconds",),
        "Age of the oldest read and uncommitted job per owned partition (grows while a watermark stalls)",
        False,
        ("topic", "partition"),
        lambda s: [((t, str(p)), v.oldest_age_s) for (t, p), v in sorted(s.lag.items())],
    ),
)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class StatsCollector(Collector):
    def __init__(self, stats: ServiceStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        for metric in METRICS:
            family = CounterMetricFamily if metric.counter else GaugeMetricFamily
            fam = family("promptbus_" + "_".join(metric.path), metric.help, labels=list(metric.labels))
            for values, value in metric.samples(self._stats):
                fam.add_metric(list(values), value)
            yield fam
        for spec in HISTOGRAMS:
            hist = HistogramMetricFamily("promptbus_" + spec.name, spec.help, labels=list(spec.labels))
            for label_values, h in self._stats.latency.series(spec):
                buckets = [(_le(bound), n) for bound, n in h.cumulative()]
                hist.add_metric(list(label_values), buckets, h.sum)
            yield hist


def register_otel_metrics(meter_provider: Any, stats: ServiceStats) -> None:
    """Observable OpenTelemetry instruments for what /metrics serves (dotted names, e.g.
    `promptbus.tier.provider_requests` with a `tier` attribute), read at each export; the
    latency histograms as OTel histograms with the same bounds, recorded as they are observed."""
    meter = meter_provider.get_meter("promptbus")

    def observe(metric: _Metric) -> Callable[[CallbackOptions], list[Observation]]:
        return lambda _options: [
            Observation(value, dict(zip(metric.labels, values, strict=True)))
            for values, value in metric.samples(stats)
        ]

    for metric in METRICS:
        create = meter.create_observable_counter if metric.counter else meter.create_observable_gauge
        create("promptbus." + ".".join(metric.path), [observe(metric)], description=metric.help)
    stats.latency.bind_otel(meter)


def _json(value: Any, status: int = 200) -> web.Response:
    """A compact JSON body typed `application/json` (no charset parameter: JSON is UTF-8)."""
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def build_app(stats: ServiceStats, is_ready: Callable[[], bool]) -> web.Application:
    """The endpoints: `/metrics` (Prometheus text exposition of `stats`), `/healthz` (200 while
    the process serves) and `/readyz` (200 once `is_ready()`, else 503). GET and HEAD each."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats))

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ready = is_ready()
        return _json({"ready": ready}, status=200 if ready else 503)

    # "/metrics/" is redirected to "/metrics", as scrapers configured either way expect
    trailing = web.normalize_path_middleware(
        append_slash=False, remove_slash=True, redirect_class=web.HTTPTemporaryRedirect
    )
    app = web.Application(middlewares=[trailing])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


#: how long stop() waits for a scrape in progress; the endpoints answer at once
_SHUTDOWN_TIMEOUT_S = 1.0


class MetricsServer:
    """The endpoints served by aiohttp in the current loop; `stop()` shuts them down."""

    def __init__(self, app: web.Application, port: int, host: str = "0.0.0.0") -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        self._host = host
        self._port = port
        self._started = False

    async def start(self) -> None:
        """Listen and serve. Raises ConfigError when the address cannot be listened on.

        The socket is bound here, before anything is set up, so a port in use or not allowed
        is one config error naming the address, and nothing is left to clean up.
        """
        try:
            family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
            listener = socket.create_server((self._host, self._port), family=family)
        except OSError as exc:
            where = f"{self._host}:{self._port}"
            raise ConfigError("PROMPTBUS_METRICS_PORT", f"cannot listen on {where}: {exc.strerror}") from None
        try:
            await self._runner.setup()
            self._started = True
            await web.SockSite(self._runner, listener).start()
        except BaseException:
            listener.close()
            raise

    async def stop(self) -> None:
        """Stop listening, close connections, wait a bounded time for a scrape in progress."""
        if self._started:
            self._started = False
            await self._runner.cleanup()
