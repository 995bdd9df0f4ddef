"""Offline mode: jobs with `mode: offline` go through the provider's Batch API.

    OfflineCollector  collects offline jobs per tier (up to `offline.max_items` or
                      `offline.collect_s`), submits them as one provider batch, writes the batch
                      id and its members (the full jobs) to the compacted batches topic, and only
                      when that record is acknowledged lets the members' input offsets commit.
    BatchTracker      owns polling. It reads the batches topic (one partition) through a
                      `TopicReader` of its own consumer group, so exactly one instance tracks at
                      a time and a restarted or surviving instance takes over: on assignment it
                      reads the topic from the beginning (latest record per batch), polls each
                      open batch every `poll_s`,
                      publishes one result or dead letter per member when the batch ends, then a
                      tombstone for the batch. In exactly_once mode those records and the
                      tombstone commit in one transaction.

What each member of a finished batch ends as is the core's decision
(`consumer.core.offline.item_outcome`); this module performs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from consumer.core.budgets import Reservation
from consumer.core.completion import CompletionRequest
from consumer.core.cost import Pricing, cost_usd
from consumer.core.embed import EmbeddingRequest
from consumer.core.errors import ErrorKind, ProviderError
from consumer.core.jobs import Job, checked_json_object
from consumer.core.offline import (
    Answered,
    BatchItemResult,
    BatchJob,
    BatchRequest,
    BatchStatus,
    Failed,
    item_outcome,
)
from consumer.core.tenants import DEFAULT_TENANT, tenant_problem
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.topicreader import TopicReader
from consumer.providers.base import BatchProvider
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.latency import DEAD_LETTER, DEFAULT_LANE, OFFLINE_JOB_LATENCY, RESULT
from consumer.runtime.outcomes import AnswerResults, RecordLimits, dead_letter_record, too_large_result
from consumer.runtime.spending import TierSpending, count_tenant_usage, reserve_offline, tier_spending
from consumer.runtime.stats import ServiceStats, TierStats
from consumer.runtime.tenancy import TenantGate
from consumer.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    items: list[JobContext] = field(default_factory=list)
    first_s: float = 0.0


class OfflineCollector:
    """Collects offline jobs per tier and submits them as provider batches.

    outcomes: where a job's recorded batch (its offset may commit) or its failed submission ends.
    """

    def __init__(
        self,
        settings: Settings,
        batch_providers: dict[str, BatchProvider],
        producer: AIOKafkaProducer,
        outcomes: OutcomeWriter,
        clock: Callable[[], float] = time.monotonic,
        *,
        gate: TenantGate | None = None,
    ) -> None:
        """gate: the tenants' budgets, when some account has one: each job's estimate (at the
        batch price) is spent when its batch is recorded (its answer comes hours later, to
        whichever instance tracks it); a job its tenant's budget does not hold is held or
        dead-lettered before it is submitted."""
        self._settings = settings
        self._providers = batch_providers
        self._producer = producer
        self._outcomes = outcomes
        self._clock = clock
        self._gate = gate
        self._spending: dict[str, TierSpending] = {}
        self._pending: dict[str, _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    def add(self, ctx: JobContext) -> None:
        pending = self._pending.setdefault(ctx.tier.name, _Pending())
        if not pending.items:
            pending.first_s = self._clock()
        pending.items.append(ctx)
        if len(pending.items) >= ctx.tier.config.offline.max_items:
            self._submit(ctx.tier.name)

    def drop_partitions(self, partitions: set[TopicPartition]) -> None:
        """Revoked partitions: unsubmitted jobs are left to their new owner (not committed)."""
        for pending in self._pending.values():
            pending.items = [c for c in pending.items if c.source.tp not in partitions]

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="promptbus-offline-collector")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    async def flush_now(self) -> None:
        for tier in list(self._pending):
            self._submit(tier)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            now_s = self._clock()
            for tier, pending in list(self._pending.items()):
                if pending.items:
                    collect_s = pending.items[0].tier.config.offline.collect_s
                    if now_s - pending.first_s >= collect_s:
                        self._submit(tier)

    def _submit(self, tier: str) -> None:
        pending = self._pending.pop(tier, None)
        if pending is None or not pending.items:
            return
        task = asyncio.create_task(self._submit_batch(tier, pending.items))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit_batch(self, tier: str, ctxs: list[JobContext]) -> None:
        provider = self._providers[tier]
        model = ctxs[0].tier.config.model
        # embed jobs after chat jobs: a provider batch has one endpoint, so each kind is one run
        ctxs = sorted(ctxs, key=lambda c: c.kind == "embed")
        requests = [BatchRequest(f"pb-{i}", offline_request(c, model)) for i, c in enumerate(ctxs)]
        held: list[tuple[Reservation | None, JobContext]] = []
        if self._gate is not None:
            spending = self._spending.get(tier)
            if spending is None:
                config, ledger = ctxs[0].tier.config, self._outcomes.ledger
                spending = self._spending[tier] = tier_spending(config, ledger, self._gate)
            requests, ctxs, held = await reserve_offline(spending, self._gate, requests, ctxs)
            if not ctxs:
                return
        taken: list[bool] = []  # the provider took the batch: its jobs cost what they will
        try:
            await self._submit_requests(tier, provider, requests, ctxs, taken)
        finally:
            spending = self._spending.get(tier)
            for reservation, _ in held:
                if spending is not None and reservation is not None:
                    spending.spent_as_estimated(reservation, recorded=bool(taken))

    async def _submit_requests(
        self,
        tier: str,
        provider: BatchProvider,
        requests: list[BatchRequest],
        ctxs: list[JobContext],
        taken: list[bool],
    ) -> None:
        """Submit the requests as provider batches (`taken` gets True once the provider took
        them); record each batch, then let its jobs' input offsets commit (or dead-letter them
        when the provider refuses the submission)."""
        delay_s = 1.0
        while True:
            try:
                jobs = await provider.submit(requests)
                taken.append(True)
                break
            except ProviderError as exc:
                if not exc.retryable:
                    log.error("offline submission for tier %s rejected: %s", tier, exc)
                    for c in ctxs:
                        message = f"batch submission rejected: {exc}"
                        self._outcomes.offline_failed(c, ErrorKind.BATCH_FAILED, message, exc)
                    return
                log.warning("offline submission for tier %s failed (%s); retrying", tier, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 30.0)
        start = 0
        for job in jobs:
            members = list(
                zip(requests[start : start + job.total], ctxs[start : start + job.total], strict=True)
            )
            start += job.total
            record = batch_record(tier, job, [(r.custom_id, c) for r, c in members])
            await self._producer.send_and_wait(
                self._settings.batches_topic, orjson.dumps(record), key=batch_key(tier, job.id)
            )
            for _, c in members:
                self._outcomes.offline_recorded(c)
        log.info("tier %s: %d offline jobs submitted as %s", tier, len(ctxs), ", ".join(j.id for j in jobs))


def offline_request(ctx: JobContext, model: str) -> CompletionRequest | EmbeddingRequest:
    """A job's request in a provider batch: its ordinary chat request, or its input alone."""
    if ctx.kind == "embed":
        return EmbeddingRequest((ctx.input,), model, ctx.options)
    return CompletionRequest(ctx.messages, model, ctx.options)


def batch_key(tier: str, batch_id: str) -> bytes:
    return f"{tier}:{batch_id}".encode()


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


def batch_record(tier: str, job: BatchJob, members: Sequence[tuple[str, JobContext]]) -> dict[str, Any]:
    return {
        "tier": tier,
        "provider": job.provider,
        "batch_id": job.id,
        "submitted_at": time.time(),
        "members": [
            {
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
            for custom_id, c in members
        ],
    }


class BatchTracker:
    """Polls open provider batches and publishes their outcomes (one instance at a time).

    reader: the batches topic, read from its beginning whenever this instance is assigned it.
    """

    def __init__(
        self,
        settings: Settings,
        batch_providers: dict[str, BatchProvider],
        producer: AIOKafkaProducer,
        reader: TopicReader,
        *,
        poll_s_by_tier: dict[str, float],
        options_by_tier: dict[str, dict[str, Any]] | None = None,
        limits: RecordLimits | None = None,
        transactional: bool,
        stats: ServiceStats | None = None,
        pricing_by_tier: dict[str, Pricing] | None = None,
        ledger: TenantLedger | None = None,
    ) -> None:
        self._settings = settings
        self._limits = limits
        self._stats = stats
        self._ledger = ledger
        self._pricing_by_tier = pricing_by_tier or {}
        self._providers = batch_providers
        self._producer = producer
        self._transactional = transactional
        self._poll_s_by_tier = poll_s_by_tier
        self._options_by_tier = options_by_tier or {}
        self._reader = reader
        self._open: dict[bytes, dict[str, Any]] = {}
        self._next_poll_s: dict[bytes, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._reader.start()
        self._task = asyncio.create_task(self._loop(), name="promptbus-batch-tracker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._reader.stop()

    async def _loop(self) -> None:
        while True:
            read = await self._reader.read(timeout_s=0.2)
            if read.rewound:  # the batches open now are in the records read from here on
                self._open.clear()
            for r in read.records:
                if r.key is None:
                    continue
                if r.value is None:
                    self._open.pop(r.key, None)
                    continue
                try:
                    self._open[r.key] = read_batch_record(r.value)
                except ValueError as exc:
                    # the latest record of this key replaces any earlier one: nothing to track
                    self._open.pop(r.key, None)
                    log.error(
                        "batches topic record %r at offset %d is not a batch record (%s); "
                        "skipped: its jobs get no outcome from it",
                        r.key,
                        r.source.offset,
                        exc,
                    )
            now_s = time.monotonic()
            for key, record in list(self._open.items()):
                if self._next_poll_s.get(key, 0.0) > now_s:
                    continue
                self._next_poll_s[key] = now_s + self._poll_s_by_tier.get(record["tier"], 60.0)
                try:
                    await self._check(key, record)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # polling is retried next round; nothing was published
                    log.warning("polling batch %s failed: %s", record.get("batch_id"), exc)

    async def _check(self, key: bytes, record: dict[str, Any]) -> None:
        provider = self._providers.get(record["tier"])
        if provider is None:
            log.error("batch %s belongs to unknown tier %s; left open", record["batch_id"], record["tier"])
            return
        job = await provider.status(record["batch_id"])
        if not job.status.done:
            return
        items: list[BatchItemResult] = []
        if job.status in (
            BatchStatus.COMPLETED,
            BatchStatus.EXPIRED,
            BatchStatus.CANCELLED,
            BatchStatus.FAILED,
        ):
            with contextlib.suppress(ProviderError):
                items = await provider.results(record["batch_id"])
        tier_options = self._options_by_tier.get(record["tier"])
        records = outcome_records(self._settings, record, job.status, items, tier_options, self._limits)
        await self._publish(key, records)
        if self._stats is not None:
            tier = record["tier"]
            count_offline_usage(self._stats.tier(tier), items, self._pricing_by_tier.get(tier))
            observe_offline_latency(self._stats, self._settings.results_topic, record, records)
        if self._ledger is not None:
            tenants = {m["custom_id"]: _member_tenant(m) for m in record["members"]}
            count_tenant_usage(self._ledger, tenants, items, self._pricing_by_tier.get(record["tier"]))
        self._open.pop(key, None)
        self._next_poll_s.pop(key, None)
        log.info("batch %s %s: %d outcomes published", record["batch_id"], job.status.value, len(records))

    async def _publish(self, key: bytes, records: list[OutRecord]) -> None:
        tombstone = OutRecord(self._settings.batches_topic, key, None)
        if self._transactional:
            async with self._producer.transaction():
                for r in [*records, tombstone]:
                    await self._producer.send(r.topic, r.value, key=r.key, headers=list(r.headers))
        else:
            futures = [
                await self._producer.send(r.topic, r.value, key=r.key, headers=list(r.headers))
                for r in records
            ]
            await asyncio.gather(*futures)
            # the tombstone only after every outcome is acked: a crash in between re-publishes (at least once)
            await self._producer.send_and_wait(tombstone.topic, None, key=key)


def observe_offline_latency(
    stats: ServiceStats, results_topic: str, record: dict[str, Any], outcomes: Sequence[OutRecord]
) -> None:
    """Acknowledged outcomes of a batch's members (one each, in member order): their latency
    from their job records' timestamps (the submission time for a batch recorded without them)."""
    now_s = time.time()
    for member, outcome in zip(record["members"], outcomes, strict=False):
        started_s = float(member.get("timestamp") or record.get("submitted_at") or now_s)
        kind = RESULT if outcome.topic == results_topic else DEAD_LETTER
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
) -> list[OutRecord]:
    """One result or dead letter per member of a finished provider batch, as
    `consumer.core.offline.item_outcome` decides (`tier_options`: the tier's, under each job's).

    A result that would be over the results topic's record size (`limits`) is `output_invalid`
    instead (a batch cannot ask again).
    """
    limits = limits or RecordLimits()
    by_id = {item.custom_id: item for item in items}
    latency_ms = max(0.0, (time.time() - float(record.get("submitted_at", time.time()))) * 1000.0)
    out: list[OutRecord] = []
    for member in record["members"]:
        job = Job.model_validate(member["job"])
        src = member["source"]
        source = SourceOffset(TopicPartition(src["topic"], int(src["partition"])), int(src["offset"]))
        item = by_id.get(member["custom_id"])
        outcome = item_outcome(item, job, status, record["batch_id"], tier_options or {})
        if isinstance(outcome, Answered):
            result = AnswerResults(settings.results_topic, outcome.answer, 1).record(
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
                tenant=_member_tenant(member),
            )
            problem = too_large_result(result, limits.results)
            if problem is None:
                out.append(result)
                continue
            outcome = Failed(ErrorKind.OUTPUT_INVALID, problem)
        out.append(
            dead_letter_record(
                settings.dlq_topic,
                source=source,
                kind=outcome.kind,
                message=outcome.message,
                job=job,
                attempts=1,
                status_code=outcome.status_code,
                provider=record.get("provider"),
                max_bytes=limits.dead_letters,
                tenant=_member_tenant(member),
            )
        )
    return out


def _member_tenant(member: dict[str, Any]) -> str:
    """A batch member's tenant: as recorded with it (its header's, when the job named none),
    else its job's own."""
    job = member.get("job")
    for value in (member.get("tenant"), job.get("tenant") if isinstance(job, dict) else None):
        if isinstance(value, str) and tenant_problem(value) is None:
            return value
    return DEFAULT_TENANT
