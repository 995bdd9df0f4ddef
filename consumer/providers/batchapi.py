"""What the HTTP Batch API adapters share (`batch_openai.py`, `batch_anthropic.py`).

Both keep the requests of the batches this process submitted, read a batch object with
`GET {batches_path}/{id}`, cancel with `POST {batches_path}/{id}/cancel`, and read a succeeded
result line with the same answer parser as their online adapter. What differs is the batch
object (`_job`), where the result lines are (`_read_results`) and their format (`_parse_line`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from consumer.core.completion import CompletionRequest
from consumer.core.embed import EmbeddingRequest
from consumer.core.errors import MalformedResponse
from consumer.core.offline import BatchItemResult, BatchJob, BatchRequest
from consumer.providers.embeddings import is_embeddings_body, read_embeddings
from consumer.providers.httpapi import HttpAdapter


class HttpBatchProvider(HttpAdapter):
    """A `BatchProvider` over HTTP: submitted-request bookkeeping, status, cancel, results.

    Subclasses set `api` and `batches_path`, implement `_job` (a batch object -> BatchJob),
    `_read_results` (the items of a batch) and `_parse_line` (one result line -> item), and
    record each batch they create in `_submitted`.
    """

    batches_path: str

    @functools.cached_property
    def _submitted(self) -> dict[str, dict[str, BatchRequest]]:
        """Batch id -> custom_id -> request, for the batches this process submitted: answers are
        read with the right request, and items the provider never mentions are known."""
        return {}

    def _job(self, payload: Any) -> BatchJob:
        """The provider's batch object as a BatchJob; MalformedResponse when it is not one."""
        raise NotImplementedError

    async def _read_results(
        self, batch_id: str, job: BatchJob, payload: Any, submitted: Mapping[str, BatchRequest]
    ) -> list[BatchItemResult] | None:
        """The items of the batch whose object is `payload`, or None while the provider has no
        results for it yet; `submitted` holds its requests when this process submitted it (else
        it is empty)."""
        raise NotImplementedError

    def _parse_line(self, raw: bytes, submitted: Mapping[str, BatchRequest]) -> BatchItemResult:
        """One result line as an item; MalformedResponse when the line ties to no custom_id."""
        raise NotImplementedError

    async def status(self, batch_id: str) -> BatchJob:
        """The batch as the provider reports it now."""
        reply = await self.http.request("GET", f"{self.batches_path}/{batch_id}")
        return self._job(reply.json)

    async def cancel(self, batch_id: str) -> BatchJob:
        """Ask the provider to cancel; returns the batch as it is then."""
        reply = await self.http.request("POST", f"{self.batches_path}/{batch_id}/cancel")
        return self._job(reply.json)

    async def results(self, batch_id: str) -> list[BatchItemResult]:
        """Every item of the batch, as `_read_results` finds them ([] while there are none yet).

        Once a finished batch's results are read, its requests are forgotten (memory stays
        bounded); results not there yet, or that fail to download, keep them for the next call.
        """
        reply = await self.http.request("GET", f"{self.batches_path}/{batch_id}")
        job = self._job(reply.json)
        items = await self._read_results(batch_id, job, reply.json, self._submitted.get(batch_id, {}))
        if items is None:
            return []
        if job.status.done:
            self._submitted.pop(batch_id, None)
        return items

    def _answered(
        self, cid: str, payload: Any, submitted: Mapping[str, BatchRequest], *, request_id: str | None = None
    ) -> BatchItemResult:
        """A succeeded line's item: `payload` read as the answer to the request submitted as
        `cid` (an empty request when this process did not submit it, e.g. after a restart);
        an answer that is not the provider's format becomes the item's error."""
        original = submitted.get(cid)
        request = original.request if original else None
        try:
            if isinstance(request, EmbeddingRequest) or (request is None and is_embeddings_body(payload)):
                embedded = EmbeddingRequest((), "") if request is None else request
                vectors = read_embeddings(payload, embedded, provider=self.name, request_id=request_id)
                return BatchItemResult(cid, completion=vectors)
            if request is None:
                request = CompletionRequest(messages=(), model="")
            completion = self.read_answer(payload, request, request_id=request_id)
        except MalformedResponse as exc:
            return BatchItemResult(cid, error=exc)
        return BatchItemResult(cid, completion=completion)
