"""Embed plans: a flushed window of embed jobs, as array requests, to outcomes.

`EmbedRunner` is the tier's `PlanRunner` that also runs embed plans (`consumer.core.embed`):
each planned request becomes one `EmbeddingRequest` whose `input` is its members' texts and
goes through the runner's one provider call path (`PlanRunner.send_planned`, then
`ProviderCalls.call` in `runtime/provider_calls.py`: the
limiter, pacing by tokens, the circuit, the error taxonomy, usage and cost counters), so an
embed job is held, retried, paced and counted as a chat job is. Answered members become
results carrying their vector; the plan's splits and retries run as tasks of the same plan.
"""

from __future__ import annotations

import functools
import logging

from consumer.core.embed import (
    EmbeddingRequest,
    Embeddings,
    EmbedPlan,
    embed_limits,
)
from consumer.core.errors import ProviderError
from consumer.core.plan import PlannedRequest, Step
from consumer.runtime.context import JobContext, as_context
from consumer.runtime.plans import PlanRunner

log = logging.getLogger(__name__)

__all__ = ["EmbedRunner"]


class EmbedRunner(PlanRunner):
    """A tier's plan runner that also runs embed plans (`run_embed`)."""

    async def run_embed(self, ctxs: list[JobContext]) -> None:
        """Send the embed plan's requests until every member has an outcome.

        Cancelled (shutdown) or a bug: members without an outcome stay uncommitted and are
        read again after a restart, as for chat plans.
        """
        tier = self.tier
        limits = embed_limits(tier.config.provider)
        assert limits is not None  # admission refuses embed jobs of a provider without embeddings
        plan = EmbedPlan(ctxs, limits=limits, retry=tier.retry_policy, rng=self._rng)
        batched = len(ctxs) > 1
        if batched:
            tier.stats.items_in_batched_plans += len(ctxs)
        try:
            first = plan.begin()
            self._apply(plan, first, None)
            send = functools.partial(self._send_embed, plan, batched_plan=batched)
            await self.send_all(first.requests, send)
        except BaseException as exc:
            self.abandon_unfinished(ctxs, exc, "an embed plan")
            raise

    def embedding_request(self, req: PlannedRequest) -> EmbeddingRequest:
        """The provider request of a planned one: its members' inputs, in order."""
        first = as_context(req.members[0])
        return EmbeddingRequest(tuple(m.input for m in req.members), self.tier.config.model, first.options)

    async def _send_embed(
        self, plan: EmbedPlan, req: PlannedRequest, *, batched_plan: bool
    ) -> list[PlannedRequest]:
        """Send one planned array request and apply its outcome; returns the requests it leads to."""
        sent = await self.send_planned(plan, req, self.embedding_request)
        if sent is None:
            return []
        req, _, answer = sent
        self.counts.sent(req, batched_plan)
        if isinstance(answer, ProviderError):
            step = plan.on_error(req, answer)
            self._apply(plan, step, None)
        else:
            assert isinstance(answer, Embeddings)
            step = plan.on_vectors(req, answer.vectors)
            self._apply_embedded(plan, step, answer)
        for nxt in step.requests:
            self.counts.follow_up(req, nxt)
        return step.requests

    def _apply_embedded(self, plan: EmbedPlan, step: Step, answer: Embeddings) -> None:
        """Answered members' results with their vectors; the rest as a chat plan's step."""
        self.answer_all(plan, step, answer, plan.embedding, self._clock())
        step.answered = []
        self._apply(plan, step, None)
