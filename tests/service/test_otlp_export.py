"""What a real `promptbus run` exports over OTLP/HTTP, as a collector receives it.

A `promptbus run` process (OTEL_TRACES_EXPORTER=otlp, OTEL_METRICS_EXPORTER=otlp, the SDK's
OTEL_EXPORTER_OTLP_* variables) on the real broker, a `promptbus simulate` process as the
provider, reached through a recording proxy that keeps every answer the provider gave (so the
spans' GenAI values are checked against what the provider said, not against promptbus), and
the test OTLP receiver (`consumer.testing.otlp`) decoding the protobuf bodies. The jobs carry
their own `traceparent` headers (one trace each), some are packed (batch: true), some go alone,
two are embed jobs, one has no traceparent, one is past its deadline and one is for a tier
whose key the provider refuses.

The exporter configuration itself (per-signal endpoints over the general one, `otlp` by its
protocol variable) is checked in-process against the same receiver.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import client_kwargs
from consumer.kafka.intake import InRecord
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.settings import Settings
from consumer.telemetry import Telemetry, meter_provider_from_env
from consumer.telemetry.genai import OPERATION_DURATION_BOUNDS_S, TOKEN_USAGE_BOUNDS
from consumer.testing.harness import create_topics, job, service_env, settings_from_env, tier_file_dict
from consumer.testing.otlp import OtlpReceiver, ReceivedSpan, serve_loopback, waterfall
from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_port
from consumer.testing.process import ServiceProcess, start_simulator

pytestmark = pytest.mark.integration

RIGHT_KEY = "sk-right-" + secrets.token_hex(8)
WRONG_KEY = "sk-wrong-" + secrets.token_hex(8)
PACKED = 4
OUTCOME_WAIT_S = 90.0
EXPORT_WAIT_S = 30.0


@dataclass
class ProviderRecorder:
    """A reverse proxy on 127.0.0.1 in front of the provider: every 200 answer of a chat or
    embeddings call is kept (`answers`: path, body), as the service received it."""

    upstream: str
    answers: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ProviderRecorder:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner, self.port = await serve_loopback(app)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        skip = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=await request.read()
        ) as upstream:
            body = await upstream.read()
            answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in skip}
            if upstream.status == 200 and request.path.endswith(("/chat/completions", "/embeddings")):
                self.answers.append((request.path, orjson.loads(body)))
            return web.Response(status=upstream.status, body=body, headers=answer_headers)


@dataclass(frozen=True)
class SentJob:
    """A job as produced: its record value, and the producer's span it continues (if any)."""

    value: dict[str, Any]
    trace_id: str | None
    span_id: str | None
    texts: tuple[str, ...]

    @property
    def id(self) -> str:
        return str(self.value["id"])


def _traced(value: dict[str, Any], *texts: str, traced: bool = True) -> SentJob:
    if not traced:
        return SentJob(value, None, None, texts)
    return SentJob(value, secrets.token_hex(16), secrets.token_hex(8), texts)


def _jobs(tier: str = "small") -> list[SentJob]:
    """The run's jobs; every prompt text, variable and input holds a marker that must never be
    exported."""

    def secret(what: str) -> str:
        return f"SECRET-{what}-{secrets.token_hex(6)}"

    jobs = []
    for i in range(PACKED):
        text = secret(f"packed{i}")
        jobs.append(_traced(job(i, batch=True, text=text), text))
    for i in (10, 11):
        text = secret(f"alone{i}")
        jobs.append(_traced(job(i, batch=False, text=text), text))
    text = secret("untraced")
    jobs.append(_traced(job(12, batch=False, text=text), text, traced=False))
    system, user = secret("system"), secret("user")
    chat = {"id": "chat-13", "tier": tier, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user},
    ]}
    jobs.append(_traced(chat, system, user))
    for i in (14, 15):
        text = secret(f"embed{i}")
        jobs.append(_traced({"id": f"emb-{i}", "tier": tier, "kind": "embed", "input": text}, text))
    text = secret("late")
    jobs.append(_traced(job(16, batch=False, text=text, deadline="2001-01-01T00:00:00Z"), text))
    text = secret("locked")
    jobs.append(_traced(job(17, batch=False, text=text, tier="locked"), text))
    return jobs


async def _produce(settings: Settings, jobs: list[SentJob]) -> None:
    producer = AIOKafkaProducer(**client_kwargs(settings))
    await producer.start()
    try:
        for j in jobs:
            headers = []
            if j.trace_id is not None:
                headers.append(("traceparent", f"00-{j.trace_id}-{j.span_id}-01".encode()))
            value = orjson.dumps(j.value)
            await producer.send(settings.jobs_topic, value, key=j.id.encode(), headers=headers)
        await producer.flush()  # one produce batch: the packed jobs arrive in one fetch
    finally:
        await producer.stop()


@dataclass(frozen=True)
class Outcome:
    topic: str
    value: dict[str, Any]
    headers: dict[str, bytes]


async def _outcomes(settings: Settings, ids: set[str]) -> dict[str, Outcome]:
    """Every job's result or dead letter with its headers, once all arrived (bounded)."""
    tps = [
        TopicPartition(topic, p)
        for topic in (settings.results_topic, settings.dlq_topic)
        for p in await topic_partitions(settings, topic)
    ]
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **client_kwargs(settings))
    await consumer.start()
    found: dict[str, Outcome] = {}
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = asyncio.get_running_loop().time() + OUTCOME_WAIT_S
        while not ids <= set(found) and asyncio.get_running_loop().time() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for r in records:
                    value = orjson.loads(r.value)
                    found[value["id"]] = Outcome(tp.topic, value, dict(r.headers))
    finally:
        await consumer.stop()
    return found


@pytest.fixture
def simulator() -> Iterator[int]:
    port = free_port()
    proc = start_simulator(port, f"latency_ms=5,api_key={RIGHT_KEY}")
    try:
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _tier_file(base_url: str, keys: Path) -> dict[str, Any]:
    """`small`'s key from a command and `locked`'s (the wrong one) from a file: each of the
    key sources must stay out of the spans and logs, as a key from the environment does."""
    tiers = tier_file_dict(
        base_url + "/v1", max_items=PACKED, options={"temperature": 0.2, "max_tokens": 64},
    )
    (keys / "right.key").write_text(RIGHT_KEY + "\n")
    (keys / "wrong.key").write_text(WRONG_KEY + "\n")
    tiers["tiers"]["small"]["api_key_command"] = ["cat", str(keys / "right.key")]
    tiers["tiers"]["locked"] = {
        **{k: v for k, v in tiers["tiers"]["small"].items() if k != "api_key_command"},
        "api_key_file": str(keys / "wrong.key"),
    }
    return tiers


async def test_a_real_run_exports_genai_and_messaging_telemetry(
    kafka_bootstrap: str, simulator: int, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=2)
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = _jobs()
    async with OtlpReceiver() as receiver, ProviderRecorder(f"http://127.0.0.1:{simulator}") as provider:
        otel = {
            **_documented_env(),  # docs/metrics.md's example, its collector this receiver
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-token=test-token",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
        }
        tiers = _tier_file(f"http://127.0.0.1:{provider.port}", tmp_path)
        service = ServiceProcess({**env, **otel}, tiers, tmp_path)
        service.start()
        try:
            await _produce(settings, jobs)
            outcomes = await _outcomes(settings, {j.id for j in jobs})
            assert set(outcomes) == {j.id for j in jobs}, service.log_tail()
            code = await asyncio.to_thread(service.terminate, 60)  # a thread: the receiver answers
            assert code == 0, service.log_tail()
        finally:
            service.ensure_stopped()
        # what the last exports (at shutdown) carried has arrived once the process exited
        spans = receiver.spans()
        print(_packed_trace(spans))

    _check_wire(receiver, jobs)
    process = _check_job_spans(spans, jobs, outcomes, settings)
    _check_send_spans(spans, jobs, outcomes, process, settings)
    _check_provider_spans(spans, jobs, provider, process, simulator_port=provider.port)
    _check_result_traceparents(jobs, outcomes, process)
    _check_metrics(receiver, provider)


def _documented_env() -> dict[str, str]:
    """The variables docs/metrics.md's example exports before `promptbus run`."""
    text = (REPO_ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    block = text.split("<!-- otlp-example", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    env: dict[str, str] = {}
    lines = [line.split("#", 1)[0].split() for line in block.splitlines()]
    for words in lines:
        if words and words[0] == "export":
            for word in words[1:]:
                name, value = word.split("=", 1)
                env[name] = value
    assert lines[-1] == ["promptbus", "run", "--config", "tiers.yaml"]
    assert env["OTEL_TRACES_EXPORTER"] == env["OTEL_METRICS_EXPORTER"] == "otlp"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in env
    return env


def _check_wire(receiver: OtlpReceiver, jobs: list[SentJob]) -> None:
    """Protobuf over HTTP as the SDK's variables ask; no prompt text, input or key anywhere."""
    traces = [p for p in receiver.posts if p.path == "/v1/traces"]
    metrics = [p for p in receiver.posts if p.path == "/v1/metrics"]
    assert traces and metrics
    assert all(p.headers.get("x-collector-token") == "test-token" for p in receiver.posts)
    assert all(p.headers.get("Content-Encoding") == "gzip" for p in traces), "per-signal compression"
    assert not any(p.headers.get("Content-Encoding") for p in metrics)
    exported = b"".join(p.body for p in receiver.posts)
    forbidden = [t for j in jobs for t in j.texts] + ["Classify the sentiment", RIGHT_KEY, WRONG_KEY]
    leaked = [t for t in forbidden if t.encode() in exported]
    assert not leaked, f"exported bytes hold job content or keys: {leaked}"
    resource = receiver.spans()[0].resource
    assert resource["service.name"] == "promptbus"
    assert resource["service.instance.id"] and resource["service.version"]


def _by_job(spans: list[ReceivedSpan], name: str) -> dict[str, ReceivedSpan]:
    found: dict[str, ReceivedSpan] = {}
    for s in spans:
        if s.name == name:
            job_id = s.attributes["promptbus.job.id"]
            assert job_id not in found, f"two spans {name} for {job_id}"
            found[job_id] = s
    return found


def _check_job_spans(
    spans: list[ReceivedSpan], jobs: list[SentJob], outcomes: dict[str, Outcome], settings: Settings
) -> dict[str, ReceivedSpan]:
    """One `process <jobs topic>` CONSUMER span per job, in its producer's trace."""
    process = _by_job(spans, f"process {settings.jobs_topic}")
    assert set(process) == {j.id for j in jobs}
    for j in jobs:
        span, source = process[j.id], outcomes[j.id].value["source"]
        assert span.kind == "CONSUMER"
        assert {k: v for k, v in span.attributes.items() if k.startswith("messaging.")} == {
            "messaging.system": "kafka",
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": settings.jobs_topic,
            "messaging.destination.partition.id": str(source["partition"]),
            "messaging.kafka.offset": source["offset"],
            "messaging.kafka.message.key": j.id,
            "messaging.consumer.group.name": settings.group_id,
        }
        assert span.attributes["promptbus.tier"] == j.value["tier"]
        if j.trace_id is not None:
            assert (span.trace_id, span.parent_id) == (j.trace_id, j.span_id), "the producer's trace"
        else:
            assert span.parent_id is None
    assert process["job-16"].attributes["error.type"] == "deadline_exceeded"
    assert process["job-17"].attributes["error.type"] == "auth_failed"
    assert {process[j].status for j in ("job-16", "job-17")} == {"ERROR"}
    return process


def _check_send_spans(
    spans: list[ReceivedSpan],
    jobs: list[SentJob],
    outcomes: dict[str, Outcome],
    process: dict[str, ReceivedSpan],
    settings: Settings,
) -> None:
    """One `send <results or dlq topic>` PRODUCER span per outcome, a child of its job's span."""
    sends = [s for s in spans if s.kind == "PRODUCER"]
    assert len(sends) == len(jobs)
    by_key = {s.attributes["messaging.kafka.message.key"]: s for s in sends}
    for j in jobs:
        send, topic = by_key[j.id], outcomes[j.id].topic
        assert send.name == f"send {topic}"
        assert (send.trace_id, send.parent_id) == (process[j.id].trace_id, process[j.id].span_id)
        assert send.attributes["messaging.system"] == "kafka"
        assert send.attributes["messaging.operation.name"] == "send"
        assert send.attributes["messaging.operation.type"] == "send"
        assert send.attributes["messaging.destination.name"] == topic
        dead = topic == settings.dlq_topic
        assert send.attributes["promptbus.outcome"] == ("dead_letter" if dead else "result")


def _check_provider_spans(
    spans: list[ReceivedSpan],
    jobs: list[SentJob],
    provider: ProviderRecorder,
    process: dict[str, ReceivedSpan],
    *,
    simulator_port: int,
) -> None:
    """A GenAI CLIENT span per provider call, its values those the provider answered."""
    calls = [s for s in spans if s.kind == "CLIENT"]
    by_response = {s.attributes.get("gen_ai.response.id"): s for s in calls}
    chat = [b for path, b in provider.answers if path.endswith("/chat/completions")]
    embedded = [b for path, b in provider.answers if path.endswith("/embeddings")]
    assert chat and embedded, "the provider answered both kinds"
    embed_spans = [s for s in calls if s.name == "embeddings sim-model"]
    assert all(s.attributes["gen_ai.operation.name"] == "embeddings" for s in embed_spans)
    assert sorted(s.attributes["gen_ai.usage.input_tokens"] for s in embed_spans) == sorted(
        b["usage"]["prompt_tokens"] for b in embedded
    )
    assert len(calls) == len(chat) + len(embedded) + 1, "one span per call (and the refused one)"
    for body in chat:
        span = by_response[body["id"]]
        choice = body["choices"][0]
        assert span.name == "chat sim-model"
        attributes = span.attributes
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "openai"
        assert attributes["gen_ai.request.model"] == "sim-model", "the model the tier names"
        assert attributes["gen_ai.response.model"] == body["model"]
        assert attributes["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
        assert attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
        assert attributes["gen_ai.response.finish_reasons"] == (choice["finish_reason"],)
        assert attributes["gen_ai.request.temperature"] == 0.2
        assert isinstance(attributes["gen_ai.request.max_tokens"], int)
        assert (attributes["server.address"], attributes["server.port"]) == ("127.0.0.1", simulator_port)
        assert attributes["promptbus.tier"] == "small"
    assert not any(name.startswith("gen_ai.") for name, _ in (e for s in calls for e in s.events)), (
        "content events only when opted in"
    )
    _check_call_parents(calls, embed_spans, jobs, process)


def _check_call_parents(
    calls: list[ReceivedSpan],
    embed_spans: list[ReceivedSpan],
    jobs: list[SentJob],
    process: dict[str, ReceivedSpan],
) -> None:
    """A packed request is a trace of its own linking its jobs (and they it); a request of one
    job is its child; the refused call names its error."""
    packed_ids = {j.id for j in jobs if j.value.get("batch")}
    packed = [s for s in calls if s.attributes["promptbus.request.size"] == PACKED]
    assert len(packed) == 1, [s.attributes for s in calls]
    (request,) = packed
    assert request.parent_id is None, "a packed request is a trace of its own"
    assert request.attributes["gen_ai.output.type"] == "json"
    assert set(request.links) == {(process[i].trace_id, process[i].span_id) for i in packed_ids}
    assert len({trace_id for trace_id, _ in request.links}) == PACKED, "jobs of several traces"
    for i in packed_ids:
        assert (request.trace_id, request.span_id) in process[i].links, "each job links its request"
    # the two embed jobs went as one array request (linking both) or one request each (a child)
    for i in ("emb-14", "emb-15"):
        job_span = process[i]
        assert any(
            (job_span.trace_id, job_span.span_id) in s.links or s.parent_id == job_span.span_id
            for s in embed_spans
        ), i
    for alone in ("job-10", "job-11", "job-12", "chat-13"):
        mine = [s for s in calls if s.parent_id == process[alone].span_id]
        assert mine and all(s.trace_id == process[alone].trace_id for s in mine), alone
        assert mine[0].attributes["gen_ai.request.max_tokens"] == 64
    (refused,) = [s for s in calls if s.attributes["promptbus.tier"] == "locked"]
    assert refused.attributes["error.type"] == "AuthFailed"
    assert refused.attributes["http.response.status_code"] == 401
    assert refused.status == "ERROR" and refused.parent_id == process["job-17"].span_id


def _check_result_traceparents(
    jobs: list[SentJob], outcomes: dict[str, Outcome], process: dict[str, ReceivedSpan]
) -> None:
    """Every result and dead letter carries its job span's traceparent: the producer's trace."""
    for j in jobs:
        _, trace_id, span_id, _flags = outcomes[j.id].headers["traceparent"].decode().split("-")
        assert (trace_id, span_id) == (process[j.id].trace_id, process[j.id].span_id), j.id
        if j.trace_id is not None:
            assert trace_id == j.trace_id, j.id


def _check_metrics(receiver: OtlpReceiver, provider: ProviderRecorder) -> None:
    """The GenAI client histograms with the conventions' boundaries, beside promptbus's own."""
    points = receiver.histograms()
    tokens = [p for p in points if p.metric == "gen_ai.client.token.usage"]
    durations = [p for p in points if p.metric == "gen_ai.client.operation.duration"]
    assert tokens and durations
    assert all(p.explicit_bounds == tuple(float(b) for b in TOKEN_USAGE_BOUNDS) for p in tokens)
    assert all(p.explicit_bounds == OPERATION_DURATION_BOUNDS_S for p in durations)
    assert {p.unit for p in tokens} == {"{token}"} and {p.unit for p in durations} == {"s"}
    chat = [b for path, b in provider.answers if path.endswith("/chat/completions")]
    embeddings = [b for path, b in provider.answers if path.endswith("/embeddings")]

    def tokens_of(kind: str) -> tuple[int, float]:
        mine = [p for p in tokens if p.attributes["gen_ai.token.type"] == kind]
        return sum(p.count for p in mine), sum(p.sum for p in mine)

    input_tokens = sum(b["usage"]["prompt_tokens"] for b in chat + embeddings)
    assert tokens_of("input") == (len(chat) + len(embeddings), input_tokens)
    assert tokens_of("output") == (len(chat), sum(b["usage"]["completion_tokens"] for b in chat))
    answered = sum(p.count for p in durations if "error.type" not in p.attributes)
    assert answered == len(chat) + len(embeddings)
    refused = [p for p in durations if p.attributes.get("error.type") == "AuthFailed"]
    assert sum(p.count for p in refused) == 1
    assert all(p.attributes["gen_ai.provider.name"] == "openai" for p in tokens + durations)
    assert {"promptbus.results", "promptbus.job_latency_seconds"} <= receiver.metric_names()


def _packed_trace(spans: list[ReceivedSpan]) -> str:
    """The waterfalls docs/metrics.md shows: the packed request's trace, one of its jobs' and
    the trace of a job that went alone (printed; pytest -s shows them)."""
    packed = [s for s in spans if s.attributes.get("promptbus.request.size") == PACKED]
    if not packed:
        return "no packed request exported"
    request = packed[0]
    member = request.links[0][0] if request.links else ""
    alone = next((s.trace_id for s in spans if s.attributes.get("promptbus.job.id") == "job-10"), "")
    return "\n\n".join(waterfall(spans, t) for t in (request.trace_id, member, alone))


async def test_per_signal_endpoints_and_the_protocol_variable_are_the_sdks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The per-signal endpoint wins over the general one (a port nothing listens on), and `otlp`
    with `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf` is the HTTP exporter; what the SDK reads
    from the environment reaches a collector without promptbus parsing any of it."""
    dead = f"http://127.0.0.1:{free_port()}"
    async with OtlpReceiver() as receiver:
        for name, value in {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": dead,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint + "/v1/traces",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.endpoint + "/v1/metrics",
            "OTEL_SERVICE_NAME": "promptbus-test",
        }.items():
            monkeypatch.setenv(name, value)
        meters = meter_provider_from_env()
        assert meters is not None
        telemetry = Telemetry(meter_provider=meters, group_id="g")
        assert telemetry.enabled
        meters.get_meter("test").create_counter("probe").add(1)
        span = telemetry.start_job(_job(), _record())
        telemetry.end_job(span)
        await asyncio.to_thread(telemetry.shutdown)  # exports synchronously: the receiver answers
        await asyncio.to_thread(meters.shutdown)
        assert await receiver.wait_until(lambda r: bool(r.spans()) and bool(r.metrics), EXPORT_WAIT_S)
    (exported,) = receiver.spans()
    assert exported.name == "process jobs" and exported.resource["service.name"] == "promptbus-test"
    assert exported.attributes["messaging.consumer.group.name"] == "g"
    assert "probe" in receiver.metric_names()
    assert os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] == dead, "the general endpoint was set, and not used"



def _job() -> Any:
    from consumer.core.jobs import decode_job

    return decode_job(orjson.dumps(job(1, batch=False)))


def _record() -> InRecord:
    return InRecord(SourceOffset(TopicPartition("jobs", 0), 7), b"job-1", b"{}", (), 0)
