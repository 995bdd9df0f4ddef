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

A provider limits the input tokens of a model's unfinished batches (OpenAI's enqueued token
limit, per organisation; `offline.max_enqueued_tokens`). A collection is cut into shards that
fit the limit (`token_shards`), each submitted once what is enqueued leaves it room
(`enqueued_tokens`); a batch the provider still fails for the limit
(`BatchJob.over_enqueued_limit`) is not a failure of its jobs: it is held and submitted again
once room frees (`may_resubmit`), never dead-lettered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.embed import EmbeddingRequest, Embeddings, Vector
from consumer.core.errors import ErrorKind, JobError, ProviderError
from consumer.core.jobs import Job
from consumer.core.output import output_format

__all__ = [
    "ENQUEUED_TOKEN_LIMIT",
    "Answered",
    "BatchItemResult",
    "BatchJob",
    "BatchRequest",
    "BatchStatus",
    "Failed",
    "enqueued_tokens",
    "fits",
    "item_outcome",
    "may_resubmit",
    "resubmit_backoff_s",
    "token_shards",
]

#: the error code of a batch the provider failed for its enqueued token limit (OpenAI's)
ENQUEUED_TOKEN_LIMIT = "token_limit_exceeded"
#: a held batch is submitted again at the latest after this long, doubling per try, up to the max
RESUBMIT_BACKOFF_S, RESUBMIT_BACKOFF_MAX_S = 60.0, 1800.0


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
    error_code: why the provider failed the whole batch, when it says (e.g. ENQUEUED_TOKEN_LIMIT).
    """

    id: str
    provider: str
    status: BatchStatus
    total: int = 0
    completed: int = 0
    failed: int = 0
    error_code: str | None = None

    @property
    def over_enqueued_limit(self) -> bool:
        """The provider failed this batch for its enqueued token limit: its jobs never ran."""
        return self.status is BatchStatus.FAILED and self.error_code == ENQUEUED_TOKEN_LIMIT


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


def token_shards(tokens: Sequence[int], limit: int) -> list[range]:
    """Consecutive runs of items whose tokens add up to at most `limit` each (an item larger
    than the limit is a run of its own: it goes alone, when nothing else is enqueued)."""
    shards: list[range] = []
    start, total = 0, 0
    for i, n in enumerate(tokens):
        if i > start and total + n > limit:
            shards.append(range(start, i))
            start, total = i, 0
        total += n
    if start < len(tokens):
        shards.append(range(start, len(tokens)))
    return shards


def enqueued_tokens(records: Iterable[Mapping[str, Any]], tier: str) -> int:
    """The estimated input tokens of a tier's unfinished batches, from their batches-topic
    records (`estimated_tokens`; a record written without it counts none)."""
    total = 0
    for record in records:
        if record.get("tier") == tier:
            with contextlib.suppress(TypeError, ValueError):
                total += max(0, int(record.get("estimated_tokens") or 0))
    return total


def fits(tokens: int, enqueued: int, limit: int | None) -> bool:
    """Whether a batch of `tokens` may be submitted beside `enqueued` ones under `limit`: it
    fits, or nothing is enqueued (a batch always gets its turn alone)."""
    return limit is None or enqueued == 0 or enqueued + tokens <= limit


def may_resubmit(
    tokens: int, enqueued: int, limit: int | None, *, ended_since: bool, waited_s: float, backoff_s: float
) -> bool:
    """Whether a batch held for the enqueued token limit goes again now: it fits beside what is
    enqueued (`fits`), and room has freed since it was held (a batch of its tier ended) or it
    has waited `backoff_s` (room the provider's other users freed is not seen here)."""
    return fits(tokens, enqueued, limit) and (ended_since or waited_s >= backoff_s)


def resubmit_backoff_s(tries: int, poll_s: float) -> float:
    """How long a held batch waits at most before its `tries`+1-th submission: at least the
    tier's poll interval, doubling per try."""
    first = max(RESUBMIT_BACKOFF_S, poll_s)
    return float(min(RESUBMIT_BACKOFF_MAX_S, first * 2 ** max(0, tries - 1)))
