"""Tenant accounts at run time: each job's account (`consumer.core.tenants`: a named tenant,
`default` or `other`) and the counters it is counted in.

`TenantLedger` is asked once per job end, per answered request and per first send; its lookup
is one dict access, and a job without a tenant allocates nothing.
"""

from __future__ import annotations

from consumer.core.tenants import OTHER_TENANT, TenantPolicies
from consumer.runtime.latency import TENANT_QUEUE_WAIT, Series
from consumer.runtime.stats import ServiceStats, TenantStats

__all__ = ["TenantLedger"]


class TenantLedger:
    """Each tenant's account and its counters (`ServiceStats.tenants`, the queue-wait series)."""

    def __init__(self, policies: TenantPolicies, stats: ServiceStats) -> None:
        self.policies = policies
        self._stats = {account: stats.tenant(account) for account in policies.accounts}
        self._other = self._stats[OTHER_TENANT]
        self._waits = {
            account: stats.latency.child(TENANT_QUEUE_WAIT, (account,)) for account in policies.accounts
        }
        self._other_wait = self._waits[OTHER_TENANT]

    def account(self, tenant: str) -> str:
        """The account `tenant` is counted in (`TenantPolicies.account`)."""
        return tenant if tenant in self._stats else OTHER_TENANT

    def stats_of(self, tenant: str) -> TenantStats:
        return self._stats.get(tenant, self._other)

    def queue_wait(self, tenant: str) -> Series:
        return self._waits.get(tenant, self._other_wait)
