"""The simulator's rate limits: one token bucket per limit, as the providers document theirs."""

from __future__ import annotations

import math


class TokenBucket:
    """One rate limit as a token bucket: at most `capacity`, refilled continuously at
    `rate_per_s`, full at the start (a fresh API key has its whole budget)."""

    def __init__(self) -> None:
        self.capacity = 0.0
        self.rate_per_s = 0.0
        self.level = 0.0
        self.at_s: float | None = None

    def configure(self, count: int, window_s: float, now_s: float) -> None:
        """Take the limit (`count` per `window_s`) and refill up to `now_s`."""
        capacity, rate_per_s = float(count), count / window_s if window_s > 0 else 0.0
        if self.at_s is None or self.capacity <= 0:
            self.level = capacity
        elif rate_per_s > 0:
            self.level = min(self.level + (now_s - self.at_s) * self.rate_per_s, capacity)
        self.capacity, self.rate_per_s, self.at_s = capacity, rate_per_s, now_s

    def holds(self, amount: float) -> bool:
        """True if `amount` can be taken now (float rounding of the refill forgiven)."""
        return self.level >= amount - 1e-9

    def wait_for_s(self, amount: float) -> float:
        """Seconds until the bucket holds `amount`."""
        return max(0.0, (amount - self.level) / self.rate_per_s) if self.rate_per_s > 0 else math.inf

    def full_in_s(self) -> float:
        """Seconds until the bucket is full again (the providers' "reset")."""
        return self.wait_for_s(self.capacity)

    def take(self, amount: float) -> None:
        """Count an admitted request."""
        self.level -= amount
