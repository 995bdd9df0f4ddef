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
    TenantTopics,
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
    topics: list[str] | None = Field(
        None,
        min_length=1,
        description="job topics bound to it (each a lane's topic, the jobs topic without lanes, or a "
        "source's topic): their jobs are its own, a job there claiming another tenant and a job "
        "claiming it elsewhere are dead letters tenant_mismatch; unset: the job's field or header "
        "says (docs/tenants.md#bound-tenants)",
    )
    results_topic: str | None = Field(
        None, min_length=1, description="where its results go; unset: PROMPTBUS_RESULTS_TOPIC"
    )
    dead_letter_topic: str | None = Field(
        None, min_length=1, description="where its dead letters go; unset: PROMPTBUS_DLQ_TOPIC"
    )

    def policy(self, name: str) -> TenantPolicy:
        """The core's value object of this tenant."""
        budget = self.budget or TenantBudgetConfig()
        return TenantPolicy(name, self.weight, budget.usd_per_day, budget.tokens_per_day, self.on_exhausted)


def tenants_problem(tenants: Mapping[str, TenantConfig]) -> tuple[str, str] | None:
    """(dotted key, reason) of a tenant the section cannot name, or of a topic bound to two
    tenants; None when nothing is wrong."""
    owners: dict[str, str] = {}
    for name, tenant in tenants.items():
        problem = tenant_problem(name)
        if problem is not None:
            return "tenants", f"tenant name {name[:70]!r} {problem}"
        if name in RESERVED_TENANTS:
            return (
                f"tenants.{name}",
                f"'{OTHER_TENANT}' is the account of every tenant the file does not name; "
                f"give their policy as '{DEFAULT_TENANT}'",
            )
        if name == DEFAULT_TENANT:
            for key in ("topics", "results_topic", "dead_letter_topic"):
                if getattr(tenant, key) is not None:
                    return (
                        f"tenants.{DEFAULT_TENANT}.{key}",
                        f"'{DEFAULT_TENANT}' is every unbound tenant's: its topics are the service's "
                        "(PROMPTBUS_JOBS_TOPIC, PROMPTBUS_RESULTS_TOPIC, PROMPTBUS_DLQ_TOPIC)",
                    )
        for i, topic in enumerate(tenant.topics or ()):
            other = owners.setdefault(topic, name)
            if other != name:
                return f"tenants.{name}.topics.{i}", f"topic {topic!r} is bound to tenant {other!r} too"
    return None


def tenant_topics(
    tenants: Mapping[str, TenantConfig] | None, results_topic: str, dead_letter_topic: str
) -> TenantTopics:
    """The tenants' bound job topics and their outputs (the service's topics for the rest)."""
    tenants = tenants or {}
    return TenantTopics(
        results_topic,
        dead_letter_topic,
        bound={name: tuple(t.topics) for name, t in tenants.items() if t.topics},
        outputs={name: (t.results_topic, t.dead_letter_topic) for name, t in tenants.items()},
    )


def tenant_policies(tenants: Mapping[str, TenantConfig] | None) -> TenantPolicies:
    """The service's tenant policies (every tenant weight 1 and unlimited without a section)."""
    return TenantPolicies({name: t.policy(name) for name, t in (tenants or {}).items()})
