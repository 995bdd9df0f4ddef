"""Turning a job's fate into the records that announce it (results and dead letters)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from consumer.core.completion import Completion
from consumer.core.embed import Embeddings
from consumer.core.errors import ErrorKind
from consumer.core.jobs import DeadLetter, ErrorInfo, Job, SourceRef, encode
from consumer.core.tenants import DEFAULT_TENANT
from consumer.core.tuples import maker
from consumer.kafka.connection import MAX_MESSAGE_BYTES
from consumer.kafka.records import (
    ERROR_KIND_HEADER,
    SOURCE_HEADER,
    TRACEPARENT_HEADER,
    OutRecord,
    SourceOffset,
)

#: what a record adds to its value in a record batch of its own: key (a job id, at most 256
#: characters), headers and batch framing, rounded up generously
RECORD_OVERHEAD_BYTES = 16 * 1024
#: the largest value a topic created by promptbus takes
MAX_VALUE_BYTES = MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class RecordLimits:
    """The largest result, dead-letter and offline batch record values the output topics take
    (see `consumer.kafka.admin.max_record_bytes`); a record over its topic's limit is refused
    by the broker on every attempt, so it would hold its partition's commits back for ever."""

    results: int = MAX_VALUE_BYTES
    dead_letters: int = MAX_VALUE_BYTES
    batches: int = MAX_VALUE_BYTES

    @classmethod
    def of_topics(
        cls,
        max_bytes: Mapping[str, int],
        *,
        results: Sequence[str],
        dead_letters: Sequence[str],
        batches: str | None = None,
    ) -> RecordLimits:
        """From each topic's largest record batch (bytes): the least of the results topics (every
        tenant's) and of the dead-letter topics, so a record fits whichever its tenant writes."""
        return cls(
            results=min(max_bytes[t] for t in results) - RECORD_OVERHEAD_BYTES,
            dead_letters=min(max_bytes[t] for t in dead_letters) - RECORD_OVERHEAD_BYTES,
            batches=max_bytes[batches] - RECORD_OVERHEAD_BYTES if batches is not None else MAX_VALUE_BYTES,
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


_new_out_record = maker(OutRecord)

#: a group's results topic and its records' closing members (`AnswerResults.tail`)
ResultTail = tuple[str, bytes]

#: the usage of a job answered by another job's identical request
_NO_USAGE = {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0, "cache_write_tokens": 0}


class AnswerResults:
    """The Result records of the jobs one provider answer completed.

    Written as the `Result` model's JSON directly: this runs once per answered job, and
    building and dumping the validated model cost more than the rest of the job's trip
    through the service. What the jobs of one answer share (status, provider, model, finish
    reason, their share of the token usage, the batch, the completion time, the deployment
    that answered) is rendered once, here, as the JSON object's closing members; before them,
    what a group of those jobs shares (tier, lane, mode, tenant: `tail`) is rendered once per
    group; each job's record is its own members followed by that tail. Every value comes from
    already-validated objects; tests/unit/test_outcomes.py holds this encoding equal to
    `encode(Result(...))`.

    topic: the results topic, or a tenant's results topic by tenant (`TenantTopics.results_of`):
    a tail carries its group's topic, looked up once per group.
    """

    __slots__ = ("_shared", "_shared_members", "_shared_no_usage", "_tails", "_topic_of")

    def __init__(
        self,
        topic: str | Callable[[str], str],
        completion: Completion | Embeddings,
        batch_size: int,
        completed_at: datetime | None = None,
    ) -> None:
        usage = completion.usage.share(max(batch_size, 1))
        self._topic_of = topic if callable(topic) else (lambda _tenant, _topic=topic: _topic)
        # an embeddings answer has no finish reason; a batched answer's is the batch's, not a job's
        if isinstance(completion, Completion) and batch_size == 1:
            finish_reason = completion.finish_reason
        else:
            finish_reason = "stop"
        shared = {
            "status": "ok",
            "provider": completion.provider,
            "model": completion.model,
            "finish_reason": finish_reason,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cached_input_tokens": usage.cached_input_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
            },
            "batch": {"request_id": completion.request_id, "size": batch_size} if batch_size > 1 else None,
            "completed_at": completed_at or datetime.now(UTC),
            "deployment": completion.deployment,
        }
        #: the shared members, opening comma included: '{"id":...' + this ends a record
        self._shared = b"," + orjson.dumps(shared, option=orjson.OPT_UTC_Z)[1:]
        self._shared_members = shared
        self._shared_no_usage: bytes | None = None  # see `_no_usage`
        #: (tier, requested tier, lane, mode, tenant) -> its jobs' tail (see `result`)
        self._tails: dict[tuple[str, str, str | None, str, str], ResultTail] = {}

    def record(
        self,
        *,
        job_id: str,
        requested_tier: str,
        metadata: dict[str, Any] | None,
        source: SourceOffset,
        output: str | None,
        attempts: int,
        latency_ms: float,
        traceparent: str | None = None,
        dedupe_of: str | None = None,
        lane: str | None = None,
        tier: str | None = None,
        mode: str = "online",
        embedding: Sequence[float] | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> OutRecord:
        """One job's Result record (`job_id`, `requested_tier`, `metadata`, `tenant`: the job's own);
        `dedupe_of`: the job whose request answered it (dedupe):
        such a job's usage is zero, since no request of its own was sent; `lane`: the lane it
        was read from; tier: the tier that answered, when not the one the job asked for (its
        fallback: `fallback_from`); mode: the way the job went. An embed job's `embedding` is
        its vector (its `output` None)."""
        if dedupe_of is None:
            tail = self.tail(tier or requested_tier, requested_tier, lane, mode, tenant)
        else:
            by = tier or requested_tier
            rendered = self._render_tail(by, requested_tier, lane, mode, tenant, dedupe_of)
            tail = (self._topic_of(tenant), rendered)
        return self.result(
            tail, job_id, metadata, source, output, attempts, latency_ms, embedding, traceparent
        )

    def tail(self, tier: str, requested_tier: str, lane: str | None, mode: str, tenant: str) -> ResultTail:
        """The topic and the closing members of the results of the jobs of `requested_tier`
        answered by `tier`, read in `lane`, gone `mode`, of `tenant`: made once per such group
        of the answer's jobs, which `result` ends each of their records with."""
        key = (tier, requested_tier, lane, mode, tenant)
        found = self._tails.get(key)
        if found is None:
            rendered = self._render_tail(tier, requested_tier, lane, mode, tenant, None)
            found = self._tails[key] = (self._topic_of(tenant), rendered)
        return found

    def result(
        self,
        tail: ResultTail,
        job_id: str,
        metadata: dict[str, Any] | None,
        source: SourceOffset,
        output: str | None,
        attempts: int,
        latency_ms: float,
        embedding: Sequence[float] | None = None,
        traceparent: str | None = None,
    ) -> OutRecord:
        """One job's Result record: its own members, then `tail` (`tail` or `record`'s)."""
        tp = source.tp
        own = orjson.dumps(
            {
                "id": job_id,
                "output": output,
                "embedding": embedding,
                "dimensions": len(embedding) if embedding is not None else None,
                "attempts": attempts,
                "latency_ms": round(latency_ms, 3) if latency_ms > 0 else 0.0,
                "metadata": metadata,
                "source": {"topic": tp.topic, "partition": tp.partition, "offset": source.offset},
            }
        )
        topic, members = tail
        return _new_out_record((topic, job_id.encode(), own[:-1] + members, _headers(source, traceparent)))

    def _render_tail(
        self, tier: str, requested_tier: str, lane: str | None, mode: str, tenant: str, dedupe_of: str | None
    ) -> bytes:
        members = orjson.dumps(
            {
                "tier": tier,
                "dedupe_of": dedupe_of,
                "lane": lane,
                "mode": mode,
                "fallback_from": requested_tier if tier != requested_tier else None,
                "tenant": tenant,
            }
        )
        return b"," + members[1:-1] + (self._shared if dedupe_of is None else self._no_usage())

    def _no_usage(self) -> bytes:
        """The shared members of a job answered by another job's identical request (no usage
        of its own), rendered once, when the first such job is."""
        if self._shared_no_usage is None:
            no_usage = {**self._shared_members, "usage": _NO_USAGE}
            self._shared_no_usage = b"," + orjson.dumps(no_usage, option=orjson.OPT_UTC_Z)[1:]
        return self._shared_no_usage


def too_large_result(record: OutRecord, max_bytes: int) -> str | None:
    """Why a result cannot be published (None: it can): over the results topic's record size,
    the broker would refuse it on every attempt. The job is dead-lettered `output_invalid`."""
    size = len(record.value or b"")
    if size <= max_bytes:
        return None
    return f"the result would be {size} bytes, over the results topic's {max_bytes}: the output is too long"


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
    max_bytes: int = MAX_VALUE_BYTES,
    tenant: str | None = None,
    key: bytes | None = None,
    headers: tuple[tuple[str, bytes], ...] | None = None,
) -> OutRecord:
    """A DeadLetter. `raw` (the original bytes) is kept whenever the caller has it and the
    dead letter stays within `max_bytes` (see `_within`); `tenant`: the job's, when known;
    `key`: the original record's key, kept in the dead letter and as its Kafka key (None: the
    job id is); `headers`: a source record's own (None: the source header)."""
    jid = job.id if job is not None else job_id
    key_text, raw_key = _key_fields(key)
    dead = DeadLetter(
        id=jid,
        error=ErrorInfo(
            kind=kind, message=message, retryable=retryable, status_code=status_code, provider=provider
        ),
        attempts=attempts,
        job=job,
        raw=base64.b64encode(raw).decode("ascii") if raw is not None else None,
        key=key_text,
        raw_key=raw_key,
        source=_source_ref(source),
        failed_at=datetime.now(UTC),
        tenant=tenant,
    )
    base = _headers(source, traceparent) if headers is None else headers
    out_headers = (*base, (ERROR_KIND_HEADER, kind.value.encode()))
    out_key = key if key is not None else (jid.encode() if jid else None)
    return OutRecord(topic, out_key, _within(dead, source, max_bytes), out_headers)


def _key_fields(key: bytes | None) -> tuple[str | None, str | None]:
    """A record key as the dead letter's `key` (text) or `raw_key` (base64, not UTF-8)."""
    if key is None:
        return None, None
    try:
        return key.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(key).decode("ascii")


def _within(dead: DeadLetter, source: SourceOffset, max_bytes: int) -> bytes:
    """The dead letter's JSON, leaving out its copies of the input (the original bytes, then
    the parsed job) while it is over `max_bytes`; its message then says what was left out and
    where the input is. A dead letter the topic refuses would be retried for ever."""
    value = encode(dead)
    if len(value) <= max_bytes:
        return value
    where = source.header_value().decode()  # topic/partition/offset, as the source header says
    for left_out, update in (
        ("the original bytes", {"raw": None}),
        ("the original bytes and the job", {"raw": None, "job": None}),
    ):
        note = (
            f" [{left_out} left out: the dead letter was {len(value)} bytes, over the dead-letter"
            f" topic's {max_bytes}; the input is at {where}]"
        )
        error = dead.error.model_copy(update={"message": dead.error.message + note})
        smaller = encode(dead.model_copy(update={**update, "error": error}))
        if len(smaller) <= max_bytes:
            return smaller
    return smaller
