"""The model routes: OpenAI chat completions and Anthropic messages, with their faults."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from consumer.testing.simulator.embeddings import embeddings_body, embeddings_refusal, embeddings_tokens
from consumer.testing.simulator.model import SimAnswer, compact, estimate_tokens, model_answer
from consumer.testing.simulator.refusals import request_refusal
from consumer.testing.simulator.responses import OrjsonResponse
from consumer.testing.simulator.state import Call, SimulatorState, endpoint
from consumer.testing.simulator.wire import (
    anthropic_message_body,
    max_tokens_of,
    openai_completion_body,
    request_view,
)

#: the retry-after-ms of a shared 429 (Retry-After says 1 s: whole seconds, at least 1)
SHARED_429_RETRY_MS = 200


class ChatRoutes(SimulatorState):
    """POST /v1/chat/completions, POST /v1/embeddings, POST /v1/messages and GET /v1/models."""

    async def _chat(self, request: Request, call: Call) -> Response:
        """The shared path of /v1/chat/completions and /v1/messages, after the preamble: the
        refusals and 429s drawn before the model, the model's answer, the rate limit, the
        latency and transport faults, then the answer in the caller's wire format."""
        kind, body = call.kind, call.body
        refused = self._refused_before_model(kind, body)
        if refused is not None:
            return refused
        cfg, counters = self.config, self.stats_.counters
        prompt, schema, tool, all_text = request_view(body, kind, ignore_structured=cfg.ignore_structured)
        if schema is not None:
            counters["structured_requests"] += 1
        answer = model_answer(
            prompt, schema, tool=tool, max_tokens=max_tokens_of(body), rng=self.rng, config=cfg
        )
        input_tokens = estimate_tokens(all_text)
        output_tokens = estimate_tokens(answer.text if answer.value is None else compact(answer.value))
        headers, wait_s = self._rate_headers(kind, time.monotonic(), input_tokens + output_tokens)
        if wait_s is not None:
            return self._error(
                kind,
                429,
                "rate_limit_error" if kind == "anthropic" else "requests",
                f"Rate limit reached for {self.limited_by} per {cfg.rate_window_s:g}s. Please try again "
                f"in {wait_s:.3f}s.",
                code="rate_limit_exceeded",
                headers=headers,
            )
        faulted = await self._serve_with_faults(request, kind)
        if faulted is not None:
            return faulted
        return self._answered(kind, body, answer, (input_tokens, output_tokens), all_text, headers)

    def _refused_before_model(self, kind: str, body: dict[str, Any]) -> Response | None:
        """A body the real API refuses, a stream request, a billing 429 or a shared 429 (the
        rng draws in this order; a shared 429 only when enabled, so seeded runs without it
        keep their sequence of faults). None: on to the model."""
        cfg, counters = self.config, self.stats_.counters
        refusal = request_refusal(body, kind)
        if refusal is not None:
            return self._refuse(kind, refusal)
        if body.get("stream"):
            return self._error(kind, 400, "invalid_request_error", "stream: streaming is not simulated")
        if self.rng.random() < cfg.billing_rate:
            counters["quota_429"] += 1
            if kind == "openai":
                return self._error(
                    kind,
                    429,
                    "insufficient_quota",
                    "You exceeded your current quota, please check your plan and billing details.",
                    code="insufficient_quota",
                )
            return self._error(
                kind,
                429,
                "rate_limit_error",
                "You have reached your specified API usage limits. "
                "You will regain access on 2099-01-01 at 00:00 UTC.",
            )
        if cfg.shared_429_rate and self.rng.random() < cfg.shared_429_rate:
            counters["shared_429"] += 1
            retry = {"retry-after": "1"}
            if kind == "openai":
                retry["retry-after-ms"] = str(SHARED_429_RETRY_MS)
            return self._error(
                kind,
                429,
                "rate_limit_error" if kind == "anthropic" else "requests",
                "Rate limit reached: the key's budget was spent by another client. Please try again "
                f"in {SHARED_429_RETRY_MS / 1000:g}s.",
                code="rate_limit_exceeded",
                headers=retry,
            )
        return None

    async def _serve_with_faults(self, request: Request, kind: str) -> Response | None:
        """A capacity slot and the latency, then the drawn fault: a dropped connection, a hang
        (then on), a 500 or an overload; None: answered."""
        cfg, counters = self.config, self.stats_.counters
        fault = self.rng.random()
        delay_s = (
            max(0.0, self.rng.uniform(cfg.latency_ms - cfg.jitter_ms, cfg.latency_ms + cfg.jitter_ms)) / 1000
        )
        async with self._sem if self._sem is not None else contextlib.nullcontext():
            stats = self.stats_
            stats.inflight += 1
            stats.max_inflight = max(stats.max_inflight, stats.inflight)
            try:
                await self._sleep(delay_s + cfg.load_ms * (stats.inflight - 1) / 1000)
                edge = cfg.drop_rate
                if fault < edge:
                    counters["drops"] += 1
                    self._drop(request)
                    return Response(status_code=500)  # never sent: the connection is gone
                edge += cfg.hang_rate
                if fault < edge:
                    counters["hangs"] += 1
                    await self._sleep(cfg.hang_s)
                edge2 = edge + cfg.error_rate
                if edge <= fault < edge2:
                    etype = "server_error" if kind == "openai" else "api_error"
                    return self._error(
                        kind, 500, etype, "The server had an error while processing your request."
                    )
                if edge2 <= fault < edge2 + cfg.overload_rate:
                    if kind == "openai":
                        return self._error(kind, 503, "server_error", "The engine is currently overloaded.")
                    return self._error(kind, 529, "overloaded_error", "Overloaded")
            finally:
                stats.inflight -= 1
        return None

    def _answered(
        self,
        kind: str,
        body: dict[str, Any],
        answer: SimAnswer,
        tokens: tuple[int, int],
        all_text: str,
        headers: dict[str, str],
    ) -> Response:
        """The answer counted and in the caller's wire format; tokens: (input, output)."""
        counters = self.stats_.counters
        counters["items_answered"] += answer.items - (1 if answer.fault == "missing" else 0)
        if answer.batched:
            counters["batched_requests"] += 1
        if answer.fault:
            counters[answer.fault] += 1
        model = str(body.get("model") or "sim")
        read, written = self.cache_usage(kind, body, all_text)
        if kind == "openai":
            payload = openai_completion_body(answer, model, *tokens, self.new_id("chatcmpl-"), read)
            headers["x-request-id"] = self.new_id("req_")
        else:
            payload = anthropic_message_body(answer, model, *tokens, self.new_id("msg_"), read, written)
            headers["request-id"] = self.new_id("req_")
        return OrjsonResponse(payload, headers=headers)

    @endpoint("openai", body=True, chat=True)
    async def openai_embeddings(self, request: Request, call: Call) -> Response:
        """POST /v1/embeddings: one vector per input, in order."""
        cfg, counters = self.config, self.stats_.counters
        body = call.body
        refusal = embeddings_refusal(body)
        if refusal is not None:
            return self._refuse("openai", refusal)
        assert body is not None
        tokens = embeddings_tokens(body)
        headers, wait_s = self._rate_headers("openai", time.monotonic(), tokens)
        if wait_s is not None:
            return self._error(
                "openai",
                429,
                "tokens",
                f"Rate limit reached for {self.limited_by} per {cfg.rate_window_s:g}s. Please try "
                f"again in {wait_s:.3f}s.",
                code="rate_limit_exceeded",
                headers=headers,
            )
        fault = self.rng.random() if cfg.error_rate else 1.0
        spread = (cfg.latency_ms - cfg.jitter_ms, cfg.latency_ms + cfg.jitter_ms)
        await self._sleep(max(0.0, self.rng.uniform(*spread)) / 1000)
        if fault < cfg.error_rate:
            message = "The server had an error while processing your request."
            return self._error("openai", 500, "server_error", message)
        payload = embeddings_body(body)
        counters["items_answered"] += len(payload["data"])
        counters["embedding_requests"] += 1
        headers["x-request-id"] = self.new_id("req_")
        return OrjsonResponse(payload, headers=headers)

    @endpoint("openai", body=True, chat=True)
    async def openai_chat(self, request: Request, call: Call) -> Response:
        """POST /v1/chat/completions."""
        return await self._chat(request, call)

    @endpoint("anthropic", body=True, chat=True)
    async def anthropic_messages(self, request: Request, call: Call) -> Response:
        """POST /v1/messages."""
        return await self._chat(request, call)

    async def models(self, request: Request) -> Response:
        """GET /v1/models: the listing both APIs serve (and the service's start-time check asks).

        The key is checked the way the caller's headers say it speaks: `x-api-key` (Anthropic,
        whose listing also needs `anthropic-version`) or a bearer token (OpenAI).
        """
        kind = "anthropic" if "x-api-key" in request.headers else "openai"
        self._count(request)
        if not self._authorized(request, kind):
            return self._unauthorized(kind)
        model = {"id": "sim-model", "created": 0}
        if kind == "anthropic":
            entry = {"id": "sim-model", "type": "model", "display_name": "Simulator",
                     "created_at": "2026-01-01T00:00:00Z"}
            return OrjsonResponse({"data": [entry], "has_more": False, "first_id": "sim-model",
                                 "last_id": "sim-model"})
        listed = {**model, "object": "model", "owned_by": "simulator"}
        return OrjsonResponse({"object": "list", "data": [listed]})
