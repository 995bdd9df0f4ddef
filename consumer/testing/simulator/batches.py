"""The offline routes: OpenAI files and batches, Anthropic message batches."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from consumer.testing.simulator import offline
from consumer.testing.simulator.embeddings import EMBEDDINGS_URL
from consumer.testing.simulator.responses import OrjsonResponse
from consumer.testing.simulator.state import BatchJob, Call, SimulatorState, endpoint
from consumer.testing.simulator.wire import file_object, now_iso, parse_multipart

#: the endpoints an OpenAI batch may name (every line's `url` is its batch's)
BATCH_ENDPOINTS = ("/v1/chat/completions", EMBEDDINGS_URL)


class BatchRoutes(SimulatorState):
    """The Batch API routes of both providers; the jobs run in `offline` when first looked at."""

    def batch_due(self, batch: BatchJob) -> None:
        offline.run_if_due(self, batch)

    @endpoint("openai")
    async def openai_upload(self, request: Request, call: Call) -> Response:
        """POST /v1/files (multipart, purpose=batch)."""
        form = parse_multipart(await request.body(), request.headers.get("content-type", ""))
        if "file" not in form or form.get("purpose", (None, b""))[1] != b"batch":
            return self._error("openai", 400, "invalid_request_error", "expected file and purpose=batch")
        filename, content = form["file"]
        file_id = self.new_id("file-")
        self.files[file_id] = (filename or "upload.jsonl", content)
        return OrjsonResponse(file_object(file_id, filename or "upload.jsonl", len(content), "batch"))

    @endpoint("openai")
    async def openai_file_content(self, request: Request, call: Call) -> Response:
        """GET /v1/files/{file_id}/content."""
        file_id = request.path_params["file_id"]
        if file_id not in self.files:
            return self._error("openai", 404, "invalid_request_error", f"No such File object: {file_id}")
        return Response(self.files[file_id][1], media_type="application/octet-stream")

    @endpoint("openai", body=True)
    async def openai_create_batch(self, request: Request, call: Call) -> Response:
        """POST /v1/batches. Each line's `body` is checked when the batch runs: a refused one
        ends in the error file as a 400, the others are answered."""
        body = call.body
        file_id = body.get("input_file_id")
        if file_id not in self.files:
            return self._error("openai", 400, "invalid_request_error", f"input_file_id {file_id} not found")
        url = body.get("endpoint")
        if url not in BATCH_ENDPOINTS:
            return self._error(
                "openai", 400, "invalid_request_error", "endpoint must be " + " or ".join(BATCH_ENDPOINTS)
            )
        if body.get("completion_window") != "24h":
            return self._error("openai", 400, "invalid_request_error", "completion_window must be 24h")
        lines = []
        seen: set[str] = set()
        for raw in self.files[file_id][1].splitlines():
            if not raw.strip():
                continue
            line = orjson.loads(raw)
            cid = line.get("custom_id")
            if not cid or cid in seen or line.get("url") != url:
                return self._error(
                    "openai", 400, "invalid_request_error", f"bad or duplicate custom_id {cid!r}"
                )
            seen.add(cid)
            lines.append(line)
        batch = BatchJob(
            self.new_id("batch_"), "openai", time.monotonic(), lines, input_file_id=file_id, endpoint=url
        )
        batch.tokens = sum(offline.line_tokens(line) for line in lines)
        self._check_enqueued_limit(batch)
        return OrjsonResponse(self._openai_batch(self._register(batch)))

    def _check_enqueued_limit(self, batch: BatchJob) -> None:
        """OpenAI's enqueued token limit: a batch whose input tokens, with those of the
        unfinished batches, exceed `batch_max_enqueued_tokens` is created failed, with the
        error `token_limit_exceeded`; none of its requests runs."""
        limit = self.config.batch_max_enqueued_tokens
        if not limit:
            return
        enqueued = sum(
            b.tokens for b in self.batches.values() if b.kind == "openai" and b.ended_s is None
        )
        if enqueued + batch.tokens <= limit:
            return
        self.stats_.counters["batches_over_enqueued_limit"] += 1
        batch.status, batch.ended_s = "failed", time.monotonic()
        message = (
            f"Enqueued token limit reached for {_model_of(batch)} in organization org-sim. Limit: "
            f"{limit:,} enqueued tokens. Please try submitting fewer tokens or wait for ongoing "
            "batches to complete."
        )
        batch.errors = {
            "object": "list",
            "data": [{"code": "token_limit_exceeded", "message": message, "param": None, "line": None}],
        }

    @endpoint("openai", batch=True)
    async def openai_get_batch(self, request: Request, call: Call) -> Response:
        """GET /v1/batches/{batch_id}."""
        return OrjsonResponse(self._openai_batch(call.batch))

    @endpoint("openai", batch=True)
    async def openai_cancel_batch(self, request: Request, call: Call) -> Response:
        """POST /v1/batches/{batch_id}/cancel."""
        self._cancel(call.batch, "cancelled")
        return OrjsonResponse(self._openai_batch(call.batch))

    def _openai_batch(self, batch: BatchJob) -> dict[str, Any]:
        created = int(time.time() - (time.monotonic() - batch.created_s))
        done = batch.ended_s is not None
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": batch.errors,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": created,
            "in_progress_at": created,
            "expires_at": created + 86400,
            "completed_at": int(time.time()) if batch.status == "completed" else None,
            "failed_at": int(time.time()) if batch.status == "failed" else None,
            "expired_at": int(time.time()) if batch.status == "expired" else None,
            "cancelled_at": int(batch.cancelled_s) if batch.cancelled_s else None,
            "request_counts": {
                "total": len(batch.lines),
                "completed": batch.counts["succeeded"] if done else 0,
                "failed": (batch.counts["errored"] + batch.counts["expired"]) if done else 0,
            },
            "metadata": None,
        }

    @endpoint("anthropic", body=True)
    async def anthropic_create_batch(self, request: Request, call: Call) -> Response:
        """POST /v1/messages/batches. Each request's `params` is checked when the batch runs:
        a refused one ends `errored` with the 400's error, the others are answered."""
        items = call.body.get("requests")
        if not isinstance(items, list) or not items:
            return self._error(
                "anthropic", 400, "invalid_request_error", "requests: must be a non-empty list"
            )
        seen: set[str] = set()
        for item in items:
            cid = item.get("custom_id") if isinstance(item, dict) else None
            if not cid or cid in seen or not isinstance(item.get("params"), dict):
                return self._error(
                    "anthropic", 400, "invalid_request_error", f"bad or duplicate custom_id {cid!r}"
                )
            seen.add(cid)
        batch = self._register(BatchJob(self.new_id("msgbatch_"), "anthropic", time.monotonic(), items))
        return OrjsonResponse(self._anthropic_batch(batch, request))

    @endpoint("anthropic", batch=True)
    async def anthropic_get_batch(self, request: Request, call: Call) -> Response:
        """GET /v1/messages/batches/{batch_id}."""
        return OrjsonResponse(self._anthropic_batch(call.batch, request))

    @endpoint("anthropic", batch=True)
    async def anthropic_cancel_batch(self, request: Request, call: Call) -> Response:
        """POST /v1/messages/batches/{batch_id}/cancel."""
        batch = call.batch
        if self._cancel(batch, "ended"):
            batch.results = [
                {"custom_id": i["custom_id"], "result": {"type": "canceled"}} for i in batch.lines
            ]
            batch.counts = Counter(canceled=len(batch.lines))
        return OrjsonResponse(self._anthropic_batch(batch, request))

    @endpoint("anthropic", batch=True)
    async def anthropic_results(self, request: Request, call: Call) -> Response:
        """GET /v1/messages/batches/{batch_id}/results (JSONL)."""
        batch = call.batch
        if batch.ended_s is None:
            return self._error("anthropic", 400, "invalid_request_error", "batch has not ended")
        content = b"".join(orjson.dumps(line) + b"\n" for line in batch.results)
        return Response(content, media_type="application/binary")

    def _anthropic_batch(self, batch: BatchJob, request: Request) -> dict[str, Any]:
        created = time.time() - (time.monotonic() - batch.created_s)
        ended = batch.ended_s is not None
        base = str(request.base_url).rstrip("/")
        processing = 0 if ended else len(batch.lines)
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": {
                "processing": processing,
                "succeeded": batch.counts["succeeded"],
                "errored": batch.counts["errored"],
                "canceled": batch.counts["canceled"],
                "expired": batch.counts["expired"],
            },
            "ended_at": now_iso() if ended else None,
            "created_at": now_iso(created),
            "expires_at": now_iso(created + 86400),
            "archived_at": None,
            "cancel_initiated_at": now_iso(batch.cancelled_s) if batch.cancelled_s else None,
            "results_url": f"{base}/v1/messages/batches/{batch.id}/results" if ended else None,
        }


def _model_of(batch: BatchJob) -> str:
    body = batch.lines[0].get("body") if batch.lines else None
    return str(body.get("model") or "sim") if isinstance(body, dict) else "sim"
