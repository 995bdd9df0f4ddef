"""This instance's share of a quota as token buckets, one per figure (`QuotaBucket`).

Each figure's bucket refills continuously at this instance's share of the figure and holds
at most `burst_s` of it. A request is admitted when every bucket holds its cost
(`wait_s` is 0.0): it takes one request and its estimated input tokens plus its `max_tokens`
(`reserve`), and when it ends it settles to what it used (`settle`): what it reserved and did
not use comes back. Over any stretch of time the requests and tokens taken (net of what came
back) are at most one bucket's fill plus the share's rate over that stretch, so instances whose
shares add up to the quota stay within it together.

A cost larger than a bucket goes when that bucket is full and leaves it below zero: it is paid
back at the share's rate before anything else goes, so the rate still holds. A bucket starts
full (a new instance's first request goes at once, at the floor's share).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from consumer.core.quota.figures import QuotaCost, QuotaFigures, QuotaKind

__all__ = ["BURST_S", "QuotaBucket", "Reservation"]

#: a bucket holds this many seconds of its share: enough for requests to go back to back at
#: the share's rate, little enough that a share's burst stays well inside the provider's own
#: bucket (which holds a minute of the figure at OpenAI and Anthropic)
BURST_S = 1.0
#: float rounding of the refill must not make a waiter wait 1e-17 s forever
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one admitted request took of each figure, in the bucket's figure order."""

    cost: QuotaCost
    taken: tuple[float, ...]


class _Figure:
    """One figure's token bucket."""

    __slots__ = ("capacity", "kind", "level", "level_s", "quota_per_s", "rate_per_s")

    def __init__(
        self, kind: QuotaKind, quota_per_s: float, fraction: float, burst_s: float, now_s: float
    ) -> None:
        self.kind = kind
        self.quota_per_s = quota_per_s
        self.rate_per_s = quota_per_s * fraction
        self.capacity = self.rate_per_s * burst_s
        self.level = self.capacity
        self.level_s = now_s

    def refill(self, now_s: float) -> None:
        if now_s > self.level_s:
            self.level = min(self.capacity, self.level + self.rate_per_s * (now_s - self.level_s))
            self.level_s = now_s

    def wait_s(self, amount: float, now_s: float) -> float:
        # a cost above the bucket waits for a full bucket (and leaves it below zero)
        need = min(amount, self.capacity)
        level = self.level
        if now_s > self.level_s:
            level = min(self.capacity, level + self.rate_per_s * (now_s - self.level_s))
        if level >= need - _EPSILON:
            return 0.0
        if self.rate_per_s <= 0.0:
            return float("inf")
        return (need - level) / self.rate_per_s


class QuotaBucket:
    """This instance's share (`fraction`) of `figures`, as one token bucket per figure."""

    def __init__(
        self, figures: QuotaFigures, *, fraction: float, now_s: float, burst_s: float = BURST_S
    ) -> None:
        self._burst_s = burst_s
        self._figures = tuple(
            _Figure(kind, per_s, fraction, burst_s, now_s) for kind, per_s in figures.per_second().items()
        )
        self._fraction = fraction
        #: tokens reserved by admitted requests that have not settled yet
        self.reserved_tokens = 0.0

    @property
    def fraction(self) -> float:
        """This instance's share of the quota (the same fraction of every figure)."""
        return self._fraction

    def rates_per_s(self) -> dict[QuotaKind, float]:
        """This instance's share of each figure, per second."""
        return {f.kind: f.rate_per_s for f in self._figures}

    def set_fraction(self, fraction: float, now_s: float) -> None:
        """Take `fraction` of the quota from now on: what refilled until now at the old rate
        stays (up to the new bucket size); from now it refills at the new rate."""
        self._fraction = fraction
        for f in self._figures:
            f.refill(now_s)
            f.rate_per_s = f.quota_per_s * fraction
            f.capacity = f.rate_per_s * self._burst_s
            f.level = min(f.level, f.capacity)

    def wait_s(self, cost: QuotaCost, now_s: float) -> float:
        """Seconds until every bucket holds `cost` (0.0: admit now)."""
        wait = 0.0
        for f in self._figures:
            wait = max(wait, f.wait_s(cost.amount(f.kind), now_s))
        return wait

    def reserve(self, cost: QuotaCost, now_s: float) -> Reservation:
        """Take `cost` from every bucket (the caller asked `wait_s` first)."""
        taken = []
        for f in self._figures:
            amount = cost.amount(f.kind)
            f.refill(now_s)
            f.level -= amount
            taken.append(amount)
        self.reserved_tokens += cost.input_tokens + cost.output_tokens
        return Reservation(cost, tuple(taken))

    def settle(self, reservation: Reservation, used: QuotaCost, now_s: float) -> bool:
        """The request of `reservation` ended having used `used`: what it took and did not use
        comes back (up to each bucket's size), what it used beyond that is taken now. True
        when something came back (waiters may fit now)."""
        self.reserved_tokens = max(
            0.0, self.reserved_tokens - reservation.cost.input_tokens - reservation.cost.output_tokens
        )
        returned = False
        for f, taken in zip(self._figures, reservation.taken, strict=True):
            back = taken - used.amount(f.kind)
            if back == 0.0:
                continue
            f.refill(now_s)
            f.level = min(f.capacity, f.level + back)
            returned = returned or back > 0.0
        return returned

    def levels(self, now_s: float) -> Mapping[QuotaKind, float]:
        """What each bucket holds at now_s (below zero: paying back a large cost)."""
        out = {}
        for f in self._figures:
            f.refill(now_s)
            out[f.kind] = f.level
        return out
