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


def _headers(source: SourceOffset, traceparent: str | None) -> list[tuple[str, bytes]]:
    headers = [(SOURCE_HEADER, source.header_value())]
    if traceparent:
        headers.append((TRACEPARENT_HEADER, traceparent.encode()))
    return headers


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
    """A Result; a batched job gets its share of the request's token usage.

    Written as the `Result` model's JSON directly: this runs once per answered job, and
    building and dumping the validated model cost more than the rest of the job's trip
    through the service. Every value here comes from already-validated objects;
    tests/unit/test_outcomes.py holds this encoding equal to `encode(Result(...))`.
    """
    share = max(batch_size, 1)
    usage = completion.usage
    value = {
        "id": job.id,
        "tier": job.tier,
        "status": "ok",
        "output": output,
        "provider": completion.provider,
        "model": completion.model,
        "finish_reason": completion.finish_reason if batch_size == 1 else "stop",
        "usage": {
            "input_tokens": max(usage.input_tokens, 0) // share,
            "output_tokens": max(usage.output_tokens, 0) // share,
        },
        "batch": {"request_id": completion.request_id, "size": batch_size} if batch_size > 1 else None,
        "attempts": attempts,
        "latency_ms": round(max(latency_ms, 0.0), 3),
        "metadata": job.metadata,
        "source": {"topic": source.topic, "partition": source.partition, "offset": source.offset},
        "completed_at": completed_at or datetime.now(UTC),
    }
    return OutRecord(
        topic,
        job.id.encode(),
        orjson.dumps(value, option=orjson.OPT_UTC_Z),
        tuple(_headers(source, traceparent)),
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
    headers = [*_headers(source, traceparent), (ERROR_KIND_HEADER, kind.value.encode())]
    return OutRecord(topic, jid.encode() if jid else None, encode(dead), tuple(headers))
