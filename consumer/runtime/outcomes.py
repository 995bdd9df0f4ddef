"""Turning a job's fate into the records that announce it (results and dead letters)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import orjson

from consumer.core.completion import Completion
from consumer.core.errors import ErrorKind
from consumer.core.jobs import DeadLetter, ErrorInfo, Job, SourceRef, encode
from consumer.kafka.records import (
    ERROR_KIND_HEADER,
    SOURCE_HEADER,
    TRACEPARENT_HEADER,
    OutRecord,
    SourceOffset,
)


def _source_ref(source: SourceOffset) -> SourceRef:
    return SourceRef(topic=source.topic, partition=source.partition, offset=source.offset)


def _headers(source: SourceOffset, traceparent: str | None) -> tuple[tuple[str, bytes], ...]:
    if traceparent:
        return ((SOURCE_HEADER, source.header_value()), (TRACEPARENT_HEADER, traceparent.encode()))
    return ((SOURCE_HEADER, source.header_value()),)


def job_id_hint(raw: bytes | None) -> str | None:
    """The `id` of a record that failed validation, when it has a usable one (for the DLQ key)."""
    if not raw:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict):
        value = data.get("id")
        if isinstance(value, str) and 0 < len(value) <= 256:
            return value
    return None


class AnswerResults:
    """The Result records of the jobs one provider answer completed.

    Written as the `Result` model's JSON directly: this runs once per answered job, and
    building and dumping the validated model cost more than the rest of the job's trip
    through the service. What the jobs of one answer share (provider, model, finish reason,
    their share of the token usage, the batch, the completion time) is worked out once, here.
    Every value comes from already-validated objects; tests/unit/test_outcomes.py holds this
    encoding equal to `encode(Result(...))`.
    """

    __slots__ = ("_batch", "_completed_at", "_finish_reason", "_model", "_provider", "_topic", "_usage")

    def __init__(
        self, topic: str, completion: Completion, batch_size: int, completed_at: datetime | None = None
    ) -> None:
        share = max(batch_size, 1)
        usage = completion.usage
        self._topic = topic
        self._provider = completion.provider
        self._model = completion.model
        self._finish_reason = completion.finish_reason if batch_size == 1 else "stop"
        self._usage = {
            "input_tokens": max(usage.input_tokens, 0) // share,
            "output_tokens": max(usage.output_tokens, 0) // share,
        }
        self._batch = {"request_id": completion.request_id, "size": batch_size} if batch_size > 1 else None
        # rendered once as the JSON string orjson gives a UTC datetime ("...Z")
        at = completed_at or datetime.now(UTC)
        self._completed_at = orjson.loads(orjson.dumps(at, option=orjson.OPT_UTC_Z))

    def record(
        self,
        *,
        job: Job,
        source: SourceOffset,
        output: str,
        attempts: int,
        latency_ms: float,
        traceparent: str | None = None,
    ) -> OutRecord:
        """One job's Result record."""
        tp = source.tp
        value = {
            "id": job.id,
            "tier": job.tier,
            "status": "ok",
            "output": output,
            "provider": self._provider,
            "model": self._model,
            "finish_reason": self._finish_reason,
            "usage": self._usage,
            "batch": self._batch,
            "attempts": attempts,
            "latency_ms": round(latency_ms, 3) if latency_ms > 0 else 0.0,
            "metadata": job.metadata,
            "source": {"topic": tp.topic, "partition": tp.partition, "offset": source.offset},
            "completed_at": self._completed_at,
        }
        return OutRecord(self._topic, job.id.encode(), orjson.dumps(value), _headers(source, traceparent))


def result_record(
    topic: str,
    *,
    job: Job,
    source: SourceOffset,
    completion: Completion,
    output: str,
    batch_size: int,
    attempts: int,
    latency_ms: float,
    traceparent: str | None = None,
    completed_at: datetime | None = None,
) -> OutRecord:
    """One job's Result (a batched job gets its share of the request's token usage)."""
    results = AnswerResults(topic, completion, batch_size, completed_at)
    return results.record(
        job=job,
        source=source,
        output=output,
        attempts=attempts,
        latency_ms=latency_ms,
        traceparent=traceparent,
    )


def dead_letter_record(
    topic: str,
    *,
    source: SourceOffset,
    kind: ErrorKind,
    message: str,
    job: Job | None = None,
    job_id: str | None = None,
    raw: bytes | None = None,
    attempts: int = 0,
    retryable: bool = False,
    status_code: int | None = None,
    provider: str | None = None,
    traceparent: str | None = None,
) -> OutRecord:
    """A DeadLetter. `raw` (the original bytes) is kept whenever the caller has it."""
    jid = job.id if job is not None else job_id
    dead = DeadLetter(
        id=jid,
        error=ErrorInfo(
            kind=kind, message=message, retryable=retryable, status_code=status_code, provider=provider
        ),
        attempts=attempts,
        job=job,
        raw=base64.b64encode(raw).decode("ascii") if raw is not None else None,
        source=_source_ref(source),
        failed_at=datetime.now(UTC),
    )
    headers = (*_headers(source, traceparent), (ERROR_KIND_HEADER, kind.value.encode()))
    return OutRecord(topic, jid.encode() if jid else None, encode(dead), headers)
