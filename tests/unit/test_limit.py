"""Concurrency limit algorithms: AIMD, gradient, fixed (pure functions of samples)."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.limit import (
    RTT_NOISE_MS,
    AIMDLimit,
    ConcurrencyLimit,
    FixedLimit,
    GradientLimit,
    limit_for,
)


def test_aimd_grows_by_one_only_while_busy() -> None:
    limit = AIMDLimit(4, min_limit=1, max_limit=10)
    assert limit.update(100, inflight=1, dropped=False, now_s=0) == 4  # idle: proves nothing
    assert limit.update(100, inflight=2, dropped=False, now_s=1) == 5  # inflight >= limit/2
    assert limit.update(100, inflight=5, dropped=False, now_s=2) == 6
    for i in range(20):
        limit.update(100, inflight=limit.limit, dropped=False, now_s=3 + i)
    assert limit.limit == 10  # max


def test_aimd_halves_on_drop_within_min() -> None:
    limit = AIMDLimit(16, min_limit=3, max_limit=64)
    assert limit.update(100, inflight=16, dropped=True, now_s=0) == 8
    assert limit.update(100, inflight=8, dropped=True, now_s=1) == 4
    assert limit.update(100, inflight=4, dropped=True, now_s=2) == 3
    assert limit.update(100, inflight=3, dropped=True, now_s=3) == 3


def test_aimd_timeout_counts_as_drop() -> None:
    limit = AIMDLimit(8, timeout_ms=1000)
    assert limit.update(1500, inflight=8, dropped=False, now_s=0) == 4


@pytest.mark.parametrize(
    "kwargs", [{"initial": 0}, {"initial": 5, "max_limit": 4}, {"initial": 2, "min_limit": 3}]
)
def test_bounds_are_checked(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        AIMDLimit(**kwargs)
    with pytest.raises(ValueError):
        GradientLimit(**kwargs)


def test_aimd_backoff_ratio_checked() -> None:
    with pytest.raises(ValueError):
        AIMDLimit(4, backoff_ratio=1.0)


def test_fixed_never_moves() -> None:
    limit = FixedLimit(7)
    assert limit.update(1e6, inflight=100, dropped=True, now_s=0) == 7 and limit.limit == 7
    with pytest.raises(ValueError):
        FixedLimit(0)


def _drive(
    limit: ConcurrencyLimit, rtt_of: object, steps: int, rng: random.Random, step_s: float = 1.0
) -> list[int]:
    seen = []
    for i in range(steps):
        current = limit.limit
        rtt = rtt_of(current)  # type: ignore[operator]
        seen.append(
            limit.update(rtt * rng.uniform(0.95, 1.05), inflight=current, dropped=False, now_s=i * step_s)
        )
    return seen


def _queueing(slots: int, service_ms: float = 100.0) -> object:
    """A server with `slots` that queues what is over them: latency grows with concurrency."""
    return lambda concurrency: service_ms * max(1.0, concurrency / slots)


def test_aimd_stops_growing_at_the_knee_of_a_queueing_server() -> None:
    limit = AIMDLimit(4, max_limit=64)
    seen = _drive(limit, _queueing(16), 3000, random.Random(2), step_s=0.05)
    tail = sorted(seen[-1000:])
    assert 16 <= tail[len(tail) // 2] <= 16 * 2  # at the knee, within the RTT tolerance of it
    assert max(seen) <= 16 * 2 + 1  # never grew to max: the queueing showed as latency
    assert limit.no_load_rtt_ms < 110


def test_aimd_grows_to_max_while_latency_is_flat() -> None:
    limit = AIMDLimit(4, max_limit=64)
    seen = _drive(limit, lambda _c: 100.0, 200, random.Random(1), step_s=0.05)
    assert seen[-1] == 64 and seen == sorted(seen)


def test_aimd_without_rtt_tolerance_grows_through_queueing() -> None:
    limit = AIMDLimit(4, max_limit=64, rtt_tolerance=None)
    seen = _drive(limit, _queueing(16), 500, random.Random(2), step_s=0.05)
    assert seen[-1] == 64


def test_aimd_latency_never_takes_the_limit_below_initial() -> None:
    limit = AIMDLimit(8, min_limit=1, max_limit=64)
    _drive(limit, lambda _c: 100.0, 20, random.Random(1), step_s=0.05)  # grows a little
    for i in range(400):  # 10x slower within one probe interval: no drop, only latency
        limit.update(1000.0, inflight=limit.limit, dropped=False, now_s=2 + i * 0.1)
    assert limit.limit == 8
    assert limit.update(1000.0, inflight=8, dropped=True, now_s=45) == 4  # a drop still halves


def test_aimd_steps_down_once_per_rtt() -> None:
    limit = AIMDLimit(4, max_limit=64)
    for i in range(10):
        limit.update(100.0, inflight=limit.limit, dropped=False, now_s=i * 0.1)
    seen = [limit.limit]
    # eight answers 1 s slow, all sent together: one step down (to where such a latency is within
    # the tolerance), not one per answer
    for _ in range(8):
        seen.append(limit.update(1000.0, inflight=limit.limit, dropped=False, now_s=2.0))
    steps = [b for a, b in itertools.pairwise(seen) if b != a]
    assert len(steps) == 1 and 4 <= steps[0] < seen[0]
    # answers sent after that step, as slow: the next step
    assert limit.update(1000.0, inflight=limit.limit, dropped=False, now_s=4.0) < steps[0]


def test_aimd_relearns_a_changed_no_load_latency_at_its_probe() -> None:
    # The server becomes 3x slower for good (a bigger model): not queueing, the new normal.
    limit = AIMDLimit(4, max_limit=64, probe_interval_s=60.0)
    rng = random.Random(5)
    seen = []
    for i in range(6000):
        c, now_s = limit.limit, i * 0.05
        service_ms = 100.0 if now_s < 100 else 300.0
        rtt = service_ms * max(1.0, c / 16) * rng.uniform(0.95, 1.05)
        seen.append(limit.update(rtt, inflight=c, dropped=False, now_s=now_s))
    assert 250 < limit.no_load_rtt_ms < 320  # measured afresh after the change
    tail = sorted(seen[-1000:])
    assert 16 <= tail[len(tail) // 2] <= 16 * 2  # back at the knee


def test_gradient_grows_while_latency_is_flat() -> None:
    limit = GradientLimit(4, max_limit=200)
    seen = _drive(limit, lambda _c: 100.0, 200, random.Random(1))
    assert seen[-1] > 40 and seen == sorted(seen)


def test_gradient_settles_near_the_knee_of_a_queueing_server() -> None:
    # A server with 16 slots: beyond them requests queue and latency grows linearly.
    def rtt(concurrency: int) -> float:
        return 100.0 * max(1.0, concurrency / 16)

    limit = GradientLimit(4, max_limit=500)
    seen = _drive(limit, rtt, 3000, random.Random(2))
    tail = sorted(seen[-1000:])
    assert 16 <= tail[len(tail) // 2] <= 16 * 3  # found the knee (plus the queue allowance)
    assert max(seen) <= 16 * 3  # and never ran away as the long-term RTT learnt the queueing
    assert min(tail) < 16  # the periodic probe drained the queue


def test_gradient_relearns_a_changed_no_load_latency() -> None:
    # The server becomes 3x slower for good (a bigger model): not queueing, the new normal.
    def rtt(step: int, concurrency: int) -> float:
        return (100.0 if step < 1500 else 300.0) * max(1.0, concurrency / 16)

    limit = GradientLimit(4, max_limit=500)
    rng = random.Random(5)
    seen = []
    for i in range(3000):
        c = limit.limit
        seen.append(limit.update(rtt(i, c) * rng.uniform(0.95, 1.05), inflight=c, dropped=False, now_s=i))
    assert min(seen[1500:1700]) < 10  # first read as queueing: the limit shrinks ...
    assert sorted(seen[-300:])[150] >= 16  # ... and after a probe it is back at the knee


def test_gradient_shrinks_when_latency_jumps_and_on_drops() -> None:
    limit = GradientLimit(50, max_limit=100)
    _drive(limit, lambda _c: 50.0, 100, random.Random(3))
    before = limit.limit
    for i in range(30):
        limit.update(400.0, inflight=limit.limit, dropped=False, now_s=100 + i)
    assert limit.limit < before and limit.last_gradient == 0.5
    low = limit.limit
    limit.update(50.0, inflight=low, dropped=True, now_s=200)
    assert limit.limit <= low


def test_gradient_does_not_grow_when_idle() -> None:
    limit = GradientLimit(20)
    for i in range(50):
        limit.update(10.0, inflight=2, dropped=False, now_s=i)
    assert limit.limit == 20


def test_gradient_long_rtt_recovers_after_a_spike() -> None:
    limit = GradientLimit(10, warmup=5)
    for i in range(20):
        limit.update(1000.0, inflight=10, dropped=False, now_s=i)
    high = limit.long_rtt_ms
    for i in range(200):
        limit.update(100.0, inflight=limit.limit, dropped=False, now_s=20 + i)
    assert limit.long_rtt_ms < high / 3


@given(
    st.sampled_from(["aimd", "gradient"]),
    st.lists(st.tuples(st.floats(0, 1e5), st.integers(0, 500), st.booleans()), max_size=200),
)
def test_limits_stay_within_bounds(algorithm: str, samples: list[tuple[float, int, bool]]) -> None:
    limit = limit_for(SimpleNamespace(algorithm=algorithm, initial=5, min=2, max=40))
    for i, (rtt, inflight, dropped) in enumerate(samples):
        value = limit.update(rtt, inflight, dropped, float(i))
        assert 2 <= value <= 40 and value == limit.limit


def test_limit_for_config() -> None:
    from consumer.settings import LimiterConfig

    assert isinstance(limit_for(LimiterConfig(algorithm="aimd")), AIMDLimit)
    assert isinstance(limit_for(LimiterConfig(algorithm="gradient")), GradientLimit)
    fixed = limit_for(LimiterConfig(algorithm="fixed", initial=9, max=10))
    assert isinstance(fixed, FixedLimit) and fixed.limit == 9
    with pytest.raises(ValueError):
        limit_for(SimpleNamespace(algorithm="vegas", initial=1, min=1, max=2))


def test_aimd_decreases_once_per_overload_event() -> None:
    limit = AIMDLimit(32, min_limit=1, max_limit=64)
    # three requests sent together at t=0 all come back 429 at t=1.0: one event, one halving
    assert limit.update(1000, inflight=32, dropped=True, now_s=1.0) == 16
    assert limit.update(1000, inflight=31, dropped=True, now_s=1.0) == 16
    assert limit.update(1000, inflight=30, dropped=True, now_s=1.0) == 16
    # a request sent after the decrease that is dropped again is a new event
    assert limit.update(100, inflight=16, dropped=True, now_s=1.2) == 8


def test_aimd_grows_through_a_fast_servers_client_side_jitter() -> None:
    """A sub-millisecond server whose answers the client reads a few ms late (its own event loop
    busy): the RTT doubles, but by less than RTT_NOISE_MS, so it is not a queue and AIMD grows."""
    limit = AIMDLimit(4, max_limit=64)
    rng = random.Random(3)
    for i in range(400):
        rtt_ms = 0.5 + rng.uniform(0.0, RTT_NOISE_MS / 2)
        limit.update(rtt_ms, inflight=limit.limit, dropped=False, now_s=i * 0.01)
    assert limit.limit == 64


def test_aimd_stops_growing_once_a_fast_server_queues_past_the_noise() -> None:
    limit = AIMDLimit(4, max_limit=64)
    for i in range(400):
        # the server serves 8 at once in 1 ms: beyond that, requests wait in its queue
        rtt_ms = 1.0 * max(1.0, limit.limit / 8) + (RTT_NOISE_MS * 2 if limit.limit > 8 else 0.0)
        limit.update(rtt_ms, inflight=limit.limit, dropped=False, now_s=i * 0.01)
    assert limit.limit <= 12


def _hosted(
    limit: AIMDLimit, answer_s: object, answers: int, rng: random.Random, *, headers: bool = True
) -> list[int]:
    """A fake clock's run of `answers` answers from a hosted provider with room for every
    request (no queue, no 429): the limit's requests always in flight, each answered after
    `answer_s(rng)` seconds; `headers`: its answers announce a rate-limit budget (the limiter
    then calls `provider_refuses`). Returns the limit after each answer."""
    import heapq

    now_s, inflight, seen = 0.0, 0, []
    done: list[tuple[float, float]] = []  # (answered at, sent at)
    for _ in range(answers):
        while inflight < limit.limit:
            heapq.heappush(done, (now_s + answer_s(rng), now_s))  # type: ignore[operator]
            inflight += 1
        now_s, sent_s = heapq.heappop(done)
        if headers:
            limit.provider_refuses()
        seen.append(limit.update((now_s - sent_s) * 1000.0, inflight, False, now_s))
        inflight -= 1
    return seen


#: answer times of hosted models: uniform over wide ranges, and a long-tailed lognormal
_SPREADS = st.one_of(
    st.tuples(st.floats(0.05, 0.5), st.floats(4.0, 40.0)).map(
        lambda p: lambda r: r.uniform(p[0], p[0] * p[1])
    ),
    st.floats(0.5, 1.5).map(lambda sigma: lambda r: r.lognormvariate(0.0, sigma)),
)


@given(_SPREADS, st.integers(0, 2**32))
def test_aimd_fills_a_refusing_providers_room_whatever_the_spread_of_answer_times(
    answer_s: object, seed: int
) -> None:
    """A provider that announces its budget: answer times that vary with the answer's length say
    nothing of load, and the limit grows to what the demand needs (here: its max)."""
    limit = AIMDLimit(4, max_limit=256)
    seen = _hosted(limit, answer_s, 1000, random.Random(seed))
    assert seen[-1] == 256 and seen == sorted(seen)
    assert limit.reason == "at_max" and not limit.watches_latency


def test_aimd_watching_latency_reads_a_wide_spread_as_a_queue() -> None:
    """Why the latency rule stays off for a provider that refuses: judged by its lowest sample,
    answers of 0.1-1.9 s read as a queue and the limit stays at initial."""
    limit = AIMDLimit(4, max_limit=256)
    seen = _hosted(limit, lambda r: r.uniform(0.1, 1.9), 3000, random.Random(1), headers=False)
    assert max(seen) <= 8 and seen[-1] <= 6 and limit.watches_latency
    limit.provider_refuses()  # the first answer with rate-limit headers
    assert limit.reason == "growing"
    seen = _hosted(limit, lambda r: r.uniform(0.1, 1.9), 1000, random.Random(1))
    assert seen[-1] == 256


@given(st.integers(4, 24), st.floats(0.0, 0.2), st.integers(0, 2**32))
def test_aimd_stops_where_a_queueing_servers_latency_grows_with_concurrency(
    slots: int, noise: float, seed: int
) -> None:
    """A server that queues past `slots` and never refuses (no headers, no 429): latency is the
    overload signal, and the limit stays within the RTT tolerance of the knee."""
    limit = AIMDLimit(4, max_limit=256)
    rng = random.Random(seed)
    seen = []
    for i in range(3000):
        c = limit.limit
        rtt = 100.0 * max(1.0, c / slots) * rng.uniform(1.0 - noise, 1.0 + noise)
        seen.append(limit.update(rtt, inflight=c, dropped=False, now_s=i * 0.05))
    assert max(seen[-1000:]) <= 2 * slots * (1 + noise) / (1 - noise) + 1
    assert limit.reason in ("latency", "growing")


def test_aimd_reasons() -> None:
    limit = AIMDLimit(4, max_limit=8, rtt_tolerance=None)
    assert limit.reason == "idle"
    limit.update(100, inflight=4, dropped=False, now_s=1)
    assert limit.reason == "growing"
    for i in range(5):
        limit.update(100, inflight=limit.limit, dropped=False, now_s=2 + i)
    assert limit.limit == 8 and limit.reason == "at_max"
    limit.update(100, inflight=8, dropped=True, now_s=10)
    assert limit.limit == 4 and limit.reason == "overload"
    for i in range(3):  # regrowing below where the cut was: still held by the overload
        limit.update(100, inflight=limit.limit, dropped=False, now_s=11 + i)
        assert limit.reason == "overload"
    limit.update(100, inflight=limit.limit, dropped=False, now_s=15)
    assert limit.limit == 8 and limit.reason == "at_max"
    limit.update(100, inflight=1, dropped=False, now_s=16)
    assert limit.reason == "idle"
    assert FixedLimit(3).reason == "fixed"


def test_limit_for_watches_latency_only_where_the_provider_may_queue() -> None:
    from consumer.settings import LimiterConfig

    config = LimiterConfig(algorithm="aimd")
    for provider, watches in (("openai_compat", True), ("openai", False), ("anthropic", False)):
        limit = limit_for(config, provider)
        assert isinstance(limit, AIMDLimit) and limit.watches_latency is watches
    assert not cast(AIMDLimit, limit_for(LimiterConfig(algorithm="aimd", rtt_tolerance=None))).watches_latency
