"""Telemetry in the conventions backends read, in-process: GenAI call spans and metrics,
messaging spans, the exporters the SDK's variables name, and nothing at all while off.

The end-to-end check (a real `promptbus run` exporting over OTLP to a receiver) is
tests/service/test_otlp_export.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from consumer.core.completion import ChatMessage, Completion, CompletionRequest, Usage
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import RateLimited
from consumer.core.jobs import Job, decode_job
from consumer.kafka.intake import InRecord
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.telemetry import CAPTURE_CONTENT_ENV, CallTarget, Telemetry, service_resource
from consumer.telemetry.genai import NO_CALL, OPERATION_DURATION_BOUNDS_S, TOKEN_USAGE_BOUNDS
from consumer.telemetry.sdk import exporters_from_env

PROMPT = "Classify: the secret text"
REQUEST = CompletionRequest(
    (ChatMessage("system", "be brief"), ChatMessage("user", PROMPT)),
    "gpt-test",
    {"temperature": 0, "max_tokens": 50, "top_p": 0.5, "seed": 3, "stop": ["\n\n"]},
)
ANSWER = Completion(
    "positive",
    "stop",
    usage=Usage(120, 7),
    provider="openai",
    model="gpt-test-0613",
    request_id="req_1",
    response_id="chatcmpl-1",
)


def _record(key: bytes | None = b"job-1", headers: tuple[tuple[str, bytes | None], ...] = ()) -> InRecord:
    """A job record read from partition 3 of promptbus.jobs at offset 42."""
    return InRecord(SourceOffset(TopicPartition("promptbus.jobs", 3), 42), key, b"{}", headers, 0)


def _outcome(topic: str, key: bytes | None) -> OutRecord:
    return OutRecord(topic, key, b"{}")


def _job(job_id: str = "job-1") -> Job:
    return decode_job(orjson.dumps({"id": job_id, "tier": "small", "prompt": PROMPT, "batch": True}))


def _tracing(**kwargs: Any) -> tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    return Telemetry(provider, MeterProvider(metric_readers=[reader]), group_id="pb", **kwargs), spans, reader


def _finished(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


#: what every call of tier small (openai_compat at http://llm.internal:8080/v1) says of it
SMALL = {
    "gen_ai.provider.name": "openai",
    "gen_ai.system": "openai",
    "server.address": "llm.internal",
    "server.port": 8080,
    "promptbus.tier": "small",
    "promptbus.provider": "openai_compat",
}


def test_a_tiers_target_names_host_and_port_never_its_user_info() -> None:
    target = CallTarget.of("small", "openai_compat", "http://user:pass@llm.internal:8080/v1")
    assert target.span_attributes == SMALL
    assert "pass" not in repr(target)
    anthropic = CallTarget.of("big", "anthropic", "https://api.anthropic.com")
    assert anthropic.metric_attributes == {
        "gen_ai.provider.name": "anthropic",
        "server.address": "api.anthropic.com",
        "server.port": 443,
    }


def test_a_call_of_one_job_is_a_genai_client_span_under_it() -> None:
    telemetry, spans, _ = _tracing()
    job_span = telemetry.start_job(_job(), _record())
    target = telemetry.call_target("small", "openai_compat", "http://llm.internal:8080/v1")
    with telemetry.provider_call(target, REQUEST, [job_span]) as call:
        call.answered(ANSWER)
    telemetry.end_job(job_span, _outcome("promptbus.results", b"job-1"))
    (chat,) = _finished(spans, "chat gpt-test")
    assert chat.kind is SpanKind.CLIENT
    assert job_span is not None and chat.parent is not None
    assert chat.parent.span_id == job_span.get_span_context().span_id
    assert dict(chat.attributes or {}) == {
        **SMALL,
        "promptbus.request.size": 1,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.max_tokens": 50,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 0.5,
        "gen_ai.request.seed": 3,
        "gen_ai.request.stop_sequences": ("\n\n",),
        "gen_ai.response.model": "gpt-test-0613",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 7,
        "promptbus.provider.request_id": "req_1",
    }
    assert not chat.events, "no content unless opted in"


def test_a_packed_request_is_its_own_trace_linked_both_ways() -> None:
    telemetry, spans, _ = _tracing()
    jobs = [telemetry.start_job(_job(f"job-{i}"), _record(key=f"job-{i}".encode())) for i in range(3)]
    target = telemetry.call_target("small", "openai", "https://api.openai.com/v1")
    with telemetry.provider_call(target, REQUEST, jobs) as call:
        call.answered(ANSWER)
    for span in jobs:
        telemetry.end_job(span, _outcome("promptbus.results", None))
    (chat,) = _finished(spans, "chat gpt-test")
    assert chat.parent is None
    job_contexts = [s.get_span_context() for s in jobs if s is not None]
    assert [link.context.span_id for link in chat.links] == [c.span_id for c in job_contexts]
    assert len({c.trace_id for c in job_contexts}) == 3 and chat.context.trace_id not in {
        c.trace_id for c in job_contexts
    }
    assert chat.attributes is not None and chat.attributes["promptbus.request.size"] == 3
    for job_span in _finished(spans, "process promptbus.jobs"):
        assert [link.context.span_id for link in job_span.links] == [chat.context.span_id]


def test_job_and_send_spans_speak_kafka() -> None:
    telemetry, spans, _ = _tracing()
    producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    span = telemetry.start_job(_job(), _record(headers=(("traceparent", producer.encode()),)))
    assert telemetry.traceparent(span) == (
        f"00-4bf92f3577b34da6a3ce929d0e0e4736-{span.get_span_context().span_id:016x}-01"  # type: ignore[union-attr]
    )
    telemetry.end_job(span, _outcome("promptbus.dlq", b"job-1"), error="retries_exhausted")
    (process,) = _finished(spans, "process promptbus.jobs")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None and process.parent.span_id == 0x00F067AA0BA902B7
    assert dict(process.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "promptbus.jobs",
        "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 42,
        "messaging.consumer.group.name": "pb",
        "messaging.kafka.message.key": "job-1",
        "promptbus.job.id": "job-1",
        "promptbus.tier": "small",
        "promptbus.batch": True,
        "error.type": "retries_exhausted",
    }
    assert process.status.status_code is StatusCode.ERROR
    (send,) = _finished(spans, "send promptbus.dlq")
    assert send.kind is SpanKind.PRODUCER and send.parent is not None
    assert send.parent.span_id == process.context.span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "promptbus.dlq",
        "messaging.kafka.message.key": "job-1",
        "promptbus.outcome": "dead_letter",
    }


def test_a_key_without_text_form_is_left_out() -> None:
    telemetry, spans, _ = _tracing()
    telemetry.end_job(telemetry.start_job(_job(), _record(key=b"\xff\xfe")))
    (process,) = _finished(spans, "process promptbus.jobs")
    assert "messaging.kafka.message.key" not in (process.attributes or {})


def test_a_failed_call_names_its_error_class_and_status() -> None:
    telemetry, spans, reader = _tracing()
    target = telemetry.call_target("small", "openai", "https://api.openai.com/v1")
    with telemetry.provider_call(target, REQUEST, [None]) as call:
        call.failed(RateLimited("429 Too Many Requests: quota text", status_code=429, provider="openai"))
    (chat,) = _finished(spans, "chat gpt-test")
    attributes = chat.attributes or {}
    assert (attributes["error.type"], attributes["http.response.status_code"]) == ("RateLimited", 429)
    assert chat.status.status_code is StatusCode.ERROR and chat.status.description == "RateLimited"
    assert "gen_ai.usage.input_tokens" not in attributes
    points = _points(reader, "gen_ai.client.operation.duration")
    assert [p.attributes["error.type"] for p in points] == ["RateLimited"]  # type: ignore[index]
    assert not _points(reader, "gen_ai.client.token.usage"), "no tokens without an answer"


async def test_a_cancelled_call_ends_its_span() -> None:
    telemetry, spans, _ = _tracing()
    target = telemetry.call_target("small", "openai", "https://api.openai.com/v1")

    async def call() -> None:
        with telemetry.provider_call(target, REQUEST, [None]):
            await asyncio.sleep(60)

    task = asyncio.create_task(call())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (chat,) = _finished(spans, "chat gpt-test")
    assert (chat.attributes or {})["error.type"] == "CancelledError"


def test_an_embeddings_call_counts_input_tokens_only() -> None:
    telemetry, spans, reader = _tracing()
    target = telemetry.call_target("small", "openai", "https://api.openai.com/v1")
    request = EmbeddingRequest(("a", "b"), "text-embedding-3-small", {"dimensions": 256})
    answer = Embeddings(((0.1,), (0.2,)), usage=Usage(9), provider="openai", model="text-embedding-3-small")
    with telemetry.provider_call(target, request, [None, None]) as call:
        call.answered(answer)
    (span,) = _finished(spans, "embeddings text-embedding-3-small")
    attributes = span.attributes or {}
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["gen_ai.embeddings.dimension.count"] == 256
    assert attributes["gen_ai.usage.input_tokens"] == 9
    assert "gen_ai.usage.output_tokens" not in attributes
    assert "gen_ai.response.finish_reasons" not in attributes
    tokens = _points(reader, "gen_ai.client.token.usage")
    assert [(p.attributes["gen_ai.token.type"], p.sum) for p in tokens] == [("input", 9)]  # type: ignore[index]


def test_the_genai_histograms_have_the_conventions_bounds() -> None:
    telemetry, _, reader = _tracing()
    target = telemetry.call_target("small", "openai", "https://api.openai.com/v1")
    with telemetry.provider_call(target, REQUEST, [None]) as call:
        call.answered(ANSWER)
    (duration,) = _points(reader, "gen_ai.client.operation.duration")
    assert tuple(duration.explicit_bounds) == OPERATION_DURATION_BOUNDS_S
    assert duration.attributes == {
        "gen_ai.provider.name": "openai",
        "server.address": "api.openai.com",
        "server.port": 443,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.response.model": "gpt-test-0613",
    }
    tokens = _points(reader, "gen_ai.client.token.usage")
    assert all(tuple(p.explicit_bounds) == TOKEN_USAGE_BOUNDS for p in tokens)
    by_type = {p.attributes["gen_ai.token.type"]: p.sum for p in tokens}  # type: ignore[index]
    assert by_type == {"input": 120, "output": 7}


def test_content_is_an_event_only_when_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    telemetry, spans, _ = _tracing()
    target = telemetry.call_target("small", "openai", "https://api.openai.com/v1")
    with telemetry.provider_call(target, REQUEST, [None]) as call:
        call.answered(ANSWER)
    (chat,) = _finished(spans, "chat gpt-test")
    (event,) = chat.events
    assert event.name == "gen_ai.client.inference.operation.details"
    attributes = event.attributes or {}
    assert orjson.loads(str(attributes["gen_ai.input.messages"])) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": PROMPT}]},
    ]
    assert orjson.loads(str(attributes["gen_ai.output.messages"])) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "positive"}], "finish_reason": "stop"}
    ]
    assert PROMPT not in str(chat.attributes), "never an attribute"


def test_tracing_off_builds_nothing() -> None:
    telemetry = Telemetry.disabled()
    assert telemetry.start_job(_job(), _record()) is None
    assert telemetry.traceparent(None) is None
    assert telemetry.call_target("small", "openai", "https://api.openai.com/v1") is None
    assert telemetry.provider_call(None, REQUEST, [None]) is NO_CALL
    with telemetry.provider_call(None, REQUEST, [None]) as call:
        call.answered(ANSWER)
    telemetry.end_job(None, _outcome("promptbus.results", b"job-1"), error="abandoned")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, [ConsoleSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, [OTLPSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "otlp_proto_http"}, [OTLPSpanExporter]),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            [OTLPSpanExporter],
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
            [OTLPSpanExporter],
        ),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, [ConsoleSpanExporter, OTLPSpanExporter]),
    ],
)
def test_the_trace_exporters_are_the_sdks_names(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[type]
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert [type(e) for e in exporters_from_env("traces")] == expected


def test_the_metric_exporters_follow_their_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,console")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    exporters = exporters_from_env("metrics")
    try:
        assert [type(e) for e in exporters] == [OTLPMetricExporter, ConsoleMetricExporter]
    finally:
        for e in exporters:
            e.shutdown()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
         "opentelemetry-exporter-otlp-proto-grpc"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "'http/json'"),
        ({"OTEL_TRACES_EXPORTER": "zipkin_json"}, "'zipkin_json': no such exporter is installed"),
    ],
)
def test_an_exporter_that_is_not_installed_is_named_and_stays_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="consumer.telemetry.sdk"):
        assert exporters_from_env("traces") == []
    assert says in caplog.text


def test_the_resource_names_the_service_unless_the_sdk_variables_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    attributes = service_resource("host-1-abc").attributes
    assert (attributes["service.name"], attributes["service.instance.id"]) == ("promptbus", "host-1-abc")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llm-jobs")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7,deployment.environment=prod")
    attributes = service_resource("host-1-abc").attributes
    assert attributes["service.name"] == "llm-jobs"
    assert attributes["service.instance.id"] == "pod-7"
    assert attributes["deployment.environment"] == "prod"


def _points(reader: InMemoryMetricReader, name: str) -> list[HistogramDataPoint]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, HistogramDataPoint)
    ]
