"""OpenTelemetry: traces per job, per model request (linked to its jobs) and per provider call.

Tracing is on when an exporter is configured (`OTEL_TRACES_EXPORTER=console`, or `otlp` when
`opentelemetry-exporter-otlp` is installed) or when a TracerProvider is injected (tests). A job
continues the `traceparent` its producer put in the record headers; results and dead letters
carry the job span's `traceparent`. When tracing is off every method is a cheap no-op.

Metrics are exported through OTel too when `OTEL_METRICS_EXPORTER` is set (`console`, or
`otlp` when installed; every `OTEL_METRIC_EXPORT_INTERVAL` ms): `meter_provider_from_env`
here, the instruments in `consumer.runtime.metrics.register_otel_metrics`, which read the same
`ServiceStats` as Prometheus `/metrics` and `promptbus stats`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Link, Span, Status, StatusCode

from consumer.core.jobs import Job

log = logging.getLogger(__name__)


def _exporter_from_env(variable: str, what: str, console: Callable[[], Any], otlp: tuple[str, str]) -> Any:
    """The exporter an OTEL_*_EXPORTER variable names: `console`, `otlp` (when
    opentelemetry-exporter-otlp is installed; `otlp` is its module and class), else None."""
    name = os.environ.get(variable, "none").strip().lower()
    if name in ("", "none"):
        return None
    if name == "console":
        return console()
    if name == "otlp":
        module, cls = otlp
        try:
            return getattr(importlib.import_module(module), cls)()
        except ImportError:
            log.warning("%s=otlp needs opentelemetry-exporter-otlp; %s stays off", variable, what)
            return None
    log.warning("unknown %s %r; %s stays off", variable, name, what)
    return None


def _tracer_provider_from_env() -> TracerProvider | None:
    exporter = _exporter_from_env(
        "OTEL_TRACES_EXPORTER",
        "tracing",
        ConsoleSpanExporter,
        ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    )
    if exporter is None:
        return None
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def meter_provider_from_env() -> MeterProvider | None:
    """A MeterProvider exporting periodically, when OTEL_METRICS_EXPORTER names an exporter."""
    exporter = _exporter_from_env(
        "OTEL_METRICS_EXPORTER",
        "OTel metric export",
        ConsoleMetricExporter,
        ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    )
    if exporter is None:
        return None
    # the reader takes its interval from OTEL_METRIC_EXPORT_INTERVAL (default 60 s)
    return MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter)])


class Telemetry:
    """Spans for the pipeline. `enabled` is False when no exporter/provider is configured."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._provider = tracer_provider if tracer_provider is not None else _tracer_provider_from_env()
        self.enabled = self._provider is not None
        self._tracer = self._provider.get_tracer("promptbus") if self._provider is not None else None

    @classmethod
    def disabled(cls) -> Telemetry:
        t = cls.__new__(cls)
        t._provider = None
        t.enabled = False
        t._tracer = None
        return t

    def start_job(self, job: Job, headers: Sequence[tuple[str, bytes | None]]) -> Span | None:
        """A span per job, continuing the producer's traceparent when the record has one."""
        if self._tracer is None:
            return None
        # Kafka allows a header without a value (None); the propagator ignores what is not valid
        carrier = {
            k: v.decode("latin-1") for k, v in headers if k in ("traceparent", "tracestate") and v is not None
        }
        parent = propagate.extract(carrier)
        return self._tracer.start_span(
            "promptbus.job",
            context=parent,
            attributes={"promptbus.job.id": job.id, "promptbus.tier": job.tier, "promptbus.batch": job.batch},
        )

    def end_job(self, span: Span | None, *, ok: bool) -> None:
        if span is None:
            return
        if not ok:
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def traceparent(self, span: Span | None) -> str | None:
        if span is None:
            return None
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent")

    @contextlib.contextmanager
    def provider_call(self, tier: str, job_spans: Sequence[Span | None]) -> Iterator[Span | None]:
        """A span per model request (linked to every job it carries) around its provider call."""
        if self._tracer is None:
            yield None
            return
        links = [Link(s.get_span_context()) for s in job_spans if s is not None]
        with (
            self._tracer.start_as_current_span(
                "promptbus.request",
                links=links,
                attributes={"promptbus.tier": tier, "promptbus.request.size": len(job_spans)},
            ),
            self._tracer.start_as_current_span(
                "provider.complete", attributes={"promptbus.tier": tier}
            ) as span,
        ):
            yield span

    def record_error(self, span: Span | None, exc: BaseException) -> None:
        if span is None:
            return
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute("promptbus.error", type(exc).__name__)

    def shutdown(self) -> None:
        if self._provider is not None and hasattr(self._provider, "shutdown"):
            self._provider.shutdown()
