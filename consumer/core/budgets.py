"""Tenants' daily budgets: what each account may still spend today (pure bookkeeping).

Every instance of the group spends from the same budget, so what one instance may spend is
recorded where all of them read it (the group's board: one record per instance, the latest
kept). A SIGKILLed instance must never leave its spend recorded too low, so spending goes by
*leases*:

1. A request's cost is estimated before it goes (its prompt tokens and `max_tokens` at the
   tier's pricing) and *reserved* from this instance's leases (`try_reserve`).
2. When the leases do not hold the estimate, the instance claims a new lease (`LeaseWanted`):
   a slice of what the group has not claimed yet (the budget less every instance's claims
   today), at least the estimate. The lease counts only once its record is on the board
   (`claimed`): a crash loses the unspent part of a lease, never records spend too low. The
   board orders every instance's claims; a lease is granted only as far as the budget less
   the claims written before it allows, so two instances claiming at once cannot both take
   the same slice.
3. The answer's usage *settles* the reservation (`settle`): the estimate is returned and the
   actual cost spent; a request never sent gives its estimate back (`release`).
4. When the group has nothing left to claim for an estimate, the account is exhausted
   (`Exhausted`) until the next UTC day, or until budget comes free (an estimate larger than
   what it cost, an instance stopping and giving its unspent lease back).

An account's spend today is what every instance claimed (its own: settled plus reserved, and
the unspent rest of its leases). Overspending is bounded by the estimates' error of the
requests in flight: a request whose usage comes out above its estimate (a prompt of more
tokens than 4 characters each) spends more than its lease held. A day is a UTC day; a record
of an earlier day counts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from consumer.core.tenants import TenantPolicies, TenantPolicy

__all__ = [
    "LEASE_FRACTION",
    "LEASE_REQUESTS",
    "ZERO",
    "BudgetBook",
    "Cost",
    "Exhausted",
    "LeaseWanted",
    "Reservation",
    "next_utc_midnight_s",
    "utc_day",
]

#: a lease is at least this share of the day's budget ...
LEASE_FRACTION = 0.02
#: ... and at least this many requests of the estimate that asked for it (fewer board writes)
LEASE_REQUESTS = 4


def utc_day(epoch_s: float) -> str:
    """The UTC day of a Unix time, e.g. "2026-12-01": the span a daily budget covers."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d")


def next_utc_midnight_s(epoch_s: float) -> float:
    """The Unix time the UTC day of `epoch_s` ends."""
    return (math.floor(epoch_s / 86400.0) + 1) * 86400.0


@dataclass(frozen=True, slots=True)
class Cost:
    """What requests cost against a budget: US dollars and tokens (input + output)."""

    usd: float = 0.0
    tokens: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.usd + other.usd, self.tokens + other.tokens)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.usd - other.usd, self.tokens - other.tokens)

    def fits(self, room: Cost, policy: TenantPolicy) -> bool:
        """True when this cost is within `room` in every dimension `policy` caps."""
        usd_ok = policy.usd_per_day is None or self.usd <= room.usd + 1e-12
        return usd_ok and (policy.tokens_per_day is None or self.tokens <= room.tokens)


ZERO = Cost()


@dataclass(frozen=True, slots=True)
class Reservation:
    """An estimate held from an account's leases until its request is answered or dropped."""

    account: str
    day: str
    estimate: Cost


@dataclass(frozen=True, slots=True)
class LeaseWanted:
    """This instance's leases do not hold the estimate: claim `amount` on the board first."""

    account: str
    day: str
    amount: Cost


@dataclass(frozen=True, slots=True)
class Exhausted:
    """The group has nothing left to claim for the estimate today."""

    account: str
    day: str
    message: str


@dataclass(slots=True)
class _Account:
    policy: TenantPolicy
    #: leases this instance claimed today (on the board), reserved and settled out of them
    claimed: Cost = ZERO
    reserved: Cost = ZERO
    settled: Cost = ZERO
    #: every other instance's claims today, by instance
    others: dict[str, Cost] = field(default_factory=dict)
    #: the estimate last refused (None: none since the day began): while the room left is
    #: smaller, the account is exhausted and new jobs wait (or are dead-lettered) at once
    refused: Cost | None = None

    def budget(self) -> Cost:
        p = self.policy
        return Cost(
            p.usd_per_day if p.usd_per_day is not None else math.inf,
            p.tokens_per_day if p.tokens_per_day is not None else 2**62,
        )

    def group_claimed(self) -> Cost:
        total = self.claimed
        for cost in self.others.values():
            total += cost
        return total

    def unclaimed(self) -> Cost:
        """What no instance has claimed yet today."""
        return self.budget() - self.group_claimed()

    def spent(self) -> Cost:
        """The group's spend today as this instance knows it: every other instance's claims,
        and what this one settled and holds reserved (its unspent leases are not spent)."""
        total = self.settled + self.reserved
        for cost in self.others.values():
            total += cost
        return total


class BudgetBook:
    """The budgeted accounts' spend today, for one instance (`instance`: its board key)."""

    def __init__(self, policies: TenantPolicies, instance: str, *, now_s: float) -> None:
        """now_s: Unix time (a budget's day is a UTC day; every call takes the time)."""
        self._instance = instance
        self._accounts = {p.name: _Account(p) for p in policies.budgeted}
        self.day = utc_day(now_s)
        self._day_ends_s = next_utc_midnight_s(now_s)

    @property
    def accounts(self) -> tuple[str, ...]:
        """The accounts a budget limits."""
        return tuple(self._accounts)

    def budgeted(self, account: str) -> bool:
        return account in self._accounts

    def policy(self, account: str) -> TenantPolicy:
        return self._accounts[account].policy

    def exhausted(self, account: str, now_s: float) -> bool:
        """True while the room left (this instance's unspent leases and what no instance has
        claimed) is too small for the estimate last refused: the account's new jobs need not
        be estimated to know they cannot go now."""
        found = self._accounts.get(account)
        if found is None:
            return False
        self._roll(now_s)
        if found.refused is None:
            return False
        room = found.claimed - found.reserved - found.settled + found.unclaimed()
        return not found.refused.fits(room, found.policy)

    def try_reserve(
        self, account: str, estimate: Cost, now_s: float
    ) -> Reservation | LeaseWanted | Exhausted:
        """Hold `estimate` for one request of `account` (which must be budgeted)."""
        acct = self._accounts[account]
        self._roll(now_s)
        headroom = acct.claimed - acct.reserved - acct.settled
        if estimate.fits(headroom, acct.policy):
            acct.reserved += estimate
            return Reservation(account, self.day, estimate)
        need = Cost(max(estimate.usd - headroom.usd, 0.0), max(estimate.tokens - headroom.tokens, 0))
        free = acct.unclaimed()
        if not need.fits(free, acct.policy):
            acct.refused = estimate
            return Exhausted(account, self.day, self._exhausted_message(acct, self.day))
        return LeaseWanted(account, self.day, _lease(acct.policy, need, estimate, free))

    def claimed(self, lease: LeaseWanted, *, arbitrated: bool = False) -> Cost:
        """`lease` is on the board (this instance's record with it is acknowledged); what of it
        is granted. `arbitrated`: every other instance's claims written before it have been
        observed since, so it is granted only as far as the budget less all of theirs allows
        (without a board, nobody else claims: all of it)."""
        if self.day != lease.day:
            return ZERO
        acct = self._accounts[lease.account]
        granted = lease.amount
        if arbitrated:
            free = acct.unclaimed()
            granted = Cost(max(min(granted.usd, free.usd), 0.0), max(min(granted.tokens, free.tokens), 0))
        acct.claimed += granted
        return granted

    def settle(self, reservation: Reservation, actual: Cost) -> None:
        """The request was answered: its estimate is returned and `actual` spent (a request
        of a day that has ended is counted in no day's budget)."""
        acct = self._accounts[reservation.account]
        if self.day != reservation.day:
            return
        acct.reserved -= reservation.estimate
        acct.settled += actual

    def release(self, reservation: Reservation) -> None:
        """The request was not sent (or its provider refused it): its estimate is returned."""
        self.settle(reservation, ZERO)

    def observe(self, instance: str, record: Mapping[str, Any], now_s: float) -> None:
        """Another instance's latest board record (`record` as `record()` makes it)."""
        if instance == self._instance:
            return
        self._roll(now_s)
        day = record.get("day")
        accounts = record.get("accounts")
        if not isinstance(accounts, Mapping):
            return
        for name, acct in self._accounts.items():
            entry = accounts.get(name)
            if day != self.day or not isinstance(entry, Mapping):
                claimed = ZERO
            else:
                claimed = Cost(_number(entry.get("claimed_usd")), int(_number(entry.get("claimed_tokens"))))
            acct.others[instance] = claimed

    def record(self, now_s: float, *, final: bool = False) -> dict[str, Any]:
        """This instance's board record: its claims today per account (`final`: it stops, so
        its claims shrink to what it spent, and the unspent leases go back to the group)."""
        self._roll(now_s)
        accounts = {}
        for name, acct in self._accounts.items():
            claimed = acct.settled + acct.reserved if final else acct.claimed
            accounts[name] = {
                "claimed_usd": round(claimed.usd, 9),
                "claimed_tokens": claimed.tokens,
                "settled_usd": round(acct.settled.usd, 9),
                "settled_tokens": acct.settled.tokens,
            }
        return {"instance": self._instance, "day": self.day, "accounts": accounts}

    def exhausted_message(self, account: str, now_s: float) -> str:
        """Why the account's jobs cannot go today (a dead letter's message)."""
        self._roll(now_s)
        return self._exhausted_message(self._accounts[account], self.day)

    def spent(self, account: str, now_s: float) -> Cost:
        """The group's spend today, as this instance knows it."""
        self._roll(now_s)
        return self._accounts[account].spent()

    def remaining(self, account: str, now_s: float) -> Cost:
        """The account's budget less the group's spend today (never below 0)."""
        acct = self._accounts[account]
        left = acct.budget() - self.spent(account, now_s)
        return Cost(max(left.usd, 0.0), max(left.tokens, 0))

    def roll(self, now_s: float) -> bool:
        """Start a new UTC day when `now_s` is in one (True then): nothing is claimed, spent or
        refused yet. Every other call rolls too; the caller rolls to release held jobs."""
        return self._roll(now_s)

    def _roll(self, now_s: float) -> bool:
        if now_s < self._day_ends_s:
            return False
        self.day = utc_day(now_s)
        self._day_ends_s = next_utc_midnight_s(now_s)
        for acct in self._accounts.values():
            acct.claimed = acct.reserved = acct.settled = ZERO
            acct.others.clear()
            acct.refused = None
        return True

    @staticmethod
    def _exhausted_message(acct: _Account, day: str) -> str:
        """Spent, or not spent but too little left for the request last refused: each said as
        it is (a budget smaller than one request's estimate spends nothing at all)."""
        p, spent = acct.policy, acct.spent()
        # what the refusal measured against: this instance's unreserved leases and what no
        # instance has claimed (others' leases and the requests in flight are not free)
        left = acct.claimed - acct.reserved - acct.settled + acct.unclaimed()
        refused = acct.refused
        used = (p.usd_per_day is not None and left.usd <= 1e-12) or (
            p.tokens_per_day is not None and left.tokens <= 0
        )
        if refused is not None and not used:
            asked, room = [], []
            if p.tokens_per_day is not None:
                asked.append(f"{refused.tokens} tokens")
                room.append(f"{max(left.tokens, 0)} of {p.tokens_per_day} tokens")
            if p.usd_per_day is not None:
                asked.append(f"${refused.usd:.4f}")
                room.append(f"${max(left.usd, 0.0):.4f} of ${p.usd_per_day:g}")
            return (
                f"tenant '{p.name}': a request's estimate, {' / '.join(asked)}, is more than the daily "
                f"budget left ({' and '.join(room)} free on {day} UTC: what no request in flight "
                "and no other instance's lease holds; docs/tenants.md says how a request is estimated)"
            )
        parts = []
        if p.usd_per_day is not None:
            parts.append(f"${spent.usd:.4f} of ${p.usd_per_day:g}")
        if p.tokens_per_day is not None:
            parts.append(f"{spent.tokens} of {p.tokens_per_day} tokens")
        return (
            f"tenant '{p.name}' has spent its daily budget ({' and '.join(parts)} on {day} UTC, "
            "leases of every instance included)"
        )


def _lease(policy: TenantPolicy, need: Cost, estimate: Cost, free: Cost) -> Cost:
    """The lease to claim for `need`: at least LEASE_FRACTION of the day's budget and
    LEASE_REQUESTS estimates, at most what is free; nothing in a dimension without a cap."""
    usd, tokens = 0.0, 0
    if policy.usd_per_day is not None:
        usd = max(need.usd, estimate.usd * LEASE_REQUESTS, policy.usd_per_day * LEASE_FRACTION)
    if policy.tokens_per_day is not None:
        least = int(policy.tokens_per_day * LEASE_FRACTION)
        tokens = max(need.tokens, estimate.tokens * LEASE_REQUESTS, least)
    return Cost(min(free.usd, usd), min(free.tokens, tokens))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
