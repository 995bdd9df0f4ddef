"""`OfflineCollector`: offline jobs collected per tier and submitted as provider batches
(see `consumer.runtime.offline`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from consumer.core.budgets import Reservation
from consumer.core.errors import ErrorKind, ProviderError
from consumer.core.offline import (
    BatchRequest,
    enqueued_tokens,
    fits,
    token_shards,
)
from consumer.kafka.board import FollowedRecord, TopicFollower
from consumer.kafka.records import TopicPartition
from consumer.providers.base import BatchProvider
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.offline.records import (
    batch_key,
    batch_member,
    batch_record,
    enqueued_fields,
    offline_request,
    provider_key,
    record_runs,
)
from consumer.runtime.spending import TierSpending, reserve_offline, tier_spending
from consumer.runtime.tenancy import TenantGate
from consumer.settings import Settings
from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)

#: a batch this instance recorded counts as enqueued by itself until the followed batches topic
#: shows it, for at most this long (a batch that ended before it was read counts until then)
RECORD_SEEN_S = 10.0
#: while a shard waits for room, it looks again at least this often
ROOM_CHECK_S = 1.0


@dataclass
class _Pending:
    items: list[JobContext] = field(default_factory=list)
    first_s: float = 0.0


class OfflineCollector:
    """Collects offline jobs per tier and submits them as provider batches.

    outcomes: where a job's recorded batch (its offset may commit) or its failed submission ends;
    batches: the batches topic followed (what is enqueued, for tiers with
    `offline.max_enqueued_tokens`; None: no tier has one); batch_providers: by `provider_key`;
    deployments: per tier with `deployments`, each one's name and model: each provider batch
    goes to the one with the most room for enqueued work (without a limit, or without the
    batches topic followed: the one this instance gave the fewest tokens); gate: the tenants' budgets, when
    some account has one: each job's estimate (at the batch price) is spent once the provider
    took its batch (its answer comes hours later, to whichever instance tracks it); a job its
    tenant's budget does not hold is held or dead-lettered before it is submitted.
    """

    def __init__(
        self,
        settings: Settings,
        batch_providers: dict[str, BatchProvider],
        producer: AIOKafkaProducer,
        outcomes: OutcomeWriter,
        clock: Callable[[], float] = time.monotonic,
        batches: TopicFollower | None = None,
        deployments: Mapping[str, Sequence[tuple[str, str]]] | None = None,
        gate: TenantGate | None = None,
    ) -> None:
        self._deployments = dict(deployments or {})
        #: tokens this instance submitted per (tier, deployment), for the choice without a limit
        self._given: Counter[tuple[str, str | None]] = Counter()
        self._settings = settings
        self._providers = batch_providers
        self._producer = producer
        self._outcomes = outcomes
        self._clock = clock
        self._batches = batches
        self._gate = gate
        self._spending: dict[str, TierSpending] = {}
        self._pending: dict[str, _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        #: tokens of this instance's shards being submitted now, per (tier, deployment)
        self._submitting: Counter[tuple[str, str | None]] = Counter()
        #: batch key -> (tier, deployment, tokens, when) of batches recorded here and not yet
        #: seen followed
        self._recorded: dict[bytes, tuple[str, str | None, int, float]] = {}
        #: batch key -> the followed record and what it says (tier, estimated tokens)
        self._followed: dict[bytes, tuple[FollowedRecord, dict[str, Any]]] = {}

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
        if self._batches is not None:
            await self._batches.start()
        self._loop_task = asyncio.create_task(self._loop(), name="promptbus-offline-collector")

    async def stop(self) -> None:
        await cancel_and_wait(self._loop_task)
        if self._batches is not None:
            await self._batches.stop()

    async def flush_now(self) -> None:
        """Submit what is collected; wait for the submissions at most the shutdown timeout (a
        shard still waiting for room then stays unsubmitted: its jobs are read again after a
        restart)."""
        for tier in list(self._pending):
            self._submit(tier)
        if self._tasks:
            _, waiting = await asyncio.wait(set(self._tasks), timeout=self._settings.shutdown_timeout_s)
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

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
        """Submit a collection: whole, or, under the tier's enqueued token limit, in shards that
        fit it, each once the tier's unfinished batches leave it room."""
        model = ctxs[0].tier.config.model
        # embed jobs after chat jobs: a provider batch has one endpoint, so each kind is one run
        ctxs = sorted(ctxs, key=lambda c: c.kind == "embed")
        requests = [BatchRequest(f"pb-{i}", offline_request(c, model)) for i, c in enumerate(ctxs)]
        #: each job's reservation from its tenant's budget until the provider takes its batch
        held: dict[int, Reservation] = {}
        if self._gate is not None:
            requests, ctxs, held = await self._reserve(tier, requests, ctxs)
            if not ctxs:
                return
        try:
            members = {r.custom_id: batch_member(r.custom_id, c) for r, c in zip(requests, ctxs, strict=True)}
            for run in self._record_runs(requests, ctxs, members):
                await self._submit_collection(
                    tier, ctxs[run.start : run.stop], requests[run.start : run.stop], held, members
                )
        finally:
            self._spend_held(tier, held, ctxs, taken=False)  # what no provider took goes back

    def _record_runs(
        self, requests: list[BatchRequest], ctxs: list[JobContext], members: dict[str, dict[str, Any]]
    ) -> list[range]:
        """The runs of the collection whose batch records fit the batches topic
        (`records.record_runs`); a member too large for any is dead-lettered: it cannot go
        offline (a source record of many megabytes, say), and its offset commits."""
        sizes = [len(orjson.dumps(members[r.custom_id])) for r in requests]
        limit = self._outcomes.limits.batches
        runs, too_large = record_runs(sizes, limit)
        for i in too_large:
            message = f"its batch record would be {sizes[i]} bytes, over the batches topic's {limit}"
            self._outcomes.fail(ctxs[i], ErrorKind.INVALID_JOB, message, attempts=0)
        return runs

    async def _reserve(
        self, tier: str, requests: list[BatchRequest], ctxs: list[JobContext]
    ) -> tuple[list[BatchRequest], list[JobContext], dict[int, Reservation]]:
        """Each job's estimate held from its tenant's budget; the jobs it does not hold are left
        out (held or dead-lettered by the gate)."""
        assert self._gate is not None
        spending = self._spending.get(tier)
        if spending is None:
            config, ledger = ctxs[0].tier.config, self._outcomes.ledger
            spending = self._spending[tier] = tier_spending(config, ledger, self._gate)
        requests, ctxs, reservations = await reserve_offline(spending, self._gate, requests, ctxs)
        return requests, ctxs, {id(c): r for r, c in reservations if r is not None}

    def _spend_held(
        self, tier: str, held: dict[int, Reservation], ctxs: list[JobContext], *, taken: bool
    ) -> None:
        """The reservations of `ctxs`: spent at their estimate when the provider took their batch
        (`taken`), else given back."""
        spending = self._spending.get(tier)
        for c in ctxs:
            reservation = held.pop(id(c), None)
            if reservation is not None and spending is not None:
                spending.spent_as_estimated(reservation, recorded=taken)

    async def _submit_collection(
        self,
        tier: str,
        ctxs: list[JobContext],
        requests: list[BatchRequest],
        held: dict[int, Reservation],
        members: dict[str, dict[str, Any]],
    ) -> None:
        model = ctxs[0].tier.config.model
        tokens = [r.request.estimated_tokens() for r in requests]
        limit = ctxs[0].tier.config.offline.max_enqueued_tokens
        if limit is None or self._batches is None:
            deployment, own_model = self._choose(tier, None, model)
            if own_model != model:
                requests = [
                    BatchRequest(r.custom_id, offline_request(c, own_model))
                    for r, c in zip(requests, ctxs, strict=True)
                ]
            await self._submit_shard(tier, deployment, ctxs, requests, tokens, held, members)
            return
        try:
            for shard in token_shards(tokens, limit):
                shard_tokens = sum(tokens[i] for i in shard)
                deployment, own_model = self._choose(tier, limit, model)
                await self._wait_for_room(tier, deployment, shard_tokens, limit)
                place = (tier, deployment)
                self._submitting[place] += shard_tokens
                shard_ctxs, shard_requests = (
                    ctxs[shard.start : shard.stop],
                    requests[shard.start : shard.stop],
                )
                if own_model != model:
                    shard_requests = [
                        BatchRequest(r.custom_id, offline_request(c, own_model))
                        for r, c in zip(shard_requests, shard_ctxs, strict=True)
                    ]
                try:
                    await self._submit_shard(
                        tier, deployment, shard_ctxs, shard_requests, tokens[shard.start : shard.stop], held,
                        members,
                    )
                finally:
                    self._submitting[place] -= shard_tokens
        except asyncio.CancelledError:
            for c in ctxs:
                if not c.done:  # not recorded: read again after a restart
                    self._outcomes.abandon(c)
            raise

    def _choose(self, tier: str, limit: int | None, model: str) -> tuple[str | None, str]:
        """The deployment a provider batch of `tier` goes to, and its model: the one with the
        most room under `limit` for enqueued work (None: the fewest tokens given it here); a
        tier without deployments: its own keys (None) and `model`, the tier's."""
        own = self._deployments.get(tier)
        if not own:
            return None, model
        if limit is not None and self._batches is not None:
            name, model = max(own, key=lambda d: limit - self._enqueued(tier, d[0]))
        else:
            name, model = min(own, key=lambda d: self._given[(tier, d[0])])
        return name, model

    async def _wait_for_room(self, tier: str, deployment: str | None, tokens: int, limit: int) -> None:
        """Until a shard of `tokens` fits beside the unfinished batches of the tier's deployment."""
        assert self._batches is not None
        waited = False
        while not fits(tokens, self._enqueued(tier, deployment), limit):
            if not waited:
                waited = True
                log.info(
                    "tier %s: %d offline tokens wait for room under offline.max_enqueued_tokens %d "
                    "(%d enqueued)",
                    provider_key(tier, deployment),
                    tokens,
                    limit,
                    self._enqueued(tier, deployment),
                )
            await self._batches.wait_for_change(self._batches.version, ROOM_CHECK_S)

    def _enqueued(self, tier: str, deployment: str | None = None) -> int:
        """The estimated input tokens of the unfinished batches of the tier's deployment (None:
        its own keys): every instance's, as the batches topic shows them, and this instance's
        not shown there yet."""
        assert self._batches is not None
        latest = self._batches.latest()
        for key in [k for k in self._followed if k not in latest]:
            del self._followed[key]
        records = []
        for key, followed in latest.items():
            known = self._followed.get(key)
            if known is None or known[0] is not followed:
                known = self._followed[key] = (followed, enqueued_fields(followed.value))
            records.append(known[1])
        total = enqueued_tokens(records, tier, deployment) + self._submitting[(tier, deployment)]
        now_s = self._clock()
        for key, (of_tier, of_deployment, tokens, at_s) in list(self._recorded.items()):
            if key in latest or now_s - at_s > RECORD_SEEN_S:
                del self._recorded[key]
            elif of_tier == tier and of_deployment == deployment:
                total += tokens
        return total

    async def _submit_shard(
        self,
        tier: str,
        deployment: str | None,
        ctxs: list[JobContext],
        requests: list[BatchRequest],
        tokens: list[int],
        held: dict[int, Reservation],
        members: dict[str, dict[str, Any]],
    ) -> None:
        """Submit one provider batch (or the several the provider's size limits make) to the
        tier's deployment and record each, with the deployment and its members' estimated
        tokens; then its members' offsets may commit. Once the provider took it, its members'
        reservations (`held`) are spent."""
        provider = self._providers[provider_key(tier, deployment)]
        self._given[(tier, deployment)] += sum(tokens)
        delay_s = 1.0
        while True:
            try:
                jobs = await provider.submit(requests)
                self._spend_held(tier, held, ctxs, taken=True)
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
            job_requests = requests[start : start + job.total]
            job_ctxs = ctxs[start : start + job.total]
            job_tokens = sum(tokens[start : start + job.total])
            start += job.total
            job_members = [members[r.custom_id] for r in job_requests]
            record = batch_record(tier, job, job_members, job_tokens, deployment)
            key = batch_key(tier, job.id, deployment)
            await self._producer.send_and_wait(self._settings.batches_topic, orjson.dumps(record), key=key)
            self._recorded[key] = (tier, deployment, job_tokens, self._clock())
            for c in job_ctxs:
                self._outcomes.offline_recorded(c)
        log.info("tier %s: %d offline jobs submitted as %s", tier, len(ctxs), ", ".join(j.id for j in jobs))
