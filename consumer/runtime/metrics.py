"""Prometheus `/metrics`, `/healthz`, `/readyz`, served in the service's own event loop, and
the same numbers as OpenTelemetry instruments (`register_otel_metrics`).

Both read `ServiceStats` when they are collected, so counters have one source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
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
}
VERIFY_COMPARED_HELP = "Batched answers compared with the job asked alone"
VERIFY_AGREED_HELP = "Compared batched answers that agreed"
_TIER_GAUGES = {
    "limit": "Current concurrency limit",
    "inflight": "Provider requests in flight",
    "batch_size": "Current adaptive batch size",
    "paused_s": "Seconds left in a quota pause",
    "budget_requests_per_s": "Refill rate of the provider's request budget, from its headers (0: none)",
    "budget_tokens_per_s": "Refill rate of the provider's token budget, from its headers (0: none)",
}


class StatsCollector(Collector):
    def __init__(self, stats: ServiceStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        s = self._stats
        yield CounterMetricFamily("promptbus_items_in", "Input records read", value=s.items_in)
        yield CounterMetricFamily("promptbus_results", "Results published", value=s.results)
        dl = CounterMetricFamily("promptbus_dead_letters", "Dead letters published", labels=["kind"])
        for kind, n in sorted(s.dead_letters.items()):
            dl.add_metric([kind], n)
        yield dl
        yield GaugeMetricFamily(
            "promptbus_inflight_items", "Input records not yet committable", value=s.inflight
        )
        yield GaugeMetricFamily(
            "promptbus_paused_partitions", "Partitions paused by backpressure", value=s.paused_partitions
        )
        for name, help_text in _TIER_COUNTERS.items():
            fam = CounterMetricFamily(f"promptbus_tier_{name}", help_text, labels=["tier"])
            for tier, ts in sorted(s.tiers.items()):
                fam.add_metric([tier], getattr(ts, name))
            yield fam
        compared = CounterMetricFamily(
            "promptbus_tier_verify_compared", VERIFY_COMPARED_HELP, labels=["tier", "size"]
        )
        agreed = CounterMetricFamily(
            "promptbus_tier_verify_agreed", VERIFY_AGREED_HELP, labels=["tier", "size"]
        )
        for tier, per_size in sorted(s.agreement.snapshot().items()):
            for size, count in per_size.items():
                compared.add_metric([tier, str(size)], count.compared)
                agreed.add_metric([tier, str(size)], count.agreed)
        yield compared
        yield agreed
        for name, help_text in _TIER_GAUGES.items():
            gfam = GaugeMetricFamily(f"promptbus_tier_{name}", help_text, labels=["tier"])
            for tier, ts in sorted(s.tiers.items()):
                gfam.add_metric([tier], getattr(ts, name))
            yield gfam


def register_otel_metrics(meter_provider: Any, stats: ServiceStats) -> None:
    """Observable OpenTelemetry instruments for what /metrics serves (dotted names, e.g.
    `promptbus.tier.provider_requests` with a `tier` attribute), read at each export."""
    meter = meter_provider.get_meter("promptbus")

    def total(value_of: Callable[[], float]) -> list[Callable[[CallbackOptions], list[Observation]]]:
        return [lambda _options: [Observation(value_of())]]

    def per_tier(field: str) -> list[Callable[[CallbackOptions], list[Observation]]]:
        return [
            lambda _options: [
                Observation(getattr(ts, field), {"tier": tier}) for tier, ts in sorted(stats.tiers.items())
            ]
        ]

    def dead_letters(_options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"kind": kind}) for kind, n in sorted(stats.dead_letters.items())]

    meter.create_observable_counter(
        "promptbus.items_in", total(lambda: stats.items_in), description="Input records read"
    )
    meter.create_observable_counter(
        "promptbus.results", total(lambda: stats.results), description="Results published"
    )
    meter.create_observable_counter(
        "promptbus.dead_letters", [dead_letters], description="Dead letters published"
    )
    meter.create_observable_gauge(
        "promptbus.inflight_items",
        total(lambda: stats.inflight),
        description="Input records not yet committable",
    )
    meter.create_observable_gauge(
        "promptbus.paused_partitions",
        total(lambda: stats.paused_partitions),
        description="Partitions paused by backpressure",
    )

    def agreement(field: str) -> list[Callable[[CallbackOptions], list[Observation]]]:
        return [
            lambda _options: [
                Observation(getattr(count, field), {"tier": tier, "size": str(size)})
                for tier, per_size in sorted(stats.agreement.snapshot().items())
                for size, count in per_size.items()
            ]
        ]

    for name, help_text in _TIER_COUNTERS.items():
        meter.create_observable_counter(f"promptbus.tier.{name}", per_tier(name), description=help_text)
    meter.create_observable_counter(
        "promptbus.tier.verify_compared", agreement("compared"), description=VERIFY_COMPARED_HELP
    )
    meter.create_observable_counter(
        "promptbus.tier.verify_agreed", agreement("agreed"), description=VERIFY_AGREED_HELP
    )
    for name, help_text in _TIER_GAUGES.items():
        meter.create_observable_gauge(f"promptbus.tier.{name}", per_tier(name), description=help_text)


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
        self._task = asyncio.create_task(self._server.serve(), name="promptbus-metrics")
        while not self._server.started and not self._task.done():  # noqa: ASYNC110 - uvicorn offers no event
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
