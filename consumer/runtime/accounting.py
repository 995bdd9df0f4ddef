"""A tier's request counters: every request, error and token of a tier is counted here, with
the tokens' cost at the tier's `pricing` (`consumer.core.cost`) and batching's saving
(estimated from every batched answer against its jobs asked alone)."""

from __future__ import annotations

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.cost import Pricing, alone_input_estimate, alone_output_estimate, cost_usd
from consumer.core.embed import Embeddings
from consumer.core.errors import ProviderError
from consumer.core.plan import PlannedRequest
from consumer.runtime.context import as_contexts
from consumer.runtime.stats import DeploymentStats, TierStats


class RequestCounts:
    """Counts one tier's requests into its `TierStats`."""

    def __init__(self, stats: TierStats, pricing: Pricing | None) -> None:
        self._stats = stats
        self._pricing = pricing

    def sent(self, req: PlannedRequest, batched_plan: bool) -> None:
        """A request was sent (`batched_plan`: for a plan of several jobs)."""
        stats = self._stats
        stats.provider_requests += 1
        if batched_plan:
            stats.requests_for_batched_plans += 1
        if len(req.members) > 1:
            stats.batched_requests += 1
        if req.attempt > 1:
            stats.retries += 1

    def usage(self, completion: Completion | Embeddings, deployment: DeploymentStats | None = None) -> None:
        """An answered request's tokens, and their cost at the tier's pricing; also counted
        in the stats of the `deployment` that answered it."""
        stats, usage = self._stats, completion.usage
        if deployment is not None:
            deployment.provider_requests += 1
            deployment.input_tokens += usage.input_tokens
            deployment.output_tokens += usage.output_tokens
        stats.input_tokens += usage.input_tokens
        stats.output_tokens += usage.output_tokens
        stats.cached_input_tokens += usage.cached_input_tokens
        stats.cache_write_tokens += usage.cache_write_tokens
        if self._pricing is not None:
            stats.cost_usd += cost_usd(usage, self._pricing)

    def batch_saving(
        self, req: PlannedRequest, request: CompletionRequest | None, completion: Completion
    ) -> None:
        """An answered batched request's tokens against its members asked alone, estimated
        from the ordinary prompts' lengths at the batched prompt's own tokens per character."""
        usage, size = completion.usage, len(req.members)
        batched_chars = sum(len(m.content) for m in request.messages) if request is not None else 0
        alone_chars = sum(ctx.alone_chars for ctx in as_contexts(req.members))
        stats = self._stats
        stats.batched_tokens += usage.input_tokens + usage.output_tokens
        stats.alone_tokens_estimate += alone_input_estimate(
            usage.input_tokens, batched_chars, alone_chars
        ) + alone_output_estimate(usage.output_tokens, size)

    def verification(self) -> None:
        """A verification request (a batched job asked alone too) was sent."""
        self._stats.provider_requests += 1
        self._stats.verify_requests += 1

    def error(self, exc: ProviderError, deployment: DeploymentStats | None = None) -> None:
        """A request failed with `exc` (on `deployment`, counted in its stats too)."""
        self._stats.provider_errors += 1
        if deployment is not None:
            deployment.provider_requests += 1
            deployment.provider_errors += 1
        if exc.status_code == 429:
            self._stats.rate_limited += 1
            if deployment is not None:
                deployment.rate_limited += 1

    def follow_up(self, req: PlannedRequest, nxt: PlannedRequest) -> None:
        """`req` led to `nxt`: a split or a re-ask when it has fewer of the members."""
        if len(nxt.members) < len(req.members) and len(req.members) > 1:
            if nxt.packed is None:
                self._stats.reasks += 1
            else:
                self._stats.splits += 1
