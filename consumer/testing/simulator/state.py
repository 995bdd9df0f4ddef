"""The simulator's state and the preamble every provider route shares (`SimulatorState`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import uvicorn
from starlette.requests import Request
from starlette.responses import Response

from consumer.providers.ratelimit import format_duration
from consumer.testing.simulator.cache import PromptCache
from consumer.testing.simulator.config import SimulatorConfig
from consumer.testing.simulator.model import estimate_tokens
from consumer.testing.simulator.ratelimit import TokenBucket
from consumer.testing.simulator.refusals import Refusal
from consumer.testing.simulator.responses import OrjsonResponse
from consumer.testing.simulator.wire import now_iso


@dataclass
class BatchJob:
    """A provider Batch API job: its requests and, once it ran, its results."""

    id: str
    kind: str  # "openai" | "anthropic"
    created_s: float
    lines: list[dict[str, Any]]  # openai: input lines; anthropic: {custom_id, params}
    input_file_id: str | None = None
    endpoint: str = "/v1/chat/completions"
    completion_window: str = "24h"
    status: str = "in_progress"
    cancelled_s: float | None = None
    ended_s: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)  # anthropic result lines
    counts: Counter[str] = field(default_factory=Counter)
    #: input tokens of its requests (what an enqueued token limit counts)
    tokens: int = 0
    #: why it failed as a whole (OpenAI's `errors` object), when it did
    errors: dict[str, Any] | None = None


class SimulatorStats:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.routes: Counter[str] = Counter()
        self.inflight = 0
        self.max_inflight = 0

    def snapshot(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict."""
        keys = (
            "requests",
            "items_answered",
            "batched_requests",
            "embedding_requests",
            "status_429",
            "quota_429",
            "shared_429",
            "status_5xx",
            "status_401",
            "hangs",
            "drops",
            "malformed",
            "truncated",
            "missing",
            "extra",
            "structured_requests",
            "batches_created",
            "batches_over_enqueued_limit",
            "batch_items",
            "cached_tokens",
            "cache_write_tokens",
            "tokens_admitted",
        )
        out: dict[str, Any] = {k: self.counters.get(k, 0) for k in keys}
        out["routes"] = dict(self.routes)
        out["inflight"] = self.inflight
        out["max_inflight"] = self.max_inflight
        return out


class Dropped(Exception):
    """The handler closed the connection: send nothing."""


@dataclass(frozen=True, slots=True)
class Call:
    """What the shared endpoint preamble hands a provider route's handler."""

    kind: str  # "openai" | "anthropic": whose wire format and error shape
    parsed: dict[str, Any] | None = None  # the JSON object body, on routes that take one
    found: BatchJob | None = None  # the path's batch, on /batches/{batch_id} routes

    @property
    def body(self) -> dict[str, Any]:
        """The parsed JSON object body (routes declared with `body=True`)."""
        if self.parsed is None:
            raise RuntimeError("this route does not parse a body")
        return self.parsed

    @property
    def batch(self) -> BatchJob:
        """The batch named by the path (routes declared with `batch=True`)."""
        if self.found is None:
            raise RuntimeError("this route does not look up a batch")
        return self.found


State = TypeVar("State", bound="SimulatorState")


def endpoint(
    kind: str, *, body: bool = False, batch: bool = False, chat: bool = False
) -> Callable[
    [Callable[[State, Request, Call], Awaitable[Response]]], Callable[[State, Request], Awaitable[Response]]
]:
    """Give a provider route the preamble every one of them shares (`SimulatorState._preamble`):
    the handler runs only for an authorized request whose body and batch were found, and a
    dropped connection answers nothing. `chat`: the route counts as a model request."""

    def wrap(
        handler: Callable[[State, Request, Call], Awaitable[Response]],
    ) -> Callable[[State, Request], Awaitable[Response]]:
        @functools.wraps(handler)
        async def route(self: State, request: Request) -> Response:
            try:
                call = await self._preamble(request, kind, body=body, batch=batch, chat=chat)
                return call if isinstance(call, Response) else await handler(self, request, call)
            except Dropped:
                return Response(status_code=500)  # never sent: the connection is gone

        return route

    return wrap


class SimulatorState:
    """The simulator's state and the request path its routes share. `server` (a uvicorn.Server)
    is set when served, so drops can close the client's connection."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.server: uvicorn.Server | None = None
        self._stop = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        """Forget counters, rate windows, files and batches; re-seed the rng."""
        self.rng = random.Random(self.config.seed)
        self.stats_ = SimulatorStats()
        self.buckets = {"requests": TokenBucket(), "tokens": TokenBucket()}
        self.limited_by = "requests"
        self.files: dict[str, tuple[str, bytes]] = {}
        self.batches: dict[str, BatchJob] = {}
        self.prompt_cache = PromptCache()
        self._ids = 0
        self._sem = asyncio.Semaphore(self.config.capacity) if self.config.capacity > 0 else None

    def configure(self, config: SimulatorConfig) -> None:
        """Use `config` from now on (counters, files and batches are kept; requests already
        waiting for a capacity slot keep the old limit)."""
        capacity_changed = config.capacity != self.config.capacity
        self.config = config
        if capacity_changed:
            self._sem = asyncio.Semaphore(config.capacity) if config.capacity > 0 else None

    def new_id(self, prefix: str) -> str:
        """A fresh object id (`prefix` + a count + seeded random hex)."""
        self._ids += 1
        return f"{prefix}{self._ids:06d}{self.rng.getrandbits(32):08x}"

    # -------- shared request path

    def _count(self, request: Request) -> None:
        route_obj = request.scope.get("route")
        path = getattr(route_obj, "path", None) or request.url.path
        route = f"{request.method} {path}"
        self.stats_.routes[route] += 1

    def _authorized(self, request: Request, kind: str) -> bool:
        wanted = self.config.api_key
        if not wanted:
            return True
        bearer = request.headers.get("authorization") == f"Bearer {wanted}"
        if kind == "openai":
            return bearer
        # Anthropic: x-api-key; recent anthropic SDKs send the key as a bearer token instead
        return request.headers.get("x-api-key") == wanted or bearer

    def _unauthorized(self, kind: str) -> Response:
        """The 401 each provider sends for a missing or wrong key, in its own words."""
        if kind == "openai":
            return self._error(
                kind, 401, "invalid_request_error", "Incorrect API key provided.", code="invalid_api_key"
            )
        return self._error(kind, 401, "authentication_error", "invalid x-api-key")

    def _error(
        self,
        kind: str,
        status: int,
        etype: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if kind == "openai":
            body: dict[str, Any] = {
                "error": {"message": message, "type": etype, "param": param, "code": code}
            }
        else:
            body = {"type": "error", "error": {"type": etype, "message": message}}
        if status == 429:
            self.stats_.counters["status_429"] += 1
        elif status >= 500:
            self.stats_.counters["status_5xx"] += 1
        elif status == 401:
            self.stats_.counters["status_401"] += 1
        return OrjsonResponse(body, status_code=status, headers=dict(headers or {}))

    def _refuse(self, kind: str, refusal: Refusal) -> Response:
        """The 400 a provider sends for a body it refuses, in its own error shape."""
        return self._error(
            kind, 400, "invalid_request_error", refusal.message, code=refusal.code, param=refusal.param
        )

    async def _preamble(
        self, request: Request, kind: str, *, body: bool, batch: bool, chat: bool
    ) -> Call | Response:
        """The steps every provider route takes before its own, in this order: count the route
        (and, on a chat route, the request, refused or not), check the key (401), parse the body
        as a JSON object (400), find the path's batch of this provider and bring it up to date
        (404). Returns what the handler needs, or the error response to send instead."""
        self._count(request)
        if chat:
            self.stats_.counters["requests"] += 1
        if not self._authorized(request, kind):
            return self._unauthorized(kind)
        parsed: dict[str, Any] | None = None
        if body:
            try:
                value = orjson.loads(await request.body())
            except orjson.JSONDecodeError:
                value = None
            if not isinstance(value, dict):
                return self._error(
                    kind, 400, "invalid_request_error", "the request body is not a JSON object"
                )
            parsed = value
        found: BatchJob | None = None
        if batch:
            found = self.batches.get(request.path_params["batch_id"])
            if found is None or found.kind != kind:
                return self._error(
                    kind,
                    404,
                    "not_found_error" if kind == "anthropic" else "invalid_request_error",
                    "batch not found",
                )
            self.batch_due(found)
        return Call(kind, parsed, found)

    def batch_due(self, batch: BatchJob) -> None:
        """Run `batch` when it is due: the batch routes do (`BatchRoutes`); plain state has none."""

    def _rate_headers(
        self, kind: str, now_s: float, tokens_needed: int
    ) -> tuple[dict[str, str], float | None]:
        """Rate-limit headers and, when over a limit, seconds until the request would fit.

        Each limit is a token bucket, as OpenAI and Anthropic document theirs: it holds at most
        the per-window count (`rpm`, `tpm`), refills continuously at count / `rate_window_s`
        per second, and an admitted request takes 1 request and its tokens. Headers: the limit,
        what remains after this request (rounded down), and the reset: the time until the bucket
        is full again (OpenAI: a duration; Anthropic: an RFC 3339 time). A request that does not
        fit is not counted; its 429 carries Retry-After (whole seconds, at least 1) and, OpenAI
        style, retry-after-ms: the time until it would fit (a request larger than the token
        limit never fits: it is told the time until the bucket is full).
        """
        cfg = self.config
        if not cfg.rpm and not cfg.tpm:
            return {}, None
        window_s = cfg.rate_window_s
        req_bucket = self.buckets["requests"]
        tok_bucket = self.buckets["tokens"]
        req_bucket.configure(cfg.rpm, window_s, now_s)
        tok_bucket.configure(cfg.tpm, window_s, now_s)
        wait_s: float | None = None
        if cfg.rpm and not req_bucket.holds(1):
            wait_s = req_bucket.wait_for_s(1)
            self.limited_by = "requests"
        if cfg.tpm and not tok_bucket.holds(tokens_needed):
            tok_wait_s = tok_bucket.wait_for_s(min(tokens_needed, cfg.tpm))
            if wait_s is None or tok_wait_s > wait_s:
                self.limited_by = "tokens"
            wait_s = max(wait_s or 0.0, tok_wait_s)
        if wait_s is None:
            if cfg.rpm:
                req_bucket.take(1)
            if cfg.tpm:
                tok_bucket.take(tokens_needed)
                # what the token limit counted: a benchmark's ceiling is this over the limit
                self.stats_.counters["tokens_admitted"] += tokens_needed
        headers: dict[str, str] = {}
        for what, limit, bucket in (("requests", cfg.rpm, req_bucket), ("tokens", cfg.tpm, tok_bucket)):
            if not limit:
                continue
            remaining = str(max(0, math.floor(bucket.level)))
            if kind == "openai":
                headers[f"x-ratelimit-limit-{what}"] = str(limit)
                headers[f"x-ratelimit-remaining-{what}"] = remaining
                headers[f"x-ratelimit-reset-{what}"] = format_duration(bucket.full_in_s())
            else:
                headers[f"anthropic-ratelimit-{what}-limit"] = str(limit)
                headers[f"anthropic-ratelimit-{what}-remaining"] = remaining
                headers[f"anthropic-ratelimit-{what}-reset"] = now_iso(time.time() + bucket.full_in_s())
        if wait_s is not None:
            wait_s = max(wait_s, 0.001)
            headers["retry-after"] = str(max(1, math.ceil(wait_s)))
            if kind == "openai":
                headers["retry-after-ms"] = str(max(1, math.ceil(wait_s * 1000)))
        return headers, wait_s

    def _drop(self, request: Request) -> None:
        server = self.server
        if server is not None:
            for conn in list(server.server_state.connections):
                if getattr(conn, "scope", None) is request.scope:
                    transport = getattr(conn, "transport", None)
                    if transport is not None:
                        transport.close()
                        return
        raise Dropped("no connection to drop")

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    def cache_usage(self, kind: str, body: Mapping[str, Any], all_text: str) -> tuple[int, int]:
        """(tokens read from, written to) the prompt cache by one answered request; counted."""
        read, written = self.prompt_cache.usage(kind, body, all_text, time.monotonic())
        self.stats_.counters["cached_tokens"] += read
        self.stats_.counters["cache_write_tokens"] += written
        return min(read, estimate_tokens(all_text)), min(written, estimate_tokens(all_text))

    def _register(self, batch: BatchJob) -> BatchJob:
        """Keep `batch` and count it."""
        self.batches[batch.id] = batch
        self.stats_.counters["batches_created"] += 1
        return batch

    def _cancel(self, batch: BatchJob, status: str) -> bool:
        """End a batch that has not ended yet with `status`; False when it had already ended."""
        if batch.ended_s is not None:
            return False
        batch.cancelled_s = time.time()
        batch.ended_s = time.monotonic()
        batch.status = status
        return True
