"""The pipeline: intake -> decode -> per-tier windows -> request plans under the limiter -> outcomes.

One asyncio task polls the jobs topic; every flushed window (or unbatched job) becomes a
`RequestPlan` run in its own task. Outcomes go to the `OutcomeSink`, which makes them durable
and commits input offsets. Step by step for one record:

    1. track its offset (a Ticket) so the commit watermark waits for it;
    2. decode and validate; poison -> dead letter with the original bytes;
    3. offline jobs -> the offline collector; batch-eligible jobs -> a collection window;
       everything else -> a one-member plan (an ordinary request);
    4. plans send requests through the tier's limiter and provider; answers are validated and
       split/re-asked by the pure planner until each member has an answer or a failure;
    5. each outcome -> a result or dead letter record -> the sink.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from consumer.core.adaptive import answers_agree, choose_verified
from consumer.core.completion import ChatMessage, Completion, CompletionRequest
from consumer.core.errors import ErrorKind, JobError, ProviderError, RateLimited, ServerError
from consumer.core.jobs import Job, decode_job
from consumer.core.output import OutputFormat, output_format, response_format_schema
from consumer.core.packing import answer_schema
from consumer.core.plan import Member, PlannedRequest, RequestPlan, Step
from consumer.core.templates import BatchablePrompt, render_and_split
from consumer.core.window import BatchKey, CollectionWindows, Flush, batch_key_for
from consumer.kafka.intake import InRecord, JobIntake
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import OutcomeSink, Ticket
from consumer.runtime.limiter import Token
from consumer.runtime.outcomes import (
    AnswerResults,
    RecordLimits,
    dead_letter_record,
    job_id_hint,
    too_large_result,
)
from consumer.runtime.stats import ServiceStats
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


@dataclass(eq=False)
class JobContext:
    """One job from intake to outcome. Identity-hashed: it is a Member's `ref`."""

    job: Job
    ticket: Ticket
    tier: TierRuntime
    received_s: float
    input: str  # the batch variable's value (or the rendered prompt / last message when unbatched)
    messages: tuple[ChatMessage, ...]
    options: dict[str, Any]
    deadline_s: float | None
    #: the prompt split for batching (prefix + its one trailing variable), when it can be
    batchable: BatchablePrompt | None = None
    trace: Any = None
    #: what the job's response_format asks of its output (None: nothing to check)
    output_format: OutputFormat | None = None
    done: bool = field(default=False)

    @property
    def source(self) -> SourceOffset:
        return self.ticket.source


class Pipeline:
    """Runs until `stop` is set, then drains within `settings.shutdown_timeout_s`."""

    def __init__(
        self,
        settings: Settings,
        tiers: dict[str, TierRuntime],
        intake: JobIntake,
        sink: OutcomeSink,
        stats: ServiceStats,
        telemetry: Telemetry,
        *,
        offline: Any = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        limits: RecordLimits | None = None,
    ) -> None:
        self._settings = settings
        self._limits = limits or RecordLimits()
        self._tiers = tiers
        self._intake = intake
        self._sink = sink
        self._stats = stats
        self._telemetry = telemetry
        self._offline = offline
        self._rng = rng or random.Random()
        self._clock = clock
        self._windows: CollectionWindows[JobContext] = CollectionWindows()
        self._plans: set[asyncio.Task[None]] = set()
        self._paused = False
        # resume well below the pause point, so the pause does not flap with every ack and a
        # resumed poll can take a full batch
        self._resume_at = settings.max_inflight - max(1, min(MAX_POLL_RECORDS, settings.max_inflight // 4))
        self._next_expire_s = 0.0
        self.ready = asyncio.Event()

    # ------------------------------------------------------------------ main loop
    async def run(self, stop: asyncio.Event) -> None:
        await self._intake.start(self)
        self.ready.set()
        try:
            while not stop.is_set():
                timeout_s = POLL_INTERVAL_S
                next_due = self._windows.next_deadline_s()
                if next_due is not None:
                    timeout_s = max(0.0, min(timeout_s, next_due - self._clock()))
                # never take more than max_inflight allows: the pause below only stops the next poll
                inflight = self._sink.inflight()
                room = self._settings.max_inflight - inflight
                if room <= 0 or (self._paused and inflight > self._resume_at):
                    # full: wait for outcomes to free room rather than in a poll of paused
                    # partitions (aiokafka heartbeats on its own; a poll comes soon enough)
                    records = []
                    await self._sink.wait_for_room(self._resume_at + 1, timeout_s)
                else:
                    records = await self._intake.poll(timeout_s, min(MAX_POLL_RECORDS, room))
                now_s = self._clock()
                for record in records:
                    self._take(record, now_s)
                self._dispatch(self._windows.due(now_s, can_still_join=self._can_still_join))
                self._apply_backpressure()
                self._refresh_gauges()
        finally:
            await self._drain()

    def _can_still_join(self, key: BatchKey) -> bool:
        # Rule 3: a window waits only while records that could join it are still unfetched.
        return self._intake.has_unfetched()

    async def _drain(self) -> None:
        """Stop intake, send what windows hold, wait (bounded) for plans, commit."""
        self.ready.clear()
        self._intake.pause(self._intake.assignment())
        self._dispatch(self._windows.drain_all())
        if self._offline is not None:
            await self._offline.flush_now()
        timeout_s = self._settings.shutdown_timeout_s
        if self._plans:
            _, pending = await asyncio.wait(set(self._plans), timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning(
                    "shutdown: abandoned %d unfinished requests (their offsets stay uncommitted)",
                    len(pending),
                )
                await asyncio.gather(*pending, return_exceptions=True)
        await self._sink.flush(timeout_s=min(timeout_s, 10.0))

    # ------------------------------------------------------------------ rebalance
    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """Stop taking work for these partitions; finish in-flight work within a bound; commit."""
        abandoned = self._windows.drain_partitions(partitions)
        for ctx in abandoned:
            self._forget(ctx)
        if self._offline is not None:
            self._offline.drop_partitions(partitions)
        log.info("revoked %s: %d windowed jobs abandoned (not committed)", sorted(partitions), len(abandoned))
        await self._sink.on_revoked(partitions, timeout_s=self._settings.revoke_timeout_s)

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        log.info("assigned %s", sorted(partitions))
        await self._sink.on_assigned(partitions)

    # ------------------------------------------------------------------ intake
    def _take(self, record: InRecord, now_s: float) -> None:
        ticket = self._sink.track(record.source)
        self._stats.items_in += 1
        try:
            self._take_tracked(record, ticket, now_s)
        except Exception:
            # a bug on one record must not stop the service (restarted, it would meet the same
            # record again); as for a failed plan, no guess is published: the record stays
            # uncommitted and is read again after a restart
            log.error(
                "input record %s/%d/%d could not be taken (a bug); it stays uncommitted, holding "
                "back its partition's commits until a restart reads it again",
                record.source.topic,
                record.source.partition,
                record.source.offset,
                exc_info=True,
            )

    def _take_tracked(self, record: InRecord, ticket: Ticket, now_s: float) -> None:
        raw = record.value if record.value is not None else b""
        if len(raw) > self._settings.max_job_bytes:
            message = f"job is {len(raw)} bytes, over max_job_bytes ({self._settings.max_job_bytes})"
            self._reject(ticket, ErrorKind.INVALID_JOB, message, raw=raw, job_id=_key_text(record.key))
            return
        try:
            job = decode_job(raw)
        except JobError as exc:
            self._reject(ticket, exc.kind, str(exc), raw=raw, job_id=job_id_hint(raw))
            return
        tier = self._tiers.get(job.tier)
        if tier is None:
            known = ", ".join(sorted(self._tiers))
            self._reject(
                ticket,
                ErrorKind.UNKNOWN_TIER,
                f"tier '{job.tier}' is not configured (known: {known})",
                raw=raw,
                job=job,
            )
            return
        if job.mode == "offline" and (self._offline is None or not tier.config.offline.enabled):
            message = f"tier '{tier.name}' does not allow mode 'offline' (offline.enabled is false)"
            self._reject(ticket, ErrorKind.INVALID_JOB, message, raw=raw, job=job)
            return
        try:
            ctx = self._context(job, ticket, tier, record, now_s)
        except JobError as exc:
            self._reject(ticket, exc.kind, str(exc), raw=raw, job=job)
            return
        tier.stats.items += 1
        if _past_deadline(ctx, now_s):
            self._fail(
                ctx, ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the job was read", attempts=0
            )
            return
        if job.mode == "offline":
            assert self._offline is not None  # checked above
            self._offline.add(ctx)
            return
        batchable = ctx.batchable if job.batch and tier.config.batching.enabled else None
        if batchable is None:
            self._start_plan(tier, [ctx], key=None)
            return
        key = batch_key_for(job, batchable)
        flushes = self._windows.add(
            key,
            ctx,
            input_chars=len(ctx.input),
            partition=ticket.source.tp,
            limits=tier.limits_for(key, now_s),
            now_s=now_s,
        )
        self._dispatch(flushes)

    def _context(
        self, job: Job, ticket: Ticket, tier: TierRuntime, record: InRecord, now_s: float
    ) -> JobContext:
        options = {**tier.config.options, **job.options}
        batchable = None
        if job.messages is not None:
            messages = tuple(ChatMessage(m.role, m.content) for m in job.messages)
            text = job.messages[-1].content
        else:
            assert job.prompt is not None
            variables = job.variables or {}
            rendered, batchable = render_and_split(job.prompt, variables)
            messages = (ChatMessage("user", rendered),)
            text = variables.get(batchable.variable, rendered) if batchable else rendered
        deadline_s = None
        if job.deadline is not None:
            deadline_s = now_s + (job.deadline - datetime.now(UTC)).total_seconds()
        wanted = output_format(options) if "response_format" in options else None
        trace = self._telemetry.start_job(job, record.headers)
        return JobContext(
            job, ticket, tier, now_s, text, messages, options, deadline_s, batchable, trace, wanted
        )

    # ------------------------------------------------------------------ plans
    def _dispatch(self, flushes: list[Flush[JobContext]]) -> None:
        for flush in flushes:
            members = [c for c in flush.items if not c.done]
            if not members:
                continue
            self._start_plan(members[0].tier, members, key=flush.key)

    def _start_plan(self, tier: TierRuntime, members: list[JobContext], *, key: BatchKey | None) -> None:
        self._spawn(self._run_plan(tier, members, key))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._plans.add(task)
        task.add_done_callback(self._plans.discard)

    async def _run_plan(self, tier: TierRuntime, ctxs: list[JobContext], key: BatchKey | None) -> None:
        plan = RequestPlan(
            [Member(c, c.input, _max_tokens(c.options), _output_check(c)) for c in ctxs],
            prefix=key.prefix if key else "",
            variable=key.variable if key else "",
            retry=tier.retry_policy,
            rng=self._rng,
            tier_max_tokens=tier.config.batching.max_output_tokens,
        )
        batched = len(ctxs) > 1
        if batched:
            tier.stats.items_in_batched_plans += len(ctxs)
        try:
            async with asyncio.TaskGroup() as group:
                first, *others = plan.start()
                for req in others:
                    group.create_task(self._send(tier, plan, req, group, key, batched))
                # the first request runs in this task: most plans are one request, and a
                # task per request was a large share of an unbatched job's cost
                await self._send(tier, plan, first, group, key, batched)
        except BaseException as exc:
            # cancelled (shutdown) or a bug: members without an outcome stay uncommitted and
            # are read again after restart; never publish a guess
            unfinished = [c for c in ctxs if not c.done]
            for c in unfinished:
                self._forget(c)
            if not isinstance(exc, asyncio.CancelledError):
                # a stalled commit watermark must not be silent: say why and what it holds
                log.error(
                    "a request plan of tier %s failed (a bug); its %d unfinished jobs stay "
                    "uncommitted, holding back their partitions' commits until a restart reads them again",
                    tier.name,
                    len(unfinished),
                    exc_info=exc,
                )
            raise

    async def _send(
        self,
        tier: TierRuntime,
        plan: RequestPlan,
        req: PlannedRequest,
        group: asyncio.TaskGroup,
        key: BatchKey | None,
        batched_plan: bool,
    ) -> None:
        if req.delay_s > 0:
            await asyncio.sleep(req.delay_s)
        if self._expire(tier, plan, req):
            return
        request = self._build_request(tier, req)
        token = await tier.limiter.acquire(request.estimated_tokens())
        if self._expire(tier, plan, req):  # the deadline may pass while waiting for a slot
            token.ignore()
            return
        tier.stats.provider_requests += 1
        if batched_plan:
            tier.stats.requests_for_batched_plans += 1
        if len(req.members) > 1:
            tier.stats.batched_requests += 1
        if req.attempt > 1:
            tier.stats.retries += 1
        completion: Completion | None = None
        with self._telemetry.provider_call(tier.name, [_ctx(m).trace for m in req.members]) as span:
            try:
                completion = await tier.provider.complete(request)
            except ProviderError as exc:
                if exc.overload:
                    token.dropped()
                else:
                    token.ignore()
                tier.stats.provider_errors += 1
                if exc.status_code == 429:
                    tier.stats.rate_limited += 1
                if isinstance(exc, RateLimited):
                    _note_rate_limited(tier, token, exc)
                self._telemetry.record_error(span, exc)
                step = plan.on_error(req, exc)
            except Exception as exc:  # an adapter bug must not lose jobs: treat as a retryable failure
                token.ignore()
                log.exception("provider %s raised unexpectedly", tier.name)
                step = plan.on_error(req, ServerError(f"unexpected {type(exc).__name__}", provider=tier.name))
            else:
                token.success()
                _note_answer(tier, token, completion)
                step = plan.on_answer(req, completion.text, completion.finish_reason)
        self._apply_step(tier, plan, req, step, completion)
        if step.verdict is not None and key is not None:
            size = tier.sizes.record(key, step.verdict.kind.value, len(req.members), self._clock())
            tier.stats.batch_size = tier.current_batch_size()
            log.debug(
                "tier %s: %s answer of %d -> batch size %d",
                tier.name,
                step.verdict.kind.value,
                len(req.members),
                size,
            )
            if step.answered and tier.config.batching.verify_fraction > 0:
                self._verify(tier, key, step)
        for nxt in step.requests:
            if len(nxt.members) < len(req.members) and len(req.members) > 1:
                if nxt.packed is None:
                    tier.stats.reasks += 1
                else:
                    tier.stats.splits += 1
            group.create_task(self._send(tier, plan, nxt, group, key, batched_plan))

    def _expire(self, tier: TierRuntime, plan: RequestPlan, req: PlannedRequest) -> bool:
        """Dead-letter members whose deadline passed before `req` goes out; True: nothing left to send."""
        now_s = self._clock()
        expired = [m for m in req.members if _past_deadline(_ctx(m), now_s)]
        if not expired:
            return False
        step = plan.cancel(
            ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the request was sent", expired
        )
        self._apply_step(tier, plan, req, step, None)
        return plan.done or len(expired) == len(req.members)

    def _verify(self, tier: TierRuntime, key: BatchKey, step: Step) -> None:
        """Ask a share of a batched request's jobs alone too, to measure answer agreement."""
        answered = [(m, answer, by) for m, answer, by in step.answered if len(by.members) > 1]
        for member, answer, by in choose_verified(answered, tier.config.batching.verify_fraction, self._rng):
            self._spawn(self._verify_one(tier, key, _ctx(member), answer, len(by.members)))

    async def _verify_one(
        self, tier: TierRuntime, key: BatchKey, ctx: JobContext, batched: str, size: int
    ) -> None:
        request = CompletionRequest(ctx.messages, tier.config.model, ctx.options)
        token = await tier.limiter.acquire(request.estimated_tokens())
        tier.stats.provider_requests += 1
        tier.stats.verify_requests += 1
        try:
            completion = await tier.provider.complete(request)
        except ProviderError as exc:
            token.dropped() if exc.overload else token.ignore()
            if isinstance(exc, RateLimited):
                _note_rate_limited(tier, token, exc)
            return  # a failed verification says nothing about agreement
        token.success()
        _note_answer(tier, token, completion)
        agreed = int(answers_agree(batched, completion.text))
        self._stats.agreement.record(tier.name, size, agreed, 1)
        tier.stats.verify_compared += 1
        tier.stats.verify_agreed += agreed
        tier.sizes.record_agreement(key, agreed, 1, size, self._clock())
        tier.stats.batch_size = tier.current_batch_size()

    def _build_request(self, tier: TierRuntime, req: PlannedRequest) -> CompletionRequest:
        first = _ctx(req.members[0])
        if req.packed is None:
            return CompletionRequest(first.messages, tier.config.model, first.options)
        options = dict(first.options)
        if req.max_tokens is not None:
            options["max_tokens"] = req.max_tokens
        # the job's own answer schema (if any) becomes the schema of each alias's value
        item_schema = response_format_schema(options.pop("response_format", None))
        schema = None
        if tier.config.batching.structured != "off":
            schema = answer_schema(req.packed.aliases, item_schema)
        return CompletionRequest((ChatMessage("user", req.packed.text),), tier.config.model, options, schema)

    def _apply_step(
        self,
        tier: TierRuntime,
        plan: RequestPlan,
        req: PlannedRequest,
        step: Step,
        completion: Completion | None,
    ) -> None:
        if step.pause_tier_s:
            tier.limiter.pause(step.pause_tier_s)
            log.warning("tier %s: quota exhausted, paused %.1fs", tier.name, step.pause_tier_s)
        now_s = self._clock()
        # what the jobs answered by one request share is built once
        results: AnswerResults | None = None
        results_of: PlannedRequest | None = None
        for member, answer, answered_by in step.answered:
            ctx = _ctx(member)
            if _past_deadline(ctx, now_s):
                self._fail(
                    ctx,
                    ErrorKind.DEADLINE_EXCEEDED,
                    "answered after the job's deadline",
                    attempts=plan.attempts(member),
                )
                continue
            assert completion is not None
            if results is None or results_of is not answered_by:
                results_of = answered_by
                results = AnswerResults(self._settings.results_topic, completion, len(answered_by.members))
            record = results.record(
                job=ctx.job,
                source=ctx.source,
                output=answer,
                attempts=plan.attempts(member),
                latency_ms=(now_s - ctx.received_s) * 1000.0,
                traceparent=self._telemetry.traceparent(ctx.trace),
            )
            problem = too_large_result(record, self._limits.results)
            if problem is not None:
                self._fail(ctx, ErrorKind.OUTPUT_INVALID, problem, attempts=plan.attempts(member))
                continue
            self._finish(ctx, record, ok=True)
        for member, kind, message in step.failed:
            ctx = _ctx(member)
            self._fail(ctx, kind, message, attempts=plan.attempts(member), error=plan.last_error(member))

    # ------------------------------------------------------------------ outcomes
    def _reject(
        self,
        ticket: Ticket,
        kind: ErrorKind,
        message: str,
        *,
        raw: bytes,
        job: Job | None = None,
        job_id: str | None = None,
    ) -> None:
        """An input that cannot even become a job context: dead letter with the original bytes."""
        record = dead_letter_record(
            self._settings.dlq_topic,
            source=ticket.source,
            kind=kind,
            message=message,
            job=job,
            job_id=job_id,
            raw=raw,
            max_bytes=self._limits.dead_letters,
        )
        self._stats.dead_letters[kind.value] += 1
        self._sink.deliver(ticket, [record])

    def _fail(
        self,
        ctx: JobContext,
        kind: ErrorKind,
        message: str,
        *,
        attempts: int,
        error: ProviderError | None = None,
    ) -> None:
        record = dead_letter_record(
            self._settings.dlq_topic,
            source=ctx.source,
            kind=kind,
            message=message,
            job=ctx.job,
            attempts=attempts,
            retryable=bool(error and error.retryable),
            status_code=error.status_code if error else None,
            provider=error.provider if error else None,
            traceparent=self._telemetry.traceparent(ctx.trace),
            max_bytes=self._limits.dead_letters,
        )
        self._stats.dead_letters[kind.value] += 1
        self._finish(ctx, record, ok=False)

    def _finish(self, ctx: JobContext, record: OutRecord, *, ok: bool) -> None:
        if ctx.done:
            return
        ctx.done = True
        if ok:
            self._stats.results += 1
        self._telemetry.end_job(ctx.trace, ok=ok)
        self._sink.deliver(ctx.ticket, [record])

    def attach_offline(self, collector: Any) -> None:
        self._offline = collector

    def offline_recorded(self, ctx: JobContext) -> None:
        """An offline job's batch is recorded durably: its input offset may commit (no outcome yet)."""
        if ctx.done:
            return
        ctx.done = True
        self._telemetry.end_job(ctx.trace, ok=True)
        self._sink.deliver(ctx.ticket, [])

    def offline_failed(self, ctx: JobContext, kind: ErrorKind, message: str, error: ProviderError) -> None:
        self._fail(ctx, kind, message, attempts=1, error=error)

    def _forget(self, ctx: JobContext) -> None:
        ctx.done = True
        self._telemetry.end_job(ctx.trace, ok=False)

    # ------------------------------------------------------------------ backpressure
    def _apply_backpressure(self) -> None:
        inflight = self._sink.inflight()
        if not self._paused and inflight >= self._settings.max_inflight:
            self._intake.pause(self._intake.assignment())
            self._paused = True
            log.info(
                "backpressure: %d items in flight >= max_inflight %d; partitions paused",
                inflight,
                self._settings.max_inflight,
            )
        elif self._paused and inflight <= self._resume_at:
            self._intake.resume(self._intake.assignment())
            self._paused = False
            log.info("backpressure released: %d items in flight", inflight)

    def _refresh_gauges(self) -> None:
        now_s = self._clock()
        if now_s >= self._next_expire_s:
            # batch keys come and go with prompts; forget the adaptive sizes of idle ones
            self._next_expire_s = now_s + SIZES_EXPIRE_EVERY_S
            for tier in self._tiers.values():
                tier.sizes.expire(now_s, idle_s=SIZES_IDLE_S)
        self._stats.inflight = self._sink.inflight()
        self._stats.paused_partitions = len(self._intake.paused())
        self._stats.dropped_late = getattr(self._sink, "dropped_late", 0)
        for tier in self._tiers.values():
            tier.stats.limit = tier.limiter.limit
            tier.stats.inflight = tier.limiter.inflight
            tier.stats.paused_s = round(tier.limiter.paused_for_s, 3)
            tier.stats.budget_requests_per_s = round(tier.limiter.pacer.rate_per_s or 0.0, 2)
            tier.stats.budget_tokens_per_s = round(tier.limiter.tokens.rate_per_s or 0.0, 1)


def _ctx(member: Member) -> JobContext:
    return cast(JobContext, member.ref)  # every Member this pipeline makes refers to its JobContext


def _note_answer(tier: TierRuntime, token: Token, completion: Completion) -> None:
    """The answer's budgets and token usage pace the tier's next requests."""
    usage = completion.usage
    tier.limiter.note_budget(
        completion.rate_limit, token, used_tokens=usage.input_tokens + usage.output_tokens
    )


def _note_rate_limited(tier: TierRuntime, token: Token, exc: RateLimited) -> None:
    """A 429: the provider's budget is empty, so the limiter's mirrors restart from there; with
    a Retry-After nobody on this tier should try before then (the limit alone bounds
    concurrency, not rate)."""
    tier.limiter.note_budget(exc.hint, token, rejected=True)
    if exc.hint.retry_after_s:
        tier.limiter.pause(min(exc.hint.retry_after_s, tier.config.retry.backoff_max_s))


def _past_deadline(ctx: JobContext, now_s: float) -> bool:
    return ctx.deadline_s is not None and now_s >= ctx.deadline_s


def _output_check(ctx: JobContext) -> Callable[[str], tuple[str, str | None]] | None:
    return ctx.output_format.accept if ctx.output_format is not None else None


def _key_text(key: bytes | None) -> str | None:
    """The record key as a job id hint (producers key jobs by id)."""
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if len(text) <= 256 else None


def _max_tokens(options: dict[str, Any]) -> int | None:
    value = options.get("max_tokens")
    return value if isinstance(value, int) and value > 0 else None
