"""Prometheus `/metrics`, `/healthz`, `/readyz`, served in the service's own event loop, and
the same numbers as OpenTelemetry instruments (`register_otel_metrics`).

Both read `ServiceStats` when they are collected, so counters have one source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from consumer.core.errors import ConfigError
from consumer.runtime.stats import ServiceStats

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
}

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
    *(
        _Metric(("tier", name), text, True, ("tier",), _per_tier(name))
        for name, text in _TIER_COUNTERS.items()
    ),
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
    *(
        _Metric(("tier", name), text, False, ("tier",), _per_tier(name))
        for name, text in _TIER_GAUGES.items()
    ),
)


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


def register_otel_metrics(meter_provider: Any, stats: ServiceStats) -> None:
    """Observable OpenTelemetry instruments for what /metrics serves (dotted names, e.g.
    `promptbus.tier.provider_requests` with a `tier` attribute), read at each export."""
    meter = meter_provider.get_meter("promptbus")

    def observe(metric: _Metric) -> Callable[[CallbackOptions], list[Observation]]:
        return lambda _options: [
            Observation(value, dict(zip(metric.labels, values, strict=True)))
            for values, value in metric.samples(stats)
        ]

    for metric in METRICS:
        create = meter.create_observable_counter if metric.counter else meter.create_observable_gauge
        create("promptbus." + ".".join(metric.path), [observe(metric)], description=metric.help)


def build_app(stats: ServiceStats, is_ready: Callable[[], bool]) -> Starlette:
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        ready = is_ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    return Starlette(
        routes=[Route("/metrics", metrics), Route("/healthz", healthz), Route("/readyz", readyz)]
    )


class MetricsServer:
    """uvicorn in the current loop; `stop()` shuts it down."""

    def __init__(self, app: Starlette, port: int, host: str = "0.0.0.0") -> None:
        self._server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen and serve. Raises ConfigError when the address cannot be listened on.

        The socket is bound here, not by uvicorn: uvicorn answers a failed bind with
        `sys.exit(1)` inside its task, which tore the service's start-up down half way and
        left it hanging in its clean-up, deaf to SIGTERM.
        """
        config = self._server.config
        try:
            family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
            listener = socket.create_server((config.host, config.port), family=family)
        except OSError as exc:
            where = f"{config.host}:{config.port}"
            raise ConfigError("PROMPTBUS_METRICS_PORT", f"cannot listen on {where}: {exc.strerror}") from None
        self._task = asyncio.create_task(self._server.serve(sockets=[listener]), name="promptbus-metrics")
        while not self._server.started and not self._task.done():  # noqa: ASYNC110 - uvicorn offers no event
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
