"""One tier's provider requests against their tenants' accounts (docs/tenants.md).

Each answered request's tokens and cost (at the tier's `pricing`) are counted to its tenant's
account, once per request (a request carries the jobs of one tenant). With budgets
(`consumer.runtime.tenancy.TenantGate`), a request holds a reservation of its estimated cost
from the moment it has its limiter slot until its answer settles it (`reserve`, `ended`): a
request the budget does not hold is not sent (`Exhausted`), and its jobs are held or
dead-lettered by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from consumer.core.budgets import Exhausted, Reservation
from consumer.core.completion import Completion, CompletionRequest
from consumer.core.cost import Pricing, cost_usd
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ProviderError
from consumer.core.offline import BatchItemResult, BatchRequest
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.budgets import estimated_cost, spend_of
from consumer.runtime.context import JobContext
from consumer.runtime.tenancy import TenantGate
from consumer.settings import TierConfig

__all__ = ["TierSpending", "count_tenant_usage", "reserve_offline", "tier_spending"]


class TierSpending:
    """A tier's requests counted per tenant, and their reservations under budgets.

    offline: the tier's requests go through the provider's Batch API (at its batch price).
    """

    def __init__(
        self, pricing: Pricing | None, ledger: TenantLedger, gate: TenantGate | None, *, offline: bool = False
    ) -> None:
        self._pricing = pricing
        self._ledger = ledger
        self._gate = gate
        self._offline = offline

    @property
    def gate(self) -> TenantGate | None:
        """The budgets' check (None: no account has a budget)."""
        return self._gate

    async def reserve(
        self, request: CompletionRequest | EmbeddingRequest, tenant: str
    ) -> Reservation | Exhausted | None:
        """Hold the request's estimated cost from its tenant's budget (None: no budget limits
        it); `Exhausted`: the budget does not hold it, the request must not go."""
        gate = self._gate
        if gate is None:
            return None
        account = gate.account(tenant)
        if not gate.budgets.budgeted(account):
            return None
        output = 0 if isinstance(request, EmbeddingRequest) else _max_tokens(request)
        estimate = estimated_cost(request.estimated_tokens(), output, self._pricing, offline=self._offline)
        return await gate.budgets.reserve(account, estimate)

    def ended(
        self,
        held: Reservation | None,
        tenant: str,
        answer: Completion | Embeddings | ProviderError | None,
    ) -> None:
        """The request ended with `answer` (None: it was not sent, or its task was cancelled):
        an answer's tokens and cost count to the tenant and settle its reservation; anything
        else gives the reservation back."""
        if isinstance(answer, Completion | Embeddings):
            usage = answer.usage
            stats = self._ledger.stats_of(tenant)
            stats.input_tokens += usage.input_tokens
            stats.output_tokens += usage.output_tokens
            if self._pricing is not None:
                stats.cost_usd += cost_usd(usage, self._pricing, offline=self._offline)
            if held is not None and self._gate is not None:
                self._gate.budgets.settle(held, spend_of(usage, self._pricing, offline=self._offline))
        elif held is not None and self._gate is not None:
            self._gate.budgets.release(held)

    def spent_as_estimated(self, held: Reservation, *, recorded: bool) -> None:
        """An offline job's reservation: spent at its estimate once the provider took its batch
        (`recorded`; its answer comes later, maybe to another instance; the estimate bounds what
        it can cost), given back when it did not."""
        if self._gate is None:
            return
        if recorded:
            self._gate.budgets.settle(held, held.estimate)
        else:
            self._gate.budgets.release(held)


def tier_spending(config: TierConfig, ledger: TenantLedger, gate: TenantGate | None) -> TierSpending:
    """The spending of a tier's offline jobs (at its pricing's batch price)."""
    pricing = config.pricing.pricing() if config.pricing is not None else None
    return TierSpending(pricing, ledger, gate, offline=True)


async def reserve_offline(
    spending: TierSpending, gate: TenantGate, requests: list[BatchRequest], ctxs: list[JobContext]
) -> tuple[list[BatchRequest], list[JobContext], list[tuple[Reservation | None, JobContext]]]:
    """Offline jobs about to go in a provider batch: each one's estimate held from its tenant's
    budget; those it does not hold are held or dead-lettered (`TenantGate`) and left out."""
    kept: list[tuple[BatchRequest, JobContext, Reservation | None]] = []
    for request, ctx in zip(requests, ctxs, strict=True):
        held = await spending.reserve(request.request, ctx.tenant)
        if isinstance(held, Exhausted):
            gate.refuse([ctx], held.message)
        else:
            kept.append((request, ctx, held))
    return [r for r, _, _ in kept], [c for _, c, _ in kept], [(h, c) for _, c, h in kept]


def count_tenant_usage(
    ledger: TenantLedger,
    tenants: Mapping[str, str],
    items: Sequence[BatchItemResult],
    pricing: Pricing | None,
) -> None:
    """A finished provider batch's answered items (`tenants`: each custom id's tenant): their
    tokens and their cost at the batch price, counted to their tenants."""
    for item in items:
        tenant = tenants.get(item.custom_id)
        if item.completion is None or tenant is None:
            continue
        usage, stats = item.completion.usage, ledger.stats_of(tenant)
        stats.input_tokens += usage.input_tokens
        stats.output_tokens += usage.output_tokens
        if pricing is not None:
            stats.cost_usd += cost_usd(usage, pricing, offline=True)


def _max_tokens(request: CompletionRequest) -> int | None:
    value = request.options.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
