"""One tier's provider requests against their tenants' accounts (docs/tenants.md).

Each answered request's tokens and cost (at the tier's `pricing`) are counted to its tenant's
account, once per request (a request carries the jobs of one tenant). With budgets
(`consumer.runtime.tenancy.TenantGate`), a request holds a reservation of its estimated cost
from the moment it has its limiter slot until its answer settles it (`reserve`, `ended`): a
request the budget does not hold is not sent (`Exhausted`), and its jobs are held or
dead-lettered by the caller.
"""

from __future__ import annotations

from consumer.core.budgets import Exhausted, Reservation
from consumer.core.completion import Completion, CompletionRequest
from consumer.core.cost import Pricing, cost_usd
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import ProviderError
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.budgets import estimated_cost, spend_of
from consumer.runtime.tenancy import TenantGate

__all__ = ["TierSpending"]


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


def _max_tokens(request: CompletionRequest) -> int | None:
    value = request.options.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
