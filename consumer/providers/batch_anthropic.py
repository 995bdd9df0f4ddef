"""Anthropic Message Batches API.

    submit   POST {base}/v1/messages/batches {requests: [{custom_id, params}]}
             (several provider batches when over max_requests / max_bytes per request body)
    status   GET  {base}/v1/messages/batches/{id}
    results  GET  the batch's `results_url` (JSONL: succeeded | errored | canceled | expired)
    cancel   POST {base}/v1/messages/batches/{id}/cancel

Status mapping: `in_progress` and `canceling` -> running; `ended` -> cancelled when a cancel was
initiated, expired when every request expired, else completed. completed = succeeded,
failed = errored + canceled + expired. `params` are built by the same `build_messages_body` the
online adapter uses. The key is only sent to a `results_url` on the base URL's origin; any other
results_url is replaced by the documented `/results` route on the base URL.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Unpack

import orjson

from consumer.core.completion import CompletionRequest
from consumer.core.errors import ProviderError, Rejected
from consumer.core.offline import BatchItemResult, BatchJob, BatchRequest, BatchStatus
from consumer.providers.anthropic import ANTHROPIC_API, DEFAULT_MAX_TOKENS, build_messages_body
from consumer.providers.batchapi import HttpBatchProvider
from consumer.providers.batchsplit import check_custom_ids, create_chunks, parse_result_lines, split_by_limits
from consumer.providers.httpapi import AdapterOptions
from consumer.providers.structured import StructuredMode
from consumer.providers.transport import HttpTransport

log = logging.getLogger(__name__)

ANTHROPIC_MAX_REQUESTS = 100_000
ANTHROPIC_MAX_BYTES = 256 * 1024 * 1024
#: Anthropic's documented custom_id format
CUSTOM_ID_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_ENVELOPE = b'{"requests":[]}'


class AnthropicBatchProvider(HttpBatchProvider):
    """Anthropic's Message Batches API behind the `BatchProvider` Protocol.

    max_requests / max_bytes: per provider batch (Anthropic: 100,000 / 256 MB); tests pass small ones.
    """

    def __init__(
        self,
        transport: HttpTransport,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        max_requests: int = ANTHROPIC_MAX_REQUESTS,
        max_bytes: int = ANTHROPIC_MAX_BYTES,
        **adapter: Unpack[AdapterOptions],
    ) -> None:
        super().__init__(transport, **adapter)
        self.default_max_tokens = default_max_tokens
        self.max_requests = max_requests
        self.max_bytes = max_bytes

    api = ANTHROPIC_API
    default_name: ClassVar[str] = "anthropic"
    default_structured_mode: ClassVar[StructuredMode] = "tool"
    batches_path = "/v1/messages/batches"

    def batch_item(self, item: BatchRequest) -> dict[str, Any]:
        """One `{custom_id, params}` entry of a Message Batches request."""
        if not isinstance(item.request, CompletionRequest):
            # admission refuses embed jobs of a provider without embeddings
            raise ValueError(f"{self.name}: Message Batches have no embeddings (request {item.custom_id})")
        return {
            "custom_id": item.custom_id,
            "params": build_messages_body(
                item.request, structured_mode=self.structured_mode, default_max_tokens=self.default_max_tokens
            ),
        }

    async def submit(self, requests: Sequence[BatchRequest]) -> list[BatchJob]:
        """Create one provider batch per chunk within the limits.

        Raises ValueError (missing, malformed or duplicate custom_id; an item over the size
        limit) before anything is sent.
        """
        check_custom_ids(requests, pattern=CUSTOM_ID_PATTERN)
        items = [self.batch_item(r) for r in requests]
        sizes = [len(orjson.dumps(i)) + 1 for i in items]  # + the separating comma
        chunks = split_by_limits(
            sizes, max_requests=self.max_requests, max_bytes=self.max_bytes, overhead_bytes=len(_ENVELOPE)
        )

        async def create(chunk: range) -> BatchJob:
            reply = await self.http.request(
                "POST", self.batches_path, json_body={"requests": [items[i] for i in chunk]}
            )
            return self._job(reply.json)

        return await create_chunks(self.name, requests, chunks, create, self._submitted)

    async def resubmit(self, batch_id: str) -> BatchJob:
        """Anthropic fails no message batch for an enqueued token limit (it refuses the creation
        with a 429 instead, which the collector retries): there is nothing to resubmit."""
        raise Rejected(
            f"{self.name}: message batch {batch_id} cannot be resubmitted (Anthropic fails no batch "
            "for an enqueued token limit)",
            provider=self.name,
        )

    def _job(self, payload: Any) -> BatchJob:
        try:
            counts = payload.get("request_counts") or {}
            succeeded = int(counts.get("succeeded") or 0)
            errored = int(counts.get("errored") or 0)
            canceled = int(counts.get("canceled") or 0)
            expired = int(counts.get("expired") or 0)
            processing = int(counts.get("processing") or 0)
            total = succeeded + errored + canceled + expired + processing
            raw = str(payload["processing_status"])
            if raw in ("in_progress", "canceling"):
                status = BatchStatus.RUNNING
            elif raw == "ended":
                if payload.get("cancel_initiated_at"):
                    status = BatchStatus.CANCELLED
                elif total and expired == total:
                    status = BatchStatus.EXPIRED
                else:
                    status = BatchStatus.COMPLETED
            else:
                raise ValueError(raw)
            return BatchJob(
                id=str(payload["id"]),
                provider=self.name,
                status=status,
                total=total,
                completed=succeeded,
                failed=errored + canceled + expired,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self.http.malformed(f"not a message batch object ({type(exc).__name__})") from None

    async def _read_results(
        self, batch_id: str, job: BatchJob, payload: Any, submitted: Mapping[str, BatchRequest]
    ) -> list[BatchItemResult] | None:
        """The lines at the batch's `results_url`; None while it has none (an unfinished batch)."""
        url = payload.get("results_url")
        if not url:
            return None
        if not self.http.same_origin(url):
            log.warning("%s: results_url is on another origin; using the API's results route", self.name)
            url = f"{self.batches_path}/{batch_id}/results"
        content = await self.http.request("GET", url, decode_json=False)
        return parse_result_lines(content.content, self._parse_line, submitted, self.name)

    def _parse_line(self, raw: bytes, submitted: Mapping[str, BatchRequest]) -> BatchItemResult:
        try:
            line = orjson.loads(raw)
            cid = str(line["custom_id"])
            result = line["result"]
            kind = str(result["type"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise self.http.malformed(f"batch result line is not a result ({type(exc).__name__})") from None
        if kind == "succeeded":
            return self._answered(cid, result.get("message"), submitted)
        if kind == "errored":
            envelope = result.get("error")
            envelope = envelope if isinstance(envelope, Mapping) else {}
            nested = envelope.get("error")
            inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else envelope
            etype = str(inner.get("type") or "")
            # Anthropic gives no HTTP status per item; the error type says which class applies
            status_code = _STATUS_FOR_TYPE.get(etype, 400)
            return BatchItemResult(cid, error=self.http.error_for(status_code, {"error": inner}, None))
        if kind == "expired":
            return BatchItemResult(
                cid,
                error=ProviderError(f"{self.name}: batch request expired", provider=self.name),
                expired=True,
            )
        return BatchItemResult(
            cid, error=ProviderError(f"{self.name}: batch request {kind}", provider=self.name)
        )


_STATUS_FOR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
