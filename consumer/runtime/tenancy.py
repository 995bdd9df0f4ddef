"""The budget check before a tenant's work is sent (`TenantGate`): it holds or dead-letters the
jobs of a tenant whose daily budget is spent (docs/tenants.md). It exists only when some
account has a budget:

- at routing, a job of an exhausted account is held (`on_exhausted: hold`: it waits here, in
  no window, plan queue or limiter queue, so it holds up nobody) or dead-lettered
  `budget_exhausted` (`dead_letter`); the plan runner refuses the same way a request whose
  reservation the budget does not hold (`consumer.runtime.budgets`);
- held jobs go on again (`take_released`, every pipeline turn) once their account has room
  for the estimate it last refused: the next UTC day, or budget given back. Held jobs stay
  uncommitted and count toward their lane's `max_inflight` like every job read; a restart
  reads them again (with the tier file's budget then, larger or not).
"""

from __future__ import annotations

from collections.abc import Iterable

from consumer.core.errors import ErrorKind
from consumer.kafka.records import TopicPartition
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.budgets import TenantBudgets
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import OutcomeWriter

__all__ = ["TenantGate"]


class TenantGate:
    """The budgets' check before a tenant's work is sent, and the jobs held for budget."""

    def __init__(self, ledger: TenantLedger, budgets: TenantBudgets, outcomes: OutcomeWriter) -> None:
        self._ledger = ledger
        self._budgets = budgets
        self._outcomes = outcomes
        #: held jobs per account, in arrival order
        self._held: dict[str, list[JobContext]] = {}

    @property
    def budgets(self) -> TenantBudgets:
        return self._budgets

    def account(self, tenant: str) -> str:
        return self._ledger.account(tenant)

    def exhausted(self, tenant: str) -> bool:
        """True when `tenant`'s account is budgeted and cannot send now."""
        account = self._ledger.account(tenant)
        return self._budgets.budgeted(account) and self._budgets.exhausted(account)

    def admits(self, ctx: JobContext) -> bool:
        """False when the job's account is exhausted: the job is held or dead-lettered now."""
        if not self.exhausted(ctx.tenant):
            return True
        account = self._ledger.account(ctx.tenant)
        self.refuse([ctx], self._budgets.exhausted_message(account))
        return False

    def refuse(self, ctxs: Iterable[JobContext], message: str) -> None:
        """Jobs whose tenant's budget is spent: held, or dead-lettered `budget_exhausted`, by
        their account's `on_exhausted` (the jobs of one call are of one tenant)."""
        for ctx in ctxs:
            if ctx.done:
                continue
            account = self._ledger.account(ctx.tenant)
            if self._budgets.book.policy(account).on_exhausted == "dead_letter":
                self._outcomes.fail(ctx, ErrorKind.BUDGET_EXHAUSTED, message, attempts=0)
            else:
                self._held.setdefault(account, []).append(ctx)

    def held(self, account: str) -> int:
        return len(self._held.get(account, ()))

    def take_released(self) -> list[JobContext]:
        """The held jobs whose account has room again (the pipeline routes them anew)."""
        self._budgets.roll()
        released: list[JobContext] = []
        for account in [a for a, jobs in self._held.items() if jobs and not self._budgets.exhausted(a)]:
            released.extend(c for c in self._held.pop(account) if not c.done)
        return released

    def drop_partitions(self, partitions: set[TopicPartition]) -> list[JobContext]:
        """Held jobs of revoked partitions (abandoned by the caller: their new owner reads them)."""
        dropped: list[JobContext] = []
        for account, jobs in self._held.items():
            dropped.extend(c for c in jobs if c.source.tp in partitions)
            self._held[account] = [c for c in jobs if c.source.tp not in partitions]
        return dropped

    def drain(self) -> list[JobContext]:
        """Every held job (shutdown: abandoned, read again after a restart)."""
        drained = [c for jobs in self._held.values() for c in jobs]
        self._held.clear()
        return drained

    def refresh_gauges(self) -> None:
        """Each budgeted account's held jobs, budget and spend today, for stats and /metrics."""
        budgets = self._budgets
        for account in budgets.book.accounts:
            stats = self._ledger.stats_of(account)
            policy = budgets.book.policy(account)
            spent = budgets.spent(account)
            stats.held = self.held(account)
            stats.budget_usd = policy.usd_per_day or 0.0
            stats.spent_usd = round(spent.usd, 6)
            stats.budget_tokens = policy.tokens_per_day or 0
            stats.spent_tokens = spent.tokens
