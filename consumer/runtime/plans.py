"""Plan runner: one tier's request plans, from members to outcomes.

A plan (`consumer.core.plan.RequestPlan`, pure) says which requests to send and what each
answer or error means; the runner performs it:

    1. each planned request waits out its backoff, drops members whose deadline passed,
       and is built (an ordinary request, or a packed prompt with its answer schema), its
       shared prefix marked for the provider's prompt cache (`prompt_cache: auto`);
    2. it waits while the tier's circuit is open (`core/circuit.py`: the provider is down;
       one probe at a time goes out), then goes through `ProviderCalls.call`
       (`runtime/provider_calls.py`), the one provider call path of ordinary, batched and
       verification requests: a limiter slot that always ends, the
       provider call, the error taxonomy, the provider's rate-limit budget fed back to the
       limiter, the answer or outage fed to the circuit. A request that meets the outage
       while the circuit is open is held and sent again later: it costs its members no
       attempt, and only their deadlines or `retry.max_outage_s` end them meanwhile;
    3. the plan's step is applied: answered members become results, failed ones dead
       letters, follow-up requests (splits, re-asks, retries) run as tasks of the same plan;
    4. batched answers feed the tier's adaptive batch size, and a share of them is asked
       again alone (`batching.verify_fraction`) to measure agreement.

With a `fallback` tier, the members of a request held through an outage longer than its
`after_s`, or of one that met an exhausted quota, move to the fallback tier before they are
sent again (`runtime/fallback.py`); only those that cannot (`fallback: false`) stay.

Every counter of a tier's requests is counted by its `RequestCounts` (`runtime/accounting.py`):
requests, tokens and their cost at the tier's `pricing`, and batching's saving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from consumer.core.adaptive import answers_agree, choose_verified
from consumer.core.budgets import Exhausted
from consumer.core.circuit import Admit
from consumer.core.completion import Completion, CompletionRequest, Usage
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ErrorKind, ProviderError, QuotaExhausted
from consumer.core.lanes import Lane, pack_lane
from consumer.core.plan import PlanMember, PlannedRequest, RequestPlan, Step
from consumer.core.window import PackKey
from consumer.runtime.accounting import RequestCounts
from consumer.runtime.context import JobContext, as_context, as_contexts
from consumer.runtime.delivery import AnsweredJob, OutcomeWriter
from consumer.runtime.deployments import Deployment
from consumer.runtime.fallback import FallbackRouter
from consumer.runtime.latency import QUEUE_WAIT, Series
from consumer.runtime.outcomes import AnswerResults
from consumer.runtime.provider_calls import ProviderCalls
from consumer.runtime.requests import build_request, ordinary_request
from consumer.runtime.spending import TierSpending
from consumer.runtime.stats import ServiceStats
from consumer.runtime.tenancy import TenantGate
from consumer.runtime.tiers import TierRuntime
from consumer.telemetry import Telemetry
from consumer.waits import wait_at_most

log = logging.getLogger(__name__)

#: the requests a plan sends: chat completions, or embeddings (`consumer.core.embed`)
AnyRequest = TypeVar("AnyRequest", CompletionRequest, EmbeddingRequest)


class PlanRunner:
    """Runs the request plans of one tier.

    spawn: starts a task the service waits for when it drains (verification requests);
    gate: the tenants' budgets, when some account has one.
    """

    def __init__(
        self,
        tier: TierRuntime,
        outcomes: OutcomeWriter,
        stats: ServiceStats,
        telemetry: Telemetry,
        *,
        rng: random.Random,
        clock: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        fallback: FallbackRouter | None = None,
        gate: TenantGate | None = None,
    ) -> None:
        self.tier = tier
        self._fallback = fallback
        pricing = tier.config.pricing.pricing() if tier.config.pricing is not None else None
        #: what this tier's requests are counted in
        self.counts = RequestCounts(tier.stats, pricing)
        self._outcomes = outcomes
        #: each request's tokens and cost per tenant, and its reservation under budgets
        self._spending = TierSpending(pricing, outcomes.ledger, gate)
        self._stats = stats
        latency = stats.latency
        #: the one provider call path of this tier's requests
        self.calls = ProviderCalls(tier, self.counts, self._spending, latency, telemetry, clock)
        #: per lane: this tier's queue-wait series
        self._queue_wait_s: dict[str, Series] = {}
        self._latency = latency
        self._rng = rng
        self._clock = clock
        self._spawn = spawn

    # ------------------------------------------------------------------ a plan
    async def run(self, ctxs: list[JobContext], key: PackKey | None) -> None:
        """Send the plan's requests until every member has an outcome.

        Cancelled (shutdown) or a bug: members without an outcome stay uncommitted and are
        read again after a restart; a guess is never published.
        """
        tier = self.tier
        plan = RequestPlan(
            ctxs,  # a job's context is its own plan member
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
            send = functools.partial(self._send, plan, key=key, batched_plan=batched)
            await self.send_all(plan.start(), send)
        except BaseException as exc:
            self.abandon_unfinished(ctxs, exc, "a request plan")
            raise

    def abandon_unfinished(self, ctxs: list[JobContext], exc: BaseException, what: str) -> None:
        """A plan ended by `exc` (shutdown, or a bug): its members without an outcome stay
        uncommitted and are read again after a restart; a bug says so, since a stalled commit
        watermark must not be silent."""
        unfinished = [c for c in ctxs if not c.done]
        for c in unfinished:
            self._outcomes.abandon(c)
        if not isinstance(exc, asyncio.CancelledError):
            log.error(
                "%s of tier %s failed (a bug); its %d unfinished jobs stay uncommitted, holding "
                "back their partitions' commits until a restart reads them again",
                what,
                self.tier.name,
                len(unfinished),
                exc_info=exc,
            )

    async def send_all(
        self,
        reqs: list[PlannedRequest],
        send: Callable[[PlannedRequest], Coroutine[Any, Any, list[PlannedRequest]]],
    ) -> None:
        """Send `reqs` with `send` (which returns the requests each leads to) and their
        follow-ups until none is left: in this task while one goes at a time (most plans are
        one request, and their retries follow one another), in a task group while several go
        at once (the halves of a split, the re-asks of missing members)."""
        while len(reqs) == 1:
            reqs = await send(reqs[0])
        if reqs:
            async with asyncio.TaskGroup() as group:
                for req in reqs:
                    group.create_task(self.send_all([req], send))

    async def _send(
        self, plan: RequestPlan, req: PlannedRequest, *, key: PackKey | None, batched_plan: bool
    ) -> list[PlannedRequest]:
        """Send one planned request and apply its outcome; returns the requests it leads to."""
        sent = await self.send_planned(plan, req, lambda planned: self.build_request(planned, key))
        if sent is None:
            return []
        req, request, answer = sent
        self.counts.sent(req, batched_plan)
        if isinstance(answer, ProviderError):
            completion = None
            step = plan.on_error(req, answer)
        else:
            assert isinstance(answer, Completion)
            completion = answer
            step = plan.on_answer(req, answer.text, answer.finish_reason)
        self._apply(plan, step, completion)
        if completion is not None and key is not None:
            self._learn_speed(key, req, step, completion)
        if completion is not None and len(req.members) > 1:
            self.counts.batch_saving(req, request, completion)
        if step.verdict is not None and key is not None:
            share = completion.usage.share(len(req.members)) if completion is not None else None
            self._learn(key, step, len(req.members), share)
        for nxt in step.requests:
            self.counts.follow_up(req, nxt)
        return step.requests

    async def send_planned(
        self, plan: RequestPlan, req: PlannedRequest, build: Callable[[PlannedRequest], AnyRequest]
    ) -> tuple[PlannedRequest, AnyRequest, Completion | Embeddings | ProviderError] | None:
        """Send a planned request (built by `build` when it first goes) once its backoff passed
        and the circuit lets it, in the lane of its most urgent member: the request as sent
        (fewer members when some moved to the tier's fallback tier), its provider request and
        the answer; None when nothing was left to send (its members' deadlines passed, the
        outage outlasted `retry.max_outage_s`, or every member moved to the fallback tier)."""
        # a retry after an exhausted quota goes at once when another deployment can take it
        if req.delay_s > 0 and not (req.quota_waited_s > 0 and self.tier.any_up(self._clock())):
            await asyncio.sleep(req.delay_s)
        request: AnyRequest | None = None
        traces = [m.trace for m in as_contexts(req.members)]
        tenant = as_context(req.members[0]).tenant  # a request carries the jobs of one tenant
        gate = self._spending.gate
        while True:
            if self._expire(plan, req):
                return None
            if gate is not None and gate.exhausted(tenant):
                # its tenant's budget is spent: no slot, no place in the limiter's queue
                self._refuse(plan, req, gate.budgets.exhausted_message(gate.account(tenant)))
                return None
            admitted = await self._through_circuit(plan, req)
            if isinstance(admitted, PlannedRequest):  # some members moved to the fallback tier
                req, request, traces = admitted, None, [as_context(m).trace for m in admitted.members]
                continue
            if admitted is None:
                return None
            probe = admitted if isinstance(admitted, Deployment) else None
            if request is None:
                request = build(req)
            # while waiting for a slot the deadline may pass or the circuit open
            wanted = functools.partial(self._still_wanted, plan, req)
            lane, deadline_s = _schedule_of(req)
            answer: Completion | Embeddings | ProviderError | Exhausted | None = await self.calls.call(
                request, traces, still_wanted=wanted, probe=probe, lane=lane, deadline_s=deadline_s,
                tenant=tenant,
            )
            if isinstance(answer, Exhausted):
                if probe is not None:
                    probe.circuit.probe_abandoned()
                self._refuse(plan, req, answer.message)
                return None
            if answer is None:
                if probe is not None:
                    probe.circuit.probe_abandoned()
                if self._expire(plan, req):
                    return None
            elif not (isinstance(answer, ProviderError) and self.calls.held(answer)):
                break
            self.tier.stats.held_requests += 1  # held: sent again once the circuit admits it
        if isinstance(answer, QuotaExhausted) and self._fallback is not None:
            rest = self._moved(plan, req)
            if rest is not req:
                if rest is None:
                    return None
                req = rest  # what stays is answered by the quota rules
        return req, request, answer

    # ------------------------------------------------------------------ the circuit
    def _still_wanted(self, plan: RequestPlan, req: PlannedRequest) -> bool:
        """Once a slot is granted (on a deployment whose circuit is closed, or as its probe):
        send unless the members' deadlines passed meanwhile. A member sent for the first
        time ends its queue wait here (window, limiter and circuit are behind it)."""
        wanted = not self._expire(plan, req)
        if wanted:
            self._end_queue_waits(as_contexts(req.members), self._clock())
        return wanted

    def _end_queue_waits(self, members: Sequence[JobContext], now_s: float) -> None:
        """The members sent for the first time end their queue wait now: observed per lane,
        and per tenant (the members are of one tenant), one call per series."""
        by_lane: dict[str, list[float]] = {}
        for ctx in members:
            if not ctx.sent:
                ctx.sent = True
                lane = ctx.lane_name
                waits = by_lane.get(lane)
                if waits is None:
                    waits = by_lane[lane] = []
                waits.append(now_s - ctx.received_s)
        if not by_lane:
            return
        for lane, waits in by_lane.items():
            series = self._queue_wait_s.get(lane)
            if series is None:
                series = self._queue_wait_s[lane] = self._latency.child(QUEUE_WAIT, (self.tier.name, lane))
            series.observe_all(waits)
        tenant_wait = self._outcomes.ledger.queue_wait(members[0].tenant)
        for waits in by_lane.values():
            tenant_wait.observe_all(waits)


    def _moved(self, plan: RequestPlan, req: PlannedRequest) -> PlannedRequest | None:
        """Move the members of the unsent `req` that the fallback takes now; returns `req`
        itself when none moved, else the request for those that stay (None: none stays)."""
        assert self._fallback is not None
        now_s = self._clock()
        fallback = self._fallback
        going = [m for m in req.members if not as_context(m).done and fallback.move(as_context(m), now_s)]
        if not going:
            return req
        rest = plan.release(req, going)
        for m in going:
            fallback.send(as_context(m))
        return rest

    async def _through_circuit(
        self, plan: RequestPlan, req: PlannedRequest
    ) -> bool | Deployment | PlannedRequest | None:
        """Wait until a circuit lets `req` go: False (a deployment's is closed), a Deployment
        (it goes as the probe of that one's open circuit),
        a PlannedRequest (some members moved to the fallback tier: send this one for the rest
        instead), None (nothing left to send: its members' deadlines passed or moved, or the
        outage lasted longer than `retry.max_outage_s`, which dead-letters them
        `retries_exhausted`)."""
        tier = self.tier
        max_outage_s = tier.config.retry.max_outage_s
        while True:
            now_s = self._clock()
            admit, wait_s, probe = tier.admit(now_s)
            if admit is Admit.SEND:
                return False
            if probe is not None:
                return probe
            if self._fallback is not None:
                rest = self._moved(plan, req)
                if rest is not req:
                    return rest
                until_s = self._fallback.wait_s(self.tier, now_s)
                if until_s is not None:
                    wait_s = min(wait_s, max(until_s, 0.01))
            outage_s = tier.outage_s(now_s)
            if max_outage_s is not None:
                if outage_s >= max_outage_s:
                    errors = [d.circuit.last_error for d in tier.deployments if d.circuit.last_error]
                    last = errors[0].message if errors else "no answer"
                    step = plan.cancel(
                        ErrorKind.RETRIES_EXHAUSTED,
                        f"provider unreachable for {outage_s:.0f} s: {last}",
                        [m for m in req.members if not as_context(m).done],
                    )
                    self._apply(plan, step, None)
                    return None
                wait_s = min(wait_s, max_outage_s - outage_s)
            deadlines = [d for m in req.members if (d := as_context(m).deadline_s) is not None]
            if deadlines:
                wait_s = min(wait_s, max(0.0, min(deadlines) - now_s))
            changed = tier.circuit_change
            await wait_at_most(changed.wait(), max(wait_s, 0.001))
            if self._expire(plan, req):
                return None

    def _refuse(self, plan: RequestPlan, req: PlannedRequest, message: str) -> None:
        """The unsent `req`'s tenant has spent its budget: its open members leave the plan, held
        or dead-lettered `budget_exhausted` by the tenant's `on_exhausted` (`TenantGate`)."""
        gate = self._spending.gate
        assert gate is not None
        members = [m for m in req.members if not as_context(m).done]
        plan.release(req, members)
        gate.refuse([as_context(m) for m in members], message)

    def build_request(self, req: PlannedRequest, pack_key: PackKey | None = None) -> CompletionRequest:
        """The provider request of a planned one (`consumer.runtime.requests.build_request`)."""
        return build_request(self.tier, req, pack_key)

    # ------------------------------------------------------------------ steps
    def _expire(self, plan: RequestPlan, req: PlannedRequest) -> bool:
        """Dead-letter members whose deadline passed before `req` goes out; True: nothing left to send."""
        now_s = self._clock()
        expired = [m for m in as_contexts(req.members) if m.past_deadline(now_s)]
        if not expired:
            return False
        step = plan.cancel(
            ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the request was sent", expired
        )
        self._apply(plan, step, None)
        return plan.done or len(expired) == len(req.members)

    def _apply(self, plan: RequestPlan, step: Step, completion: Completion | None) -> None:
        # step.pause_tier_s: the deployment that said so is paused already (`_quota_exhausted`)
        now_s = self._clock()
        # the jobs answered by one request end together: what they share is built once
        self.answer_all(plan, step, completion, None, now_s)
        for member, kind, message in step.failed:
            ctx, error = as_context(member), plan.last_error(member)
            self._outcomes.fail(ctx, kind, message, attempts=plan.attempts(member), error=error)

    def answer_all(
        self,
        plan: RequestPlan,
        step: Step,
        answer: Completion | Embeddings | None,
        embedding_of: Callable[[PlanMember], Sequence[float]] | None,
        now_s: float,
    ) -> None:
        """The step's answered members end with their answers: the members of one request
        together, so what they share is built once (`embedding_of`: an embed plan's vectors)."""
        answered: list[AnsweredJob] = []
        answered_by: PlannedRequest | None = None
        attempts = plan.attempts
        for member, output, by in step.answered:
            ctx = as_context(member)
            if by is not answered_by and answered:
                self._answered_by(answered_by, answer, answered, now_s)
                answered = []
            answered_by = by
            if embedding_of is None:
                answered.append((ctx, output, None, attempts(ctx)))
            else:  # an embed job's answer is its vector alone
                answered.append((ctx, None, embedding_of(ctx), attempts(ctx)))
        if answered:
            self._answered_by(answered_by, answer, answered, now_s)

    def _answered_by(
        self,
        req: PlannedRequest | None,
        answer: Completion | Embeddings | None,
        answered: list[AnsweredJob],
        now_s: float,
    ) -> None:
        assert req is not None and answer is not None  # only an answer answers members
        results = AnswerResults(self._outcomes.results_topic, answer, len(req.members))
        self._outcomes.answered_all(results, answered, now_s=now_s)

    # ------------------------------------------------------------------ adaptive size and verification
    def _learn(self, key: PackKey, step: Step, size: int, share: Usage | None) -> None:
        tier = self.tier
        assert step.verdict is not None
        new_size = tier.sizes.record(key, step.verdict.kind.value, size, self._clock())
        tier.stats.batch_size = tier.current_batch_size()
        kind = step.verdict.kind.value
        log.debug("tier %s: %s answer of %d -> batch size %d", tier.name, kind, size, new_size)
        verifying = tier.config.batching.verify_fraction > 0 and tier.sizes.wants_verification(key, size)
        if step.answered and verifying:
            answered = [(m, answer, by) for m, answer, by in step.answered if len(by.members) > 1]
            chosen = choose_verified(answered, tier.config.batching.verify_fraction, self._rng)
            for member, answer, by in chosen:
                self._spawn(self._verify(key, as_context(member), answer, len(by.members), share))

    def _learn_speed(
        self, key: PackKey, req: PlannedRequest | None, step: Step | None, completion: Completion
    ) -> None:
        """What one answered request took per item feeds the adaptive size's speed evidence
        (`req` None: a verification, one job asked alone)."""
        size = len(req.members) if req is not None else 1
        answered = sum(1 for _, _, by in step.answered if by is req) if step is not None else 1
        usage = completion.usage
        self.tier.sizes.record_speed(
            key, size, answered, completion.latency_ms / 1000.0, self._clock(),
            tokens=usage.input_tokens + usage.output_tokens,
        )

    async def _verify(
        self, key: PackKey, ctx: JobContext, batched: str, size: int, share: Usage | None = None
    ) -> None:
        """Ask a batched job alone too; the two answers' agreement feeds the adaptive size, and
        the two usages (`share`: the job's share of its batched request) measure what batching
        saved."""
        tier = self.tier
        if all(d.circuit.open for d in tier.deployments):
            return  # while the provider is down only the probe goes out
        request = ordinary_request(self.tier, ctx)
        answer = await self.calls.call(request, [ctx.trace], lane=ctx.lane, tenant=ctx.tenant)
        self.counts.verification()
        if not isinstance(answer, Completion):
            return  # a failed verification says nothing about agreement
        self._learn_speed(key, None, None, answer)
        if share is not None:
            tier.stats.verify_batched_tokens += share.input_tokens + share.output_tokens
            tier.stats.verify_alone_tokens += answer.usage.input_tokens + answer.usage.output_tokens
        agreed = int(answers_agree(batched, answer.text))
        self._stats.agreement.record(tier.name, size, agreed, 1)
        tier.stats.verify_compared += 1
        tier.stats.verify_agreed += agreed
        tier.sizes.record_agreement(key, agreed, 1, size, self._clock())
        tier.stats.batch_size = tier.current_batch_size()


def _schedule_of(req: PlannedRequest) -> tuple[Lane | None, float | None]:
    """Where a request waits for its tier's slot: the lane of its most urgent job (a request
    is as urgent as its most urgent member) and its members' nearest deadline."""
    ctxs = as_contexts(req.members)
    lanes = [c.lane for c in ctxs if c.lane is not None]
    deadlines = [c.deadline_s for c in ctxs if c.deadline_s is not None]
    return (pack_lane(lanes) if lanes else None), (min(deadlines) if deadlines else None)
