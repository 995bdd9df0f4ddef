"""Per-tier circuit breaker: a provider that is down holds work instead of failing it.

States and rules (pure: every method takes `now_s`; nothing sleeps):

- CLOSED: requests flow. Each outage failure (a connection error, a timeout, a 5xx or an
  overloaded answer: `is_outage`) adds one to a run; any answer from the provider, an error
  that belongs to one request included (a 400, a malformed body), ends the run. A run of
  `failures` outage failures opens the circuit.
- OPEN: no request is sent. After `probe_s` one request may go as the probe (`admit` grants
  it to exactly one caller); while it is out nobody else is admitted. The probe answered:
  CLOSED. The probe met the outage too: OPEN again, the wait doubled up to `probe_max_s`.
- While the circuit is open, a request that met the outage is held: the caller sends it
  again once admitted, and the failure does not count against its attempts
  (`holds(error)`); no job is dead-lettered because of the outage. `outage_s(now)` is how
  long the provider has been unreachable (since the circuit opened), for `retry.max_outage_s`.

An outage of connections refused (`listing_probes`) is probed by the caller's cheap request
(the provider's model listing) on the circuit's own timer; any other outage by one request.

`admit` answers SEND (closed), PROBE (this caller is the probe) or WAIT (with how long until
the next probe could go; a probe already out answers WAIT with the current wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from consumer.core.errors import ConnectionFailed, Overloaded, ProviderError, RequestTimeout, ServerError

__all__ = ["Admit", "CircuitBreaker", "CircuitState", "is_outage"]

#: error classes that say the provider is unreachable or down, not that one request is wrong
OUTAGE_ERRORS: tuple[type[ProviderError], ...] = (ConnectionFailed, RequestTimeout, ServerError, Overloaded)


def is_outage(error: ProviderError) -> bool:
    """True for an error that says the provider is down or unreachable (see OUTAGE_ERRORS)."""
    return isinstance(error, OUTAGE_ERRORS)


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"


class Admit(StrEnum):
    SEND = "send"
    PROBE = "probe"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of state the caller reports once: `opened` (with the error) or `closed`."""

    opened: bool
    error: ProviderError | None = None
    outage_s: float = 0.0


class CircuitBreaker:
    """One tier's circuit. failures: the run that opens it; probe_s / probe_max_s: the first
    and the largest wait before a probe."""

    def __init__(self, *, failures: int = 5, probe_s: float = 1.0, probe_max_s: float = 30.0) -> None:
        if failures < 1 or probe_s <= 0 or probe_max_s < probe_s:
            raise ValueError("failures >= 1 and 0 < probe_s <= probe_max_s")
        self.failures = failures
        self.probe_s = probe_s
        self.probe_max_s = probe_max_s
        self.state = CircuitState.CLOSED
        self._run = 0
        self._opened_s = 0.0
        self._wait_s = probe_s
        self._next_probe_s = 0.0
        self._probe_out = False
        #: how often the circuit opened
        self.opened_count = 0
        self.last_error: ProviderError | None = None

    @property
    def open(self) -> bool:
        return self.state is CircuitState.OPEN

    def admit(self, now_s: float) -> tuple[Admit, float]:
        """May a request go now? (SEND | PROBE | WAIT, seconds to wait when WAIT)."""
        if self.state is CircuitState.CLOSED:
            return Admit.SEND, 0.0
        if self._probe_out:
            return Admit.WAIT, self._wait_s
        if now_s >= self._next_probe_s:
            self._probe_out = True
            return Admit.PROBE, 0.0
        return Admit.WAIT, self._next_probe_s - now_s

    def on_answer(self, now_s: float) -> Transition | None:
        """The provider answered (any answer, an error that belongs to the request included)."""
        self._run = 0
        self._probe_out = False
        if self.state is CircuitState.CLOSED:
            return None
        outage_s = now_s - self._opened_s
        self.state = CircuitState.CLOSED
        self._wait_s = self.probe_s
        return Transition(opened=False, outage_s=outage_s)

    def on_outage(self, error: ProviderError, now_s: float, *, probe: bool = False) -> Transition | None:
        """A request met an outage error (`is_outage`). probe: it was the probe."""
        self.last_error = error
        if self.state is CircuitState.OPEN:
            if probe:
                self._probe_out = False
                self._wait_s = min(self._wait_s * 2, self.probe_max_s)
                self._next_probe_s = now_s + self._wait_s
            return None
        self._run += 1
        if self._run < self.failures:
            return None
        self.state = CircuitState.OPEN
        self.opened_count += 1
        self._opened_s = now_s
        self._wait_s = self.probe_s
        self._next_probe_s = now_s + self.probe_s
        self._probe_out = False
        return Transition(opened=True, error=error)

    def holds(self, error: ProviderError) -> bool:
        """True when a request that failed with `error` is to be held and sent again later
        rather than counted as an attempt: the error is an outage and the circuit is open."""
        return self.state is CircuitState.OPEN and is_outage(error)

    def probe_due(self, now_s: float) -> bool:
        """True while open with no probe out and the wait before the next one over (what
        `admit` would grant as PROBE), without granting it."""
        return self.state is CircuitState.OPEN and not self._probe_out and now_s >= self._next_probe_s

    @property
    def listing_probes(self) -> bool:
        """True when the outage is connections refused (`ConnectionFailed`): a cheap request
        (the provider's model listing) fails the same way, so it may be the probe; an outage the
        server answered itself (5xx, overloaded, a timeout) is probed by a real request."""
        return isinstance(self.last_error, ConnectionFailed)

    def probe_wait_s(self, now_s: float) -> float:
        """Seconds until a probe may go (0.0: due now; the current wait while one is out)."""
        if self.state is CircuitState.CLOSED:
            return 0.0
        if self._probe_out:
            return self._wait_s
        return max(0.0, self._next_probe_s - now_s)

    def probe_abandoned(self) -> None:
        """The probe was granted but not sent (its members ended meanwhile): another may go."""
        self._probe_out = False

    def outage_s(self, now_s: float) -> float:
        """Seconds since the circuit opened (0 while closed)."""
        return now_s - self._opened_s if self.state is CircuitState.OPEN else 0.0
