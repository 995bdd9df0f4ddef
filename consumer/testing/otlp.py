"""A test OTLP/HTTP receiver: what a collector receives from the service, decoded.

`OtlpReceiver` listens on 127.0.0.1 (aiohttp, in the caller's event loop) and accepts what
an OTLP/HTTP exporter posts: `POST /v1/traces` and `POST /v1/metrics`, protobuf bodies
(`Content-Encoding: gzip` too, kept inflated), decoded with the `opentelemetry-proto` messages a collector
uses (`ExportTraceServiceRequest`, `ExportMetricsServiceRequest`). It keeps every request's
decompressed bytes and headers (`posts`), the spans flattened (`spans()`, `ReceivedSpan`) and
the histogram points of the latest metrics export (`histograms()`). `wait_until` waits,
bounded, until what arrived satisfies a condition. `waterfall` draws one trace as a tracing
backend lays it out (docs/metrics.md shows one).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from consumer.waits import wait_at_most

__all__ = [
    "HistogramPoint",
    "OtlpReceiver",
    "Post",
    "ReceivedSpan",
    "attributes_of",
    "serve_loopback",
    "waterfall",
]

PROTOBUF = "application/x-protobuf"
GZIP_MAGIC = b"\x1f\x8b"
TRACES_OK = ExportTraceServiceResponse().SerializeToString()
METRICS_OK = ExportMetricsServiceResponse().SerializeToString()


async def serve_loopback(
    app: web.Application, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Serve `app` in this event loop on `host` (port 0: a free one); its runner (to
    `cleanup()`) and the port it listens on."""
    listener = socket.create_server((host, port))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, listener).start()
    return runner, int(listener.getsockname()[1])


def value_of(value: AnyValue) -> Any:
    """An OTLP AnyValue as Python: str, bool, int, float, bytes, tuple (array), dict (kvlist)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind) if kind is not None else None


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in pairs}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span. Ids are lowercase hex; `parent_id` None for a root span; `links`
    are (trace id, span id); `events` are (name, attributes)."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status: str
    resource: dict[str, Any]
    scope: str

    @classmethod
    def of(cls, span: Span, resource: dict[str, Any], scope: str) -> ReceivedSpan:
        return cls(
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex() or None,
            name=span.name,
            kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
            start_ns=span.start_time_unix_nano,
            end_ns=span.end_time_unix_nano,
            attributes=attributes_of(span.attributes),
            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
            events=tuple((e.name, attributes_of(e.attributes)) for e in span.events),
            status=Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
            resource=resource,
            scope=scope,
        )


@dataclass(frozen=True)
class HistogramPoint:
    """One histogram data point of a metrics export."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bucket_counts: tuple[int, ...]
    explicit_bounds: tuple[float, ...]


@dataclass(frozen=True)
class Post:
    """One request as received: its path, headers and (decompressed) body."""

    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass
class OtlpReceiver:
    """`async with OtlpReceiver() as receiver:` an OTLP/HTTP endpoint at `receiver.endpoint`.

    keep: False counts what arrives (`counts`, also served as `GET /_counts`) and keeps
    nothing: a benchmark's long run.
    """

    host: str = "127.0.0.1"
    port: int = 0
    keep: bool = True
    #: exports and spans received
    counts: dict[str, int] = field(default_factory=lambda: {"posts": 0, "spans": 0})
    posts: list[Post] = field(default_factory=list)
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def endpoint(self) -> str:
        """The base URL to give as OTEL_EXPORTER_OTLP_ENDPOINT."""
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        traces = self._receiver(self.traces, ExportTraceServiceRequest, TRACES_OK)
        metrics = self._receiver(self.metrics, ExportMetricsServiceRequest, METRICS_OK)
        app.router.add_post("/v1/traces", traces)
        app.router.add_post("/v1/metrics", metrics)
        app.router.add_get("/_counts", self._counts)
        self._runner, self.port = await serve_loopback(app, self.host, self.port)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _receiver(self, into: list[Any], message: Any, answer: bytes) -> Callable[..., Any]:
        """The handler of one signal's path: decode the body as `message`, keep it in `into`."""

        async def receive(request: web.Request) -> web.Response:
            if request.content_type != PROTOBUF:
                return web.Response(status=415, text=f"only {PROTOBUF} is decoded here")
            body = await request.read()  # aiohttp inflates a gzip Content-Encoding itself
            if body[:2] == GZIP_MAGIC:  # no protobuf message starts so: a server that did not
                body = gzip.decompress(body)
            decoded = message.FromString(body)
            self.counts["posts"] += 1
            if isinstance(decoded, ExportTraceServiceRequest):
                scopes = (ss for rs in decoded.resource_spans for ss in rs.scope_spans)
                self.counts["spans"] += sum(len(ss.spans) for ss in scopes)
            if self.keep:
                self.posts.append(Post(request.path, dict(request.headers), body))
                into.append(decoded)
            self._arrived.set()
            return web.Response(body=answer, content_type=PROTOBUF)

        return receive

    async def _counts(self, _request: web.Request) -> web.Response:
        return web.json_response(self.counts)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order."""
        out: list[ReceivedSpan] = []
        for export in self.traces:
            for rs in export.resource_spans:
                resource = attributes_of(rs.resource.attributes)
                for ss in rs.scope_spans:
                    out.extend(ReceivedSpan.of(s, resource, ss.scope.name) for s in ss.spans)
        return out

    def histograms(self) -> list[HistogramPoint]:
        """The histogram points of the latest metrics export (cumulative: its points count
        everything recorded so far)."""
        if not self.metrics:
            return []
        out: list[HistogramPoint] = []
        for rm in self.metrics[-1].resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.WhichOneof("data") != "histogram":
                        continue
                    for p in metric.histogram.data_points:
                        out.append(
                            HistogramPoint(
                                metric.name,
                                metric.unit,
                                attributes_of(p.attributes),
                                p.count,
                                p.sum,
                                tuple(p.bucket_counts),
                                tuple(p.explicit_bounds),
                            )
                        )
        return out

    def metric_names(self) -> set[str]:
        """The names of the metrics in the latest export."""
        if not self.metrics:
            return set()
        latest = self.metrics[-1].resource_metrics
        return {m.name for rm in latest for sm in rm.scope_metrics for m in sm.metrics}

    async def wait_until(self, condition: Callable[[OtlpReceiver], bool], timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until `condition(self)` holds; checked on every export."""
        deadline = time.monotonic() + timeout_s
        while not condition(self):
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return False
            self._arrived.clear()
            await wait_at_most(self._arrived.wait(), left_s)
        return True


def waterfall(spans: Iterable[ReceivedSpan], trace_id: str, *, width: int = 40) -> str:
    """One trace as a backend's waterfall: a row per span under its parent, a bar on the
    trace's time axis, its duration and kind; below a span, a `↗` row per link naming the
    linked span (and its job) and its trace."""
    every = list(spans)
    by_id = {(s.trace_id, s.span_id): s for s in every}
    mine = sorted((s for s in every if s.trace_id == trace_id), key=lambda s: (s.start_ns, s.name))
    if not mine:
        return ""
    ids = {s.span_id for s in mine}
    children: dict[str | None, list[ReceivedSpan]] = {}
    for s in mine:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    start = min(s.start_ns for s in mine)
    total = max(max(s.end_ns for s in mine) - start, 1)
    rows: list[tuple[str, ReceivedSpan | None]] = []

    def visit(span: ReceivedSpan, depth: int) -> None:
        rows.append(("  " * depth + span.name, span))
        for link in span.links:
            linked = by_id.get(link)
            what = linked.name if linked is not None else "span " + link[1]
            job = linked.attributes.get("promptbus.job.id") if linked is not None else None
            named = f"{what} [{job}]" if job else what
            rows.append((f"{'  ' * depth}  ↗ {named} · trace {link[0][:8]}", None))
        for child in children.get(span.span_id, []):
            visit(child, depth + 1)

    for root in children.get(None, []):
        visit(root, 0)
    label_width = max(len(label) for label, row in rows if row is not None)
    lines = [f"trace {trace_id}"]
    for label, row in rows:
        if row is None:
            lines.append(label)
            continue
        left = round((row.start_ns - start) / total * width)
        length = max(1, round((row.end_ns - row.start_ns) / total * width))
        bar = (" " * left + "█" * length)[: width + 1]
        ms = (row.end_ns - row.start_ns) / 1e6
        lines.append(f"{label:<{label_width}}  |{bar:<{width + 1}}| {ms:7.1f} ms  {row.kind}")
    return "\n".join(lines)


async def _serve(port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with OtlpReceiver(port=port, keep=False) as receiver:
        print(receiver.endpoint, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """`python -m consumer.testing.otlp --port N`: a counting receiver until SIGTERM (benchmarks
    run it in a process of its own, so decoding does not share the service's core)."""
    parser = argparse.ArgumentParser(prog="python -m consumer.testing.otlp", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(_serve(parser.parse_args(argv).port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
