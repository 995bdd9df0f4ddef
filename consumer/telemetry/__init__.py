"""OpenTelemetry: spans per job, per provider call and per outcome sent; GenAI client metrics.

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`: OTLP over HTTP/protobuf,
installed with promptbus; `console`; see `consumer.telemetry.sdk`) or when a TracerProvider is
injected (tests). One job's trace, as a backend draws it:

    process promptbus.jobs          CONSUMER  the job, admission to outcome (messaging.py);
    │                                         a child of the producer's span when the record's
    │                                         traceparent names one
    ├── chat MODEL                  CLIENT    its provider call, when it went alone (genai.py)
    └── send promptbus.results      PRODUCER  its result handed to the producer (or
                                              `send promptbus.dlq`, its dead letter)

A packed request's `chat MODEL` span is the root of a trace of its own and links the span of
every job it carries. Results and dead letters carry the job span's `traceparent` header, so
a result's trace is its job's (the producer's, when the job record carried one).

When tracing is off every method returns at once: no span, no attribute built, nothing
formatted per job. The GenAI histograms (`gen_ai.client.*`) are recorded per provider call
when a MeterProvider is given (`OTEL_METRICS_EXPORTER`, see `meter_provider_from_env`),
beside the promptbus instruments of `consumer.runtime.metrics.register_otel_metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from consumer import __version__
from consumer.core.completion import CompletionRequest
from consumer.core.embed import EmbeddingRequest
from consumer.core.jobs import Job
from consumer.telemetry.genai import (
    CAPTURE_CONTENT_ENV,
    NO_CALL,
    CallTarget,
    GenAIMetrics,
    NoCall,
    ProviderCall,
    content_capture_from_env,
)
from consumer.telemetry.messaging import (
    PROCESS,
    SEND,
    W3C,
    ConsumedRecord,
    ProducedRecord,
    process_attributes,
    producer_context,
    send_attributes,
)
from consumer.telemetry.sdk import meter_provider_from_env, service_resource, tracer_provider_from_env

__all__ = [
    "ABANDONED",
    "CAPTURE_CONTENT_ENV",
    "CallTarget",
    "Telemetry",
    "meter_provider_from_env",
    "service_resource",
    "tracer_provider_from_env",
]

#: the semantic conventions the spans follow (GenAI attributes as of this version)
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
#: `error.type` of a job span that ended without an outcome (it is read again)
ABANDONED = "abandoned"


class Telemetry:
    """Spans for the pipeline and the GenAI metrics. `enabled`: tracing is on.

    group_id: the consumer group the job spans name; meter_provider: where the GenAI client
    histograms go (None: not recorded); capture_content: prompt and answer text as span
    events (default: `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`).
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        *,
        group_id: str | None = None,
        resource: Any = None,
        capture_content: bool | None = None,
    ) -> None:
        if tracer_provider is None:
            tracer_provider = tracer_provider_from_env(resource)
        self._provider = tracer_provider
        self.enabled = self._provider is not None
        self._tracer = (
            self._provider.get_tracer("promptbus", __version__, schema_url=SCHEMA_URL)
            if self._provider is not None
            else None
        )
        self._metrics = GenAIMetrics(meter_provider) if meter_provider is not None else None
        self._group = group_id
        self._capture = content_capture_from_env() if capture_content is None else capture_content
        #: span names per (operation, topic), made once
        self._names: dict[tuple[str, str], str] = {}

    @classmethod
    def disabled(cls) -> Telemetry:
        """Tracing and GenAI metrics off, whatever the environment says."""
        t = cls.__new__(cls)
        t._provider = None
        t.enabled = False
        t._tracer = None
        t._metrics = None
        t._group = None
        t._capture = False
        t._names = {}
        return t

    # ------------------------------------------------------------------ jobs
    def start_job(self, job: Job, record: ConsumedRecord) -> Span | None:
        """The job's `process <topic>` span, continuing the producer's traceparent when the
        record carries a valid one."""
        tracer = self._tracer
        if tracer is None:
            return None
        attributes = process_attributes(record, self._group)
        attributes["promptbus.job.id"] = job.id
        attributes["promptbus.tier"] = job.tier
        attributes["promptbus.batch"] = job.batch
        return tracer.start_span(
            self._name(PROCESS, record.source.topic),
            context=producer_context(record.headers),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )

    def end_job(
        self, span: Span | None, sent: ProducedRecord | None = None, *, error: str | None = None
    ) -> None:
        """End the job's span: `sent`, its outcome record, gets its `send <topic>` span;
        `error`, why the job failed (its dead letter's kind, or `abandoned`)."""
        if span is None:
            return
        if sent is not None and self._tracer is not None:
            outcome = "result" if error is None else "dead_letter"
            self._tracer.start_span(
                self._name(SEND, sent.topic),
                context=trace.set_span_in_context(span),
                kind=SpanKind.PRODUCER,
                attributes=send_attributes(sent, outcome),
            ).end()
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def traceparent(self, span: Span | None) -> str | None:
        """The W3C `traceparent` of a job's span, for its outcome record's headers."""
        if span is None:
            return None
        carrier: dict[str, str] = {}
        W3C.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent")

    def _name(self, operation: str, topic: str) -> str:
        name = self._names.get((operation, topic))
        if name is None:
            name = self._names[(operation, topic)] = f"{operation} {topic}"
        return name

    # ------------------------------------------------------------------ provider calls
    def call_target(self, tier: str, provider: str, base_url: str) -> CallTarget | None:
        """A tier's fixed call attributes, made once per tier (None while nothing is recorded)."""
        if self._tracer is None and self._metrics is None:
            return None
        return CallTarget.of(tier, provider, base_url)

    def provider_call(
        self,
        target: CallTarget | None,
        request: CompletionRequest | EmbeddingRequest,
        traces: Sequence[Span | None],
    ) -> ProviderCall | NoCall:
        """What one provider call is traced with (`with` around it): its GenAI client span,
        linked to the spans of the jobs it carries (`traces`), and its metric points."""
        if target is None:
            return NO_CALL
        return ProviderCall(self._tracer, self._metrics, target, request, traces, capture=self._capture)

    def shutdown(self) -> None:
        """Export what is buffered and stop (the provider's own shutdown)."""
        if self._provider is not None and hasattr(self._provider, "shutdown"):
            self._provider.shutdown()
