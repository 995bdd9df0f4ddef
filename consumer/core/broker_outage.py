"""Broker outage bookkeeping: connection failures and successes in, one decision per edge out.

A client that loses its brokers fails every reconnect (aiokafka retries every ~100 ms and
logs each failure). `OutageTracker` turns that stream into two decisions per outage:
`BrokersUnreachable` at the first failure and `BrokersReachable` when the brokers answer
again. It is pure: the caller passes `now_s` (a monotonic clock) and performs the decisions
(logging them); nothing here sleeps or logs.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a success closes an outage only when no failure came for this long: a broker that accepts
#: one connection while it starts and drops the next is still the same outage
DEFAULT_SETTLE_S = 2.0


@dataclass(frozen=True)
class BrokersUnreachable:
    """The first failure of an outage: announce it once."""

    #: what failed first, as the client said it (never holds a credential)
    reason: str
    #: when the outage began (the caller's clock)
    since_s: float


@dataclass(frozen=True)
class BrokersReachable:
    """A success that closes an outage: announce the recovery once."""

    #: from the first failure to this success
    down_s: float
    #: failures seen during the outage, the first included
    failures: int


class OutageTracker:
    """Whether the brokers are reachable, from failures and successes reported in time order.

    Rules:

    1. While up, a failure opens an outage and returns `BrokersUnreachable` with its reason.
    2. While down, a failure returns nothing; it only moves the time of the last failure.
    3. While down, a success returns `BrokersReachable` when at least `settle_s` passed since
       the last failure, and nothing otherwise (the outage is not over yet).
    4. While up, a success returns nothing.
    """

    def __init__(self, settle_s: float = DEFAULT_SETTLE_S) -> None:
        if settle_s < 0:
            raise ValueError("settle_s must be >= 0")
        self.settle_s = settle_s
        self._since_s: float | None = None
        self._last_failure_s = 0.0
        self._failures = 0

    @property
    def down(self) -> bool:
        """True from the first failure of an outage until the success that closes it."""
        return self._since_s is not None

    def failure(self, now_s: float, reason: str) -> BrokersUnreachable | None:
        """A connection to a broker failed at `now_s`; the decision to announce, if any."""
        self._last_failure_s = now_s
        self._failures += 1
        if self._since_s is not None:
            return None
        self._since_s = now_s
        self._failures = 1
        return BrokersUnreachable(reason=reason, since_s=now_s)

    def success(self, now_s: float) -> BrokersReachable | None:
        """A broker answered at `now_s`; the decision to announce, if any."""
        if self._since_s is None or now_s - self._last_failure_s < self.settle_s:
            return None
        verdict = BrokersReachable(down_s=max(0.0, now_s - self._since_s), failures=self._failures)
        self._since_s = None
        self._failures = 0
        return verdict
