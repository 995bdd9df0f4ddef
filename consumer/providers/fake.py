"""In-memory providers for tests of the runtime: no HTTP, answers from a handler.

A handler takes the `CompletionRequest` and returns a `Completion`, raises or returns an
exception (returned exceptions are raised), or returns an awaitable of either. An embeddings
handler does the same for an `EmbeddingRequest` and its `Embeddings`.
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from consumer.core.completion import Completion, CompletionRequest, Usage
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ProviderError
from consumer.core.offline import BatchItemResult, BatchJob, BatchRequest, BatchStatus
from consumer.providers.batchsplit import check_custom_ids, split_by_limits

FakeAnswer = Completion | Exception | BatchItemResult
FakeHandler = Callable[[CompletionRequest], FakeAnswer | Awaitable[FakeAnswer]]
FakeEmbedHandler = Callable[[EmbeddingRequest], Embeddings | Exception | Awaitable[Embeddings | Exception]]


def text_completion(
    text: str, *, finish_reason: str = "stop", provider: str = "fake", model: str = "fake"
) -> Completion:
    """A Completion with usage ~ len/4, for handlers."""
    return Completion(
        text=text,
        finish_reason=finish_reason,
        usage=Usage(input_tokens=0, output_tokens=max(1, len(text) // 4)),
        provider=provider,
        model=model,
    )


async def _resolve(handler: Callable[[Any], Any], request: Any) -> Any:
    answer = handler(request)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


Answer = TypeVar("Answer", Completion, Embeddings)


async def _answer(handler: Callable[[Any], Any], request: Any, kind: type[Answer]) -> Answer:
    """The handler's answer to `request`: raised when it is an exception, else of `kind`."""
    answer = await _resolve(handler, request)
    if isinstance(answer, BaseException):
        raise answer
    if not isinstance(answer, kind):
        raise TypeError(f"fake handler returned {type(answer).__name__}, not {kind.__name__}")
    return answer


class FakeProvider:
    """A CompletionProvider answering from `handler`; records every request in `requests`.
    With `embed_handler` it is an EmbeddingProvider too (its requests in `embed_requests`)."""

    def __init__(
        self,
        handler: FakeHandler,
        *,
        name: str = "fake",
        unreachable: ProviderError | None = None,
        embed_handler: FakeEmbedHandler | None = None,
    ) -> None:
        self.name = name
        self.handler = handler
        self.embed_handler = embed_handler
        self.requests: list[CompletionRequest] = []
        self.embed_requests: list[EmbeddingRequest] = []
        self.closed = False
        #: raised by `check_reachable` (None: the fake is reachable)
        self.unreachable = unreachable
        #: when `check_reachable` was called (`time.monotonic`)
        self.checked_at: list[float] = []

    def __repr__(self) -> str:
        return f"FakeProvider(name={self.name!r}, calls={len(self.requests)})"

    async def check_reachable(self) -> str:
        """`fake://NAME`, or raise `unreachable` when it is set."""
        self.checked_at.append(time.monotonic())
        if self.unreachable is not None:
            raise self.unreachable
        return f"fake://{self.name}"

    async def complete(self, request: CompletionRequest) -> Completion:
        """Record the request and answer it from the handler."""
        self.requests.append(request)
        return await _answer(self.handler, request, Completion)

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """Record the request and answer it from `embed_handler` (TypeError without one)."""
        if self.embed_handler is None:
            raise TypeError(f"{self!r} has no embed_handler")
        self.embed_requests.append(request)
        return await _answer(self.embed_handler, request, Embeddings)

    async def aclose(self) -> None:
        """Nothing to close; records that it was called."""
        self.closed = True


@dataclass
class _FakeBatch:
    job: BatchJob
    requests: list[BatchRequest]
    polls: int = 0
    results: list[BatchItemResult] | None = None
    forced: BatchStatus | None = None
    extra: dict[str, object] = field(default_factory=dict)


class FakeBatchProvider:
    """A BatchProvider in memory.

    A batch is RUNNING until `status()` was called `polls_until_done` times (or `finish()` /
    `expire()` / `cancel()` is called); then the handler answers every item: a Completion is a
    success, a ProviderError an errored item, a BatchItemResult is used as is. `expire()` makes
    every item expired. Limits (`max_requests`) split submissions like the real ones.
    """

    def __init__(
        self,
        handler: FakeHandler,
        *,
        name: str = "fake",
        polls_until_done: int = 0,
        max_requests: int = 50_000,
    ) -> None:
        self.name = name
        self.handler = handler
        self.polls_until_done = polls_until_done
        self.max_requests = max_requests
        self.batches: dict[str, _FakeBatch] = {}
        self.submissions = 0
        self._ids = itertools.count(1)

    async def submit(self, requests: Sequence[BatchRequest]) -> list[BatchJob]:
        """Validate custom_ids, split by max_requests, store the batches (RUNNING)."""
        check_custom_ids(requests)
        jobs = []
        for chunk in split_by_limits([1] * len(requests), max_requests=self.max_requests, max_bytes=1 << 62):
            batch_id = f"fakebatch_{next(self._ids)}"
            job = BatchJob(batch_id, self.name, BatchStatus.RUNNING, total=len(chunk))
            self.batches[batch_id] = _FakeBatch(job, [requests[i] for i in chunk])
            jobs.append(job)
        self.submissions += 1
        return jobs

    def _get(self, batch_id: str) -> _FakeBatch:
        try:
            return self.batches[batch_id]
        except KeyError:
            raise ProviderError(
                f"{self.name}: no batch {batch_id}", status_code=404, provider=self.name
            ) from None

    async def _settle(self, batch: _FakeBatch, status: BatchStatus) -> None:
        results: list[BatchItemResult] = []
        for item in batch.requests:
            if status is BatchStatus.EXPIRED:
                results.append(
                    BatchItemResult(
                        item.custom_id, error=ProviderError("expired", provider=self.name), expired=True
                    )
                )
                continue
            if status is BatchStatus.CANCELLED:
                results.append(
                    BatchItemResult(item.custom_id, error=ProviderError("cancelled", provider=self.name))
                )
                continue
            if not isinstance(item.request, CompletionRequest):
                raise TypeError("the fake batch provider answers chat requests only")
            answer = await _resolve(self.handler, item.request)
            if isinstance(answer, BatchItemResult):
                results.append(answer)
            elif isinstance(answer, ProviderError):
                results.append(BatchItemResult(item.custom_id, error=answer))
            elif isinstance(answer, Completion):
                results.append(BatchItemResult(item.custom_id, completion=answer))
            else:
                raise TypeError(f"fake batch handler returned {type(answer).__name__}")
        batch.results = results
        ok = sum(r.ok for r in results)
        batch.job = BatchJob(
            batch.job.id, self.name, status, total=len(results), completed=ok, failed=len(results) - ok
        )

    async def finish(self, batch_id: str) -> None:
        """Complete the batch now."""
        await self._settle(self._get(batch_id), BatchStatus.COMPLETED)

    async def expire(self, batch_id: str) -> None:
        """Expire the batch now: every item expired."""
        await self._settle(self._get(batch_id), BatchStatus.EXPIRED)

    async def status(self, batch_id: str) -> BatchJob:
        """Counts a poll; settles the batch once polled more than `polls_until_done` times."""
        batch = self._get(batch_id)
        if batch.results is None:
            batch.polls += 1
            if batch.polls > self.polls_until_done:
                await self._settle(batch, BatchStatus.COMPLETED)
        return batch.job

    async def resubmit(self, batch_id: str) -> BatchJob:
        """A new RUNNING batch of the same requests."""
        old = self._get(batch_id)
        job_id = f"fakebatch_{next(self._ids)}"
        job = BatchJob(job_id, self.name, BatchStatus.RUNNING, total=len(old.requests))
        self.batches[job.id] = _FakeBatch(job, list(old.requests))
        self.submissions += 1
        return job

    async def results(self, batch_id: str) -> list[BatchItemResult]:
        """The settled items ([] while the batch runs)."""
        batch = self._get(batch_id)
        return list(batch.results or [])

    async def cancel(self, batch_id: str) -> BatchJob:
        """Cancel a running batch: every item ends cancelled."""
        batch = self._get(batch_id)
        if batch.results is None:
            await self._settle(batch, BatchStatus.CANCELLED)
        return batch.job

    async def aclose(self) -> None:
        """Nothing to close; records that it was called."""
        return None
