"""Fallback decisions (core/fallback.py) and the mode auto decision (core/routing.py): pure,
on a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from consumer.core.circuit import CircuitBreaker
from consumer.core.errors import ConnectionFailed
from consumer.core.fallback import (
    FallbackCause,
    FallbackRule,
    QuotaWatch,
    TierCondition,
    chain_problem,
    fallback_cause,
    fallback_tier,
)
from consumer.core.routing import ModePolicy, parse_duration_s

OUTAGE_ONLY = frozenset({FallbackCause.OUTAGE})
QUOTA_ONLY = frozenset({FallbackCause.QUOTA_EXHAUSTED})


def _condition(circuit: CircuitBreaker, quota: QuotaWatch, now_s: float) -> TierCondition:
    return TierCondition(circuit.open, circuit.outage_s(now_s), quota.exhausted(now_s))


def test_an_outage_moves_jobs_only_after_after_s_and_until_the_circuit_closes() -> None:
    rule = FallbackRule("backup", after_s=5.0, on=OUTAGE_ONLY)
    circuit, quota = CircuitBreaker(failures=2, probe_s=1.0), QuotaWatch()
    assert fallback_cause(rule, _condition(circuit, quota, 0.0)) is None
    circuit.on_outage(ConnectionFailed("down"), 10.0)
    circuit.on_outage(ConnectionFailed("down"), 10.0)
    assert circuit.open
    assert fallback_cause(rule, _condition(circuit, quota, 14.9)) is None
    assert fallback_cause(rule, _condition(circuit, quota, 15.0)) is FallbackCause.OUTAGE
    circuit.on_answer(40.0)
    assert fallback_cause(rule, _condition(circuit, quota, 40.0)) is None


def test_an_exhausted_quota_moves_jobs_until_its_cooldown_or_an_answer() -> None:
    rule = FallbackRule("backup", after_s=30.0, on=QUOTA_ONLY)
    circuit, quota = CircuitBreaker(), QuotaWatch()
    quota.on_exhausted(100.0, cooldown_s=60.0)
    assert fallback_cause(rule, _condition(circuit, quota, 100.0)) is FallbackCause.QUOTA_EXHAUSTED
    assert fallback_cause(rule, _condition(circuit, quota, 159.9)) is FallbackCause.QUOTA_EXHAUSTED
    assert fallback_cause(rule, _condition(circuit, quota, 160.0)) is None
    quota.on_exhausted(200.0, cooldown_s=60.0)
    quota.on_answer()
    assert fallback_cause(rule, _condition(circuit, quota, 201.0)) is None
    assert quota.exhausted_count == 2


def test_a_cause_not_listed_in_on_moves_nothing() -> None:
    outage = TierCondition(circuit_open=True, outage_s=1000.0)
    assert fallback_cause(FallbackRule("b", 0.0, QUOTA_ONLY), outage) is None
    assert fallback_cause(FallbackRule("b", 0.0, OUTAGE_ONLY), TierCondition(quota_exhausted=True)) is None


def test_the_chain_skips_tiers_in_trouble_and_those_that_cannot_take_the_job() -> None:
    rules = {
        "main": FallbackRule("backup", 0.0),
        "backup": FallbackRule("spare", 0.0),
        "spare": None,
    }
    down = TierCondition(circuit_open=True, outage_s=1.0)
    ok = TierCondition()
    assert fallback_tier("main", rules, {"main": ok, "backup": ok, "spare": ok}) is None
    assert fallback_tier("main", rules, {"main": down, "backup": ok, "spare": ok}) == "backup"
    assert fallback_tier("main", rules, {"main": down, "backup": down, "spare": ok}) == "spare"
    assert fallback_tier("main", rules, {"main": down, "backup": down, "spare": down}) is None
    only_spare = fallback_tier(
        "main", rules, {"main": down, "backup": ok, "spare": ok}, accepts=lambda t: t == "spare"
    )
    assert only_spare == "spare"


def test_chain_problems_name_the_tier_unknown_targets_and_cycles() -> None:
    assert chain_problem({"a": FallbackRule("b"), "b": None}) is None
    unknown = ("a", "fallback tier 'zz' is not configured (known: a)")
    assert chain_problem({"a": FallbackRule("zz")}) == unknown
    assert chain_problem({"a": FallbackRule("a")}) == ("a", "fallback cycle: a -> a")
    problem = chain_problem({"a": FallbackRule("b"), "b": FallbackRule("c"), "c": FallbackRule("b")})
    assert problem == ("a", "fallback cycle: b -> c -> b")


@given(
    targets=st.dictionaries(
        st.sampled_from("abcdef"), st.none() | st.sampled_from("abcdef"), min_size=1, max_size=6
    ),
    troubled=st.sets(st.sampled_from("abcdef")),
)
def test_a_valid_chain_always_ends_on_a_tier_free_of_trouble_or_nowhere(
    targets: dict[str, str | None], troubled: set[str]
) -> None:
    rules = {n: FallbackRule(t, 0.0) if t is not None else None for n, t in targets.items()}
    rules = {n: r if r is None or r.tier in rules else None for n, r in rules.items()}
    conditions = {n: TierCondition(circuit_open=n in troubled, outage_s=1.0) for n in rules}
    assume(chain_problem(rules) is None)  # else the tier file refuses it
    for name in rules:
        found = fallback_tier(name, rules, conditions)
        if found is not None:
            assert name in troubled and found != name and found not in troubled


def test_durations() -> None:
    assert parse_duration_s("24h") == 86400
    assert parse_duration_s("1h30m") == 5400
    assert parse_duration_s("45s") == 45
    assert parse_duration_s("2d") == 172800
    for bad in ("", "24", "h", "1x", "1h 30m"):
        with pytest.raises(ValueError):
            parse_duration_s(bad)


def test_auto_goes_offline_only_when_the_deadline_leaves_window_and_margin() -> None:
    policy = ModePolicy("online", offline_allowed=True, completion_window_s=86400, auto_margin_s=3600)
    assert policy.mode_for("auto", 48 * 3600) == "offline"
    assert policy.mode_for("auto", 600) == "online"
    assert policy.mode_for("auto", 25 * 3600) == "offline"
    assert policy.mode_for("auto", 25 * 3600 - 1) == "online"
    assert policy.mode_for("auto", None) == "offline", "no deadline: the job can wait"
    assert policy.mode_for(None, None) == "online", "the tier's default_mode"
    assert policy.mode_for("offline", 1) == "offline", "an explicit offline is admission's to check"
    closed = ModePolicy("auto", offline_allowed=False)
    assert closed.mode_for(None, None) == "online", "auto on a tier without offline goes online"
    assert ModePolicy("auto", offline_allowed=True).mode_for(None, None) == "offline"


@given(
    left_s=st.none() | st.floats(min_value=-1e6, max_value=1e7, allow_nan=False),
    window_s=st.floats(min_value=0, max_value=1e6),
    margin_s=st.floats(min_value=0, max_value=1e5),
    allowed=st.booleans(),
)
def test_auto_offline_never_risks_the_deadline(
    left_s: float | None, window_s: float, margin_s: float, allowed: bool
) -> None:
    mode = ModePolicy("auto", allowed, window_s, margin_s).mode_for("auto", left_s)
    if mode == "offline":
        assert allowed and (left_s is None or left_s >= window_s + margin_s)
    else:
        assert not allowed or (left_s is not None and left_s < window_s + margin_s)
