"""Adaptive batch size, agreement accounting, answers_agree and choose_verified (pure core)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.adaptive import (
    INVALID_KINDS,
    AdaptiveBatchSize,
    AdaptiveSizes,
    AgreementCount,
    AgreementStats,
    answers_agree,
    choose_verified,
    normalize_answer,
)
from consumer.core.packing import AnswerKind

KINDS = sorted(k.value for k in AnswerKind)


def test_verdict_kinds_cover_answer_kinds() -> None:
    # every packing verdict is either the valid one or an invalid one
    assert set(KINDS) == INVALID_KINDS | {"complete"}


# --- the size rule ----------------------------------------------------------------------------


def test_slow_start_doubles_then_caps_at_max() -> None:
    s = AdaptiveBatchSize(2, 20, probe_after_s=10)
    assert s.size == 2
    assert s.record("complete", 2, 0) == 4
    assert s.record("complete", 4, 1) == 8
    assert s.record("complete", 8, 2) == 16
    assert s.record("complete", 16, 3) == 20  # x2 capped at max_items
    assert s.record("complete", 20, 4) == 20


def test_grows_by_one_after_a_failure() -> None:
    s = AdaptiveBatchSize(16, 32)
    assert s.record("malformed", 16, 0) == 8
    # threshold is now 8: additive increase
    assert s.record("complete", 8, 1) == 9
    assert s.record("complete", 9, 2) == 10
    assert s.record("complete", 10, 3) == 11


def test_smaller_request_does_not_grow() -> None:
    s = AdaptiveBatchSize(8, 32)
    # a window that flushed with 3 items says nothing about 8
    assert s.record("complete", 3, 0) == 8
    assert s.record(AnswerKind.COMPLETE, 8, 1) == 16  # StrEnum values work as kinds


@pytest.mark.parametrize("kind", sorted(INVALID_KINDS))
def test_each_invalid_kind_halves(kind: str) -> None:
    s = AdaptiveBatchSize(16, 16, fallback_after=10)
    assert s.record(kind, 16, 0) == 8


def test_halving_is_from_the_request_size_so_concurrent_failures_halve_once() -> None:
    s = AdaptiveBatchSize(16, 16, fallback_after=10)
    for t in range(4):  # four requests of 16 in flight together, all invalid
        s.record("missing", 16, t)
    assert s.size == 8
    s.record("missing", 8, 5)
    assert s.size == 4


def test_falls_to_one_after_repeated_failures_and_probes_again() -> None:
    s = AdaptiveBatchSize(16, 16, probe_after_s=30, fallback_after=3)
    s.record("malformed", 16, 0)  # -> 8
    s.record("malformed", 8, 1)  # -> 4
    assert s.size == 4
    s.record("malformed", 4, 2)  # third strike: straight to 1, not 2
    assert s.size == 1
    assert s.size_at(31.9) == 1  # not yet
    assert s.size_at(32.0) == 2  # probe after 30 s at 1
    assert s.probing
    # a valid probe resumes additive growth
    assert s.record("complete", 2, 33) == 3
    assert not s.probing
    assert s.record("complete", 3, 34) == 4


def test_halving_alone_reaches_one() -> None:
    s = AdaptiveBatchSize(4, 4, fallback_after=100)
    s.record("truncated", 4, 0)
    s.record("truncated", 2, 1)
    assert s.size == 1


def test_failed_probe_falls_back_and_restarts_timer() -> None:
    s = AdaptiveBatchSize(2, 8, probe_after_s=10, fallback_after=1)
    s.record("unexpected", 2, 0)
    assert s.size == 1
    assert s.size_at(10) == 2
    assert s.record("missing", 2, 12) == 1
    assert not s.probing
    assert s.size_at(21.9) == 1  # timer restarted at 12
    assert s.size_at(22) == 2


def test_late_invalid_reports_at_one_do_not_delay_the_probe() -> None:
    s = AdaptiveBatchSize(4, 8, probe_after_s=10, fallback_after=1)
    s.record("malformed", 4, 0)
    assert s.size == 1
    s.record("malformed", 4, 5)  # sent before the fall, reported late
    assert s.size_at(10) == 2


def test_late_valid_report_at_one_resumes_batching() -> None:
    s = AdaptiveBatchSize(4, 8, probe_after_s=100, fallback_after=1)
    s.record("malformed", 4, 0)
    assert s.size == 1
    assert s.record("complete", 4, 1) == 2  # batching worked after all: leave size 1


def test_initial_one_probes_after_the_interval() -> None:
    s = AdaptiveBatchSize(1, 8, probe_after_s=5)
    assert s.size_at(100) == 1  # timer starts at the first look
    assert s.size_at(104) == 1
    assert s.size_at(105) == 2


def test_max_items_one_never_batches() -> None:
    s = AdaptiveBatchSize(1, 1, probe_after_s=0)
    assert s.size_at(0) == 1
    assert s.size_at(1000) == 1


def test_ordinary_requests_are_never_judged() -> None:
    s = AdaptiveBatchSize(4, 8)
    assert s.record("malformed", 1, 0) == 4
    assert s.record("complete", 1, 1) == 4
    assert s.record_agreement(0, 5, 1, 2) == 4


def test_unknown_kind_and_bad_bounds_are_errors() -> None:
    with pytest.raises(ValueError):
        AdaptiveBatchSize(4, 8).record("great", 4, 0)
    for args in ((0, 4), (5, 4), (1, 0)):
        with pytest.raises(ValueError):
            AdaptiveBatchSize(*args)
    with pytest.raises(ValueError):
        AdaptiveBatchSize(2, 4, min_agreement=1.5)
    with pytest.raises(ValueError):
        AdaptiveBatchSize(2, 4).record_agreement(3, 2, 2, 0)


def test_low_agreement_counts_as_invalid_once_enough_is_compared() -> None:
    s = AdaptiveBatchSize(8, 8, min_agreement=0.8, agreement_min_compared=5, fallback_after=10)
    assert s.record_agreement(1, 2, 8, 0) == 8  # 2 compared: too few to judge
    assert s.record_agreement(1, 3, 8, 1) == 4  # 2/5 = 0.4 < 0.8: like an invalid answer at 8
    # counts restart after judging
    assert s.record_agreement(4, 4, 4, 2) == 4
    assert s.record_agreement(1, 1, 4, 3) == 4  # 5/5: fine, no change (growth comes from record)


def test_low_agreement_holds_growth() -> None:
    s = AdaptiveBatchSize(4, 32, min_agreement=0.8, agreement_min_compared=5, fallback_after=10)
    s.record_agreement(0, 1, 4, 0)  # one disagreement so far: not judged, but no reason to grow
    assert s.record("complete", 4, 1) == 4
    s.record_agreement(4, 4, 4, 2)  # 4/5 = 0.8: judged fine
    assert s.record("complete", 4, 3) == 8
    s.record_agreement(0, 5, 8, 4)  # judged low: halve to 4 and hold
    assert s.size == 4
    assert s.record("complete", 4, 5) == 4
    s.record_agreement(5, 5, 4, 6)  # judged fine again: growth resumes (+1 after a failure)
    assert s.record("complete", 4, 7) == 5


def test_good_agreement_does_not_shrink() -> None:
    s = AdaptiveBatchSize(8, 8, min_agreement=0.8, agreement_min_compared=5)
    assert s.record_agreement(4, 5, 8, 0) == 8  # exactly 0.8 is not below


def test_agreement_counts_restart_when_the_size_shrinks() -> None:
    s = AdaptiveBatchSize(8, 8, min_agreement=0.8, agreement_min_compared=5, fallback_after=10)
    s.record_agreement(0, 4, 8, 0)  # bad, not yet judged
    s.record("malformed", 8, 1)  # -> 4; the counts spoke for 8
    assert s.record_agreement(1, 1, 4, 2) == 4  # 1 compared since the shrink: not judged


# --- properties -------------------------------------------------------------------------------

sizes_params = st.tuples(st.integers(1, 64), st.integers(1, 64)).map(lambda t: (min(t), max(t)))
events = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(KINDS), st.integers(1, 80)),
        st.tuples(st.just("agree"), st.integers(0, 10), st.integers(1, 80)),
        st.tuples(st.just("look"), st.floats(0, 100), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(sizes_params, st.floats(0, 50), st.integers(1, 5), events)
def test_size_always_within_bounds(
    params: tuple[int, int], probe_after_s: float, fallback_after: int, evs: list[tuple[str, object, int]]
) -> None:
    initial, max_items = params
    s = AdaptiveBatchSize(initial, max_items, probe_after_s=probe_after_s, fallback_after=fallback_after)
    now = 0.0
    for ev in evs:
        now += 1.0
        if ev[0] == "record":
            s.record(str(ev[1]), ev[2], now)
        elif ev[0] == "agree":
            agreed = int(str(ev[1]))
            s.record_agreement(agreed // 2, agreed, ev[2], now)
        else:
            now += float(str(ev[1]))
            s.size_at(now)
        assert 1 <= s.size <= max_items


@given(sizes_params, st.integers(0, 5))
def test_grows_under_all_valid_to_max(params: tuple[int, int], fails_first: int) -> None:
    initial, max_items = params
    s = AdaptiveBatchSize(initial, max_items, probe_after_s=0, fallback_after=100)
    for t in range(fails_first):
        s.record("malformed", s.size, t)
    previous = s.size_at(10)
    for t in range(200):
        size = s.size_at(10 + t)
        new = s.record("complete", size, 10 + t)
        if size > 1:
            assert new > previous or new == max_items  # strictly grows until the cap
        previous = new
    if max_items > 1:
        assert s.size == max_items


@given(sizes_params, st.integers(1, 5), st.floats(0.5, 100))
def test_reaches_one_under_all_invalid_then_probes(
    params: tuple[int, int], fallback_after: int, probe_after_s: float
) -> None:
    initial, max_items = params
    s = AdaptiveBatchSize(initial, max_items, probe_after_s=probe_after_s, fallback_after=fallback_after)
    now = 0.0
    s.size_at(now)  # the runtime asks before sending; starts the timer when initial is 1
    steps = 0
    while s.size > 1:
        size = s.size
        s.record("malformed", size, now)
        assert s.size < size  # every invalid answer at the current size shrinks it
        steps += 1
        assert steps <= 7  # log2(64) + 1
    fell_at = now
    assert s.size_at(fell_at + probe_after_s * 0.99) == 1
    expected = 2 if max_items >= 2 else 1
    assert s.size_at(fell_at + probe_after_s) == expected


@given(sizes_params, st.lists(st.one_of(st.none(), st.integers(1, 6)), min_size=1, max_size=60))
def test_never_grows_while_answers_disagree(params: tuple[int, int], evs: list[int | None]) -> None:
    # None: a well-formed answer at the current size; n: n answers compared, none agreed
    initial, max_items = params
    s = AdaptiveBatchSize(initial, max_items, min_agreement=0.5)
    disagreed = False
    for t, ev in enumerate(evs):
        before = s.size
        if ev is None:
            s.record("complete", s.size, t)
        else:
            s.record_agreement(0, ev, s.size, t)
            disagreed = disagreed or before > 1
        if disagreed:
            assert s.size <= before


# --- the registry -----------------------------------------------------------------------------


def test_registry_keeps_one_tracker_per_key_and_expires_idle_ones() -> None:
    made: list[tuple[str, str]] = []

    def factory(key: tuple[str, str]) -> AdaptiveBatchSize:
        made.append(key)
        return AdaptiveBatchSize(4 if key[0] == "small" else 2, 16)

    sizes: AdaptiveSizes[tuple[str, str]] = AdaptiveSizes(factory)
    a, b = ("small", "k1"), ("big", "k1")
    assert sizes.size_at(a, 0) == 4
    assert sizes.size_at(b, 0) == 2
    assert sizes.record(a, "complete", 4, 1) == 8
    assert sizes.record(b, "malformed", 2, 1) == 1
    assert sizes.record_agreement(a, 0, 5, 8, 2) == 4
    assert sizes.get(a) is sizes.get(a)
    assert made == [a, b]
    assert sizes.snapshot() == {a: 4, b: 1}
    c = ("small", "k2")
    sizes.get(c)  # created, never used
    assert sizes.expire(now_s=50, idle_s=49) == [b, c]  # b last used at 1, a at 2
    assert list(sizes) == [a] and len(sizes) == 1


# --- agreement accounting ---------------------------------------------------------------------


def test_agreement_stats_per_tier_and_size() -> None:
    stats = AgreementStats()
    assert stats.rate("small") is None
    stats.record("small", 4, agreed=3, compared=4)
    stats.record("small", 4, agreed=1, compared=1)
    stats.record("small", 8, agreed=0, compared=2)
    stats.record("big", 2, agreed=2, compared=2)
    assert stats.count("small", 4) == AgreementCount(compared=5, agreed=4)
    assert stats.rate("small", 4) == pytest.approx(0.8)
    assert stats.rate("small", 8) == 0.0
    assert stats.count("small") == AgreementCount(compared=7, agreed=4)
    assert stats.rate("small", 16) is None
    assert stats.as_dict() == {
        "small": {
            "4": {"compared": 5, "agreed": 4, "rate": pytest.approx(0.8)},
            "8": {"compared": 2, "agreed": 0, "rate": 0.0},
        },
        "big": {"2": {"compared": 2, "agreed": 2, "rate": 1.0}},
    }
    with pytest.raises(ValueError):
        stats.record("small", 4, agreed=2, compared=1)


# --- answers_agree ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("positive", "Positive."),
        ("  Positive\n", "POSITIVE!"),
        ('"positive"', "positive"),  # JSON string vs plain text
        ("not  good", "Not good."),
        ('{"label": "positive", "score": 1}', '{"score": 1.0, "label": "Positive"}'),
        ('```json\n{"a": [1, 2]}\n```', '{"a":[1,2]}'),
        ("[1, 2, 3]", "[1,2,3]"),
        ("Café", "CAFÉ"),
    ],
)
def test_answers_agree(a: str, b: str) -> None:
    assert answers_agree(a, b)
    assert answers_agree(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("positive", "negative"),
        ("positive", "positive sentiment"),
        ('{"label": "positive"}', '{"label": "negative"}'),
        ('{"a": true}', '{"a": 1}'),  # true is not 1
        ("[1, 2]", "[2, 1]"),  # list order matters
        ('{"a": 1}', '{"a": 1, "b": 2}'),
        ("null", "false"),
    ],
)
def test_answers_disagree(a: str, b: str) -> None:
    assert not answers_agree(a, b)
    assert not answers_agree(b, a)


def test_normalize_answer() -> None:
    assert normalize_answer("  It's  GREAT!\n") == "it s great"
    assert normalize_answer("¡Hola, mundo!") == "hola mundo"


@given(st.text(max_size=40))
def test_answers_agree_is_reflexive(a: str) -> None:
    assert answers_agree(a, a)


# --- choose_verified --------------------------------------------------------------------------


def test_choose_verified_edges() -> None:
    rng = random.Random(1)
    members = list("abcdefgh")
    assert choose_verified(members, 0.0, rng) == []
    assert choose_verified(members, 1.0, rng) == members
    assert choose_verified([], 0.5, rng) == []
    half = choose_verified(members, 0.5, rng)
    assert len(half) == 4
    assert half == sorted(half, key=members.index)  # input order
    with pytest.raises(ValueError):
        choose_verified(members, 1.5, rng)


def test_choose_verified_expected_share_on_small_batches() -> None:
    rng = random.Random(7)
    picked = sum(len(choose_verified([1, 2, 3, 4], 0.1, rng)) for _ in range(5000))
    # 0.1 of 4 = 0.4 per call on average: floor would give 0, rounding 0; the draw keeps the share
    assert 0.35 * 5000 < picked < 0.45 * 5000


@given(st.lists(st.integers(), max_size=30, unique=True), st.floats(0, 1), st.integers(0, 2**32))
def test_choose_verified_picks_a_subset_of_the_right_size(
    members: list[int], fraction: float, seed: int
) -> None:
    chosen = choose_verified(members, fraction, random.Random(seed))
    assert set(chosen) <= set(members)
    assert len(chosen) == len(set(chosen))
    exact = fraction * len(members)
    assert int(exact) <= len(chosen) <= int(exact) + 1


def test_choose_verified_is_seeded() -> None:
    members = list(range(20))
    assert choose_verified(members, 0.3, random.Random(3)) == choose_verified(members, 0.3, random.Random(3))
