"""Offline batches (a provider's Batch API): their value objects, and what a finished batch's
item means for its job.

A provider batch carries many offline jobs, each one `BatchRequest` with its `custom_id`; the
provider adapters (`consumer.providers.batch_*`) normalize the batch (`BatchJob`, its
`BatchStatus`) and each item's outcome (`BatchItemResult`). When a batch ends, each member job
gets `item_outcome`: `Answered` (its result carries this answer) or `Failed` (its dead letter
says why). Pure: the runtime (`consumer.runtime.offline.BatchTracker`) builds and publishes
the records.

Failed or expired members are dead-lettered (`batch_failed`, `batch_expired`), never retried
online: the job asked for offline processing. An answer is checked against the output format
the job's options (merged over the tier's) ask for, like an online answer; one that breaks it
is `output_invalid`, since a batch cannot ask again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.embed import EmbeddingRequest, Embeddings, Vector
from consumer.core.errors import ErrorKind, JobError, ProviderError
from consumer.core.jobs import Job
from consumer.core.output import output_format

__all__ = [
    "Answered",
    "BatchItemResult",
    "BatchJob",
    "BatchRequest",
    "BatchStatus",
    "Failed",
    "item_outcome",
]


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


@dataclass(frozen=True, slots=True)
class Answered:
    """A member answered as its job asks: its result carries `answer`, with `output` (the text
    as published; None for an embedding) or `embedding`."""

    answer: Completion | Embeddings
    output: str | None = None
    embedding: Vector | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A member that ends as a dead letter: its kind, why, and the provider's status code."""

    kind: ErrorKind
    message: str
    status_code: int | None = None


def item_outcome(
    item: BatchItemResult | None,
    job: Job,
    status: BatchStatus,
    batch_id: str,
    tier_options: Mapping[str, Any],
) -> Answered | Failed:
    """What the item of member `job` (None: the provider returned none for it) means once its
    batch `batch_id` ended `status`.

    An embedding holds one vector per input, so exactly one; a completion must obey the output
    format of the job's options merged over `tier_options` (the tier's, as online jobs).
    """
    answer = item.completion if item is not None else None
    if isinstance(answer, Embeddings):
        if len(answer.vectors) == 1:
            return Answered(answer, embedding=answer.vectors[0])
        problem = f"the batch answered {len(answer.vectors)} vectors for one input"
        return Failed(ErrorKind.OUTPUT_INVALID, problem, _status_code(item))
    if answer is not None:
        output: str | None = answer.text
        try:
            wanted = output_format({**tier_options, **job.options})
        except JobError as exc:  # the tier's options changed since the job was read
            return Failed(ErrorKind.OUTPUT_INVALID, str(exc), _status_code(item))
        if wanted is not None:
            output, problem_or_none = wanted.accept(answer.text)
            if problem_or_none is not None:
                return Failed(ErrorKind.OUTPUT_INVALID, problem_or_none, _status_code(item))
        return Answered(answer, output=output)
    if (item is not None and item.expired) or (item is None and status is BatchStatus.EXPIRED):
        return Failed(
            ErrorKind.BATCH_EXPIRED,
            f"provider batch {batch_id} expired before this item ran",
            _status_code(item),
        )
    if item is not None and item.error is not None:
        return Failed(ErrorKind.BATCH_FAILED, f"batch item failed: {item.error.message}", _status_code(item))
    return Failed(ErrorKind.BATCH_FAILED, f"provider batch {batch_id} ended {status.value} without this item")


def _status_code(item: BatchItemResult | None) -> int | None:
    """The provider's status code of a failed item, for its dead letter."""
    return item.error.status_code if item is not None and item.error is not None else None
