"""Fallback tiers: when a tier cannot answer, a second one does (pure decisions).

A tier's `fallback: {tier, after_s, on}` names the tier that answers its jobs while it is in
trouble of a kind listed in `on`:

- `outage`: its circuit (`core/circuit.py`) has been open at least `after_s`;
- `quota_exhausted`: its provider said the quota is spent, and the quota's cool-down since
  that answer has not passed (`QuotaWatch`); the first answer after it ends the trouble.

While that lasts, its held jobs and its new ones go down the chain to the first tier that
is not in trouble itself and can take the job (`fallback_tier`); none: the job stays, held
as it would be without a fallback. A job that says `fallback: false` always stays. When
the tier is back (its circuit closes, its quota answers), new jobs go to it again; jobs
already moved are answered where they went.

`chain_problem` is what the tier file's validation refuses: a fallback to an unknown tier,
and a chain that comes back to a tier already on it (a cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "FallbackCause",
    "FallbackRule",
    "QuotaWatch",
    "TierCondition",
    "chain_problem",
    "fallback_cause",
    "fallback_tier",
]


class FallbackCause(StrEnum):
    OUTAGE = "outage"
    QUOTA_EXHAUSTED = "quota_exhausted"


@dataclass(frozen=True, slots=True)
class FallbackRule:
    """A tier's `fallback`: the tier that answers instead, after how long an outage, on what."""

    tier: str
    after_s: float = 30.0
    on: frozenset[FallbackCause] = frozenset(FallbackCause)


@dataclass(frozen=True, slots=True)
class TierCondition:
    """What a tier's own answers say now: circuit_open for outage_s seconds, quota_exhausted."""

    circuit_open: bool = False
    outage_s: float = 0.0
    quota_exhausted: bool = False

    @property
    def troubled(self) -> bool:
        """True when the tier cannot be expected to answer now."""
        return self.circuit_open or self.quota_exhausted


class QuotaWatch:
    """One tier's quota: exhausted from a quota answer until `cooldown_s` later, or until
    the provider answers a request again, whichever comes first."""

    def __init__(self) -> None:
        self._until_s: float | None = None
        #: how often the provider said the quota is exhausted
        self.exhausted_count = 0

    def on_exhausted(self, now_s: float, cooldown_s: float) -> None:
        self.exhausted_count += 1
        self._until_s = now_s + max(cooldown_s, 0.0)

    def on_answer(self) -> None:
        self._until_s = None

    def exhausted(self, now_s: float) -> bool:
        return self._until_s is not None and now_s < self._until_s

    def left_s(self, now_s: float) -> float:
        """Seconds until the cool-down ends (0.0: not exhausted)."""
        return max(0.0, self._until_s - now_s) if self._until_s is not None else 0.0


def fallback_cause(rule: FallbackRule, condition: TierCondition) -> FallbackCause | None:
    """Why the rule's tier is to hand its jobs on now (None: it is not)."""
    if (
        FallbackCause.OUTAGE in rule.on
        and condition.circuit_open
        and condition.outage_s >= rule.after_s
    ):
        return FallbackCause.OUTAGE
    if FallbackCause.QUOTA_EXHAUSTED in rule.on and condition.quota_exhausted:
        return FallbackCause.QUOTA_EXHAUSTED
    return None


def fallback_tier(
    name: str,
    rules: Mapping[str, FallbackRule | None],
    conditions: Mapping[str, TierCondition],
    *,
    accepts: Callable[[str], bool] = lambda tier: True,
) -> str | None:
    """The tier that is to answer a job of tier `name` now instead of it; None: `name`
    answers (it is not in trouble its rule names, or no tier down its chain is free of
    trouble and `accepts` the job)."""
    rule = rules.get(name)
    if rule is None or fallback_cause(rule, conditions.get(name, TierCondition())) is None:
        return None
    seen = {name}
    while rule is not None and rule.tier not in seen:
        candidate = rule.tier
        seen.add(candidate)
        if accepts(candidate) and not conditions.get(candidate, TierCondition()).troubled:
            return candidate
        rule = rules.get(candidate)
    return None


def chain_problem(rules: Mapping[str, FallbackRule | None]) -> tuple[str, str] | None:
    """The first tier whose fallback is wrong and why: (tier, message), or None. Wrong: it
    names a tier that is not configured, or its chain comes back to a tier on it."""
    for name in rules:
        rule = rules[name]
        if rule is None:
            continue
        if rule.tier not in rules:
            known = ", ".join(sorted(rules))
            return name, f"fallback tier '{rule.tier}' is not configured (known: {known})"
    for name in rules:
        path = [name]
        rule = rules[name]
        while rule is not None:
            if rule.tier in path:
                cycle = " -> ".join([*path[path.index(rule.tier):], rule.tier])
                return name, f"fallback cycle: {cycle}"
            path.append(rule.tier)
            rule = rules[rule.tier]
    return None
