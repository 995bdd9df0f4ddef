"""A tier's one provider call path: of ordinary, batched, embed and verification requests.

`ProviderCalls.call` waits for a limiter slot (which always ends), sends the request to the
deployment the slot names and returns the answer or the `ProviderError`, under the error
taxonomy: the provider's rate-limit budgets go back to the limiter, the answer or the outage
to the deployment's circuit, an exhausted quota pauses that deployment, and the request's tokens
and cost are counted (`RequestCounts`) and held against its tenant's budget while it is in
flight (`TierSpending`). The plan runner (`runtime/plans.py`) decides what to send; this
module only sends it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast, overload

from consumer.core.budgets import Exhausted
from consumer.core.circuit import is_outage
from consumer.core.completion import Completion, CompletionRequest
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ProviderError, QuotaExhausted, RateLimited, ServerError
from consumer.core.lanes import Lane
from consumer.core.tenants import DEFAULT_TENANT
from consumer.providers.embeddings import EmbeddingProvider
from consumer.runtime.accounting import RequestCounts
from consumer.runtime.deployments import Deployment
from consumer.runtime.latency import ERROR, OK, PROVIDER_REQUEST, RATE_LIMITED, LatencyHistograms
from consumer.runtime.limiter import NoDeploymentUp, Token
from consumer.runtime.spending import TierSpending
from consumer.runtime.tiers import TierRuntime
from consumer.settings.tiers import FallbackConfig
from consumer.telemetry import Telemetry

log = logging.getLogger(__name__)


def open_circuit_route(deployments: int, fallback: FallbackConfig | None) -> str:
    """Where the requests of a deployment whose circuit just opened go, as its WARNING says:
    to the tier's other deployments when it has any (`deployments` > 1), else they wait; with
    a `fallback` on outages, those held through its `after_s` move to that tier."""
    if deployments > 1:
        route = (
            "its requests go to the tier's other deployments, or are held (one probe at a time) "
            "while none is up"
        )
    else:
        route = "its requests are held (one probe at a time) until it answers again"
    if fallback is not None and "outage" in fallback.on:
        route += f"; after {fallback.after_s:g} s of outage its held requests move to tier {fallback.tier}"
    return route


class ProviderCalls:
    """The provider calls of one tier (see the module docstring)."""

    def __init__(
        self,
        tier: TierRuntime,
        counts: RequestCounts,
        spending: TierSpending,
        latency: LatencyHistograms,
        telemetry: Telemetry,
        clock: Callable[[], float],
    ) -> None:
        self.tier = tier
        self.counts = counts
        self._spending = spending
        self._deployments = tier.deployments
        #: per deployment, its provider-request series per outcome (made now: a 429 series
        #: shows 0 until one)
        self._request_s = [
            {
                outcome: latency.child(PROVIDER_REQUEST, (tier.name, outcome, d.label))
                for outcome in (OK, RATE_LIMITED, ERROR)
            }
            for d in tier.deployments
        ]
        self._telemetry = telemetry
        #: per deployment, what its provider calls' spans and GenAI metrics name (None: not traced)
        self._call_targets = [
            telemetry.call_target(tier.name, d.config.provider, d.config.resolved_base_url)
            for d in tier.deployments
        ]
        self._clock = clock

    @overload
    async def call(
        self,
        request: CompletionRequest,
        traces: Sequence[Any],
        *,
        still_wanted: Callable[[], bool] | None = None,
        probe: Deployment | None = None,
        lane: Lane | None = None,
        deadline_s: float | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Completion | ProviderError | Exhausted | None: ...

    @overload
    async def call(
        self,
        request: EmbeddingRequest,
        traces: Sequence[Any],
        *,
        still_wanted: Callable[[], bool] | None = None,
        probe: Deployment | None = None,
        lane: Lane | None = None,
        deadline_s: float | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Embeddings | ProviderError | Exhausted | None: ...

    async def call(
        self,
        request: CompletionRequest | EmbeddingRequest,
        traces: Sequence[Any],
        *,
        still_wanted: Callable[[], bool] | None = None,
        probe: Deployment | None = None,
        lane: Lane | None = None,
        deadline_s: float | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Completion | Embeddings | ProviderError | Exhausted | None:
        """One provider call under the tier's limiter: the answer or the ProviderError; an
        embeddings request (`consumer.core.embed`) goes to the provider's `embed`. With
        budgets, the request holds its estimated cost from its tenant's budget while it is in
        flight (`consumer.runtime.spending`); `Exhausted`: the budget does not hold it and it
        was not sent.

        An unexpected exception from an adapter is a bug there; it must not lose jobs, so it
        becomes a retryable ServerError (which says nothing to the circuit). None:
        `still_wanted` said no once the slot was granted, or no deployment's circuit is closed
        (the caller holds the request). The limiter token ends exactly once whatever happens
        (`AsyncLimiter.slot`); its gate names the deployment the call goes to. probe: this call
        is that deployment's open circuit's probe. lane, deadline_s, tenant: where the request
        waits for its slot (`consumer.core.lanes`, `consumer.core.scheduling`): a request carries
        the jobs of one tenant.
        """
        tier = self.tier
        limiter = tier.limiter
        # a fleet quota reserves the output a request may produce: its max_tokens
        output_tokens = _max_tokens(request) if limiter.quota is not None else None
        slot = limiter.slot(
            request.estimated_tokens(),
            lane=lane,
            deadline_s=deadline_s,
            output_tokens=output_tokens,
            probe=probe.gate if probe is not None else None,
            tenant=tenant,
        )
        try:
            async with slot as token:
                deployment = self._deployments[token.gate.index]
                if (probe is None and deployment.circuit.open) or (
                    still_wanted is not None and not still_wanted()
                ):
                    limiter.note_budget(None, token, rejected=True)  # never sent: the provider counts nothing
                    return None
                spending = self._spending
                held = await spending.reserve(request, tenant) if spending.gate is not None else None
                if isinstance(held, Exhausted):
                    limiter.note_budget(None, token, rejected=True)  # never sent
                    return held  # its slot goes to the next waiter; its jobs wait or fail
                if deployment.name is not None and deployment.config.model != request.model:
                    request = dataclasses.replace(request, model=deployment.config.model)
                answer: Completion | Embeddings | ProviderError | None = None
                try:
                    answer = await self._send_to(deployment, request, traces, token, probe is not None)
                    return answer
                finally:
                    self._spending.ended(held, tenant, answer)
        except NoDeploymentUp:
            return None

    async def _send_to(
        self,
        deployment: Deployment,
        request: CompletionRequest | EmbeddingRequest,
        traces: Sequence[Any],
        token: Token,
        probe: bool,
    ) -> Completion | Embeddings | ProviderError:
        """The provider call of `call` on the deployment its slot was granted to."""
        tier = self.tier
        series = self._request_s[deployment.gate.index]
        target = self._call_targets[deployment.gate.index]
        with self._telemetry.provider_call(target, request, traces) as traced:
            sent_s = self._clock()
            try:
                completion: Completion | Embeddings
                if isinstance(request, EmbeddingRequest):
                    completion = await cast(EmbeddingProvider, deployment.provider).embed(request)
                else:
                    completion = await deployment.provider.complete(request)
            except ProviderError as exc:
                series[RATE_LIMITED if exc.status_code == 429 else ERROR].observe(self._clock() - sent_s)
                if isinstance(exc, RateLimited):  # before the token ends: it settles as not counted
                    _note_rate_limited(tier, token, exc)
                token.dropped() if exc.overload else token.ignore()
                exc.deployment = deployment.gate.index
                self.counts.error(exc, deployment.stats)
                if isinstance(exc, QuotaExhausted):
                    self._quota_exhausted(deployment, exc)
                traced.failed(exc)
                self._circuit_saw(exc, deployment, probe=probe)
                return exc
            except Exception as exc:
                series[ERROR].observe(self._clock() - sent_s)
                traced.failed(exc)
                log.exception("provider %s raised unexpectedly", tier.name)
                if probe:
                    deployment.circuit.probe_abandoned()
                error = ServerError(f"unexpected {type(exc).__name__}", provider=tier.name)
                error.deployment = deployment.gate.index
                return error
            traced.answered(completion)
        series[OK].observe(self._clock() - sent_s)
        _note_answer(tier, token, completion)  # before the token ends: it settles to the usage
        token.success()
        deployment.quota.on_answer()
        self.counts.usage(completion, deployment.stats)
        self._circuit_saw(None, deployment, probe=probe)
        if deployment.name is not None:
            completion = dataclasses.replace(completion, deployment=deployment.name)
        return completion

    def _quota_exhausted(self, deployment: Deployment, exc: QuotaExhausted) -> None:
        """The deployment's provider quota is spent: it is down (the others go on) for the
        answer's Retry-After, else the tier's `retry.quota_cooldown_s`; the requests waiting for
        a slot leave it at once (to another deployment, or to the circuit, where the fallback
        tier may take them)."""
        hinted = exc.hint.retry_after_s
        cooldown_s = self.tier.config.retry.quota_cooldown_s if hinted is None else hinted
        deployment.quota.on_exhausted(self._clock(), cooldown_s)
        log.warning("%s: quota exhausted, paused %.1fs", deployment.where(self.tier.name), cooldown_s)
        self.tier.circuit_changed()

    def held(self, error: ProviderError) -> bool:
        """True when a request that failed with `error` is held and sent again (to another
        deployment, or once its circuit admits it) without costing its members an attempt:
        an outage of a deployment whose circuit is open."""
        return self._deployments[error.deployment].circuit.holds(error)

    def _circuit_saw(self, error: ProviderError | None, deployment: Deployment, *, probe: bool) -> None:
        """Feed one call's outcome to its deployment's circuit; log and wake the held requests
        on a change."""
        tier, now_s, circuit = self.tier, self._clock(), deployment.circuit
        if error is not None and is_outage(error):
            change = circuit.on_outage(error, now_s, probe=probe)
        elif circuit.open or circuit.last_error is not None or probe:
            change = circuit.on_answer(now_s)
        else:
            return  # closed with no run of failures: nothing to change, nobody to wake
        if change is not None:
            url = deployment.config.resolved_base_url
            if change.opened:
                log.warning(
                    "%s: provider at %s unreachable (%s); circuit open: %s",
                    deployment.where(tier.name), url, error.message if error else "?",
                    open_circuit_route(len(self._deployments), tier.config.fallback),
                )
            else:
                log.info(
                    "%s: provider at %s answers again after %.1f s; circuit closed",
                    deployment.where(tier.name), url, change.outage_s,
                )
        if change is not None or probe:
            tier.circuit_changed()


def _note_answer(tier: TierRuntime, token: Token, completion: Completion | Embeddings) -> None:
    """The answer's budgets and token usage pace the tier's next requests."""
    tier.limiter.note_budget(completion.rate_limit, token, usage=completion.usage)


def _max_tokens(request: CompletionRequest | EmbeddingRequest) -> int | None:
    """The output a request may produce: its max_tokens (an embeddings request: none; None:
    not set)."""
    if isinstance(request, EmbeddingRequest):
        return 0
    value = request.options.get("max_tokens")
    return value if isinstance(value, int) and value >= 0 else None


def _note_rate_limited(tier: TierRuntime, token: Token, exc: RateLimited) -> None:
    """A 429: the deployment's budget is empty, so its mirrors restart from there; with a
    Retry-After nobody should try that deployment before then (the limit alone bounds
    concurrency, not rate)."""
    tier.limiter.note_budget(exc.hint, token, rejected=True)
    if exc.hint.retry_after_s:
        tier.limiter.pause(min(exc.hint.retry_after_s, tier.config.retry.backoff_max_s), token.gate)
