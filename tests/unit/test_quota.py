"""Fleet quotas, the pure core: how the live instances split a quota (hypothesis properties:
the fractions add up to at most the quota, each at least the floor, the rest in proportion to
demand) and this instance's bucket (it admits no more than its share, a request reserves its
input estimate and max_tokens and settles to what it used)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.quota import (
    BURST_S,
    FLOOR_SHARE,
    NOTHING_USED,
    QuotaBucket,
    QuotaCost,
    QuotaFigures,
    QuotaKind,
    share_fractions,
)

#: float rounding of a sum of fractions (the split itself never rounds up)
ROUNDING = 1e-9

demands = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    min_size=1,
    max_size=40,
)
floors = st.floats(min_value=0.0, max_value=0.5, allow_nan=False)


@given(demands, floors)
def test_the_fractions_never_add_up_to_more_than_the_quota(demand: dict[str, float], floor: float) -> None:
    fractions = share_fractions(demand, floor_share=floor)
    assert set(fractions) == set(demand)
    assert sum(fractions.values()) <= 1.0 + ROUNDING


@given(demands, floors)
def test_every_live_instance_keeps_at_least_the_floor(demand: dict[str, float], floor: float) -> None:
    fractions = share_fractions(demand, floor_share=floor)
    least = min(floor, 1.0 / len(demand))
    assert all(f >= least - ROUNDING for f in fractions.values())


@given(demands, floors)
def test_above_the_floor_the_shares_follow_demand(demand: dict[str, float], floor: float) -> None:
    fractions = share_fractions(demand, floor_share=floor)
    least = min(floor, 1.0 / len(demand))
    total = sum(demand.values())
    for name, d in demand.items():
        above = fractions[name] - least
        if total > 0:
            # the rest (1 - n * floor) goes out in proportion to demand (the ratio first, as the split does)
            assert above == pytest.approx((1.0 - len(demand) * least) * (d / total), rel=1e-9, abs=1e-12)
        else:
            assert above == pytest.approx((1.0 - len(demand) * least) / len(demand), abs=1e-12)


@given(demands)
def test_the_whole_quota_is_handed_out(demand: dict[str, float]) -> None:
    assert sum(share_fractions(demand).values()) == pytest.approx(1.0, abs=ROUNDING)


def test_an_idle_instance_keeps_the_floor_and_busy_ones_split_the_rest() -> None:
    fractions = share_fractions({"busy-a": 300, "busy-b": 100, "idle": 0})
    assert fractions["idle"] == pytest.approx(FLOOR_SHARE)
    rest = 1.0 - 3 * FLOOR_SHARE
    assert fractions["busy-a"] == pytest.approx(FLOOR_SHARE + rest * 0.75)
    assert fractions["busy-b"] == pytest.approx(FLOOR_SHARE + rest * 0.25)
    assert share_fractions({}) == {}


def test_figures_need_one_positive_figure_and_name_their_keys() -> None:
    with pytest.raises(ValueError, match="at least one figure"):
        QuotaFigures()
    with pytest.raises(ValueError, match="tokens_per_minute must be positive"):
        QuotaFigures(tokens_per_minute=0)
    figures = QuotaFigures(requests_per_minute=1200, output_tokens_per_minute=6000)
    assert figures.per_second() == {QuotaKind.REQUESTS: 20.0, QuotaKind.OUTPUT_TOKENS: 100.0}
    assert [k.key for k in figures.per_minute()] == ["requests_per_minute", "output_tokens_per_minute"]


def test_a_cost_counts_each_figure_as_the_quota_names_it() -> None:
    cost = QuotaCost(1, input_tokens=30.0, output_tokens=16.0)
    assert [cost.amount(k) for k in QuotaKind] == [1.0, 46.0, 30.0, 16.0]
    assert [NOTHING_USED.amount(k) for k in QuotaKind] == [0.0, 0.0, 0.0, 0.0]


# ----------------------------------------------------------------------------------------------
# the bucket

REQUESTS_AND_TOKENS = QuotaFigures(requests_per_minute=1200, tokens_per_minute=36000)


def _admit_greedily(bucket: QuotaBucket, cost: QuotaCost, start_s: float, end_s: float, step_s: float) -> int:
    """Admit `cost` whenever the bucket says it fits, on a clock stepping by step_s."""
    admitted, now_s = 0, start_s
    while now_s < end_s:
        while bucket.wait_s(cost, now_s) == 0.0:
            bucket.reserve(cost, now_s)
            admitted += 1
        now_s += step_s
    return admitted


def test_a_bucket_admits_its_share_of_the_quota_and_no_more() -> None:
    """A quarter of 20 requests/s: 5 a second after the first bucketful, on a fine clock."""
    bucket = QuotaBucket(QuotaFigures(requests_per_minute=1200), fraction=0.25, now_s=0.0)
    admitted = _admit_greedily(bucket, QuotaCost(1, 10.0, 10.0), 0.0, 20.0, 0.001)
    assert 5 * 20.0 - 1 <= admitted <= math.floor(5 * BURST_S + 5 * 20.0) + 1


def test_the_tighter_figure_admits() -> None:
    """Requests of 60 tokens: the token figure (600/s) allows 10 a second, the request figure 20."""
    bucket = QuotaBucket(REQUESTS_AND_TOKENS, fraction=1.0, now_s=0.0)
    admitted = _admit_greedily(bucket, QuotaCost(1, 44.0, 16.0), 0.0, 30.0, 0.001)
    assert admitted == pytest.approx(10 * 30, abs=10)


def test_a_cost_larger_than_the_bucket_goes_when_it_is_full_and_is_paid_back() -> None:
    bucket = QuotaBucket(
        QuotaFigures(tokens_per_minute=600), fraction=1.0, now_s=0.0, burst_s=0.5
    )  # 10/s, holds 5
    big = QuotaCost(1, 40.0, 0.0)
    assert bucket.wait_s(big, 0.0) == 0.0  # full: it goes
    bucket.reserve(big, 0.0)
    assert bucket.levels(0.0)[QuotaKind.TOKENS] == pytest.approx(5.0 - 40.0)
    # the debt is paid back at the share's rate before the next one goes: 4 s to refill 40
    assert bucket.wait_s(big, 0.0) == pytest.approx(4.0)


def test_settling_gives_back_what_was_reserved_and_not_used() -> None:
    bucket = QuotaBucket(
        QuotaFigures(tokens_per_minute=6000), fraction=1.0, now_s=0.0, burst_s=0.5
    )  # 100/s, holds 50
    reserved = bucket.reserve(QuotaCost(1, 20.0, 16.0), 0.0)
    assert bucket.reserved_tokens == 36.0
    assert bucket.levels(0.0)[QuotaKind.TOKENS] == pytest.approx(14.0)
    assert bucket.settle(reserved, QuotaCost(1, 22.0, 4.0), 0.0) is True
    assert bucket.levels(0.0)[QuotaKind.TOKENS] == pytest.approx(50.0 - 26.0)
    assert bucket.reserved_tokens == 0.0
    # a 429: nothing was used, everything comes back
    refused = bucket.reserve(QuotaCost(1, 20.0, 16.0), 0.0)
    bucket.settle(refused, NOTHING_USED, 0.0)
    assert bucket.levels(0.0)[QuotaKind.TOKENS] == pytest.approx(24.0)
    # more used than reserved: the rest is taken now, nothing comes back
    under = bucket.reserve(QuotaCost(1, 5.0, 5.0), 0.0)
    assert bucket.settle(under, QuotaCost(1, 15.0, 5.0), 0.0) is False
    assert bucket.levels(0.0)[QuotaKind.TOKENS] == pytest.approx(24.0 - 20.0)


def test_a_smaller_share_caps_what_the_bucket_holds_and_a_larger_one_refills_faster() -> None:
    bucket = QuotaBucket(QuotaFigures(requests_per_minute=1200), fraction=1.0, now_s=0.0, burst_s=0.5)
    assert bucket.levels(0.0)[QuotaKind.REQUESTS] == pytest.approx(10.0)  # 20/s for 0.5 s
    bucket.set_fraction(0.1, 0.0)
    assert bucket.levels(0.0)[QuotaKind.REQUESTS] == pytest.approx(1.0)
    assert bucket.rates_per_s() == {QuotaKind.REQUESTS: pytest.approx(2.0)}
    for _ in range(2):
        bucket.reserve(QuotaCost(1, 0.0, 0.0), 0.0)
    assert bucket.wait_s(QuotaCost(1, 0.0, 0.0), 0.0) == pytest.approx(1.0)  # from -1 to 1 at 2/s
    bucket.set_fraction(0.5, 0.0)
    assert bucket.wait_s(QuotaCost(1, 0.0, 0.0), 0.0) == pytest.approx(0.2)  # at 10/s


steps = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=0.3, allow_nan=False),  # time passing
        st.floats(min_value=1.0, max_value=60.0, allow_nan=False),  # input tokens reserved
        st.floats(min_value=0.0, max_value=1.0, allow_nan=False),  # share of the reservation used
        st.booleans(),  # counted by the provider (False: a 429)
    ),
    min_size=1,
    max_size=200,
)


@settings(max_examples=200)
@given(steps, st.floats(min_value=0.05, max_value=1.0))
def test_over_any_run_what_was_used_stays_within_the_share(
    run: list[tuple[float, float, float, bool]], fraction: float
) -> None:
    """Admitting whenever the bucket allows and settling each request to a random use of its
    reservation: for every figure, what was used over the run is at most one bucketful plus the
    share's rate times the run (what a provider's bucket of the same size could take)."""
    figures = QuotaFigures(requests_per_minute=600, tokens_per_minute=60000)
    bucket = QuotaBucket(figures, fraction=fraction, now_s=0.0)
    rates = bucket.rates_per_s()
    start = dict(bucket.levels(0.0))
    used = dict.fromkeys(rates, 0.0)
    now_s = 0.0
    for dt_s, input_tokens, share_used, counted in run:
        now_s += dt_s
        cost = QuotaCost(1, input_tokens, 16.0)
        # costs above a bucket go when it is full: keep to those that fit, as the bound assumes
        if any(cost.amount(k) > rates[k] * BURST_S for k in rates):
            continue
        if bucket.wait_s(cost, now_s) > 0.0:
            continue
        reservation = bucket.reserve(cost, now_s)
        use = QuotaCost(1, input_tokens * share_used, 16.0 * share_used) if counted else NOTHING_USED
        bucket.settle(reservation, use, now_s)
        for kind in rates:
            used[kind] += use.amount(kind)
    for kind, rate in rates.items():
        assert used[kind] <= start[kind] + rate * now_s + 1e-6
