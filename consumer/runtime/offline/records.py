"""The batches topic's records (what a submitted provider batch is, read back checked) and
what a finished batch's members become: their outcome records, their latency, their usage."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from pydantic import BaseModel

from consumer.core.completion import CompletionRequest
from consumer.core.cost import Pricing, cost_usd
from consumer.core.embed import EmbeddingRequest
from consumer.core.errors import ErrorKind, JobError
from consumer.core.jobs import Job, checked_json_object
from consumer.core.offline import (
    Answered,
    BatchItemResult,
    BatchJob,
    BatchStatus,
    Failed,
    item_outcome,
    token_shards,
)
from consumer.core.tenants import DEFAULT_TENANT, TenantTopics, tenant_problem
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import enriched_record
from consumer.runtime.latency import DEAD_LETTER, DEFAULT_LANE, OFFLINE_JOB_LATENCY, RESULT
from consumer.runtime.outcomes import AnswerResults, RecordLimits, dead_letter_record, too_large_result
from consumer.runtime.sources import SourceRuntime, stored_origin, stored_record
from consumer.runtime.stats import ServiceStats, TierStats
from consumer.settings import Settings


def offline_request(ctx: JobContext, model: str) -> CompletionRequest | EmbeddingRequest:
    """A job's request in a provider batch: its ordinary chat request, or its input alone."""
    if ctx.kind == "embed":
        return EmbeddingRequest((ctx.input,), model, ctx.options)
    return CompletionRequest(ctx.messages, model, ctx.options)


def batch_key(tier: str, batch_id: str, deployment: str | None = None) -> bytes:
    """A batch's key on the batches topic: `TIER:ID`, or `TIER/DEPLOYMENT:ID` (two deployments'
    providers may use the same ids)."""
    return f"{provider_key(tier, deployment)}:{batch_id}".encode()


def provider_key(tier: str, deployment: str | None) -> str:
    """Where a batch goes and is read back from: `TIER` (the tier's own keys) or
    `TIER/DEPLOYMENT` (one of its `deployments`)."""
    return tier if deployment is None else f"{tier}/{deployment}"


def enqueued_fields(value: bytes) -> dict[str, Any]:
    """What a batches-topic record says about the enqueued tokens (its tier and estimate; an
    unreadable record counts none)."""
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(record, dict):
        return {}
    return {
        "tier": record.get("tier"),
        "deployment": record.get("deployment"),
        "estimated_tokens": record.get("estimated_tokens"),
    }


class _MemberSource(BaseModel):
    topic: str
    partition: int
    offset: int


class _Member(BaseModel):
    custom_id: str
    job: Job
    source: _MemberSource


class _OpenBatch(BaseModel):
    """What `outcome_records` needs of a batches-topic record (extra fields are kept)."""

    tier: str
    batch_id: str
    members: list[_Member]


def read_batch_record(value: bytes) -> dict[str, Any]:
    """A batches-topic record, checked to hold what publishing its outcomes needs.

    Raises ValueError naming what is wrong: promptbus writes these records, but a topic
    written by something else (an operator's tool, another version) must not stop tracking.
    """
    return checked_json_object(value, _OpenBatch, what="batch record")


def batch_member(custom_id: str, c: JobContext) -> dict[str, Any]:
    """One member of a batch record: its custom id, the full job, its record's time, its lane,
    tenant and where its input was read (`source`); a source's job also its `origin`
    (`consumer.runtime.sources.stored_origin`: the source record its enriched record is
    written from, by whichever instance collects the batch)."""
    member = {
        "custom_id": custom_id,
        "job": c.parsed_job().model_dump(mode="json"),
        "timestamp": c.timestamp_s,
        "lane": c.lane_name,
        "tenant": c.tenant,
        "source": {
            "topic": c.source.topic,
            "partition": c.source.partition,
            "offset": c.source.offset,
        },
    }
    if c.origin is not None:
        member["origin"] = stored_origin(c.origin)
    return member


def batch_record(
    tier: str,
    job: BatchJob,
    members: Sequence[dict[str, Any]],
    estimated_tokens: int = 0,
    deployment: str | None = None,
) -> dict[str, Any]:
    """The batches-topic record of a submitted batch: its id, the tier's deployment it went to
    (None: the tier's own keys), its members (`batch_member`) and its estimated input tokens
    (what it holds of the provider's enqueued token limit)."""
    return {
        "tier": tier,
        "deployment": deployment,
        "provider": job.provider,
        "batch_id": job.id,
        "submitted_at": time.time(),
        "estimated_tokens": estimated_tokens,
        "members": list(members),
    }


#: what a batch record holds besides its members (tier, ids, times, a resubmission's), at most
RECORD_ENVELOPE_BYTES = 1024


def record_runs(member_bytes: Sequence[int], max_bytes: int) -> tuple[list[range], list[int]]:
    """Runs of consecutive members whose batch record stays within `max_bytes` (the batches
    topic's largest value: a record over it is refused on every attempt, after the provider
    took the batch), each submitted as its own provider batch; and the members too large for
    a record of their own (they cannot go offline)."""
    limit = max_bytes - RECORD_ENVELOPE_BYTES
    sizes = [n + 1 for n in member_bytes]  # a comma between members
    runs, too_large = [], []
    for run in token_shards(sizes, limit):
        if len(run) == 1 and sizes[run.start] > limit:
            too_large.append(run.start)
        else:
            runs.append(run)
    return runs, too_large


def observe_offline_latency(
    stats: ServiceStats,
    dlq_topics: Collection[str],
    record: dict[str, Any],
    outcomes: Sequence[OutRecord | None],
) -> None:
    """Acknowledged outcomes of a batch's members (one each, in member order; None: a source
    job whose key had a newer record written): their latency from their job records'
    timestamps (the submission time for a batch recorded without them). `dlq_topics`: every
    tenant's dead-letter topic (`TenantTopics.own_dead_letter_topics`)."""
    now_s = time.time()
    for member, outcome in zip(record["members"], outcomes, strict=False):
        if outcome is None:
            continue
        started_s = float(member.get("timestamp") or record.get("submitted_at") or now_s)
        kind = DEAD_LETTER if outcome.topic in dlq_topics else RESULT
        labels = (str(record["tier"]), str(member.get("lane") or DEFAULT_LANE), kind)
        stats.latency.observe(OFFLINE_JOB_LATENCY, labels, max(0.0, now_s - started_s))


def count_offline_usage(stats: TierStats, items: Sequence[BatchItemResult], pricing: Pricing | None) -> None:
    """A finished provider batch's answered items: their tokens, and their cost at the batch
    price (`pricing.batch_discount`), in the tier's counters."""
    for item in items:
        if item.completion is None:
            continue
        usage = item.completion.usage
        stats.input_tokens += usage.input_tokens
        stats.output_tokens += usage.output_tokens
        stats.cached_input_tokens += usage.cached_input_tokens
        stats.cache_write_tokens += usage.cache_write_tokens
        if pricing is not None:
            cost = cost_usd(usage, pricing, offline=True)
            stats.cost_usd += cost
            stats.offline_saved_usd += cost_usd(usage, pricing) - cost


def outcome_records(
    settings: Settings,
    record: dict[str, Any],
    status: BatchStatus,
    items: Sequence[BatchItemResult],
    tier_options: dict[str, Any] | None = None,
    limits: RecordLimits | None = None,
    sources: Mapping[str, SourceRuntime] | None = None,
    tenants: TenantTopics | None = None,
) -> list[OutRecord | None]:
    """One result or dead letter per member of a finished provider batch, as
    `consumer.core.offline.item_outcome` decides (`tier_options`: the tier's, under each job's);
    a source's member (`origin`) ends as its enriched record instead (`_source_outcome`;
    `sources`: the configured ones by name), or None when a newer record of its key was written.
    Each goes to its tenant's topic (`tenants`; None: the service's topics).

    A result that would be over the results topic's record size (`limits`) is `output_invalid`
    instead (a batch cannot ask again).
    """
    limits = limits or RecordLimits()
    tenants = tenants if tenants is not None else TenantTopics(settings.results_topic, settings.dlq_topic)
    by_id = {item.custom_id: item for item in items}
    latency_ms = max(0.0, (time.time() - float(record.get("submitted_at", time.time()))) * 1000.0)
    out: list[OutRecord | None] = []
    deployment = record.get("deployment")  # the tier's deployment the batch went to
    for member in record["members"]:
        job = Job.model_validate(member["job"])
        src = member["source"]
        source = SourceOffset(TopicPartition(src["topic"], int(src["partition"])), int(src["offset"]))
        item = by_id.get(member["custom_id"])
        outcome = item_outcome(item, job, status, record["batch_id"], tier_options or {})
        stored = member.get("origin")
        tenant = member_tenant(member)
        if isinstance(stored, dict):
            dlq_topic = tenants.dead_letters_of(tenant)
            place = _SourcePlace(dlq_topic, record, tier_options or {}, limits, sources or {})
            out.append(_source_outcome(place, stored, member, job, source, outcome))
            continue
        if isinstance(outcome, Answered):
            answer = outcome.answer
            if isinstance(deployment, str):
                answer = dataclasses.replace(answer, deployment=deployment)
            result = AnswerResults(tenants.results_of, answer, 1).record(
                job_id=job.id,
                requested_tier=job.tier,
                metadata=job.metadata,
                source=source,
                output=outcome.output,
                attempts=1,
                latency_ms=latency_ms,
                lane=member.get("lane"),
                tier=record.get("tier"),
                mode="offline",
                embedding=outcome.embedding,
                tenant=tenant,
            )
            problem = too_large_result(result, limits.results)
            if problem is None:
                out.append(result)
                continue
            outcome = Failed(ErrorKind.OUTPUT_INVALID, problem)
        out.append(
            dead_letter_record(
                tenants.dead_letters_of(tenant),
                source=source,
                kind=outcome.kind,
                message=outcome.message,
                job=job,
                attempts=1,
                status_code=outcome.status_code,
                provider=record.get("provider"),
                max_bytes=limits.dead_letters,
                tenant=tenant,
            )
        )
    return out


def member_tenant(member: dict[str, Any]) -> str:
    """A batch member's tenant: as recorded with it (its header's, when the job named none),
    else its job's own."""
    job = member.get("job")
    for value in (member.get("tenant"), job.get("tenant") if isinstance(job, dict) else None):
        if isinstance(value, str) and tenant_problem(value) is None:
            return value
    return DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class _SourcePlace:
    """What a source member's outcome needs beside the member: its tenant's dead-letter topic,
    its batch record, the tier's options, the record limits and the configured sources by name."""

    dlq_topic: str
    record: dict[str, Any]
    tier_options: dict[str, Any]
    limits: RecordLimits
    sources: Mapping[str, SourceRuntime]


def _source_outcome(
    place: _SourcePlace,
    stored: dict[str, Any],
    member: dict[str, Any],
    job: Job,
    offset: SourceOffset,
    outcome: Answered | Failed,
) -> OutRecord | None:
    """A source member's outcome, by the online rules: its enriched record (written by
    `consumer.runtime.delivery.enriched_record`, as an online answer's; None: a newer record of
    its key was written), or with on_error: field, the enriched record with the error beside
    the null answer; else a dead letter with the record's key, bytes and headers."""
    name = stored.get("source")
    runtime = place.sources.get(name) if isinstance(name, str) else None
    key, raw, headers = stored_record(stored)
    if runtime is None:
        message = f"source {name!r} is not configured here: its offline answer cannot be written back"
        return dead_letter_record(
            place.dlq_topic, source=offset, kind=ErrorKind.INVALID_JOB, message=message, job=job, attempts=1,
            max_bytes=place.limits.dead_letters, tenant=member_tenant(member), raw=raw, key=key,
        )
    try:
        origin = runtime.restored(stored, offset, job)
    except JobError as exc:
        outcome, origin = Failed(exc.kind, str(exc)), None
    if origin is not None:
        structured = "response_format" in {**place.tier_options, **job.options}
        enrich = partial(
            enriched_record, origin, attempts=1, tier=str(place.record["tier"]), structured=structured,
            max_bytes=place.limits.results,
        )
        if isinstance(outcome, Answered):
            record, problem = enrich(outcome.output, outcome.embedding)
            if problem is None:
                return record
            outcome = Failed(ErrorKind.OUTPUT_INVALID, problem)
        assert isinstance(outcome, Failed)
        if runtime.config.on_error == "field":
            runtime.stats.dead_letters[outcome.kind.value] += 1
            error = {"kind": outcome.kind.value, "message": outcome.message}
            record, _problem = enrich(None, None, error=error)
            return record
    assert isinstance(outcome, Failed)
    runtime.stats.dead_letters[outcome.kind.value] += 1
    return dead_letter_record(
        place.dlq_topic,
        source=offset,
        kind=outcome.kind,
        message=outcome.message,
        job=job,
        attempts=1,
        status_code=outcome.status_code,
        provider=place.record.get("provider"),
        max_bytes=place.limits.dead_letters,
        tenant=member_tenant(member),
        raw=raw,
        key=key,
        headers=runtime.headers(headers, offset),
    )
