"""Adaptive batch size from evidence, agreement accounting, answers_agree and choose_verified (pure core)."""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.adaptive import (
    INVALID_KINDS,
    MIN_SINGLE_REQUESTS,
    PROBE_PATIENCE_S,
    AdaptivePackSize,
    AdaptiveSizes,
    AgreementCount,
    AgreementStats,
    answers_agree,
    choose_verified,
    levels_for,
    normalize_answer,
    wilson_bounds,
)
from consumer.core.packing import AnswerKind

KINDS = sorted(k.value for k in AnswerKind)
Z90 = statistics.NormalDist().inv_cdf(0.9)


def test_verdict_kinds_cover_answer_kinds() -> None:
    # every packing verdict is either the valid one or an invalid one
    assert set(KINDS) == INVALID_KINDS | {"complete"}


# --- building blocks --------------------------------------------------------------------------


def test_levels_double_up_to_max_items() -> None:
    assert levels_for(1) == (1,)
    assert levels_for(2) == (1, 2)
    assert levels_for(16) == (1, 2, 4, 8, 16)
    assert levels_for(10) == (1, 2, 4, 8, 10)
    s = AdaptivePackSize(10)
    assert [s.level_of(n) for n in (1, 2, 3, 7, 8, 9, 10)] == [1, 2, 2, 4, 8, 8, 10]


def test_wilson_bounds() -> None:
    assert wilson_bounds(0, 0, Z90) == (0.0, 1.0)
    low, high = wilson_bounds(7, 7, Z90)
    assert low >= 0.8 > wilson_bounds(6, 6, Z90)[0], "7 of 7 prove 80 % at 90 %, 6 of 6 do not"
    assert high == 1.0
    low, high = wilson_bounds(50, 100, 1.96)
    assert low == pytest.approx(0.404, abs=0.001) and high == pytest.approx(0.596, abs=0.001)


@given(st.integers(0, 200), st.integers(1, 200), st.floats(0.5, 3.0))
def test_wilson_bounds_contain_the_rate(successes: int, trials: int, z: float) -> None:
    successes = min(successes, trials)
    low, high = wilson_bounds(successes, trials, z)
    assert 0.0 <= low <= successes / trials <= high <= 1.0


# --- a fake pipeline: jobs, windows, verdicts, verification, a fake clock ---------------------


@dataclass
class Run:
    jobs: int = 0
    requests: int = 0
    batched_jobs: int = 0
    verify_requests: int = 0


def drive(
    s: AdaptivePackSize,
    jobs: int,
    *,
    agrees: Callable[[random.Random], bool] = lambda _rng: True,
    seconds: Callable[[int], float] = lambda n: 1.0 + 0.1 * n,
    tokens: Callable[[int], int] | None = None,
    verify_fraction: float = 0.25,
    rng: random.Random | None = None,
    run: Run | None = None,
) -> Run:
    """Route `jobs` jobs as the pipeline does: every job asks `size_at`; the job that opens a
    window fixes its size; a window's request takes `seconds(n)` (the fake clock advances),
    is answered completely, and a share of its jobs is asked alone and compared."""
    rng = rng or random.Random(0)
    run = run or Run()
    now_s = 1000.0 if run.jobs == 0 else 1000.0 + run.requests
    sent = 0
    while sent < jobs:
        size = s.size_at(now_s)
        n = min(size, jobs - sent)
        for _ in range(n - 1):
            s.size_at(now_s)  # jobs that join the open window
        sent += n
        run.requests += 1
        elapsed = seconds(n)
        now_s += elapsed
        s.record_speed(n, n, elapsed, now_s, tokens=tokens(n) if tokens else 0)
        if n > 1:
            run.batched_jobs += n
            s.record("complete", n, now_s)
            chosen = choose_verified(list(range(n)), verify_fraction, rng)
            for _ in chosen:
                run.requests += 1
                run.verify_requests += 1
                s.record_speed(1, 1, seconds(1), now_s, tokens=tokens(1) if tokens else 0)
            if chosen:
                s.record_agreement(sum(agrees(rng) for _ in chosen), len(chosen), n, now_s)
    run.jobs += jobs
    return run


# --- the size rule ----------------------------------------------------------------------------


def test_with_verification_a_key_starts_at_one() -> None:
    s = AdaptivePackSize(8)
    assert s.size == 1 and s.size_at(0) == 1
    assert s.reason() == "size 1: at size 2, agreement not measured yet (probing 10% of jobs)"


def test_without_verification_the_configured_size_is_trusted() -> None:
    s = AdaptivePackSize(8, trusted=8, measure_agreement=False)
    assert s.size == 8 and s.size_at(0) == 8
    assert s.reason() == "size 8: configured, 7.0 requests saved per 8 jobs (max_items)"
    assert AdaptivePackSize(8, trusted=4).size == 4  # initial_items vouches for 4


def test_grows_only_once_agreement_is_proven() -> None:
    s = AdaptivePackSize(8, min_agreement=0.8, confidence=0.9)
    for _ in range(4):
        s.record("complete", 2, 0)
    for _ in range(6):
        assert s.record_agreement(1, 1, 2, 0) == 1, "6 of 6 do not prove 80 % at 90 %"
    assert s.reason() == (
        "size 1: at size 2, batching agreed 6/6, not yet 80% at 90% confidence (probing 10% of jobs)"
    )
    assert s.record_agreement(1, 1, 2, 0) == 2  # 7 of 7 do
    assert s.reason().startswith("size 2: agreement 100% of 7, valid 100%, 1.0 requests saved per 2 jobs")


def test_shape_must_be_proven_too() -> None:
    s = AdaptivePackSize(4)
    s.record_agreement(7, 7, 2, 0)
    assert s.size == 1, "agreement alone, no judged answers"
    s.record("complete", 2, 0)
    s.record("complete", 2, 0)
    assert s.size == 1  # 4 valid items: too few
    for _ in range(2):
        s.record("complete", 2, 0)
    assert s.size == 2


def _proven(s: AdaptivePackSize, size: int, n: int = 10) -> None:
    for _ in range(n):
        s.record("complete", size, 0)
    s.record_agreement(n, n, size, 0)


def test_a_disagreement_shrinks_at_once() -> None:
    s = AdaptivePackSize(8)
    _proven(s, 2, n=7)
    _proven(s, 4, n=7)
    assert s.size == 4
    s.record_agreement(0, 1, 4, 1)  # 7 of 8 no longer prove 80 %
    assert s.size == 2
    assert s.reason().startswith("size 2: agreement 100% of 7, valid 100%, 1.0 requests saved per 2 jobs")
    assert s.reason().endswith(
        "; at size 4, batching agreed 7/8, not yet 80% at 90% confidence (probing 10% of jobs)"
    )


def test_evidence_from_a_small_window_speaks_for_the_level_below() -> None:
    s = AdaptivePackSize(8)
    _proven(s, 3)  # 3 items: evidence for size 2, never for 4
    assert s.size == 2


def test_invalid_answers_leave_a_trusted_size_until_size_one() -> None:
    """Without verification, answers that keep dropping ids take the size down to 1."""
    s = AdaptivePackSize(8, trusted=8, measure_agreement=False, probe_fraction=0.0)
    assert s.record("missing", 8, 0) == 4
    assert s.record("missing", 4, 1) == 2
    assert s.record("malformed", 2, 2) == 1
    assert s.reason() == "size 1: at size 2, batched answers valid 0% < 80%"
    assert s.record("missing", 8, 3) == 1  # late reports of bigger requests change nothing


@pytest.mark.parametrize("kind", sorted(INVALID_KINDS))
def test_each_invalid_kind_counts_against_the_size(kind: str) -> None:
    s = AdaptivePackSize(16, trusted=16, measure_agreement=False)
    assert s.record(kind, 16, 0) == 8


def test_ordinary_requests_are_never_judged() -> None:
    s = AdaptivePackSize(8, trusted=4, measure_agreement=False)
    assert s.record("malformed", 1, 0) == 4
    assert s.record_agreement(0, 5, 1, 2) == 4


def test_unknown_kind_and_bad_bounds_are_errors() -> None:
    with pytest.raises(ValueError):
        AdaptivePackSize(8).record("great", 4, 0)
    for kwargs in (
        {"trusted": 0},
        {"trusted": 9},
        {"min_agreement": 1.5},
        {"confidence": 1.0},
        {"probe_fraction": -0.1},
    ):
        with pytest.raises(ValueError):
            AdaptivePackSize(8, **kwargs)
    with pytest.raises(ValueError):
        AdaptivePackSize(0)
    with pytest.raises(ValueError):
        AdaptivePackSize(8).record_agreement(3, 2, 2, 0)
    with pytest.raises(ValueError):
        AdaptivePackSize(8).record_speed(2, 3, 1.0, 0)


# --- probes -----------------------------------------------------------------------------------


def test_a_share_of_jobs_goes_out_at_the_probe_size() -> None:
    s = AdaptivePackSize(8, probe_fraction=0.2)
    answers = [s.size_at(t) for t in range(101)]
    # one probe of 2 jobs per 10 jobs (the probe's own jobs count): 2 / 10 = the share
    assert answers[:22] == [1] * 9 + [2, 2] + [1] * 8 + [2, 2, 1]
    assert answers.count(2) == 20 and s.probes == 10


def test_a_probe_waits_for_the_evidence_of_the_one_before() -> None:
    """Jobs are routed long before their answers come back (a backlog fills the windows):
    a level is probed again only once a request of at most its size has reported since its
    last probe (or PROBE_PATIENCE_S passed), not once per share of the jobs routed meanwhile."""
    s = AdaptivePackSize(4, trusted=4, measure_agreement=False, probe_fraction=0.25)
    s.record_speed(4, 4, 1.0, 0)  # batching, never timed alone: size 1 is the probe
    answers = [s.size_at(t * 0.01) for t in range(1000)]  # 1,000 jobs in 10 s, no answer yet
    assert answers.count(1) == 4 and s.probes == 1, "one probe, not one per 16 jobs"
    s.record_speed(4, 4, 1.0, 10.0)  # a batched answer says nothing of the probe's
    assert {s.size_at(10.0 + t * 0.01) for t in range(100)} == {4}
    s.record_speed(1, 1, 0.2, 11.0)  # one of the probe's single requests: the share goes on
    # (the probe's own jobs counted towards it: 12 jobs more make the next probe's 4)
    assert [s.size_at(11.0 + t * 0.01) for t in range(16)] == [4] * 12 + [1] * 4
    # that probe (sent at 11.12 s) is never answered: from 20 s on, one job a second
    later = [s.size_at(20.0 + t) for t in range(100)]
    resumed = math.ceil(11.12 + PROBE_PATIENCE_S - 20.0)  # the first job counted again
    assert set(later[:resumed]) == {4}
    assert later[resumed + 12 : resumed + 16] == [1] * 4 and later.count(1) == 4, "patience is over"



def test_no_probes_when_the_share_is_zero_or_nothing_is_left_to_learn() -> None:
    s = AdaptivePackSize(8, probe_fraction=0.0)
    assert {s.size_at(t) for t in range(100)} == {1}
    full = AdaptivePackSize(8, trusted=8, measure_agreement=False)
    assert {full.size_at(t) for t in range(100)} == {8}
    assert AdaptivePackSize(1, probe_fraction=1.0).size_at(0) == 1


def test_probes_back_off_from_a_level_that_failed() -> None:
    s = AdaptivePackSize(8, probe_fraction=0.2)
    s.record_agreement(0, 4, 2, 0)  # size 2 is known to be worse than 80 %
    answers = [s.size_at(t) for t in range(1000)]
    # the share would probe every 10 jobs; each probe's bad evidence makes the next 4 times
    # further away: 40, 160, 640 jobs
    starts = [t for t, size in enumerate(answers) if size == 2][::2]
    assert starts == [39, 199, 839] and s.probes == 3


def test_probes_grow_the_size_one_level_at_a_time() -> None:
    s = AdaptivePackSize(8, probe_fraction=0.5)
    _proven(s, 2)
    assert s.size == 2
    # the next probe tries 4: 4 jobs once the share has built up 4 jobs' worth
    answers = [s.size_at(t) for t in range(9)]
    assert answers == [2] * 7 + [4, 4]


def test_a_probe_is_answered_to_as_many_jobs_as_it_takes() -> None:
    s = AdaptivePackSize(8, probe_fraction=1.0)
    _proven(s, 2)
    _proven(s, 4)
    assert [s.size_at(t) for t in range(10)] == [4] * 7 + [8] * 3


# --- speed and charges ------------------------------------------------------------------------


def _timed(s: AdaptivePackSize, size: int, seconds_each: float, requests: int = 3, tokens: int = 0) -> None:
    for _ in range(requests):
        s.record_speed(size, size, seconds_each, 0, tokens=tokens)


def test_slower_batching_on_a_free_server_stops() -> None:
    """A local server charges nothing per request: batching that is slower per item is worse."""
    s = AdaptivePackSize(8)
    _proven(s, 2)
    assert s.size == 2
    _timed(s, 1, 0.2)  # 5 items/s alone
    _timed(s, 2, 0.8)  # 2.5 items/s batched
    assert s.size == 1
    assert s.reason() == (
        "size 1: at size 2, batching slower (2.5 vs 5.0 items/s alone) "
        "and saves nothing the provider charges for"
    )


def test_faster_batching_is_kept() -> None:
    s = AdaptivePackSize(8)
    _proven(s, 2)
    _timed(s, 1, 0.2)
    _timed(s, 2, 0.3)
    assert s.size == 2
    assert "1.0 requests saved per 2 jobs, 6.7 vs 5.0 items/s alone" in s.reason()


def test_slower_batching_is_kept_where_requests_are_limited() -> None:
    """Under a request budget every request saved is throughput and money."""
    s = AdaptivePackSize(8)
    _proven(s, 2)
    _timed(s, 1, 0.2)
    _timed(s, 2, 0.8)
    assert s.size == 1
    assert s.size_at(0, request_limited=True) == 2
    assert s.size == 2 and "requests are limited" in s.reason()
    s.size_at(1, request_limited=False)
    assert s.size == 1


def test_under_a_request_limit_batches_that_answer_nothing_save_nothing() -> None:
    s = AdaptivePackSize(8, trusted=8, measure_agreement=False)
    _timed(s, 1, 0.2)
    assert s.size_at(0, request_limited=True) == 8
    for _ in range(3):
        s.record_speed(8, 0, 2.0, 0)  # discarded answers: requests spent, nothing answered
    assert s.size == 4, "size 8 is slower and saves no requests; size 4 is not timed yet"


def test_per_token_providers_keep_slower_batching_only_while_it_saves_tokens() -> None:
    saving = AdaptivePackSize(8, per_token=True)
    _proven(saving, 2)
    _timed(saving, 1, 0.2, tokens=100)  # 100 tokens per item alone
    _timed(saving, 2, 0.8, tokens=120)  # 60 per item batched: the prefix is sent once
    assert saving.size == 2
    costly = AdaptivePackSize(8, per_token=True)
    _proven(costly, 2)
    _timed(costly, 1, 0.2, tokens=100)
    _timed(costly, 2, 0.8, tokens=260)  # 130 per item: the instruction costs more than it saves
    assert costly.size == 1


def test_verification_is_wanted_only_where_agreement_can_still_decide() -> None:
    s = AdaptivePackSize(8)
    assert s.wants_verification(2) and s.wants_verification(5)
    assert not s.wants_verification(1), "an ordinary request has nothing to compare"
    _timed(s, 1, 0.2)
    _timed(s, 2, 0.8)  # size 2 is slower and saves nothing: agreement cannot make it worth it
    assert not s.wants_verification(3)
    assert s.wants_verification(4), "size 4 is not timed yet"
    assert not AdaptivePackSize(8, trusted=8, measure_agreement=False).wants_verification(8)


def test_speed_is_judged_only_with_enough_single_requests() -> None:
    s = AdaptivePackSize(8)
    _proven(s, 2)
    _timed(s, 2, 10.0)
    _timed(s, 1, 0.1, requests=MIN_SINGLE_REQUESTS - 1)
    assert s.size == 2
    s.record_speed(1, 1, 0.1, 0)
    assert s.size == 1


def test_a_batching_key_probes_single_requests_to_time_them() -> None:
    """Batching with speed reported but never timed alone: a share of jobs goes alone."""
    s = AdaptivePackSize(4, trusted=4, measure_agreement=False, probe_fraction=0.25)
    s.record_speed(4, 4, 1.0, 0)
    answers = [s.size_at(t) for t in range(16)]
    assert answers == [4] * 15 + [1]  # one probe of size 1 for 4 jobs ...
    assert [s.size_at(t) for t in range(3)] == [1, 1, 1]  # ... the window each of them opens
    _timed(s, 1, 0.5)  # 2 items/s alone, 4 batched
    assert {s.size_at(t) for t in range(40)} == {4}, "timed: nothing left to probe"


def test_a_discarded_batched_answer_costs_its_time() -> None:
    s = AdaptivePackSize(4, trusted=4, measure_agreement=False)
    _timed(s, 1, 0.5)
    s.record_speed(4, 0, 1.0, 0)  # malformed: answered nothing
    assert s.size == 2, "size 4 is slower than single requests; size 2 is not timed yet"
    s.record_speed(2, 0, 1.0, 0)
    assert s.size == 1


# --- properties (a fake clock and seeded models) ----------------------------------------------

events = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(KINDS), st.integers(1, 80)),
        st.tuples(st.just("agree"), st.integers(0, 10), st.integers(1, 80)),
        st.tuples(st.just("speed"), st.floats(0, 5), st.integers(1, 80)),
        st.tuples(st.just("look"), st.booleans(), st.just(0)),
    ),
    max_size=80,
)


def replay(s: AdaptivePackSize, kind: str, value: object, size: int, now: float) -> bool:
    """Report one generated event to `s` (False for "look": the caller asks `size_at`)."""
    if kind == "record":
        s.record(str(value), size, now)
    elif kind == "agree":
        compared = int(str(value))
        s.record_agreement(compared // 2, compared, size, now)
    elif kind == "speed":
        s.record_speed(min(size, s.max_items), min(size, s.max_items), float(str(value)), now)
    else:
        return False
    return True


@settings(max_examples=200)
@given(st.integers(1, 64), st.integers(1, 64), st.booleans(), st.floats(0, 1), events)
def test_size_is_always_a_level_within_bounds(
    max_items: int, trusted: int, measure: bool, probe_fraction: float, evs: list[tuple[str, object, int]]
) -> None:
    s = AdaptivePackSize(
        max_items, trusted=min(trusted, max_items), measure_agreement=measure, probe_fraction=probe_fraction
    )
    for now, (kind, value, size) in enumerate(evs, start=1):
        if not replay(s, kind, value, size, float(now)):
            asked = s.size_at(float(now), request_limited=bool(value))
            assert asked in s.levels
        assert s.size in s.levels and 1 <= s.size <= max_items
        assert s.reason().startswith(f"size {s.size}: ")


@settings(max_examples=30, deadline=None)
@given(
    st.integers(2, 32),
    st.sampled_from([0.25, 0.5, 1.0]),
    st.sampled_from([0.1, 0.2, 0.5]),
    st.integers(0, 2**16),
)
def test_a_faithful_model_reaches_max_items_and_saves_requests(
    max_items: int, verify_fraction: float, probe_fraction: float, seed: int
) -> None:
    """Answers always agree and a batch is faster per item: the size climbs to max_items,
    and the requests (verification included) are far fewer than the jobs."""
    s = AdaptivePackSize(max_items, probe_fraction=probe_fraction)
    run = drive(s, 3000, verify_fraction=verify_fraction, rng=random.Random(seed))
    assert s.size == max_items, s.reason()
    assert run.requests - run.verify_requests < run.jobs
    later = drive(s, 1000, verify_fraction=verify_fraction, rng=random.Random(seed + 1), run=Run())
    # at max_items: one request per max_items jobs (besides the verification requests)
    assert later.requests - later.verify_requests <= 1000 / max_items + 1
    assert later.batched_jobs >= 1000 - max_items


@settings(max_examples=30, deadline=None)
@given(
    st.integers(2, 32), st.sampled_from([0.25, 1.0]), st.sampled_from([0.1, 0.2, 0.5]), st.integers(0, 2**16)
)
def test_a_model_that_never_agrees_stays_at_one_and_probes_less_and_less(
    max_items: int, verify_fraction: float, probe_fraction: float, seed: int
) -> None:
    s = AdaptivePackSize(max_items, probe_fraction=probe_fraction)
    first = drive(s, 500, agrees=lambda _rng: False, verify_fraction=verify_fraction, rng=random.Random(seed))
    assert s.size == 1
    assert first.batched_jobs <= probe_fraction * 500 + 2
    later = drive(s, 2000, agrees=lambda _rng: False, verify_fraction=verify_fraction, run=Run())
    assert later.batched_jobs <= probe_fraction * 2000 / 4 + 2, "probes of a failed size back off"


def test_a_model_that_agrees_half_the_time_batches_little() -> None:
    for seed in range(20):
        s = AdaptivePackSize(16, probe_fraction=0.2)
        run = drive(s, 2000, agrees=lambda rng: rng.random() < 0.5, rng=random.Random(seed))
        assert s.size == 1, (seed, s.reason())
        assert run.batched_jobs <= 0.2 * 2000, seed


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 32), st.sampled_from([0.1, 0.2, 0.5]), st.integers(0, 2**16))
def test_slower_batching_on_a_free_server_is_dropped_and_probed_less_and_less(
    max_items: int, probe_fraction: float, seed: int
) -> None:
    """Answers agree but a batch takes longer per item than single requests (a small model
    on a one-slot CPU server): the key stays at ordinary requests."""
    s = AdaptivePackSize(max_items, probe_fraction=probe_fraction)

    def slow(n: int) -> float:
        return 0.2 * n * (1.8 if n > 1 else 1.0)

    first = drive(s, 500, seconds=slow, rng=random.Random(seed))
    assert s.size == 1, s.reason()
    assert first.batched_jobs <= probe_fraction * 500 + 2
    later = drive(s, 2000, seconds=slow, rng=random.Random(seed), run=Run())
    assert s.size == 1
    assert later.batched_jobs <= probe_fraction * 2000 / 4 + 2


# --- remembered evidence ----------------------------------------------------------------------


def through_json(state: dict[str, object]) -> dict[str, object]:
    """What a record in the batching topic gives back."""
    loaded: dict[str, object] = orjson.loads(orjson.dumps(state))
    return loaded


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.booleans(), st.floats(0, 1), events, st.lists(st.floats(0, 5), max_size=30))
def test_a_restored_tracker_decides_as_the_one_it_came_from(
    max_items: int,
    measure: bool,
    probe_fraction: float,
    evs: list[tuple[str, object, int]],
    later: list[float],
) -> None:
    """Same size and reason at once, and after every further report the same decision."""

    def make() -> AdaptivePackSize:
        return AdaptivePackSize(max_items, measure_agreement=measure, probe_fraction=probe_fraction)

    s = make()
    now = 0.0
    for kind, value, size in evs:
        now += 1.0
        replay(s, kind, value, size, now)
    restored = make()
    restored.restore(through_json(s.export()))
    assert (restored.size, restored.reason()) == (s.size, s.reason())
    for i, seconds in enumerate(later):
        now += 1.0
        for t in (s, restored):
            t.record_speed(1 if i % 2 else max_items, 1, seconds, now)
            t.record("complete" if i % 3 else "malformed", 2, now)
        assert (restored.size, restored.reason()) == (s.size, s.reason()), i


def test_a_restarted_key_starts_at_its_proven_size_without_probing_again() -> None:
    s = AdaptivePackSize(8, probe_fraction=0.2)
    drive(s, 3000, rng=random.Random(1))
    assert s.size == 8
    restarted = AdaptivePackSize(8, probe_fraction=0.2)
    assert restarted.restore(through_json(s.export())) == 8
    run = drive(restarted, 400, rng=random.Random(2))
    assert run.requests - run.verify_requests <= 400 / 8 + 1, "batched at 8 from its first job"
    assert restarted.reason().startswith("size 8: agreement 100% of ")


def test_a_restarted_key_keeps_its_probe_backoff_where_batching_was_slower() -> None:
    """Slower batching on a free server: the restarted key neither batches nor probes early."""

    def slow(n: int) -> float:
        return 0.2 * n * (1.8 if n > 1 else 1.0)

    s = AdaptivePackSize(8, probe_fraction=0.1)
    drive(s, 300, seconds=slow)
    assert s.size == 1 and s.probes >= 1
    fresh, restarted = AdaptivePackSize(8, probe_fraction=0.1), AdaptivePackSize(8, probe_fraction=0.1)
    restarted.restore(through_json(s.export()))
    assert "batching slower" in restarted.reason()
    fresh_run, restarted_run = drive(fresh, 64, seconds=slow), drive(restarted, 64, seconds=slow)
    assert fresh_run.batched_jobs > 0, "a new key probes within 64 jobs"
    assert restarted_run.batched_jobs == 0, "the restarted one knows batching is slower"


def test_restore_matches_levels_by_size_and_refuses_what_is_not_evidence() -> None:
    s = AdaptivePackSize(4, measure_agreement=False, trusted=1)  # levels 1, 2, 4
    for _ in range(20):
        s.record("complete", 2, 1.0)
        s.record("complete", 4, 1.0)
    assert s.size == 4
    state = through_json(s.export())
    # levels 1, 2, 4, 6: 2 and 4 come back proven, 6 is not measured yet
    assert AdaptivePackSize(6, measure_agreement=False, trusted=1).restore(state) == 4
    # levels 1, 2, 3: only 2 matches
    assert AdaptivePackSize(3, measure_agreement=False, trusted=1).restore(state) == 2
    bad: list[tuple[object, str]] = [
        ({}, "levels must be an object"),
        ({"levels": {"two": {}}}, "level 'two' must be a size"),
        ({"levels": {"2": {"valid": -1}}}, "level 2: valid must be a number >= 0, got -1"),
        ({"levels": {"2": {"valid": 3, "judged": 2}}}, "level 2: valid (3) exceeds judged (2)"),
        ({"levels": {"2": {"gap": 0.5}}}, "level 2: gap must be within 1..256"),
        ({"levels": {}, "probes": "3"}, "probes must be an integer >= 0"),
    ]
    fresh = AdaptivePackSize(4, measure_agreement=False, trusted=1)
    for state_, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            fresh.restore(state_)  # type: ignore[arg-type]
    assert fresh.size == 1 and fresh.changes == 0, "a refused state changes nothing"


# --- the registry -----------------------------------------------------------------------------


def test_registry_keeps_one_tracker_per_key_explains_and_expires_idle_ones() -> None:
    made: list[tuple[str, str]] = []

    def factory(key: tuple[str, str]) -> AdaptivePackSize:
        made.append(key)
        return AdaptivePackSize(16, trusted=4 if key[0] == "small" else 2, measure_agreement=False)

    sizes: AdaptiveSizes[tuple[str, str]] = AdaptiveSizes(factory)
    assert sizes.explain() == ""
    a, b = ("small", "k1"), ("big", "k1")
    assert sizes.size_at(a, 0) == 4
    assert sizes.size_at(b, 0) == 2
    assert sizes.record(b, "malformed", 2, 1) == 1
    assert sizes.record_speed(a, 4, 4, 1.0, 2) == 4
    assert sizes.record_agreement(a, 1, 1, 4, 2) == 4
    assert sizes.get(a) is sizes.get(a)
    assert made == [a, b]
    assert sizes.snapshot() == {a: 4, b: 1}
    assert sizes.explain() == (
        "size 4: configured, 3.0 requests saved per 4 jobs; at size 8, not measured yet (probing 10% of jobs)"
    )
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
