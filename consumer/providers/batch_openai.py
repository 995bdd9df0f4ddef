"""OpenAI Batch API: JSONL upload, batch create, poll, read the output AND the error file.

    submit   POST {base}/files (multipart, purpose=batch; lines {custom_id, method, url, body})
             POST {base}/batches {input_file_id, endpoint: /v1/chat/completions, completion_window}
             (several provider batches when over max_requests / max_bytes per file)
    status   GET  {base}/batches/{id}
    resubmit POST {base}/batches with the failed batch's input file (its enqueued token limit)
    results  GET  {base}/files/{output_file_id}/content and .../{error_file_id}/content
    cancel   POST {base}/batches/{id}/cancel

Status mapping: validating -> pending; in_progress, finalizing, cancelling -> running;
completed, failed, expired, cancelled as named. Each line's `body` is built by the same
`build_chat_body` the online adapter uses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Unpack

import orjson

from consumer.core.embed import EmbeddingRequest
from consumer.core.errors import ProviderError, Rejected
from consumer.core.offline import BatchItemResult, BatchJob, BatchRequest, BatchStatus
from consumer.providers.batchapi import HttpBatchProvider
from consumer.providers.batchsplit import check_custom_ids, create_chunks, parse_result_lines, split_by_limits
from consumer.providers.embeddings import EMBEDDINGS_ENDPOINT, build_embeddings_body
from consumer.providers.httpapi import AdapterOptions, ProviderHttp
from consumer.providers.openai import OPENAI_API, build_chat_body
from consumer.providers.structured import StructuredMode
from consumer.providers.transport import HttpTransport

log = logging.getLogger(__name__)

OPENAI_MAX_REQUESTS = 50_000
OPENAI_MAX_BYTES = 200 * 1024 * 1024
CHAT_ENDPOINT = "/v1/chat/completions"

_STATUS = {
    "validating": BatchStatus.PENDING,
    "in_progress": BatchStatus.RUNNING,
    "finalizing": BatchStatus.RUNNING,
    "cancelling": BatchStatus.RUNNING,
    "completed": BatchStatus.COMPLETED,
    "failed": BatchStatus.FAILED,
    "expired": BatchStatus.EXPIRED,
    "cancelled": BatchStatus.CANCELLED,
}


class OpenAIBatchProvider(HttpBatchProvider):
    """OpenAI's Batch API behind the `BatchProvider` Protocol.

    max_requests / max_bytes: per input file (OpenAI: 50,000 / 200 MB); tests pass small ones.
    completion_window: sent as is (OpenAI accepts "24h").
    """

    def __init__(
        self,
        transport: HttpTransport,
        *,
        completion_window: str = "24h",
        max_requests: int = OPENAI_MAX_REQUESTS,
        max_bytes: int = OPENAI_MAX_BYTES,
        **adapter: Unpack[AdapterOptions],
    ) -> None:
        super().__init__(transport, **adapter)
        self.completion_window = completion_window
        self.max_requests = max_requests
        self.max_bytes = max_bytes

    api = OPENAI_API
    default_name: ClassVar[str] = "openai"
    default_structured_mode: ClassVar[StructuredMode] = "json_schema"
    batches_path = "/batches"

    def jsonl_line(self, item: BatchRequest) -> bytes:
        """One input-file line (newline included)."""
        request = item.request
        if isinstance(request, EmbeddingRequest):
            url, body = EMBEDDINGS_ENDPOINT, build_embeddings_body(request)
        else:
            url, body = CHAT_ENDPOINT, build_chat_body(request, structured_mode=self.structured_mode)
        line = {"custom_id": item.custom_id, "method": "POST", "url": url, "body": body}
        return orjson.dumps(line) + b"\n"

    async def submit(self, requests: Sequence[BatchRequest]) -> list[BatchJob]:
        """Upload and create one provider batch per chunk within the limits.

        Raises ValueError (missing/duplicate custom_id, an item over the size limit) before
        anything is sent. If a later chunk fails, earlier chunks stay submitted (their ids are
        logged); the error is raised.
        """
        check_custom_ids(requests)
        lines = [self.jsonl_line(item) for item in requests]
        # a provider batch has one endpoint: each run of one endpoint's requests is split apart
        endpoints = [_endpoint(item) for item in requests]
        chunks: list[range] = []
        start = 0
        for end in range(1, len(requests) + 1):
            if end == len(requests) or endpoints[end] != endpoints[start]:
                sizes = [len(line) for line in lines[start:end]]
                run = split_by_limits(sizes, max_requests=self.max_requests, max_bytes=self.max_bytes)
                chunks += [range(start + c.start, start + c.stop) for c in run]
                start = end

        async def create(chunk: range) -> BatchJob:
            content = b"".join(lines[i] for i in chunk)
            upload = await self.http.request(
                "POST",
                "/files",
                files={"file": ("batch.jsonl", content, "application/jsonl")},
                data={"purpose": "batch"},
            )
            return await self._create(_field(upload.json, "id", self.http), endpoints[chunk.start])

        return await create_chunks(self.name, requests, chunks, create, self._submitted)

    async def _create(self, file_id: str, endpoint: str) -> BatchJob:
        """A batch of the uploaded input file `file_id`, all of whose lines go to `endpoint`."""
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": self.completion_window}
        created = await self.http.request("POST", "/batches", json_body=body)
        return self._job(created.json)

    def _job(self, payload: Any) -> BatchJob:
        try:
            counts = payload.get("request_counts") or {}
            return BatchJob(
                id=str(payload["id"]),
                provider=self.name,
                status=_STATUS[str(payload["status"])],
                total=int(counts.get("total") or 0),
                completed=int(counts.get("completed") or 0),
                failed=int(counts.get("failed") or 0),
                error_code=_batch_error_code(payload),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self.http.malformed(f"not a batch object ({type(exc).__name__})") from None

    async def resubmit(self, batch_id: str) -> BatchJob:
        """A new batch of the failed one's input file (OpenAI keeps it): the same requests and
        custom_ids; what this process submitted of the old batch is known under the new one."""
        reply = await self.http.request("GET", f"{self.batches_path}/{batch_id}")
        job = await self._create(
            _field(reply.json, "input_file_id", self.http), _field(reply.json, "endpoint", self.http)
        )
        if batch_id in self._submitted:
            self._submitted[job.id] = self._submitted.pop(batch_id)
        return job

    async def _read_results(
        self, batch_id: str, job: BatchJob, payload: Any, submitted: Mapping[str, BatchRequest]
    ) -> list[BatchItemResult]:
        """The output file's lines, the error file's lines and, for a batch submitted by this
        process, one error per request neither file mentions (expired when the batch expired,
        else failed)."""
        results: dict[str, BatchItemResult] = {}
        for key in ("output_file_id", "error_file_id"):
            file_id = payload.get(key)
            if not file_id:
                continue
            content = await self.http.request("GET", f"/files/{file_id}/content", decode_json=False)
            for item in parse_result_lines(content.content, self._parse_line, submitted, self.name):
                results[item.custom_id] = item
        for cid in submitted:
            if cid not in results:
                expired = job.status is BatchStatus.EXPIRED
                what = "expired before it ran" if expired else f"not answered (batch {job.status.value})"
                results[cid] = BatchItemResult(
                    cid,
                    error=ProviderError(f"{self.name}: batch {batch_id}: request {what}", provider=self.name),
                    expired=expired,
                )
        return list(results.values())

    def _parse_line(self, raw: bytes, submitted: Mapping[str, BatchRequest]) -> BatchItemResult:
        try:
            line = orjson.loads(raw)
            cid = str(line["custom_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise self.http.malformed(
                f"batch result line is not JSON with custom_id ({type(exc).__name__})"
            ) from None
        response = line.get("response")
        error = line.get("error")
        if isinstance(response, Mapping) and response.get("status_code") is not None:
            try:
                status_code = int(response["status_code"])
            except (TypeError, ValueError):
                malformed = self.http.malformed("batch result status_code is not a number")
                return BatchItemResult(cid, error=malformed)
            body = response.get("body")
            if 200 <= status_code < 300:
                return self._answered(cid, body, submitted, request_id=response.get("request_id"))
            return BatchItemResult(cid, error=self.http.error_for(status_code, body, None))
        code = str((error or {}).get("code") or "") if isinstance(error, Mapping) else ""
        message = str((error or {}).get("message") or "") if isinstance(error, Mapping) else ""
        if code == "batch_expired":
            return BatchItemResult(
                cid,
                error=ProviderError(f"{self.name}: batch_expired: {message[:200]}", provider=self.name),
                expired=True,
            )
        return BatchItemResult(
            cid,
            error=Rejected(f"{self.name}: batch item failed: {code}: {message[:200]}", provider=self.name),
        )


def _batch_error_code(payload: Any) -> str | None:
    """The code of the first error of a failed batch (`errors.data[0].code`), if any."""
    errors = payload.get("errors")
    data = errors.get("data") if isinstance(errors, Mapping) else None
    if isinstance(data, list) and data and isinstance(data[0], Mapping) and data[0].get("code"):
        return str(data[0]["code"])
    return None


def _endpoint(item: BatchRequest) -> str:
    return EMBEDDINGS_ENDPOINT if isinstance(item.request, EmbeddingRequest) else CHAT_ENDPOINT


def _field(payload: Any, key: str, http: ProviderHttp) -> str:
    if isinstance(payload, Mapping) and payload.get(key):
        return str(payload[key])
    raise http.malformed(f"answer has no {key!r}")
