"""`BatchTracker`: the one instance of the group that polls open provider batches and
publishes their outcomes (see `consumer.runtime.offline`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from consumer.core.cost import Pricing
from consumer.core.errors import ProviderError
from consumer.core.offline import (
    BatchItemResult,
    BatchStatus,
    enqueued_tokens,
    may_resubmit,
    resubmit_backoff_s,
)
from consumer.core.tenants import TenantTopics
from consumer.kafka.records import OutRecord
from consumer.kafka.topicreader import TopicReader
from consumer.providers.base import BatchProvider
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.offline.records import (
    batch_key,
    count_offline_usage,
    member_tenant,
    observe_offline_latency,
    outcome_records,
    provider_key,
    read_batch_record,
)
from consumer.runtime.outcomes import RecordLimits
from consumer.runtime.sources import SourceRuntime, stored_record
from consumer.runtime.spending import count_tenant_usage
from consumer.runtime.stats import ServiceStats
from consumer.settings import Settings
from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Held:
    """A batch held for the provider's enqueued token limit: since when, how many batches of
    its tier had ended then, and which submission of it this is."""

    since_s: float
    ended: int
    tries: int


class BatchTracker:
    """Polls open provider batches and publishes their outcomes (one instance at a time).

    reader: the batches topic, read from its beginning whenever this instance is assigned it.
    While a batch is open, each source member's key counts as in flight in its source's
    `KeyOrder`, so an older version's answer collected after a newer one's is dropped.
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
        max_enqueued_tokens_by_tier: dict[str, int] | None = None,
        ledger: TenantLedger | None = None,
        sources: Mapping[str, SourceRuntime] | None = None,
        tenants: TenantTopics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """sources: the configured sources by name: a source job's member is written back as its
        enriched record (`outcome_records`); tenants: where each tenant's outcomes go (None:
        the service's topics)."""
        self._sources = dict(sources or {})
        self._settings = settings
        self._tenants = (
            tenants if tenants is not None else TenantTopics(settings.results_topic, settings.dlq_topic)
        )
        self._clock = clock
        self._max_enqueued = max_enqueued_tokens_by_tier or {}
        #: batch key -> the batch the provider failed for its enqueued token limit, held
        self._held: dict[bytes, _Held] = {}
        #: per tier, batches that ended since start (room freed for a held one)
        self._ended: Counter[str] = Counter()
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
        await cancel_and_wait(self._task)
        await self._reader.stop()

    async def _loop(self) -> None:
        while True:
            read = await self._reader.read(timeout_s=0.2)
            if read.rewound:  # the batches open now are in the records read from here on
                for key in list(self._open):
                    self._set_open(key, None)
                self._held.clear()  # a held batch is found failed again when polled
            for r in read.records:
                if r.key is None:
                    continue
                if r.value is None:
                    self._set_open(r.key, None)
                    continue
                try:
                    self._set_open(r.key, read_batch_record(r.value))
                except ValueError as exc:
                    # the latest record of this key replaces any earlier one: nothing to track
                    self._set_open(r.key, None)
                    log.error(
                        "batches topic record %r at offset %d is not a batch record (%s); "
                        "skipped: its jobs get no outcome from it",
                        r.key,
                        r.source.offset,
                        exc,
                    )
            now_s = self._clock()
            for key, record in list(self._open.items()):
                if key in self._held:
                    await self._resubmit_if_room(key, record)
                    continue
                if self._next_poll_s.get(key, 0.0) > now_s:
                    continue
                self._next_poll_s[key] = now_s + self._poll_s_by_tier.get(record["tier"], 60.0)
                try:
                    await self._check(key, record)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # polling is retried next round; nothing was published
                    log.warning("polling batch %s failed: %s", record.get("batch_id"), exc)

    def _set_open(self, key: bytes, record: dict[str, Any] | None) -> None:
        """The batch `key` is open with `record` (None: it is not): its source members' keys
        are in flight in their sources' key order while it is."""
        for source, record_key, _value in self._source_members(self._open.pop(key, None)):
            source.order.ended(record_key)
        if record is not None:
            self._open[key] = record
            for source, record_key, _value in self._source_members(record):
                source.order.admitted(record_key)

    def _source_members(
        self, record: dict[str, Any] | None
    ) -> list[tuple[SourceRuntime, bytes | None, bytes | None]]:
        """The configured source, record key and value of each source member of `record`."""
        out = []
        for member in record["members"] if record is not None else ():
            stored = member.get("origin")
            if not isinstance(stored, dict):
                continue
            source = self._sources.get(str(stored.get("source")))
            if source is not None:
                key, value, _headers = stored_record(stored)
                out.append((source, key, value))
        return out

    async def _prepare_sources(self, record: dict[str, Any]) -> None:
        """Learn the writer schemas the source members' values need (the codecs keep them): a
        registry that is down raises, and the batch is polled again later, as its records
        would be held online."""
        for source, _key, value in self._source_members(record):
            writer = source.codec.missing(value)
            if writer is not None:
                await source.codec.prepare(writer)

    async def _check(self, key: bytes, record: dict[str, Any]) -> None:
        provider = self._providers.get(provider_key(record["tier"], record.get("deployment")))
        if provider is None:
            log.error(
                "batch %s belongs to unknown tier or deployment %s; left open",
                record["batch_id"],
                provider_key(record["tier"], record.get("deployment")),
            )
            return
        job = await provider.status(record["batch_id"])
        if job.over_enqueued_limit:
            self._hold(key, record)
            return
        if not job.status.done:
            return
        await self._prepare_sources(record)
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
        records = outcome_records(
            self._settings, record, job.status, items, tier_options, self._limits, self._sources,
            self._tenants,
        )
        await self._publish(key, [r for r in records if r is not None])
        if self._stats is not None:
            tier = record["tier"]
            count_offline_usage(self._stats.tier(tier), items, self._pricing_by_tier.get(tier))
            observe_offline_latency(self._stats, self._tenants.own_dead_letter_topics, record, records)
        if self._ledger is not None:
            tenants = {m["custom_id"]: member_tenant(m) for m in record["members"]}
            count_tenant_usage(self._ledger, tenants, items, self._pricing_by_tier.get(record["tier"]))
        self._set_open(key, None)
        self._next_poll_s.pop(key, None)
        self._ended[record["tier"]] += 1
        log.info("batch %s %s: %d outcomes published", record["batch_id"], job.status.value, len(records))

    def _hold(self, key: bytes, record: dict[str, Any]) -> None:
        """The provider failed the batch for its enqueued token limit before any of it ran: it
        waits for room, and is submitted again."""
        tier = record["tier"]
        tries = int(record.get("resubmissions") or 0) + 1
        self._held[key] = _Held(self._clock(), self._ended[tier], tries)
        log.warning(
            "batch %s of tier %s (%s estimated tokens) failed for the provider's enqueued token limit; "
            "held until room frees, then submitted again (try %d)",
            record["batch_id"],
            tier,
            record.get("estimated_tokens", "?"),
            tries,
        )

    async def _resubmit_if_room(self, key: bytes, record: dict[str, Any]) -> None:
        """Submit a held batch again once it fits beside the tier's other unfinished batches
        and room has freed (`consumer.core.offline.may_resubmit`): the new batch's record is
        written before the old one's tombstone, so a crash in between tracks both (the old one
        is held again, the new one runs)."""
        held, tier = self._held[key], record["tier"]
        others = [r for k, r in self._open.items() if k != key and k not in self._held]
        poll_s = self._poll_s_by_tier.get(tier, 60.0)
        if not may_resubmit(
            int(record.get("estimated_tokens") or 0),
            enqueued_tokens(others, tier, record.get("deployment")),
            self._max_enqueued.get(tier),
            ended_since=self._ended[tier] > held.ended,
            waited_s=self._clock() - held.since_s,
            backoff_s=resubmit_backoff_s(held.tries, poll_s),
        ):
            return
        provider = self._providers.get(provider_key(tier, record.get("deployment")))
        if provider is None:
            return
        job = await provider.resubmit(record["batch_id"])
        again = {
            **record,
            "batch_id": job.id,
            "submitted_at": time.time(),
            "resubmissions": held.tries,
            "resubmitted_from": record["batch_id"],
        }
        new_key = batch_key(tier, job.id, record.get("deployment"))
        await self._publish(key, [OutRecord(self._settings.batches_topic, new_key, orjson.dumps(again))])
        self._held.pop(key, None)
        self._set_open(key, None)
        self._next_poll_s.pop(key, None)
        log.info("batch %s of tier %s submitted again as %s", record["batch_id"], tier, job.id)

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
