"""Tenants: who a job belongs to, and what the tier file's `tenants` section says of them
(docs/tenants.md).

A job's tenant is its `tenant` field; when it has none, its record's `promptbus-tenant`
header; when neither, `default`. A tenant name is 1-64 characters of `A-Z a-z 0-9 . _ -`;
anything else in the field or the header makes the job an `invalid_job`.

The tier file names tenants with a weight (their fair share of a lane's slots), a daily budget
(USD and/or tokens) and what happens once it is spent (`on_exhausted`: hold their jobs until the
next UTC day, or dead-letter them `budget_exhausted`). `tenants.default` is the policy of jobs
without a tenant and of every tenant the file does not name.

Accounts: what budgets and counters are kept per. A named tenant is its own account; jobs
without a tenant are the `default` account; every tenant the file does not name shares the one
account `other` (with `default`'s policy), so a producer cannot escape a budget by inventing
names, and metrics have one label value per named tenant. Fair share is per tenant name, each
unnamed tenant at `default`'s weight: one unnamed tenant's backlog never goes ahead of
another's either.

Bound tenants (`TenantTopics`): a tenant the tier file binds to job topics (`topics`) owns every
job read from them, whatever the job claims; a job there that claims another tenant, and a job
that claims a bound tenant from a topic not bound to it, is a `tenant_mismatch` dead letter. Who
may write a topic is what Kafka's ACLs decide, so a bound tenant is as safe as its topics'
ACLs. A tenant may have its own results and dead-letter topics (unset: the service's); its
outcomes go there and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "DEFAULT_TENANT",
    "OTHER_TENANT",
    "RESERVED_TENANTS",
    "TENANT_HEADER",
    "TENANT_PATTERN",
    "OnExhausted",
    "TenantPolicies",
    "TenantPolicy",
    "TenantTopics",
    "tenant_problem",
]

#: the tenant of a job that names none (and the policy of tenants the tier file does not name)
DEFAULT_TENANT = "default"
#: the account, and the metrics label, of every tenant the tier file does not name
OTHER_TENANT = "other"
#: names the tier file cannot give a tenant of its own (`other` is the unnamed tenants' account)
RESERVED_TENANTS = frozenset({OTHER_TENANT})
#: the record header a producer may name a job's tenant in (the job's `tenant` field wins)
TENANT_HEADER = "promptbus-tenant"
#: what a tenant name is
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
_TENANT_RE = re.compile(TENANT_PATTERN)

OnExhausted = Literal["hold", "dead_letter"]


def tenant_problem(value: object) -> str | None:
    """Why `value` is not a tenant name (None: it is one); never echoes the value."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    # fullmatch: `$` alone would also match before a trailing newline, which the Job field's
    # pattern (pydantic's regex) refuses; a header and a job field must be read alike
    if _TENANT_RE.fullmatch(value) is None:
        return f"must be 1-64 characters of A-Z a-z 0-9 . _ - (got {len(value)} characters)"
    return None


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One account's policy.

    name: the account (a named tenant, `default` or `other`); weight: its fair share of a
    lane's slots against the other tenants with work (> 0); usd_per_day, tokens_per_day: its
    daily budgets (None: unlimited); on_exhausted: `hold` its jobs until the budget allows
    them, or `dead_letter` them `budget_exhausted`.
    """

    name: str
    weight: float = 1.0
    usd_per_day: float | None = None
    tokens_per_day: int | None = None
    on_exhausted: OnExhausted = "hold"

    @property
    def budgeted(self) -> bool:
        """True when some daily budget limits it."""
        return self.usd_per_day is not None or self.tokens_per_day is not None


class TenantPolicies:
    """The tier file's tenants: each named tenant's policy, `default`'s for the rest.

    `account(tenant)` is cheap (one dict lookup): it runs per request and per answer.
    """

    def __init__(self, named: Mapping[str, TenantPolicy] | None = None) -> None:
        named = dict(named or {})
        default = named.get(DEFAULT_TENANT) or TenantPolicy(DEFAULT_TENANT)
        self._policies: dict[str, TenantPolicy] = {**named, DEFAULT_TENANT: default}
        self._other = replace(default, name=OTHER_TENANT)
        #: every account, named ones first, then default and other
        self.accounts: tuple[str, ...] = (
            *(n for n in named if n != DEFAULT_TENANT),
            DEFAULT_TENANT,
            OTHER_TENANT,
        )
        self._by_account = {**self._policies, OTHER_TENANT: self._other}

    def account(self, tenant: str) -> str:
        """The account `tenant` is counted in: itself when named (or `default`), else `other`."""
        return tenant if tenant in self._policies else OTHER_TENANT

    def policy(self, tenant: str) -> TenantPolicy:
        """The policy of `tenant` (a tenant or an account name)."""
        found = self._policies.get(tenant)
        return found if found is not None else self._other

    def weight(self, tenant: str) -> float:
        """The fair-share weight of `tenant`."""
        return self.policy(tenant).weight

    @property
    def budgeted(self) -> tuple[TenantPolicy, ...]:
        """The accounts some daily budget limits."""
        return tuple(p for a in self.accounts if (p := self._by_account[a]).budgeted)


class TenantTopics:
    """Which tenant each bound job topic belongs to, and where each tenant's outcomes go.

    bound: tenant -> the job topics bound to it (a topic is bound to one tenant at most);
    outputs: tenant -> (its results topic, its dead-letter topic), None for the service's;
    results_topic, dead_letter_topic: the service's, every other tenant's.
    `claim`, `results_of` and `dead_letters_of` are one dict lookup each: they run per job.
    """

    def __init__(
        self,
        results_topic: str,
        dead_letter_topic: str,
        *,
        bound: Mapping[str, Sequence[str]] | None = None,
        outputs: Mapping[str, tuple[str | None, str | None]] | None = None,
    ) -> None:
        self.results_topic = results_topic
        self.dead_letter_topic = dead_letter_topic
        #: job topic -> its tenant
        self._owner = {topic: tenant for tenant, topics in (bound or {}).items() for topic in topics}
        self._bound_tenants = frozenset(self._owner.values())
        outputs = outputs or {}
        self._results = {t: r for t, (r, _) in outputs.items() if r is not None}
        self._dead_letters = {t: d for t, (_, d) in outputs.items() if d is not None}

    def owner(self, topic: str) -> str | None:
        """The tenant `topic` is bound to (None: it is bound to none)."""
        return self._owner.get(topic)

    def claim(self, topic: str, claimed: str | None) -> tuple[str, str | None]:
        """(the tenant of a job read from `topic` claiming `claimed` (None: it names none), why
        the claim is a `tenant_mismatch` (None: it is not)). A bound topic's job is its owner's
        whatever it claims; an unbound topic's job claiming a bound tenant is `default`'s."""
        owner = self._owner.get(topic)
        if owner is not None:
            if claimed is None or claimed == owner:
                return owner, None
            return owner, f"topic {topic!r} is bound to tenant {owner!r}; the job claims tenant {claimed!r}"
        if claimed is None:
            return DEFAULT_TENANT, None
        if claimed in self._bound_tenants:
            return DEFAULT_TENANT, (
                f"tenant {claimed!r} is bound to its own topics; topic {topic!r} is not one of them"
            )
        return claimed, None

    def results_of(self, tenant: str) -> str:
        """The topic `tenant`'s results go to."""
        return self._results.get(tenant, self.results_topic)

    def dead_letters_of(self, tenant: str | None) -> str:
        """The topic `tenant`'s dead letters go to (None: a record whose tenant is unknown)."""
        if tenant is None:
            return self.dead_letter_topic
        return self._dead_letters.get(tenant, self.dead_letter_topic)

    @property
    def output_topics(self) -> tuple[str, ...]:
        """Every results and dead-letter topic, the service's first."""
        return tuple(dict.fromkeys((*self.own_results_topics, *self.own_dead_letter_topics)))

    @property
    def own_results_topics(self) -> tuple[str, ...]:
        """Every results topic (the service's first)."""
        return tuple(dict.fromkeys((self.results_topic, *self._results.values())))

    @property
    def own_dead_letter_topics(self) -> tuple[str, ...]:
        """Every dead-letter topic (the service's first)."""
        return tuple(dict.fromkeys((self.dead_letter_topic, *self._dead_letters.values())))
