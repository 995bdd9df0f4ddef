"""The provider edge: one Protocol for online completions, one for offline Batch APIs.

Each has real implementations in this package (HTTP through an injected `HttpTransport`) and a
fake for tests. Adapters raise only `consumer.core.errors` classes. The offline batches' value
objects (`BatchRequest`, `BatchJob`, `BatchStatus`, `BatchItemResult`) are the core's
(`consumer.core.offline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.offline import BatchItemResult, BatchJob, BatchRequest


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

    async def resubmit(self, batch_id: str) -> BatchJob:
        """Submit a batch the provider failed before it ran (its enqueued token limit) again,
        with the same requests: the new batch."""
        ...

    async def results(self, batch_id: str) -> list[BatchItemResult]:
        """Every item of a finished batch: successes and errors (OpenAI's error file too)."""
        ...

    async def cancel(self, batch_id: str) -> BatchJob: ...
