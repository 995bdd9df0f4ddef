"""Concurrency limit algorithms: how many provider requests a tier may have in flight.

Pure functions of samples, in the shape of Netflix/concurrency-limits: the async limiter in
`consumer.runtime` hands out permits and reports every finished request with
`update(rtt_ms, inflight, dropped, now_s)`; the algorithm returns the new limit.
`dropped` is the overload signal: a 429, 529, 503 or a timeout.

- `AIMDLimit`: additive increase, multiplicative decrease. For providers that say when they
  are overloaded (429/529): halve on a drop, +1 on a success while at least half the limit
  was in use (an idle limit proves nothing), always within min..max. Against a server that
  queues instead of refusing (a self-hosted vLLM or llama.cpp past its slots), latency is the
  only overload signal: it grows only while the latest RTT stays within `rtt_tolerance` of
  the lowest RTT measured since its last probe, and steps back down once per RTT while the
  smoothed RTT is beyond it (latency alone never below `initial`); the way Netflix's concurrency-limits
  combines AIMD with Vegas' no-load RTT. Every `probe_interval_s` it drops to that floor for
  a moment and measures the no-load RTT afresh (the server's queue drains), so a genuine
  change of it is learnt and queueing delay never is.
- `GradientLimit`: for local servers that never send 429, in the spirit of Netflix's
  Gradient2. It compares the short-term RTT with a baseline (slow long-term average,
  anchored by the lowest RTT since a periodic probe): when latency grows (queueing on the
  server), the gradient baseline/short drops below 1 and the limit shrinks; when latency
  is stable the limit grows by a queue allowance of sqrt(limit). Changes are smoothed. A
  drop counts as the steepest allowed gradient.
- `FixedLimit`: never changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

__all__ = [
    "AIMD_RTT_TOLERANCE",
    "DEFAULT_MAX_LIMIT",
    "LIMIT_REASONS",
    "QUEUEING_PROVIDERS",
    "AIMDLimit",
    "ConcurrencyLimit",
    "FixedLimit",
    "GradientLimit",
    "LimitReason",
    "limit_for",
]

#: why a limit is where it is. The algorithm's own: `growing` (answers come back with the limit
#: in use: it grows), `at_max` (it reached the tier's max), `latency` (answers slow down as
#: concurrency grows: the server queues), `overload` (429s, overloads or timeouts cut it; it
#: stays so until it has grown back to where the last cut was), `idle` (fewer requests than
#: half the limit: nothing to learn), `fixed`. The limiter's, on top (`consumer.runtime.limiter`):
#: `paused` (Retry-After or an exhausted quota), `paced` (the provider's announced budget holds
#: requests back), `quota_share` (this instance's share of a fleet quota does)
LimitReason = Literal[
    "growing", "at_max", "latency", "overload", "idle", "fixed", "paused", "paced", "quota_share"
]
LIMIT_REASONS: tuple[LimitReason, ...] = get_args(LimitReason)
#: a tier's highest limit unless it sets one: a hosted provider's quota needs its rate times
#: its answer time in flight (20 requests/s of answers taking 0.2-8 s: about 82), and a tier
#: that wants fewer sets `max`
DEFAULT_MAX_LIMIT = 256
#: the providers that may queue instead of refusing (self-hosted OpenAI-compatible servers):
#: only their tiers watch latency, until they announce a budget or answer 429
QUEUEING_PROVIDERS = frozenset({"openai_compat"})


class ConcurrencyLimit(Protocol):
    """A concurrency limit algorithm, as `consumer.runtime.limiter.AsyncLimiter` drives it: `limit`
    is the current limit; `update(...)` takes one finished request and returns the new limit;
    `reason` says why the limit is where it is; `provider_refuses()` tells it the provider
    refuses past its budget (rate-limit headers, a 429) rather than queueing."""

    @property
    def limit(self) -> int: ...

    @property
    def reason(self) -> LimitReason: ...

    def update(self, rtt_ms: float, inflight: int, dropped: bool, now_s: float) -> int: ...

    def provider_refuses(self) -> None: ...


def _check_bounds(initial: int, min_limit: int, max_limit: int) -> None:
    if not 1 <= min_limit <= initial <= max_limit:
        raise ValueError(f"need 1 <= min ({min_limit}) <= initial ({initial}) <= max ({max_limit})")


class FixedLimit:
    """A limit that never changes."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def reason(self) -> LimitReason:
        return "fixed"

    def update(self, rtt_ms: float, inflight: int, dropped: bool, now_s: float) -> int:
        """Ignores the sample."""
        return self._limit

    def provider_refuses(self) -> None:
        """Changes nothing."""


#: AIMD's default `rtt_tolerance`: how much slower than the no-load RTT answers may get before
#: it stops growing (a server that queues past its capacity doubles it with as many waiting as
#: served)
AIMD_RTT_TOLERANCE = 2.0
#: latency growth smaller than this is not a server's queue: the client's own event loop, busy
#: with other work, reads an answer milliseconds late, which doubles a sub-millisecond RTT
#: (a server that queues adds at least one of its service times, far more than this)
RTT_NOISE_MS = 20.0


class AIMDLimit:
    """Additive increase (+1), multiplicative decrease (x `backoff_ratio`) on drops; no growth
    while latency grows with concurrency.

    timeout_ms: a success slower than this counts as a drop (None: never);
    rtt_tolerance: grow only while the latest RTT is at most this multiple of the no-load RTT
    (the lowest since the last probe), and at least `RTT_NOISE_MS` above it; while the smoothed
    RTT is above that the limit steps down,
    once per RTT, to the concurrency that RTT allows, never below `initial`; and from the first
    time it is, growth is one step per RTT, not one per success (None: latency is ignored and
    only drops shrink the limit);
    smoothing: weight of a new sample in the smoothed RTT;
    probe_interval_s: how often the limit drops to `initial` for a moment so the no-load RTT
    is measured afresh (while latency is watched);
    watch_latency: whether the latency rule starts on (False for a provider known to refuse
    rather than queue); `provider_refuses()` turns it off for good.
    """

    def __init__(
        self,
        initial: int = 4,
        *,
        min_limit: int = 1,
        max_limit: int = 64,
        backoff_ratio: float = 0.5,
        timeout_ms: float | None = None,
        rtt_tolerance: float | None = AIMD_RTT_TOLERANCE,
        smoothing: float = 0.1,
        probe_interval_s: float = 60.0,
        watch_latency: bool = True,
    ) -> None:
        _check_bounds(initial, min_limit, max_limit)
        if not 0.0 < backoff_ratio < 1.0:
            raise ValueError("backoff_ratio must be in (0, 1)")
        if rtt_tolerance is not None and rtt_tolerance <= 1.0:
            raise ValueError("rtt_tolerance must be > 1")
        self._limit = initial
        self._last_decrease_s = float("-inf")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.backoff_ratio = backoff_ratio
        self.timeout_ms = timeout_ms
        self.rtt_tolerance = rtt_tolerance
        self.smoothing = smoothing
        self.probe_interval_s = probe_interval_s
        #: latency alone never takes the limit below this (what the tier was configured to start at)
        self._latency_floor = initial
        self._no_load_rtt_ms = math.inf
        self._smoothed_rtt_ms = 0.0
        #: False once latency has grown past the tolerance: from then on, one step per RTT
        self._per_success = True
        self._last_increase_s = float("-inf")
        self._last_step_down_s = float("-inf")
        self._probed_s = float("-inf")  # the last probe; samples sent before it are not no-load
        self._next_probe_s: float | None = None
        #: the tolerance the latency rule applies (None: latency is not watched)
        self._tolerance = rtt_tolerance if watch_latency else None
        self._reason: LimitReason = "idle"
        #: the limit at the last overload cut: `overload` lasts until the limit is back there
        self._cut_from = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def reason(self) -> LimitReason:
        return self._reason

    @property
    def watches_latency(self) -> bool:
        """Whether the latency rule is on (the provider may queue instead of refusing)."""
        return self._tolerance is not None

    def provider_refuses(self) -> None:
        """The provider refuses past its budget: only drops shrink the limit from now on."""
        if self._tolerance is None:
            return
        self._tolerance = None
        if self._reason == "latency":
            self._reason = "growing"

    @property
    def no_load_rtt_ms(self) -> float:
        """The lowest RTT since the last probe (inf before any)."""
        return self._no_load_rtt_ms

    @property
    def smoothed_rtt_ms(self) -> float:
        """The smoothed RTT of the samples since the last probe (0 before any)."""
        return self._smoothed_rtt_ms

    def update(self, rtt_ms: float, inflight: int, dropped: bool, now_s: float) -> int:
        """Apply one finished request's sample; return the new limit."""
        sent_s = now_s - rtt_ms / 1000.0
        if dropped or (self.timeout_ms is not None and rtt_ms > self.timeout_ms):
            # one decrease per overload event: requests sent before the last decrease went out
            # at the old limit and say nothing new (TCP halves once per loss window)
            if sent_s < self._last_decrease_s:
                return self._limit
            self._last_decrease_s = now_s
            self._cut_from = self._limit
            self._limit = max(self.min_limit, int(self._limit * self.backoff_ratio))
            self._reason = "overload"
            return self._limit
        tolerance = self._tolerance
        if inflight * 2 < self._limit:
            if tolerance is not None and sent_s >= self._probed_s:
                self._latency_grew(rtt_ms, tolerance)  # an idle limit proves nothing
            if self._reason != "overload":
                self._reason = "idle"
            return self._limit
        if tolerance is not None:
            if sent_s < self._probed_s or self._probe(now_s):
                return self._limit  # sent before the probe, at the higher limit: not no-load
            smoothed_over, latest_over = self._latency_grew(rtt_ms, tolerance)
            if smoothed_over:
                self._step_down(inflight, tolerance, sent_s, now_s)
            if latest_over or smoothed_over:
                self._per_success = False
                self._reason = "latency"
                return self._limit
            if not self._per_success:
                # one step per RTT: requests sent before the last step say nothing of it yet
                if sent_s < self._last_increase_s:
                    return self._limit
                self._last_increase_s = now_s
        self._limit = min(self.max_limit, self._limit + 1)
        if self._limit >= self.max_limit:
            self._reason = "at_max"
        elif self._reason != "overload" or self._limit >= self._cut_from:
            self._reason = "growing"
        return self._limit

    def _probe(self, now_s: float) -> bool:
        """Start a probe when one is due: the limit drops to its latency floor, the server's
        queue drains, and the no-load RTT is measured afresh from the requests sent from now."""
        if self._next_probe_s is None:
            self._next_probe_s = now_s + self.probe_interval_s
            return False
        if now_s < self._next_probe_s:
            return False
        self._next_probe_s = now_s + self.probe_interval_s
        self._probed_s = now_s
        self._limit = min(self._limit, self._latency_floor)
        self._no_load_rtt_ms = math.inf
        return True

    def _latency_grew(self, rtt_ms: float, tolerance: float) -> tuple[bool, bool]:
        """Feed one sample to the no-load and smoothed RTTs; whether the smoothed RTT, and the
        sample itself, are more than `tolerance` times the no-load one (growth stops at the
        first slow sample; a step down waits for the smoothed RTT, which one slow answer does
        not move far)."""
        rtt_ms = max(rtt_ms, 1e-3)
        if self._no_load_rtt_ms == math.inf:
            self._smoothed_rtt_ms = rtt_ms
        else:
            self._smoothed_rtt_ms += (rtt_ms - self._smoothed_rtt_ms) * self.smoothing
        self._no_load_rtt_ms = min(self._no_load_rtt_ms, rtt_ms)
        bound_ms = max(tolerance * self._no_load_rtt_ms, self._no_load_rtt_ms + RTT_NOISE_MS)
        return self._smoothed_rtt_ms > bound_ms, rtt_ms > bound_ms

    def _step_down(self, inflight: int, tolerance: float, sent_s: float, now_s: float) -> None:
        """Down to the concurrency whose RTT the tolerance allows, at most once per RTT
        (requests sent before the last step went out at the higher limit) and never below the
        latency floor. A server that queues serves a fixed rate, so RTT grows in proportion to
        the requests in flight: `inflight * tolerance * no_load / smoothed` is where it was
        within the tolerance."""
        if sent_s < self._last_step_down_s or self._limit <= self._latency_floor:
            return
        self._last_step_down_s = now_s
        allowed = int(inflight * tolerance * self._no_load_rtt_ms / self._smoothed_rtt_ms)
        self._limit = max(self._latency_floor, min(self._limit - 1, allowed))


@dataclass(slots=True)
class _ExpAverage:
    """Exponential moving average after a plain-average warm-up (Gradient2's long RTT)."""

    window: int
    warmup: int
    value: float = 0.0
    count: int = 0

    def add(self, sample: float) -> float:
        if self.count < self.warmup:
            self.count += 1
            self.value += (sample - self.value) / self.count
        else:
            factor = 2.0 / (self.window + 1)
            self.value = self.value * (1 - factor) + sample * factor
        return self.value


class GradientLimit:
    """Latency-gradient limit (Netflix Gradient2 spirit) for servers that never say 429.

    gradient = tolerance * baseline_rtt / short_rtt, clamped to [0.5, 1]; the new estimate
    is ``limit * gradient + sqrt(limit)`` (the queue allowance), smoothed by `smoothing`.

    The baseline is the smaller of the long-term RTT average (Gradient2) and the lowest
    RTT seen since the last probe. A long-term average alone drifts up under sustained
    queueing (it learns the queueing delay as "normal") and the limit then runs away; the
    probe minimum anchors it. Every `probe_interval` samples the limit drops to the queue
    allowance for a moment and the minimum is measured afresh (Gradient1's probe), so a
    genuine change of the server's no-load latency is learnt too.

    long_window: samples in the long-term average; tolerance: how much slower than the
    baseline the short-term RTT may be before the limit shrinks; smoothing: weight of a new
    estimate.
    """

    def __init__(
        self,
        initial: int = 4,
        *,
        min_limit: int = 1,
        max_limit: int = 64,
        smoothing: float = 0.2,
        tolerance: float = 1.5,
        long_window: int = 600,
        warmup: int = 10,
        probe_interval: int = 1000,
    ) -> None:
        _check_bounds(initial, min_limit, max_limit)
        self._estimate = float(initial)
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.smoothing = smoothing
        self.tolerance = tolerance
        self.probe_interval = probe_interval
        self._long_rtt = _ExpAverage(window=long_window, warmup=warmup)
        self._min_rtt = math.inf
        self._samples_since_probe = 0
        self.last_gradient = 1.0
        self._reason: LimitReason = "idle"

    @property
    def limit(self) -> int:
        return int(self._estimate)

    @property
    def reason(self) -> LimitReason:
        return self._reason

    def provider_refuses(self) -> None:
        """Changes nothing: a tier names `gradient` for a server that queues."""

    @property
    def long_rtt_ms(self) -> float:
        """The long-term RTT average."""
        return self._long_rtt.value

    @property
    def baseline_rtt_ms(self) -> float:
        """The RTT taken as "no queueing": min(long-term average, lowest since the last probe)."""
        return min(self._long_rtt.value, self._min_rtt)

    def _clamp(self, estimate: float) -> float:
        return max(float(self.min_limit), min(float(self.max_limit), estimate))

    def update(self, rtt_ms: float, inflight: int, dropped: bool, now_s: float) -> int:
        """Apply one finished request's sample; return the new limit."""
        short_rtt = max(rtt_ms, 1e-3)
        long_rtt = self._long_rtt.add(short_rtt)
        # After a load spike the long average lags high; pull it down so it can recover.
        if long_rtt / short_rtt > 2.0:
            self._long_rtt.value *= 0.95
        self._min_rtt = min(self._min_rtt, short_rtt)
        self._samples_since_probe += 1
        if self._samples_since_probe >= self.probe_interval:
            # Probe: drain the server's queue and re-measure its no-load latency.
            self._samples_since_probe = 0
            self._min_rtt = math.inf
            self._estimate = self._clamp(min(self._estimate, math.sqrt(self._estimate)))
            return self.limit
        # Don't grow while the limit is not used (app-limited); a drop still shrinks.
        if not dropped and inflight < self._estimate / 2:
            self._reason = "idle"
            return self.limit
        if dropped:
            gradient = 0.5
        else:
            gradient = max(0.5, min(1.0, self.tolerance * self.baseline_rtt_ms / short_rtt))
        self.last_gradient = gradient
        new_estimate = self._estimate * gradient + math.sqrt(self._estimate)
        self._estimate = self._clamp(self._estimate * (1 - self.smoothing) + new_estimate * self.smoothing)
        if dropped:
            self._reason = "overload"
        elif gradient < 1.0:
            self._reason = "latency"
        else:
            self._reason = "at_max" if self.limit >= self.max_limit else "growing"
        return self.limit


def limit_for(config: Any, provider: str = "openai_compat") -> ConcurrencyLimit:
    """The algorithm a `consumer.settings.LimiterConfig` names (algorithm, initial, min, max,
    and aimd's rtt_tolerance) for a tier of `provider`: aimd watches latency only for a
    provider that may queue (`QUEUEING_PROVIDERS`)."""
    if config.algorithm == "aimd":
        tolerance = getattr(config, "rtt_tolerance", AIMD_RTT_TOLERANCE)
        return AIMDLimit(
            config.initial,
            min_limit=config.min,
            max_limit=config.max,
            rtt_tolerance=tolerance,
            watch_latency=provider in QUEUEING_PROVIDERS,
        )
    if config.algorithm == "gradient":
        return GradientLimit(config.initial, min_limit=config.min, max_limit=config.max)
    if config.algorithm == "fixed":
        return FixedLimit(config.initial)
    raise ValueError(f"unknown limiter algorithm {config.algorithm!r}")
