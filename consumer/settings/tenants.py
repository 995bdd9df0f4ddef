"""The tier file's `tenants` section: one `TenantConfig` per named tenant, and the core's
`TenantPolicies` made from them (`consumer.core.tenants`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from consumer.core.tenants import (
    DEFAULT_TENANT,
    OTHER_TENANT,
    RESERVED_TENANTS,
    TenantPolicies,
    TenantPolicy,
    tenant_problem,
)
from consumer.settings.base import StrictModel


class TenantBudgetConfig(StrictModel):
    """A tenant's daily budgets (per UTC day, shared by every instance of the group)."""

    usd_per_day: float | None = Field(
        None,
        gt=0,
        description="USD a day at the tiers' pricing (a tier without pricing counts 0); null: no USD cap",
    )
    tokens_per_day: int | None = Field(
        None, gt=0, description="input + output tokens a day; null: no token cap"
    )


class TenantConfig(StrictModel):
    """One tenant of the tier file: its fair share, its daily budget and what happens past it."""

    weight: float = Field(
        1.0, gt=0, description="its share of a lane's slots against the other tenants with work"
    )
    budget: TenantBudgetConfig | None = Field(None, description="daily budgets; null: unlimited")
    on_exhausted: Literal["hold", "dead_letter"] = Field(
        "hold",
        description="budget spent: hold its jobs until the next UTC day (or a larger budget), or "
        "dead-letter them budget_exhausted",
    )

    def policy(self, name: str) -> TenantPolicy:
        """The core's value object of this tenant."""
        budget = self.budget or TenantBudgetConfig()
        return TenantPolicy(name, self.weight, budget.usd_per_day, budget.tokens_per_day, self.on_exhausted)


def tenants_problem(tenants: Mapping[str, TenantConfig]) -> tuple[str, str] | None:
    """(dotted key, reason) of a tenant the section cannot name; None when nothing is wrong."""
    for name in tenants:
        problem = tenant_problem(name)
        if problem is not None:
            return "tenants", f"tenant name {name[:70]!r} {problem}"
        if name in RESERVED_TENANTS:
            return (
                f"tenants.{name}",
                f"'{OTHER_TENANT}' is the account of every tenant the file does not name; "
                f"give their policy as '{DEFAULT_TENANT}'",
            )
    return None


def tenant_policies(tenants: Mapping[str, TenantConfig] | None) -> TenantPolicies:
    """The service's tenant policies (every tenant weight 1 and unlimited without a section)."""
    return TenantPolicies({name: t.policy(name) for name, t in (tenants or {}).items()})
