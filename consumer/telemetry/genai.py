"""Provider calls in the OpenTelemetry GenAI semantic conventions: client spans and metrics.

Each provider call (one attempt of one request: ordinary, packed, verification or embeddings)
is one CLIENT span named `{gen_ai.operation.name} {gen_ai.request.model}` (`chat sim-model`,
`embeddings text-embedding-3-small`). A request of one job is a child of that job's span; a
packed request (or an embeddings array request) of several jobs is the root of a trace of its
own and links every member job's span, since its members come from several traces; each
member's span links back to it (one link per attempt), so a backend leads both ways.

Attributes (`CallTarget` holds a tier's fixed ones, made once; the rest are made once per
call, never per member job):

    gen_ai.operation.name        chat | embeddings
    gen_ai.provider.name         openai | anthropic; an OpenAI-compatible server
                                 (`openai_compat`: vLLM, llama.cpp, Ollama, TGI) is `openai`,
                                 the API flavour it speaks (the conventions identify the
                                 server by `server.address` and the model, not by this name)
    gen_ai.system                the same value, under the name older backends read
    gen_ai.request.model / .max_tokens / .temperature / .top_p / .seed / .stop_sequences
    gen_ai.output.type           json when the request asks for a JSON answer (packed prompts,
                                 response_format)
    gen_ai.embeddings.dimension.count   an embeddings request's `dimensions`
    gen_ai.response.model / .id / .finish_reasons, gen_ai.usage.input_tokens / .output_tokens
    server.address, server.port  the tier's base URL's host and port (never its user info)
    error.type                   the promptbus error class the call ended with (`RateLimited`,
                                 `QuotaExhausted`, `Overloaded`, `ServerError`,
                                 `RequestTimeout`, `ConnectionFailed`, `AuthFailed`,
                                 `Rejected`, `MalformedResponse`), or the exception's class name
                                 (`CancelledError` at shutdown, an adapter's bug);
                                 `http.response.status_code` beside it when there was a response
    promptbus.tier, promptbus.provider (the tier's provider kind), promptbus.request.size (the
    jobs it carries), promptbus.provider.request_id (the id a result's `batch.request_id` shows)

Prompt and answer text are never attributes. With `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`
a chat span gets one event, `gen_ai.client.inference.operation.details`, whose
`gen_ai.input.messages` / `gen_ai.output.messages` hold the messages sent and the answer
(JSON in the conventions' message schema): an opt-in for environments whose trace storage
may hold the jobs' content.

Metrics (when a MeterProvider is given): `gen_ai.client.operation.duration` (s) per call and
`gen_ai.client.token.usage` ({token}, by `gen_ai.token.type` input / output) per answered
call, with the conventions' explicit bucket boundaries.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ProviderError

CHAT, EMBEDDINGS = "chat", "embeddings"
#: `gen_ai.provider.name` per promptbus provider kind (an OpenAI-compatible server speaks OpenAI's API)
GENAI_PROVIDER = {"openai": "openai", "anthropic": "anthropic", "openai_compat": "openai"}
#: the conventions' bucket boundaries (gen-ai-metrics.md)
TOKEN_USAGE_BOUNDS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
OPERATION_DURATION_BOUNDS_S = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
#: the opt-in for prompt and answer text on spans (the OTel Python GenAI instrumentations' variable)
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CONTENT_EVENT = "gen_ai.client.inference.operation.details"
#: a context without a span: a packed request's span starts a trace of its own
_ROOT = Context()
_DEFAULT_PORTS = {"http": 80, "https": 443}


def content_capture_from_env() -> bool:
    """Whether the opt-in variable asks for prompt and answer text on spans (`true`)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class CallTarget:
    """One tier's provider, as its calls' spans and metrics name it (made once per tier)."""

    #: the attributes every span of the tier's calls carries
    span_attributes: Mapping[str, Any]
    #: the attributes every metric point of the tier's calls carries
    metric_attributes: Mapping[str, Any]

    @classmethod
    def of(cls, tier: str, provider: str, base_url: str) -> CallTarget:
        genai = GENAI_PROVIDER.get(provider, provider)
        server: dict[str, Any] = {}
        url = urlsplit(base_url)
        if url.hostname:
            server["server.address"] = url.hostname
            port = url.port or _DEFAULT_PORTS.get(url.scheme)
            if port is not None:
                server["server.port"] = port
        metric = {"gen_ai.provider.name": genai, **server}
        span = {
            **metric,
            "gen_ai.system": genai,
            "promptbus.tier": tier,
            "promptbus.provider": provider,
        }
        return cls(span, metric)


class GenAIMetrics:
    """The GenAI client histograms, recorded once per provider call."""

    def __init__(self, meter_provider: Any) -> None:
        meter = meter_provider.get_meter("promptbus")
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(OPERATION_DURATION_BOUNDS_S),
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(TOKEN_USAGE_BOUNDS),
        )


class NoCall:
    """What a provider call is traced with while tracing and GenAI metrics are off: nothing."""

    __slots__ = ()

    def __enter__(self) -> NoCall:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def answered(self, answer: Completion | Embeddings) -> None:
        return None

    def failed(self, exc: BaseException) -> None:
        return None


NO_CALL = NoCall()


class ProviderCall:
    """One provider call's span and metric points: `with` around the call, `answered` or
    `failed` inside it; the span ends and the points are recorded when the block ends."""

    __slots__ = (
        "_answer", "_capture", "_error", "_metrics", "_operation", "_request", "_span",
        "_start_s", "_target", "_token", "_tracer", "_traces",
    )

    def __init__(
        self,
        tracer: Any,
        metrics: GenAIMetrics | None,
        target: CallTarget,
        request: CompletionRequest | EmbeddingRequest,
        traces: Sequence[Any],
        *,
        capture: bool = False,
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._target = target
        self._request = request
        self._traces = traces
        self._capture = capture
        self._operation = EMBEDDINGS if isinstance(request, EmbeddingRequest) else CHAT
        self._span: Any = None
        self._token: Any = None
        self._answer: Completion | Embeddings | None = None
        self._error: BaseException | None = None
        self._start_s = 0.0

    def __enter__(self) -> ProviderCall:
        if self._tracer is not None:
            request = self._request
            parent, links = _parent_and_links(self._traces)
            self._span = span = self._tracer.start_span(
                f"{self._operation} {request.model}",
                context=parent,
                kind=SpanKind.CLIENT,
                attributes=self._request_attributes(),
                links=links,
            )
            if links:  # and each job links back: a backend leads from the job to its request
                called = span.get_span_context()
                for job in self._traces:
                    if job is not None:
                        job.add_link(called)
            # current while the call runs: an instrumented HTTP client's span nests under it
            self._token = otel_context.attach(trace.set_span_in_context(span))
        self._start_s = time.perf_counter()
        return self

    def answered(self, answer: Completion | Embeddings) -> None:
        """The call answered: its response attributes and token usage are recorded."""
        self._answer = answer

    def failed(self, exc: BaseException) -> None:
        """The call failed with `exc` (a ProviderError, or an adapter's unexpected exception)."""
        self._error = exc

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        duration_s = time.perf_counter() - self._start_s
        error = self._error if self._error is not None else exc
        error_type = type(error).__name__ if error is not None else None
        if self._span is not None:
            self._end_span(error, error_type)
        if self._metrics is not None:
            self._record(duration_s, error_type)

    def _request_attributes(self) -> dict[str, Any]:
        request = self._request
        attributes = {
            **self._target.span_attributes,
            "gen_ai.operation.name": self._operation,
            "gen_ai.request.model": request.model,
            "promptbus.request.size": len(self._traces),
        }
        options = request.options
        if isinstance(request, EmbeddingRequest):
            dimensions = options.get("dimensions")
            if isinstance(dimensions, int):
                attributes["gen_ai.embeddings.dimension.count"] = dimensions
            return attributes
        for option, name in _NUMBER_OPTIONS:
            value = options.get(option)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[name] = float(value) if name in _FLOAT_ATTRIBUTES else value
        stop = options.get("stop")
        if isinstance(stop, str):
            attributes["gen_ai.request.stop_sequences"] = (stop,)
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            attributes["gen_ai.request.stop_sequences"] = tuple(stop)
        if request.answer_schema is not None or _asks_json(options.get("response_format")):
            attributes["gen_ai.output.type"] = "json"
        return attributes

    def _end_span(self, error: BaseException | None, error_type: str | None) -> None:
        span, answer = self._span, self._answer
        if answer is not None and error is None:
            span.set_attributes(_response_attributes(answer))
        if error is not None:
            span.set_attribute("error.type", error_type)
            if isinstance(error, ProviderError) and error.status_code is not None:
                span.set_attribute("http.response.status_code", error.status_code)
            # the class only: a provider's error message may quote what it was sent
            span.set_status(Status(StatusCode.ERROR, error_type))
        if self._capture and isinstance(self._request, CompletionRequest):
            span.add_event(CONTENT_EVENT, _content(self._request, answer))
        span.end()
        otel_context.detach(self._token)

    def _record(self, duration_s: float, error_type: str | None) -> None:
        assert self._metrics is not None
        attributes = {
            **self._target.metric_attributes,
            "gen_ai.operation.name": self._operation,
            "gen_ai.request.model": self._request.model,
        }
        answer = self._answer
        if error_type is not None:
            attributes["error.type"] = error_type
        elif answer is not None:
            attributes["gen_ai.response.model"] = answer.model
        self._metrics.duration.record(duration_s, attributes)
        if answer is None or error_type is not None:
            return
        usage = answer.usage
        self._metrics.tokens.record(usage.input_tokens, {**attributes, "gen_ai.token.type": "input"})
        if isinstance(answer, Completion):
            self._metrics.tokens.record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})


#: (request option, attribute) of the numeric request settings the conventions name
_NUMBER_OPTIONS = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("seed", "gen_ai.request.seed"),
)
_FLOAT_ATTRIBUTES = frozenset({"gen_ai.request.temperature", "gen_ai.request.top_p"})


def _asks_json(response_format: Any) -> bool:
    return isinstance(response_format, Mapping) and str(response_format.get("type", "")).startswith("json")


def _parent_and_links(traces: Sequence[Any]) -> tuple[Context, list[Link]]:
    """A request of one job continues that job's trace; one of several starts its own and
    links them all."""
    jobs = [s for s in traces if s is not None]
    if len(traces) == 1:
        return (trace.set_span_in_context(jobs[0]) if jobs else _ROOT), []
    return _ROOT, [Link(s.get_span_context()) for s in jobs]


def _response_attributes(answer: Completion | Embeddings) -> dict[str, Any]:
    usage = answer.usage
    attributes: dict[str, Any] = {
        "gen_ai.response.model": answer.model,
        "gen_ai.usage.input_tokens": usage.input_tokens,
    }
    if answer.response_id:
        attributes["gen_ai.response.id"] = answer.response_id
    if answer.request_id:
        attributes["promptbus.provider.request_id"] = answer.request_id
    if isinstance(answer, Completion):
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        attributes["gen_ai.response.finish_reasons"] = (answer.finish_reason,)
    return attributes


def _content(request: CompletionRequest, answer: Completion | Embeddings | None) -> dict[str, str]:
    """The opt-in event's attributes: the messages sent and the answer, as JSON strings in the
    conventions' input / output message schema."""
    sent = [{"role": m.role, "parts": [{"type": "text", "content": m.content}]} for m in request.messages]
    content = {"gen_ai.input.messages": orjson.dumps(sent).decode()}
    if isinstance(answer, Completion):
        answered = [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": answer.text}],
                "finish_reason": answer.finish_reason,
            }
        ]
        content["gen_ai.output.messages"] = orjson.dumps(answered).decode()
    return content
