"""The pipeline: intake -> admission -> window -> plan -> limiter -> provider -> outcome -> commit.

One asyncio task runs this loop; it owns no decision of its own. Step by step for one record:

    1. intake: the record's offset is tracked (a Ticket), so the commit watermark waits for it;
    2. admission (`admission.py`): the record becomes a job context, or a rejection that is
       dead-lettered with the original bytes;
    3. routing: offline jobs -> the offline collector; with the tier's `dedupe`, a job whose
       identical deterministic request is in flight or answered recently waits for it or takes
       its answer (`core/dedupe.py`, ended by `delivery.py`, which hands back the jobs whose
       leader's deadline passed: they are routed again next turn); batch-eligible jobs -> a
       collection window (`core/window.py`); everything else -> a one-member plan (an
       ordinary request);
    4. plans (`plans.py`, one runner per tier): requests through the tier's limiter and
       provider, answers validated and split / re-asked by the pure planner;
    5. outcomes (`delivery.py`): each result or dead letter -> the sink, which makes it durable
       and commits the input offset (`kafka/sink.py`).

Around that the loop keeps each lane's intake within its `max_inflight` (pause / resume,
`backpressure.py`), drains on stop and hands revoked partitions back.

Hand-overs (at_least_once, `consumer.core.handover`): at a revoke the sink publishes the
offsets in flight here; a moved partition's work goes on (its windows, plans and requests),
and its outcomes are written until the hand-over's deadline. A stop hands over every owned
partition and leaves the group before it drains. As a new owner, the loop parks the records a
hand-over names (tracked, not run) and, as the old owner's finished record or the deadline
comes, completes them without an outcome or runs them (`consumer.runtime.handovers`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from consumer.core.dedupe import DedupeTable, Lead, Reuse, dedupe_key
from consumer.core.embed import embed_dedupe_key
from consumer.core.errors import ErrorKind
from consumer.core.lanes import DEFAULT_LANE_NAME, Lane
from consumer.core.tenants import TenantPolicies
from consumer.core.tuples import maker
from consumer.core.window import Flush, LaneWindows, PackKey
from consumer.kafka.handover import HandOverBoard
from consumer.kafka.intake import InRecord, JobIntake
from consumer.kafka.records import TopicPartition
from consumer.kafka.sink import OutcomeSink, Ticket
from consumer.runtime.admission import Admission, Rejection
from consumer.runtime.backpressure import LaneGate
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.embed_runner import EmbedRunner
from consumer.runtime.fallback import FallbackRouter
from consumer.runtime.handovers import HandedOverRecords
from consumer.runtime.plangate import PlanGate, running_plan_limit
from consumer.runtime.sources import Ready, SourceIntake
from consumer.runtime.stats import ServiceStats
from consumer.runtime.tenancy import TenantGate
from consumer.runtime.tiers import TierRuntime
from consumer.settings import Settings
from consumer.telemetry import Telemetry

log = logging.getLogger(__name__)

#: records taken per poll; the loop comes back at least every POLL_INTERVAL_S
MAX_POLL_RECORDS = 500
POLL_INTERVAL_S = 0.05
#: adaptive batch sizes of batch keys unused this long are forgotten (checked this often)
SIZES_IDLE_S = 3600.0
SIZES_EXPIRE_EVERY_S = 60.0
_new_pack_key = maker(PackKey)


def _unweighted(_tenant: str) -> float:
    return 1.0


class OfflineJobs(Protocol):
    """Where offline jobs go (`offline.OfflineCollector`): collected, then a provider batch."""

    def add(self, ctx: JobContext) -> None: ...

    def drop_partitions(self, partitions: set[TopicPartition]) -> None:
        """Revoked partitions: their unsubmitted jobs are left to the new owner."""
        ...

    async def flush_now(self) -> None:
        """Submit what is collected now and wait for the submissions (shutdown)."""
        ...


class Pipeline:
    """Runs until `stop` is set, then drains within `settings.shutdown_timeout_s`."""

    def __init__(
        self,
        settings: Settings,
        tiers: dict[str, TierRuntime],
        intake: JobIntake,
        sink: OutcomeSink,
        outcomes: OutcomeWriter,
        stats: ServiceStats,
        telemetry: Telemetry,
        *,
        offline: OfflineJobs | None = None,
        lanes: tuple[Lane, ...] = (),
        tenants: TenantPolicies | None = None,
        gate: TenantGate | None = None,
        sources: SourceIntake | None = None,
        handovers: HandOverBoard | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """tenants: their fair-share weights order the windows due together and the queued
        plans (None: every tenant weighs 1); gate: the tenants' budgets, when some account has
        one (their spent tenants' jobs are held or dead-lettered before they go further);
        sources: the source topics' records, decoded before admission (None: no sources);
        handovers: the group's hand-overs (None: none are made or read); clock_ms: the
        wall clock their deadlines are on."""
        self._settings = settings
        self._tiers = tiers
        self._intake = intake
        self._sink = sink
        self._outcomes = outcomes
        self._stats = stats
        self._offline = offline
        self._clock = clock
        self._tenant_gate = gate
        self._admission = Admission(
            tiers,
            max_job_bytes=settings.max_job_bytes,
            offline_runs=offline is not None,
            start_trace=telemetry.start_job,
            tenants=outcomes.tenants,
        )
        rng = rng or random.Random()
        fallback = FallbackRouter(tiers, lambda ctx: self._route(ctx, self._clock(), counted=True), clock)
        self._fallback = fallback if fallback.active else None
        self._runners = {
            name: EmbedRunner(
                tier, outcomes, stats, telemetry,
                rng=rng, clock=clock, spawn=self._spawn, fallback=self._fallback, gate=gate,
            )
            for name, tier in tiers.items()
        }
        weight_of = tenants.weight if tenants is not None else _unweighted
        self._windows: LaneWindows[JobContext] = LaneWindows(weight_of)
        self._plans: set[asyncio.Task[None]] = set()
        # each lane pauses its own partitions at its own bound (no lanes: one on the jobs topic)
        lanes = lanes or (Lane(DEFAULT_LANE_NAME, settings.jobs_topic, max_inflight=settings.max_inflight),)
        self._sources = sources
        source_lanes = {src.topic: src.lane for src in sources.sources} if sources is not None else {}
        self._lanes = LaneGate(
            lanes, intake, sink, stats, max_poll_records=MAX_POLL_RECORDS, extra_topics=source_lanes
        )
        # plans start per (tier, lane, tenant account): a lane's or an account's queued plans
        # never wait behind another's running ones (within a key: fair between tenants)
        self._gate: PlanGate[tuple[str, str, str], tuple[list[JobContext], PackKey | None]] = PlanGate(
            lambda key: running_plan_limit(tiers[key[0]].config.limiter.max),
            self._run_plan,
            self._task,
            weight_of,
        )
        self._next_expire_s = 0.0
        self.ready = asyncio.Event()
        self._handed_over = (
            HandedOverRecords(
                handovers, sink, stats, timeout_s=settings.handover_timeout_s, clock_ms=clock_ms
            )
            if handovers is not None
            else None
        )
        #: what this instance hands over names its parked records as not its own to finish
        self._parked = self._handed_over.parked if self._handed_over is not None else {}
        #: a stop handed every partition over and is leaving the group: a rebalance that
        #: still reaches this member (its leave waits for one in progress) changes nothing
        self._leaving = False

    def runner(self, tier: str) -> EmbedRunner:
        """The plan runner of a tier (benchmarks and tests look at its tier)."""
        return self._runners[tier]

    # ------------------------------------------------------------------ main loop
    async def run(self, stop: asyncio.Event) -> None:
        """Poll, admit, route and dispatch until `stop`; then drain. Intake is started and
        stopped by its owner (`app.run_service`)."""
        self.ready.set()
        try:
            while not stop.is_set():
                timeout_s = POLL_INTERVAL_S
                next_due = self._windows.next_deadline_s()
                if next_due is not None:
                    timeout_s = max(0.0, min(timeout_s, next_due - self._clock()))
                # never take more than a lane's max_inflight allows: the pause below only stops
                # the next poll
                room = self._lanes.room()
                if room <= 0:
                    # full: wait for outcomes to free room rather than in a poll of paused
                    # partitions (aiokafka heartbeats on its own; a poll comes soon enough)
                    records: Iterable[InRecord] = ()
                    await self._sink.wait_for_room(self._lanes.wait_target(), timeout_s)
                else:
                    records = await self._intake.poll(timeout_s, min(MAX_POLL_RECORDS, room))
                if self._handed_over is not None and records:
                    await self._handed_over.wait_for_assignment()
                now_s = self._clock()
                if self._parked:
                    self._take_released(now_s)
                self._route_again(now_s)
                if self._sources is not None:
                    self._take_sources(self._sources.released(), now_s)
                self._take_all(records, now_s)
                self._dispatch(self._windows.due(now_s, can_still_join=self._can_still_join))
                self._lanes.apply()
                self._refresh_gauges()
        finally:
            await self._drain()

    def _can_still_join(self, key: PackKey) -> bool:
        # Rule 3: a window waits only while records that could join it are still unfetched.
        return self._intake.has_unfetched()

    async def _drain(self) -> None:
        """Stop intake, hand the owned partitions' work over and leave the group, send what
        windows hold, wait (bounded) for plans, commit."""
        self.ready.clear()
        self._intake.pause(self._intake.assignment())
        await self._hand_over_at_stop()
        self._route_again(self._clock())
        self._dispatch(self._windows.drain_all())
        if self._offline is not None:
            await self._offline.flush_now()
        timeout_s = self._settings.shutdown_timeout_s
        deadline_s = self._clock() + timeout_s
        # queued plans start as running ones end
        while self._gate.queued() and self._plans and self._clock() < deadline_s:
            await asyncio.wait(set(self._plans), timeout=deadline_s - self._clock())
        for members, _ in self._gate.drop(lambda _: True):
            for ctx in members:
                self._outcomes.abandon(ctx)
        if self._plans:
            _, pending = await asyncio.wait(set(self._plans), timeout=max(0.0, deadline_s - self._clock()))
            for task in pending:
                task.cancel()
            if pending:
                log.warning(
                    "shutdown: abandoned %d unfinished requests (their offsets stay uncommitted)",
                    len(pending),
                )
                await asyncio.gather(*pending, return_exceptions=True)
        # no new plan starts now: jobs still to be routed again are left to a restart
        for ctx in self._outcomes.take_rerouted():
            self._outcomes.abandon(ctx)
        for ctx in self._tenant_gate.drain() if self._tenant_gate is not None else ():
            self._outcomes.abandon(ctx)  # held for budget: read again after a restart
        await self._sink.flush(timeout_s=min(timeout_s, 10.0))
        # the last snapshot of the stats tells what the drain committed
        self._lanes.record()
        self._refresh_gauges()

    # ------------------------------------------------------------------ rebalance
    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """A rebalance began (every partition is revoked; which move is known on assignment):
        commit what is durable and hold new outcomes. The work goes on meanwhile: waiting
        for it here would hold up the whole group's join for an answer's time."""
        if self._leaving:
            return
        if self._handed_over is not None:
            self._handed_over.revoked()
        if not partitions:  # aiokafka also revokes the empty set before the first join
            return
        self._stats.rebalances += 1
        started_s = self._clock()
        log.info("rebalance: %d partitions revoked until the new assignment", len(partitions))
        await self._sink.on_revoked(partitions, timeout_s=self._settings.revoke_timeout_s)
        took_s = self._clock() - started_s
        log.info("rebalance: revoke done in %.3f s (what was durable is committed)", took_s)
        if self._handed_over is not None:
            await self._sink.hand_over(self._job_partitions(partitions), self._parked)

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        """These partitions moved to another member. A handed-over one's work goes on (its
        outcomes are written until the hand-over's deadline); another's waiting jobs are
        abandoned (not committed: the new owner reads them again) and its running requests'
        outcomes dropped when they end. Jobs held for a budget, offline or for a source are
        abandoned either way, and parked records forgotten."""
        if self._leaving:
            return
        idle = partitions - self._sink.handed_over(partitions)
        abandoned = self._windows.drain_partitions(idle)
        for members, _ in self._gate.drop(lambda plan: all(c.source.tp in idle for c in plan[0])):
            abandoned += members
        self._forget_parked(partitions)
        if self._tenant_gate is not None:
            abandoned += self._tenant_gate.drop_partitions(partitions)
        for ctx in abandoned:
            self._outcomes.abandon(ctx)
        if self._offline is not None:
            self._offline.drop_partitions(partitions)
        if self._sources is not None:
            self._sources.drop_partitions(partitions)
        self._stats.partitions_lost += len(partitions)
        await self._sink.on_lost(partitions)
        log.info("lost %s: %d waiting jobs abandoned (not committed)", sorted(partitions), len(abandoned))

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        if self._leaving:
            log.info("assigned %s while leaving the group: not taken", sorted(partitions))
            return
        log.info("assigned %s", sorted(partitions))
        await self._sink.on_assigned(partitions)
        if self._handed_over is not None:
            # read before any record of the new partitions is taken in
            await self._handed_over.read_at_assignment()
        if self._sources is not None:
            await self._sources.on_assigned(partitions)

    # ------------------------------------------------------------------ hand-overs
    async def _hand_over_at_stop(self) -> None:
        """at_least_once: hand the owned partitions' work over and leave the group at once, so
        the partitions move now, not after the drain; the drain then finishes that work and
        the sink says what of it was finished. Unpublished hand-overs: the partitions stay
        until the drain's end (as without hand-overs); so do they when sources are read (a
        source's work is not handed over, and leaving would drop it)."""
        owned = self._intake.assignment()
        if self._handed_over is None or self._sources is not None or not owned:
            return
        await self._sink.on_revoked(owned, timeout_s=self._settings.revoke_timeout_s)
        if not await self._sink.hand_over(self._job_partitions(owned), self._parked):
            await self._sink.on_assigned(owned)  # kept: drained and committed as before
            return
        self._leaving = True
        await self._intake.leave_group()
        await self._sink.leave(owned)
        self._forget_parked(owned)
        log.info("stopping: handed over %d partitions' work and left the group", len(owned))

    def _job_partitions(self, partitions: set[TopicPartition]) -> set[TopicPartition]:
        """The lanes' partitions of these: a source's are not handed over (a key's records must
        be enriched in order, which two owners working at once would not keep)."""
        if self._sources is None:
            return partitions
        sources = self._sources.by_topic
        return {tp for tp in partitions if tp.topic not in sources}

    def _take_released(self, now_s: float) -> None:
        """Parked records whose hand-over expired are taken in here."""
        assert self._handed_over is not None
        released = self._handed_over.released()
        if released:
            self._stats.items_in += len(released)
            self._take_tracked(released, now_s)

    def _forget_parked(self, partitions: set[TopicPartition]) -> None:
        if self._handed_over is not None:
            self._handed_over.forget(partitions)

    # ------------------------------------------------------------------ intake and routing
    def _take_all(self, records: Iterable[InRecord], now_s: float) -> None:
        """Track a poll's records, then admit and route them in order (but those a hand-over
        parks or completes)."""
        track = self._sink.track
        taken = [(record, track(record.source)) for record in records]
        if self._handed_over is not None:
            taken = self._handed_over.take(taken)
        # parked and completed records are not taken in (yet): like those skipped as done
        self._stats.items_in += len(taken)
        self._take_tracked(taken, now_s)

    def _take_tracked(self, taken: Iterable[tuple[InRecord, Ticket]], now_s: float) -> None:
        """Admit and route tracked records, in order (a source's, once it can decode them)."""
        lane_of, admit = self._lanes.lane_of, self._admission.admit
        route = self._route
        sources = self._sources.by_topic if self._sources is not None else None
        for record, ticket in taken:
            try:
                lane = lane_of(record.source.tp.topic)
                if sources is not None:
                    source = sources.get(record.source.tp.topic)
                    if source is not None:
                        assert self._sources is not None
                        if self._sources.past_range(record):
                            self._outcomes.deliver_record(ticket, None)  # committed, not written
                        elif self._sources.take(source, record, ticket, lane):
                            self._take_sources([(record, ticket, lane, source)], now_s)
                        continue
                admitted = admit(record, ticket, now_s, lane)
                if isinstance(admitted, Rejection):
                    self._outcomes.reject(ticket, admitted, lane)
                else:
                    route(admitted, now_s)
            except Exception:
                self._not_taken(record)

    def _take_sources(self, ready: Iterable[Ready], now_s: float) -> None:
        """Admit and route source records: a job, a dead letter, or a tombstone for its key."""
        admit = self._admission.admit_source
        for record, ticket, lane, source in ready:
            try:
                admitted = admit(source, record, ticket, now_s, lane)
                if isinstance(admitted, Rejection):
                    self._outcomes.reject(ticket, admitted, lane)
                elif isinstance(admitted, JobContext):
                    self._route(admitted, now_s)
                else:  # a deleted row's tombstone, or nothing when a newer record was written
                    self._outcomes.deliver_record(ticket, admitted, lane)
            except Exception:
                self._not_taken(record)

    def _not_taken(self, record: InRecord) -> None:
        """Taking `record` raised (a bug; called in its except block). One record must not stop
        the service (restarted, it would meet the same record again); as for a failed plan, no
        guess is published: it stays uncommitted and is read again after a restart."""
        log.error(
            "input record %s/%d/%d could not be taken (a bug); it stays uncommitted, holding "
            "back its partition's commits until a restart reads it again",
            record.source.topic,
            record.source.partition,
            record.source.offset,
            exc_info=True,
        )

    def _route(self, ctx: JobContext, now_s: float, *, counted: bool = False) -> None:
        """Send an admitted job on its way; `counted`: it was routed before (a dedupe follower
        routed again)."""
        tier = ctx.tier
        if not counted:
            tier.stats.items += 1
            wanted = ctx.requested_mode
            if wanted == "auto" or (wanted is None and tier.config.default_mode == "auto"):
                tier.stats.count_auto(ctx.mode)
        if ctx.past_deadline(now_s):
            self._outcomes.fail(
                ctx, ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the job was read", attempts=0
            )
            return
        if self._tenant_gate is not None and not self._tenant_gate.admits(ctx):
            return  # its tenant's budget is spent: held, or dead-lettered budget_exhausted
        if self._fallback is not None:
            self._fallback.route_new(ctx, now_s)  # its tier in trouble: the fallback tier's job now
            tier = ctx.tier
        if ctx.mode == "offline":
            assert self._offline is not None  # admission refuses offline jobs when none runs
            self._offline.add(ctx)
            return
        if tier.dedupe is not None and not self._lead_or_share(ctx, tier.dedupe, now_s):
            return
        if ctx.kind == "embed":
            # embed jobs share a window whenever the tier windows: an array request changes no vector
            embedding = tier.embed_window(ctx.options_key, ctx.options, ctx.mode, ctx.tenant)
            if embedding is None:
                self._start_plan([ctx], key=None)
                return
            key, limits = embedding
        else:
            batchable = ctx.batchable
            if batchable is None or not ctx.batch or not tier.config.batching.enabled:
                self._start_plan([ctx], key=None)
                return
            key = _new_pack_key(
                (
                    ctx.requested_tier,
                    batchable.prefix,
                    batchable.variable,
                    ctx.options_key,
                    ctx.requested_mode or "online",
                    ctx.tenant,
                )
            )
            limits = tier.limits_for(key, now_s)
        if ctx.fallback_from is not None:
            key = key._replace(tier=tier.name)  # never in one window with the jobs of its own tier
        flushes = self._windows.add(key, ctx, ctx.lane, len(ctx.input), ctx.source.tp, limits, now_s)
        if flushes:
            self._dispatch(flushes)

    def _route_again(self, now_s: float) -> None:
        """Route the jobs the outcome writer handed back (deduped to a leader whose deadline
        passed), each under its own deadline, and the jobs held for budget whose tenant has
        room again."""
        for ctx in self._outcomes.take_rerouted():
            self._route(ctx, now_s, counted=True)
        if self._tenant_gate is not None:
            for ctx in self._tenant_gate.take_released():
                self._route(ctx, now_s, counted=True)

    def _lead_or_share(self, ctx: JobContext, table: DedupeTable[Any, Any], now_s: float) -> bool:
        """Dedupe: True when the job's own request is to go out (it leads, or it cannot be
        shared); False when an identical request answers it: it waits for the one in flight
        (ended with it by `OutcomeWriter`), or ends now with one answered within the window.

        Batched jobs are deduped the same way, before their window: the key is of the request
        the job would send alone, so a batched leader's answer is one its followers would
        have got in the same batch.
        """
        options, model = ctx.options, ctx.tier.config.model
        if ctx.kind == "embed":
            key: str | None = embed_dedupe_key(ctx.tier.name, model, options, ctx.input, ctx.tenant)
        else:
            messages = ((m.role, m.content) for m in ctx.messages)
            key = dedupe_key(ctx.tier.name, model, options, messages, ctx.tenant)
        if key is None:
            return True
        claim = table.claim(key, ctx.id, ctx, now_s)
        if isinstance(claim, Lead):
            ctx.dedupe_key = key
            return True
        if isinstance(claim, Reuse):
            self._outcomes.share(ctx, claim.leader, claim.answer, None)
        return False

    # ------------------------------------------------------------------ plans
    def _dispatch(self, flushes: list[Flush[JobContext]]) -> None:
        for flush in flushes:
            members = [c for c in flush.items if not c.done]
            if members:
                self._start_plan(members, key=flush.key)

    def _start_plan(self, members: list[JobContext], *, key: PackKey | None) -> None:
        # a request waits in its most urgent member's lane (the limiter's too), as its tenant's
        # (a plan's members are of one tenant: windows are per tenant)
        first = members[0]
        if len(members) == 1:
            lane, deadline_s = first.lane_name, first.deadline_s
        else:
            lane = min(members, key=lambda c: c.lane.rank if c.lane is not None else 0).lane_name
            deadline_s = min((d for c in members if (d := c.deadline_s) is not None), default=None)
        account = self._outcomes.ledger.account(first.tenant)
        self._gate.submit((first.tier.name, lane, account), (members, key), first.tenant, deadline_s)

    async def _run_plan(
        self, key: tuple[str, str, str], plan: tuple[list[JobContext], PackKey | None]
    ) -> None:
        runner = self._runners[key[0]]
        members, pack_key = plan
        if members[0].kind == "embed":  # a window holds jobs of one kind
            await runner.run_embed(members)
        else:
            await runner.run(members, pack_key)

    @property
    def running(self) -> int:
        """Request plans and verifications running now (the drain waits for these)."""
        return len(self._plans)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._task(coro)

    def _task(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task the drain waits for."""
        task = asyncio.create_task(coro)
        self._plans.add(task)
        task.add_done_callback(self._plans.discard)
        return task

    # ------------------------------------------------------------------ gauges
    def _refresh_gauges(self) -> None:
        now_s = self._clock()
        if now_s >= self._next_expire_s:
            # batch keys come and go with prompts; forget the adaptive sizes of idle ones
            self._next_expire_s = now_s + SIZES_EXPIRE_EVERY_S
            for tier in self._tiers.values():
                tier.sizes.expire(now_s, idle_s=SIZES_IDLE_S)
        self._stats.inflight = self._sink.inflight()
        self._stats.paused_partitions = len(self._intake.paused())
        self._stats.dropped_late = self._sink.dropped_late
        self._stats.commits = self._sink.commits
        self._stats.skipped_done = self._intake.skipped_done
        self._stats.handover_parked = len(self._parked)
        for tier in self._tiers.values():
            tier.refresh_gauges(now_s)
        if self._tenant_gate is not None:
            self._tenant_gate.refresh_gauges()
