"""Tracing (traceparent continued, spans per job, provider call and outcome sent), the metrics
endpoints and the same metrics through OpenTelemetry."""

from __future__ import annotations

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer.runtime.latency import JOB_LATENCY
from consumer.telemetry import meter_provider_from_env
from consumer.testing.harness import (
    InProcessService,
    job,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.ports import free_port
from consumer.testing.simulator import SimulatorConfig, SimulatorServer

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_trace_continues_from_job_headers_and_metrics_are_served(kafka_bootstrap: str) -> None:
    port = free_port()
    settings = settings_from_env(
        service_env(
            kafka_bootstrap, partitions=1, PROMPTBUS_METRICS_PORT=port, PROMPTBUS_METRICS_HOST="127.0.0.1"
        )
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    jobs = [job(i, batch=True) for i in range(3)]
    async with SimulatorServer(SimulatorConfig()) as base_url:
        service = InProcessService(
            settings,
            tier_file_dict(base_url + "/v1", max_items=3),
            tracer_provider=provider,
            meter_provider=meters,
        )
        async with service:
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await producer.start()
            try:
                for i, j in enumerate(jobs):
                    header = f"00-{TRACE_ID}-{i + 1:016x}-01".encode()
                    await producer.send(
                        settings.jobs_topic,
                        orjson.dumps(j),
                        key=j["id"].encode(),
                        headers=[("traceparent", header)],
                    )
                await producer.flush()  # one produce batch: the three jobs arrive in one fetch
            finally:
                await producer.stop()
            outcomes = await wait_for_outcomes(settings, {j["id"] for j in jobs}, timeout_s=60)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                metrics = (await client.get("/metrics")).text
                health = await client.get("/healthz")
                ready = await client.get("/readyz")
            otel = _otel_values(reader)

    assert len(outcomes.results) == 3
    spans = exporter.get_finished_spans()
    job_spans = [s for s in spans if s.name == f"process {settings.jobs_topic}"]
    assert len(job_spans) == 3
    assert {format(s.context.trace_id, "032x") for s in job_spans} == {TRACE_ID}, "traceparent continued"
    request_spans = [s for s in spans if s.name == "chat sim-model"]
    assert request_spans and max(len(s.links) for s in request_spans) == 3, "a batched request links its jobs"
    linked = {link.context.span_id for s in request_spans for link in s.links}
    assert {s.context.span_id for s in job_spans} <= linked
    packed = next(s for s in request_spans if len(s.links) == 3)
    assert packed.parent is None, "a request of several jobs is a trace of its own"
    sent = [s for s in spans if s.name == f"send {settings.results_topic}"]
    assert sorted(s.parent.span_id for s in sent if s.parent) == sorted(s.context.span_id for s in job_spans)

    # every result carries its job span's traceparent
    consumer = AIOKafkaConsumer(
        settings.results_topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=5000)
        headers = [dict(r.headers) for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()
    assert len(headers) == 3
    assert all(h["traceparent"].decode().split("-")[1] == TRACE_ID for h in headers)
    assert all(h["promptbus-source"].decode().startswith(settings.jobs_topic + "/0/") for h in headers)

    assert health.status_code == 200
    assert ready.status_code == 200
    assert 'promptbus_tier_provider_requests_total{tier="small"} 1.0' in metrics
    assert 'promptbus_tier_requests_saved_total{tier="small"} 2.0' in metrics
    assert 'promptbus_tier_budget_tokens_per_s{tier="small"} 0.0' in metrics, "no budget announced"
    assert "promptbus_results_total 3.0" in metrics

    # the same numbers through OpenTelemetry
    assert otel[("promptbus.results", ())] == 3
    assert otel[("promptbus.tier.provider_requests", (("tier", "small"),))] == 1
    assert otel[("promptbus.tier.requests_saved", (("tier", "small"),))] == 2
    assert ("promptbus.tier.limit", (("tier", "small"),)) in otel
    # latency histograms: one per job in Prometheus and in OTel, with the same bounds
    job_labels = (("lane", "default"), ("outcome", "result"), ("tier", "small"))
    assert 'promptbus_job_latency_seconds_count{lane="default",outcome="result",tier="small"} 3.0' in metrics
    assert 'promptbus_queue_wait_seconds_count{lane="default",tier="small"} 3.0' in metrics
    assert 'promptbus_provider_request_seconds_count{outcome="ok",tier="small"} 1.0' in metrics
    assert otel[("promptbus.job_latency_seconds", job_labels)] == 3
    assert otel[("promptbus.job_latency_seconds.bounds", job_labels)] == JOB_LATENCY.bounds
    assert otel[("promptbus.provider_request_seconds", (("outcome", "ok"), ("tier", "small")))] == 1


async def test_null_and_garbage_trace_headers_start_new_traces(kafka_bootstrap: str) -> None:
    """Kafka allows a header without a value, and producers send anything: such a job is
    processed like any other, its span the root of a new trace."""
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=1))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    odd_headers: list[list[tuple[str, bytes | None]]] = [
        [("traceparent", None)],
        [("traceparent", b"\xff\xfe not a traceparent"), ("tracestate", None)],
        [("traceparent", f"00-{TRACE_ID}-0000000000000000-01".encode())],  # an all-zero span id is invalid
    ]
    jobs = [job(i, batch=False) for i in range(len(odd_headers))]
    async with SimulatorServer(SimulatorConfig()) as base_url:
        async with InProcessService(settings, tier_file_dict(base_url + "/v1"), tracer_provider=provider):
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await producer.start()
            try:
                for j, headers in zip(jobs, odd_headers, strict=True):
                    await producer.send_and_wait(
                        settings.jobs_topic, orjson.dumps(j), key=j["id"].encode(), headers=headers
                    )
            finally:
                await producer.stop()
            outcomes = await wait_for_outcomes(settings, {j["id"] for j in jobs}, timeout_s=60)
    assert set(outcomes.results) == {j["id"] for j in jobs} and not outcomes.dead
    job_spans = [s for s in exporter.get_finished_spans() if s.name == f"process {settings.jobs_topic}"]
    assert len(job_spans) == len(jobs)
    assert all(s.parent is None for s in job_spans), "nothing valid to continue: new traces"


def _otel_values(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, object], ...]], float]:
    """{(instrument name, sorted attributes): value} of one collection."""
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[tuple[str, tuple[tuple[str, object], ...]], float] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = tuple(sorted((point.attributes or {}).items()))
                    # a histogram's point by its count (and its bounds under "<name>.bounds")
                    if isinstance(point, HistogramDataPoint):
                        out[(metric.name, attributes)] = point.count
                        out[(metric.name + ".bounds", attributes)] = tuple(point.explicit_bounds)
                    else:
                        out[(metric.name, attributes)] = point.value  # type: ignore[union-attr]
    return out


@pytest.mark.parametrize(("value", "on"), [("none", False), ("console", True), ("bogus", False)])
def test_otel_metrics_follow_the_exporter_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", value)
    provider = meter_provider_from_env()
    try:
        assert (provider is not None) == on
    finally:
        if provider is not None:
            provider.shutdown()
