"""Outcome delivery: the one place a job's result or dead letter is built and handed to the sink.

Every part that ends a job (admission's rejections, plan runners, the offline collector) ends
it here, so each job ends exactly once (`JobContext.done`), its trace ends with it, and the
service counters for results and dead letters are counted in one place, and so is each
online job's latency (`promptbus_job_latency_seconds`: its record's Kafka timestamp to its
outcome handed to the sink, which acknowledges it within a produce round trip; a record that
never became a job, a rejection, is counted as a dead letter of the service and of the lane it
was read in, and in no latency histogram).

Dedupe (`consumer.core.dedupe`): a job that leads its tier's dedupe table ends here, and so do
the identical jobs that waited for it. Each follower gets a record of its own, built from the
leader's answer (`SharedAnswer`) with its own id, metadata, source and `dedupe_of` naming the
leader (and no usage: its request was never sent), or its own dead letter when the leader's
request failed. Its input offset commits only once that record is delivered, like any other.
A leader abandoned (shutdown, revoke, a failed plan) abandons its followers: no outcome, not
committed, read again by the partition's next owner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from consumer.core.errors import ErrorKind, JobError, ProviderError
from consumer.core.lanes import Lane
from consumer.core.tenants import TenantPolicies, TenantTopics
from consumer.kafka.records import OutRecord
from consumer.kafka.sink import OutcomeSink, Ticket
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.admission import Rejection
from consumer.runtime.context import JobContext
from consumer.runtime.latency import DEAD_LETTER, JOB_LATENCY, OFFLINE_JOB_LATENCY, RESULT, Series
from consumer.runtime.outcomes import (
    AnswerResults,
    RecordLimits,
    ResultTail,
    dead_letter_record,
    too_large_result,
)
from consumer.runtime.sources import SourceOrigin
from consumer.runtime.stats import LaneStats, ServiceStats
from consumer.settings import Settings
from consumer.telemetry import ABANDONED, Telemetry

#: one job an answer answered: its context, its output (None for an embed job), its vector
#: (an embed job's, else None) and the requests that carried it
AnsweredJob = tuple[JobContext, str | None, Sequence[float] | None, int]


@dataclass(frozen=True, slots=True)
class SharedAnswer:
    """What identical jobs' results are built from: the answer's shared part and its output."""

    results: AnswerResults
    output: str | None
    embedding: Sequence[float] | None = None


@dataclass(frozen=True, slots=True)
class SharedFailure:
    """How a dedupe leader's request failed: each job deduped to it gets this dead letter."""

    kind: ErrorKind
    message: str
    error: ProviderError | None


def enriched_record(
    origin: SourceOrigin,
    output: str | None,
    embedding: Sequence[float] | None,
    attempts: int,
    *,
    tier: str,
    structured: bool,
    max_bytes: int,
    error: Mapping[str, str] | None = None,
) -> tuple[OutRecord | None, str | None]:
    """A source job's enriched record (None: a newer record of its key was written) and why
    it cannot be published (None: it can): over the results' record size, the broker would
    refuse it on every attempt. The one way an answer becomes an enriched record, online and
    offline (`consumer.runtime.offline.records`: a member collected from its provider batch).
    `structured`: the job asked for a response_format (the answer is the object it gives)."""
    source = origin.source
    answer = None if error is not None else source.answer_of(output, embedding, structured)
    try:
        record = source.enriched(origin, answer, tier=tier, attempts=attempts, error=error)
    except JobError as exc:  # an answer the output's schema cannot hold
        return None, str(exc)
    if record is not None and record.size_bytes > max_bytes:
        return record, f"the enriched record would be {record.size_bytes} bytes, over {max_bytes}"
    return record, None


class OutcomeWriter:
    """Builds dead letters and hands every outcome to the sink; counts them."""

    def __init__(
        self,
        settings: Settings,
        sink: OutcomeSink,
        stats: ServiceStats,
        telemetry: Telemetry,
        limits: RecordLimits,
        *,
        ledger: TenantLedger | None = None,
        tenants: TenantTopics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """ledger: where each job's end is counted per tenant (None: every tenant weight 1 and
        no budget, as without a `tenants` section); tenants: the tenants' bound topics and
        outputs (None: every tenant's outcomes go to the service's topics)."""
        self._settings = settings
        #: where each tenant's results and dead letters go (admission reads its bound topics)
        self.tenants = (
            tenants if tenants is not None else TenantTopics(settings.results_topic, settings.dlq_topic)
        )
        self.ledger = ledger if ledger is not None else TenantLedger(TenantPolicies(), stats)
        self._sink = sink
        self._stats = stats
        self._telemetry = telemetry
        self.limits = limits
        self._clock = clock
        #: jobs deduped to a leader whose own deadline passed before it was answered: they are
        #: routed again under their own deadlines, by whoever routes jobs (`take_rerouted`)
        self._rerouted: list[JobContext] = []
        #: per (tier, lane name): what a job's end is counted in (`_ends_of`)
        self._series: dict[tuple[str, str | None], tuple[LaneStats | None, tuple[Series, ...]]] = {}

    @property
    def stats(self) -> ServiceStats:
        """The service counters outcomes are counted in."""
        return self._stats

    @property
    def results_topic(self) -> Callable[[str], str]:
        """A tenant's results topic (`TenantTopics.results_of`), what `AnswerResults` takes."""
        return self.tenants.results_of

    def take_rerouted(self) -> list[JobContext]:
        """The jobs to route again since the last call (the pipeline takes them every turn)."""
        taken, self._rerouted = self._rerouted, []
        return taken

    def reject(self, ticket: Ticket, rejection: Rejection, lane: Lane | None = None) -> None:
        """An input that cannot become a job context: dead letter with the original bytes,
        counted in the totals and in the dead letters of `lane`, the lane it was read in."""
        record = dead_letter_record(
            self.tenants.dead_letters_of(rejection.tenant),
            source=ticket.source,
            kind=rejection.kind,
            message=rejection.message,
            job=rejection.job,
            job_id=rejection.job_id,
            raw=rejection.raw,
            max_bytes=self.limits.dead_letters,
            tenant=rejection.tenant,
            key=rejection.key,
            headers=rejection.headers or None,
        )
        self._stats.dead_letters[rejection.kind.value] += 1
        if rejection.source is not None:
            rejection.source.stats.dead_letters[rejection.kind.value] += 1
        if lane is not None:  # rejected as it is read: its outcome took no time after its read
            self._stats.lane(lane.name).ended(0.0, ok=False)
        if rejection.tenant is not None:  # a record whose tenant cannot be read counts in none
            account = self.ledger.stats_of(rejection.tenant)
            account.ended(ok=False)
            account.mismatched += rejection.kind is ErrorKind.TENANT_MISMATCH
        self._sink.deliver(ticket, record)

    def deliver_record(self, ticket: Ticket, record: OutRecord | None, lane: Lane | None = None) -> None:
        """An input's record that is no job's outcome (a source's tombstone; None: nothing to
        write, the offset commits), counted in its lane as a result."""
        if lane is not None:
            self._stats.lane(lane.name).ended(0.0, ok=True)
        self._sink.deliver(ticket, record)

    def fail(
        self,
        ctx: JobContext,
        kind: ErrorKind,
        message: str,
        *,
        attempts: int,
        error: ProviderError | None = None,
        answer: SharedAnswer | None = None,
    ) -> None:
        """The job's dead letter (its parsed job, the provider error's details). `answer`: the
        provider did answer, but not in time or too large for this job's own record; jobs
        deduped to it get results from it (a failed request gives them dead letters)."""
        if ctx.done:
            return
        origin = ctx.origin
        if origin is not None and origin.source.config.on_error == "field":
            self._source_failed_in_field(ctx, origin, kind, message, attempts)
            return
        record = dead_letter_record(
            self.tenants.dead_letters_of(ctx.tenant),
            source=ctx.source,
            kind=kind,
            message=message,
            job=ctx.parsed_job(),
            attempts=attempts,
            retryable=bool(error and error.retryable),
            status_code=error.status_code if error else None,
            provider=error.provider if error else None,
            traceparent=self._telemetry.traceparent(ctx.trace),
            max_bytes=self.limits.dead_letters,
            tenant=ctx.tenant,
            # a source's job: the record's own key, bytes and headers
            raw=origin.value if origin is not None else None,
            key=origin.key if origin is not None else ctx.record_key,
            headers=origin.source.headers(origin.headers, origin.offset) if origin is not None else None,
        )
        self._stats.dead_letters[kind.value] += 1
        if origin is not None:
            origin.source.stats.dead_letters[kind.value] += 1
        self._end(ctx, record, kind.value)
        if ctx.dedupe_key is not None:
            self._settle(ctx, answer, SharedFailure(kind, message, error))

    def answered(
        self,
        ctx: JobContext,
        results: AnswerResults,
        output: str | None,
        *,
        attempts: int,
        now_s: float,
        dedupe_of: str | None = None,
        embedding: Sequence[float] | None = None,
    ) -> None:
        """The job's answer as its result record, or the dead letter that says why it cannot
        be one (answered after its deadline, too large for the results topic). Jobs deduped
        to this one are answered from the same answer, whatever becomes of its own record.
        An embed job's answer is its `embedding` (`output` None)."""
        shared = SharedAnswer(results, output, embedding) if ctx.dedupe_key is not None else None
        if ctx.past_deadline(now_s):
            message = "answered after the job's deadline"
            self.fail(ctx, ErrorKind.DEADLINE_EXCEEDED, message, attempts=attempts, answer=shared)
            return
        origin = ctx.origin
        if origin is not None:
            self._source_answered(ctx, origin, output, embedding, attempts, shared, now_s)
            return
        record = results.record(
            job_id=ctx.id,
            requested_tier=ctx.requested_tier,
            metadata=ctx.metadata,
            source=ctx.source,
            output=output,
            attempts=attempts,
            latency_ms=(now_s - ctx.received_s) * 1000.0,
            traceparent=self._telemetry.traceparent(ctx.trace),
            dedupe_of=dedupe_of,
            lane=ctx.lane.name if ctx.lane is not None else None,
            tier=ctx.tier.name,
            mode=ctx.mode,
            embedding=embedding,
            tenant=ctx.tenant,
        )
        problem = too_large_result(record, self.limits.results)
        if problem is not None:
            self.fail(ctx, ErrorKind.OUTPUT_INVALID, problem, attempts=attempts, answer=shared)
            return
        self.succeed(ctx, record, shared, now_s=now_s)

    def answered_all(self, results: AnswerResults, answered: Sequence[AnsweredJob], *, now_s: float) -> None:
        """`answered` for each (job, output, embedding, attempts) answered by one request, with
        what they share done once: one clock reading, one hand-over to the sink, counters per
        group. A job that leads a dedupe, has a span, was moved to a fallback tier or is past
        its deadline takes `answered` itself."""
        # the jobs of one answer share their records' tail and their counters: per (tier,
        # lane, mode, tenant), its tail and the jobs that ended in it
        groups: dict[tuple[str, str | None, str, str], tuple[ResultTail, list[JobContext]]] = {}
        outcomes: list[tuple[Ticket, OutRecord | None]] = []
        superseded = 0  # source jobs whose key had a newer record written: no record of their own
        max_bytes, result = self.limits.results, results.result
        for ctx, output, embedding, attempts in answered:
            if ctx.done:
                continue
            deadline_s = ctx.deadline_s
            if (
                ctx.dedupe_key is not None
                or ctx.trace is not None
                or ctx.fallback_from is not None
                or (deadline_s is not None and now_s >= deadline_s)
            ):
                self.answered(ctx, results, output, attempts=attempts, now_s=now_s, embedding=embedding)
                continue
            lane = ctx.lane
            key = (ctx.tier.name, lane.name if lane is not None else None, ctx.mode, ctx.tenant)
            group = groups.get(key)
            if group is None:
                # not moved to a fallback tier: the tier that answers is the one it asked for
                group = groups[key] = (results.tail(key[0], key[0], key[1], key[2], key[3]), [])
            origin = ctx.origin
            record: OutRecord | None
            if origin is None:
                latency_ms = (now_s - ctx.received_s) * 1000.0
                record = result(
                    group[0], ctx.id, ctx.metadata, ctx.ticket.source, output, attempts, latency_ms, embedding
                )
                problem = too_large_result(record, max_bytes)
            else:
                # a source's job: its enriched record (None: a newer one of its key was written)
                record, problem = self._enriched(ctx, origin, output, embedding, attempts)
                if problem is None:
                    origin.source.order.ended(origin.key)
                    superseded += record is None
            if problem is not None:
                self.fail(ctx, ErrorKind.OUTPUT_INVALID, problem, attempts=attempts)
                continue
            ctx.done = True
            group[1].append(ctx)
            outcomes.append((ctx.ticket, record))
        if not outcomes:
            return
        self._stats.results += len(outcomes) - superseded
        self._sink.deliver_all(outcomes)
        wall_s = time.time()
        for (_, _, mode, tenant), (_, ended) in groups.items():
            if not ended:
                continue
            # counted as `_end` counts one job: lane, tenant, job latency
            lane_stats, series = self._ends_of(ended[0])
            if lane_stats is not None:
                lane_stats.ended_all([now_s - ctx.received_s for ctx in ended], ok=True)
            self.ledger.stats_of(tenant).ended(ok=True, jobs=len(ended))
            series[2 * (mode == "offline")].observe_all([wall_s - ctx.timestamp_s for ctx in ended])

    def _enriched(
        self,
        ctx: JobContext,
        origin: SourceOrigin,
        output: str | None,
        embedding: Sequence[float] | None,
        attempts: int,
        error: dict[str, str] | None = None,
    ) -> tuple[OutRecord | None, str | None]:
        """A source job's enriched record and why it cannot be published (`enriched_record`)."""
        structured = ctx.output_format is not None
        return enriched_record(
            origin, output, embedding, attempts, tier=ctx.tier.name, structured=structured,
            max_bytes=self.limits.results, error=error,
        )

    def _superseded(self, ctx: JobContext, origin: SourceOrigin) -> None:
        """A source job whose key had a newer record written: no record, its offset commits."""
        ctx.done = True
        self._telemetry.end_job(ctx.trace)
        self._sink.deliver(ctx.ticket, None)
        origin.source.order.ended(origin.key)

    def _source_answered(
        self,
        ctx: JobContext,
        origin: SourceOrigin,
        output: str | None,
        embedding: Sequence[float] | None,
        attempts: int,
        shared: SharedAnswer | None,
        now_s: float,
    ) -> None:
        """A source job's answer as its enriched record."""
        record, problem = self._enriched(ctx, origin, output, embedding, attempts)
        if problem is not None:
            self.fail(ctx, ErrorKind.OUTPUT_INVALID, problem, attempts=attempts, answer=shared)
        elif record is None:
            self._superseded(ctx, origin)
            self._settle(ctx, shared, None)
        else:
            self.succeed(ctx, record, shared, now_s=now_s)

    def _source_failed_in_field(
        self, ctx: JobContext, origin: SourceOrigin, kind: ErrorKind, message: str, attempts: int
    ) -> None:
        """on_error: field: the enriched record with the answer null and the error beside it."""
        error = {"kind": kind.value, "message": message}
        record, _problem = self._enriched(ctx, origin, None, None, attempts, error)
        origin.source.stats.dead_letters[kind.value] += 1
        self._stats.dead_letters[kind.value] += 1
        if record is None:
            self._superseded(ctx, origin)
        else:
            self._end(ctx, record, kind.value)

    def succeed(
        self,
        ctx: JobContext,
        record: OutRecord,
        answer: SharedAnswer | None = None,
        *,
        now_s: float | None = None,
    ) -> None:
        """The job's result record; `answer`, what it was built from, answers the jobs deduped
        to this one (`now_s`: the clock's reading, when the caller has it)."""
        if ctx.done:
            return
        self._stats.results += 1
        if ctx.fallback_from is not None:
            ctx.tier.stats.fallback_jobs[ctx.fallback_from] += 1
        self._end(ctx, record, None, now_s)
        self._settle(ctx, answer, None)

    def share(
        self, ctx: JobContext, leader_id: str, answer: SharedAnswer | None, failure: SharedFailure | None
    ) -> None:
        """End a job deduped to `leader_id` with that job's answer (or its failure)."""
        if ctx.done:
            return
        ctx.tier.stats.deduped += 1
        now_s = self._clock()
        if answer is not None:
            self.answered(
                ctx, answer.results, answer.output, attempts=0, now_s=now_s, dedupe_of=leader_id,
                embedding=answer.embedding,
            )
            return
        if ctx.past_deadline(now_s):
            self.fail(ctx, ErrorKind.DEADLINE_EXCEEDED, "answered after the job's deadline", attempts=0)
            return
        assert failure is not None
        note = f" [shared: the identical request of job {leader_id} failed]"
        self.fail(ctx, failure.kind, failure.message + note, attempts=0, error=failure.error)

    def _settle(self, ctx: JobContext, answer: SharedAnswer | None, failure: SharedFailure | None) -> None:
        """A dedupe leader ended: so do the jobs that waited for it."""
        key, table = ctx.dedupe_key, ctx.tier.dedupe
        if key is None or table is None:
            return
        ctx.dedupe_key = None
        leader_id, followers = table.settle(key, answer, self._clock())
        expired = answer is None and failure is not None and failure.kind is ErrorKind.DEADLINE_EXCEEDED
        for follower in followers:
            if expired:
                self._rerouted.append(follower)  # the leader's deadline is not theirs
            else:
                self.share(follower, leader_id, answer, failure)

    def offline_recorded(self, ctx: JobContext) -> None:
        """An offline job's batch is recorded durably: its input offset may commit (no outcome yet;
        a source job's enriched record is written by whichever instance collects the batch)."""
        if ctx.done:
            return
        ctx.done = True
        self._telemetry.end_job(ctx.trace)
        self._sink.deliver(ctx.ticket, None)
        if ctx.origin is not None:
            ctx.origin.source.order.ended(ctx.origin.key)

    def offline_failed(self, ctx: JobContext, kind: ErrorKind, message: str, error: ProviderError) -> None:
        """An offline job whose submission failed for good."""
        self.fail(ctx, kind, message, attempts=1, error=error)

    def abandon(self, ctx: JobContext) -> None:
        """No outcome: the job stays uncommitted and is read again by the partition's next
        owner; so do the jobs deduped to it."""
        ctx.done = True
        self._sink.abandon(ctx.ticket)
        if ctx.origin is not None:
            ctx.origin.source.order.ended(ctx.origin.key)
        self._telemetry.end_job(ctx.trace, error=ABANDONED)
        key, table = ctx.dedupe_key, ctx.tier.dedupe
        if key is not None and table is not None:
            ctx.dedupe_key = None
            for follower in table.abandon(key):
                self.abandon(follower)

    def _end(self, ctx: JobContext, record: OutRecord, error: str | None, now_s: float | None = None) -> None:
        """Hand the job's outcome record to the sink (`error`: its dead letter's kind; `now_s`:
        the clock's reading, when the caller has it)."""
        ok = error is None
        ctx.done = True
        self._telemetry.end_job(ctx.trace, record, error=error)
        self._sink.deliver(ctx.ticket, record)
        if ctx.origin is not None:
            ctx.origin.source.order.ended(ctx.origin.key)
        lane_stats, series = self._ends_of(ctx)
        if lane_stats is not None:
            lane_stats.ended((self._clock() if now_s is None else now_s) - ctx.received_s, ok=ok)
        self.ledger.stats_of(ctx.tenant).ended(ok=ok)
        series[2 * (ctx.mode == "offline") + (not ok)].observe(time.time() - ctx.timestamp_s)

    def _ends_of(self, ctx: JobContext) -> tuple[LaneStats | None, tuple[Series, ...]]:
        """What a job's end is counted in, per tier and lane (made once, kept): its lane's
        stats and its job-latency series (online result, online dead letter, offline result,
        offline dead letter)."""
        lane_or_none = ctx.lane
        key = (ctx.tier.name, lane_or_none.name if lane_or_none is not None else None)
        found = self._series.get(key)
        if found is None:
            lane = ctx.lane_name
            found = self._series[key] = (
                self._stats.lane(lane) if ctx.lane is not None else None,
                tuple(
                    self._stats.latency.child(family, (ctx.tier.name, lane, outcome))
                    for family in (JOB_LATENCY, OFFLINE_JOB_LATENCY)
                    for outcome in (RESULT, DEAD_LETTER)
                ),
            )
        return found
