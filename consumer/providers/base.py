"""The provider edge: one Protocol for online completions, one for offline Batch APIs.

Each has real implementations in this package (HTTP through an injected `HttpTransport`) and a fake for
tests. Adapters raise only `consumer.core.errors` classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ProviderError


@runtime_checkable
class CompletionProvider(Protocol):
    """Sends one completion request; returns a Completion or raises a ProviderError."""

    name: str

    async def complete(self, request: CompletionRequest) -> Completion: ...

    async def check_reachable(self) -> str:
        """Ask the provider something that costs nothing (a models listing); return where it
        was asked. Raises a ProviderError when the provider cannot be reached or refuses us."""
        ...

    async def aclose(self) -> None: ...


class BatchStatus(StrEnum):
    """Normalized offline batch status."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def done(self) -> bool:
        return self not in (BatchStatus.PENDING, BatchStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One request inside an offline batch; `custom_id` matches its result. An embeddings
    request is answered with Embeddings (where the provider's Batch API has the endpoint)."""

    custom_id: str
    request: CompletionRequest | EmbeddingRequest


@dataclass(frozen=True, slots=True)
class BatchJob:
    """A provider batch as last seen.

    id: the provider's batch id. total/completed/failed: request counts as the provider reports.
    """

    id: str
    provider: str
    status: BatchStatus
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class BatchItemResult:
    """One request's outcome: exactly one of `completion` and `error` is set.

    For an item the provider expired or cancelled, `error` is a ProviderError and `expired`
    tells which dead-letter kind applies (batch_expired vs batch_failed).
    """

    custom_id: str
    completion: Completion | Embeddings | None = None
    error: ProviderError | None = None
    expired: bool = False

    @property
    def ok(self) -> bool:
        return self.completion is not None


@runtime_checkable
class BatchProvider(Protocol):
    """A provider's offline Batch API, normalized."""

    name: str

    async def submit(self, requests: Sequence[BatchRequest]) -> list[BatchJob]:
        """Submit; split into several provider batches when over the provider's limits.

        Raises ValueError on a missing or duplicate custom_id before anything is sent.
        """
        ...

    async def status(self, batch_id: str) -> BatchJob: ...

    async def results(self, batch_id: str) -> list[BatchItemResult]:
        """Every item of a finished batch: successes and errors (OpenAI's error file too)."""
        ...

    async def cancel(self, batch_id: str) -> BatchJob: ...
