"""RequestPlan: split-and-retry decisions (DESIGN.md rules 5, 7, 8) and its properties."""

from __future__ import annotations

import random
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    ErrorKind,
    MalformedResponse,
    Overloaded,
    ProviderError,
    QuotaExhausted,
    RateLimited,
    RateLimitHint,
    Rejected,
    RequestTimeout,
    ServerError,
)
from consumer.core.packing import AnswerKind
from consumer.core.plan import Member, PlannedRequest, RequestPlan, Step
from consumer.core.retry import RetryPolicy

Check = Callable[[str], "tuple[str, str | None]"]

POLICY = RetryPolicy(
    max_attempts=3, backoff_initial_s=0.5, backoff_max_s=4.0, quota_cooldown_s=60, quota_max_wait_s=150
)


def _members(n: int, max_tokens: int | None = 20, check: Check | None = None) -> list[Member]:
    return [Member(ref=f"job{i}", input=f"input {i}", max_tokens=max_tokens, check=check) for i in range(n)]


def _plan(n: int, *, policy: RetryPolicy = POLICY, tier_max_tokens: int | None = 4096,
          max_tokens: int | None = 20, seed: int = 0, check: Check | None = None) -> RequestPlan:
    return RequestPlan(_members(n, max_tokens, check), prefix="Summarize:\n", variable="text", retry=policy,
                       rng=random.Random(seed), tier_max_tokens=tier_max_tokens)


def _ans_only(text: str) -> tuple[str, str | None]:
    """An output format that only takes the model's proper answers ("ans:...")."""
    return text, None if text.startswith("ans:") else f"not an answer: {text[:10]}"


def _perfect(req: PlannedRequest, skip: int = 0) -> str:
    assert req.packed is not None
    return orjson.dumps(
        {a: f"ans:{m.input}" for a, m in list(zip(req.packed.aliases, req.members, strict=True))[skip:]}
    ).decode()


def _answered(step: Step) -> dict[object, str]:
    return {m.ref: text for m, text, _ in step.answered}


def test_single_member_is_an_ordinary_request_and_its_answer_is_not_judged() -> None:
    plan = _plan(1)
    (req,) = plan.start()
    assert req.packed is None and not req.batched and req.attempt == 1 and req.delay_s == 0
    assert req.max_tokens == 20
    step = plan.on_answer(req, "", "length")  # empty and truncated: still the model's answer
    assert _answered(step) == {"job0": ""} and step.requests == [] and step.verdict is None
    assert plan.done and plan.attempts(plan.members[0]) == 1


def test_complete_batched_answer() -> None:
    plan = _plan(4)
    (req,) = plan.start()
    assert req.batched and req.packed is not None and len(req.packed.aliases) == 4
    assert req.max_tokens == 4 * 20 + 4 * 8 + 16
    step = plan.on_answer(req, _perfect(req), "stop")
    assert step.verdict is not None and step.verdict.kind is AnswerKind.COMPLETE
    assert _answered(step) == {f"job{i}": f"ans:input {i}" for i in range(4)}
    assert all(r is req for _, _, r in step.answered)
    assert plan.done and plan.requests_sent == 1


def test_batch_max_tokens_capped_by_tier_or_left_to_tier() -> None:
    (req,) = _plan(10, tier_max_tokens=100).start()
    assert req.max_tokens == 100
    (req,) = _plan(3, max_tokens=None, tier_max_tokens=512).start()
    assert req.max_tokens == 512
    (req,) = _plan(3, max_tokens=None, tier_max_tokens=None).start()
    assert req.max_tokens is None


def test_missing_aliases_are_asked_again_alone() -> None:
    plan = _plan(4)
    (req,) = plan.start()
    step = plan.on_answer(req, _perfect(req, skip=2), "stop")
    assert step.verdict is not None and step.verdict.kind is AnswerKind.MISSING
    assert set(_answered(step)) == {"job2", "job3"}
    assert [(r.members[0].ref, r.packed) for r in step.requests] == [("job0", None), ("job1", None)]
    for r in step.requests:
        assert _answered(plan.on_answer(r, "solo", "stop")) == {r.members[0].ref: "solo"}
    assert plan.done
    assert plan.attempts(plan.members[0]) == 2 and plan.attempts(plan.members[3]) == 1


@pytest.mark.parametrize(("text", "finish"), [("garbage", "stop"), ('{"zzzz": "x"}', "stop")])
def test_malformed_or_unexpected_splits_in_halves(text: str, finish: str) -> None:
    plan = _plan(5)
    (req,) = plan.start()
    step = plan.on_answer(req, text, finish)
    assert step.answered == [] and step.failed == []
    halves = [[str(m.ref) for m in r.members] for r in step.requests]
    assert [len(h) for h in halves] == [3, 2]
    assert sorted(halves[0] + halves[1]) == [f"job{i}" for i in range(5)]  # each member once
    assert all(r.batched and r.attempt == 1 and r.delay_s == 0 for r in step.requests)
    # the halves carry their own aliases, one per member
    assert [len(r.packed.aliases) for r in step.requests if r.packed is not None] == [3, 2]


def test_unexpected_alias_discards_valid_entries_too() -> None:
    plan = _plan(2)
    (req,) = plan.start()
    assert req.packed is not None
    a, b = req.packed.aliases
    step = plan.on_answer(req, orjson.dumps({a: "x", b: "y", "job0": "z"}).decode(), "stop")
    assert step.answered == [] and len(step.requests) == 2 and all(not r.batched for r in step.requests)


def test_truncated_keeps_complete_entries_and_splits_the_rest() -> None:
    plan = _plan(6)
    (req,) = plan.start()
    full = _perfect(req)
    cut = full[: full.index('"', full.index("ans:input 2"))]  # cut inside the third answer
    step = plan.on_answer(req, cut, "length")
    assert step.verdict is not None and step.verdict.kind is AnswerKind.TRUNCATED
    assert _answered(step) == {"job0": "ans:input 0", "job1": "ans:input 1"}
    halves = [[str(m.ref) for m in r.members] for r in step.requests]
    assert [len(h) for h in halves] == [2, 2]
    assert sorted(halves[0] + halves[1]) == ["job2", "job3", "job4", "job5"]  # the rest, each once


def _reask_orders(text: str, finish: str, seeds: range) -> set[tuple[object, ...]]:
    """The member order of the re-asks after one failed answer to a batch of 8, per seed."""
    orders = set()
    for seed in seeds:
        plan = _plan(8, seed=seed)
        (req,) = plan.start()
        answer = text if text else _perfect(req)[:40]  # "" : cut inside the first entries
        step = plan.on_answer(req, answer, finish)
        orders.add(tuple(m.ref for r in step.requests for m in r.members))
    return orders


@pytest.mark.parametrize(
    ("text", "finish"), [("garbage", "stop"), ('{"zzzz": "x"}', "stop"), ("", "length")]
)
def test_reasks_after_a_failed_answer_shuffle_the_remaining_items(text: str, finish: str) -> None:
    """Position in the list affects a batched answer: a re-ask must not repeat the order that
    failed. Over seeds the halves come in many orders (not only the input order), and a
    given seed always gives the same order (the plan's rng decides)."""
    orders = _reask_orders(text, finish, range(20))
    assert len(orders) > 10
    assert _reask_orders(text, finish, range(3, 4)) == _reask_orders(text, finish, range(3, 4))


def test_missing_items_are_asked_alone_without_reordering_the_answered_ones() -> None:
    plan = _plan(4, seed=5)
    (req,) = plan.start()
    step = plan.on_answer(req, _perfect(req, skip=2), "stop")
    assert [r.members[0].ref for r in step.requests] == ["job0", "job1"]


def test_truncated_down_to_single() -> None:
    plan = _plan(2)
    (req,) = plan.start()
    full = _perfect(req)
    step = plan.on_answer(req, full[: full.index(",") + 1], "length")
    assert len(step.answered) == 1 and len(step.requests) == 1 and not step.requests[0].batched


@pytest.mark.parametrize(
    "error",
    [
        RateLimited("429"), Overloaded("529"), ServerError("500"), ConnectionFailed("reset"),
        MalformedResponse("not json"),  # RequestTimeout on a batch: see the split test below
    ],
)
def test_retryable_errors_retry_then_exhaust(error: ProviderError) -> None:
    plan = _plan(3)
    (req,) = plan.start()
    delays = []
    for attempt in (1, 2):
        step = plan.on_error(req, error)
        (req,) = step.requests
        assert req.attempt == attempt + 1 and req.batched
        delays.append(req.delay_s)
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0  # backoff with equal jitter
    step = plan.on_error(req, error)
    assert step.requests == []
    assert {m.ref for m, _, _ in step.failed} == {"job0", "job1", "job2"}
    assert {k for _, k, _ in step.failed} == {ErrorKind.RETRIES_EXHAUSTED}
    assert "after 3 attempts" in step.failed[0][2]
    assert plan.done and plan.attempts(plan.members[0]) == 3
    assert plan.last_error(plan.members[0]) is error


def test_batched_request_that_keeps_timing_out_is_split_with_one_last_attempt_each() -> None:
    plan = _plan(5)
    (req,) = plan.start()
    for _ in range(2):
        (req,) = plan.on_error(req, RequestTimeout("read timeout")).requests
    step = plan.on_error(req, RequestTimeout("read timeout"))
    assert step.failed == []
    first, second = step.requests
    assert [len(first.members), len(second.members)] == [3, 2] and first.attempt == second.attempt == 3
    step = plan.on_error(first, RequestTimeout("read timeout"))  # halves again
    assert [len(r.members) for r in step.requests] == [2, 1]
    single = step.requests[1]
    step = plan.on_error(single, RequestTimeout("read timeout"))  # a single has no split left
    assert [k for _, k, _ in step.failed] == [ErrorKind.RETRIES_EXHAUSTED]
    assert plan.attempts(single.members[0]) == 5


def test_retry_reuses_the_packed_prompt_and_honours_retry_after() -> None:
    plan = _plan(3)
    (req,) = plan.start()
    (again,) = plan.on_error(req, RateLimited("429", hint=RateLimitHint(retry_after_s=7.0))).requests
    assert again.packed == req.packed and again.delay_s == 7.0 and again.seq != req.seq


def test_auth_failure_fails_every_member() -> None:
    plan = _plan(3)
    (req,) = plan.start()
    step = plan.on_error(req, AuthFailed("invalid api key", status_code=401))
    assert [k for _, k, _ in step.failed] == [ErrorKind.AUTH_FAILED] * 3 and step.requests == []
    assert plan.done


def test_rejected_batched_splits_down_to_the_member_that_causes_it() -> None:
    plan = _plan(4)
    (req,) = plan.start()
    bad = "job2"
    failed: list[tuple[object, ErrorKind]] = []
    answered: dict[object, str] = {}
    queue = [req]
    sent = 0
    while queue:
        r = queue.pop()
        sent += 1
        if any(m.ref == bad for m in r.members):
            step = plan.on_error(r, Rejected("context too long", status_code=400))
        else:
            step = plan.on_answer(r, _perfect(r) if r.batched else "ok", "stop")
        failed += [(m.ref, k) for m, k, _ in step.failed]
        answered.update(_answered(step))
        queue += step.requests
    assert failed == [(bad, ErrorKind.PROVIDER_REJECTED)]
    assert set(answered) == {"job0", "job1", "job3"}
    assert plan.done and sent <= 2 * 4 - 1


def test_quota_pauses_the_tier_then_fails() -> None:
    plan = _plan(2)
    (req,) = plan.start()
    step = plan.on_error(req, QuotaExhausted("billing"))
    assert step.pause_tier_s == 60 and len(step.requests) == 1
    req = step.requests[0]
    assert req.delay_s == 60 and req.attempt == 1 and req.quota_waited_s == 60 and req.packed is not None
    step = plan.on_error(req, QuotaExhausted("billing"))
    req = step.requests[0]
    assert req.quota_waited_s == 120
    step = plan.on_error(req, QuotaExhausted("billing"))  # 180 s would pass the 150 s budget
    assert step.requests == [] and step.pause_tier_s is None
    assert [k for _, k, _ in step.failed] == [ErrorKind.QUOTA_EXHAUSTED] * 2


def test_quota_pause_follows_retry_after_but_never_zero() -> None:
    plan = _plan(1, policy=RetryPolicy(quota_cooldown_s=0, quota_max_wait_s=4.5))
    (req,) = plan.start()
    step = plan.on_error(req, QuotaExhausted("q", hint=RateLimitHint(retry_after_s=3)))
    assert step.pause_tier_s == 3
    step = plan.on_error(step.requests[0], QuotaExhausted("q"))
    assert step.pause_tier_s == 1.0  # MIN_QUOTA_PAUSE_S, so it cannot spin
    step = plan.on_error(step.requests[0], QuotaExhausted("q"))
    assert step.failed and plan.done


def test_rejected_single_fails_provider_rejected() -> None:
    plan = _plan(1)
    (req,) = plan.start()
    step = plan.on_error(req, Rejected("content policy", status_code=400))
    assert step.failed == [(plan.members[0], ErrorKind.PROVIDER_REJECTED, "content policy")]


def test_reporting_twice_or_foreign_requests_is_an_error() -> None:
    plan = _plan(2)
    (req,) = plan.start()
    plan.on_answer(req, _perfect(req), "stop")
    with pytest.raises(ValueError):
        plan.on_answer(req, _perfect(req), "stop")
    with pytest.raises(ValueError):
        plan.on_error(req, ServerError("x"))
    with pytest.raises(RuntimeError):
        plan.start()


def test_invalid_members() -> None:
    with pytest.raises(ValueError):
        RequestPlan([], prefix="", variable="v", retry=POLICY, rng=random.Random())
    with pytest.raises(ValueError):
        twins = [Member("a", "x"), Member("a", "y")]
        RequestPlan(twins, prefix="", variable="v", retry=POLICY, rng=random.Random())


def test_cancel_some_members_then_the_rest() -> None:
    plan = _plan(3)
    (req,) = plan.start()
    step = plan.cancel(ErrorKind.DEADLINE_EXCEEDED, "deadline passed", [plan.members[1]])
    assert [(m.ref, k) for m, k, _ in step.failed] == [("job1", ErrorKind.DEADLINE_EXCEEDED)]
    step = plan.on_answer(req, _perfect(req), "stop")
    assert set(_answered(step)) == {"job0", "job2"}  # never job1 again
    assert plan.done


def test_cancel_during_retry_narrows_the_retry() -> None:
    plan = _plan(2)
    (req,) = plan.start()
    plan.cancel(ErrorKind.DEADLINE_EXCEEDED, "late", [plan.members[0]])
    (again,) = plan.on_error(req, ServerError("503")).requests
    assert [m.ref for m in again.members] == ["job1"] and not again.batched
    plan.cancel(ErrorKind.DEADLINE_EXCEEDED, "late")
    assert plan.done and plan.outstanding == []
    plan2 = _plan(2)
    (req2,) = plan2.start()
    plan2.cancel(ErrorKind.DEADLINE_EXCEEDED, "late", [plan2.members[0]])
    assert plan2.outstanding == [req2]
    plan2.cancel(ErrorKind.DEADLINE_EXCEEDED, "late", [plan2.members[1]])
    assert plan2.done and plan2.outstanding == []


def test_outcome_of_a_request_whose_members_were_all_cancelled_is_a_noop() -> None:
    plan = _plan(4)
    (req,) = plan.start()
    first, second = plan.on_answer(req, "garbage", "stop").requests
    plan.cancel(ErrorKind.DEADLINE_EXCEEDED, "late", first.members)
    assert plan.on_error(first, ServerError("503")) == Step()
    step = plan.on_answer(second, _perfect(second), "stop")
    assert set(_answered(step)) == {m.ref for m in second.members} and plan.done


# --- the job's own output format (output_invalid) -------------------------------------


def test_ordinary_answer_that_breaks_the_output_format_fails_output_invalid() -> None:
    plan = _plan(1, check=_ans_only)
    (req,) = plan.start()
    step = plan.on_answer(req, "Sure! Here it is", "stop")
    assert step.answered == [] and step.requests == []
    ((member, kind, message),) = step.failed
    assert member.ref == "job0" and kind is ErrorKind.OUTPUT_INVALID
    assert message == "not an answer: Sure! Here"
    assert plan.done


def test_ordinary_answer_that_obeys_the_output_format_is_the_result() -> None:
    plan = _plan(1, check=_ans_only)
    (req,) = plan.start()
    step = plan.on_answer(req, "ans:input 0", "stop")
    assert _answered(step) == {"job0": "ans:input 0"} and step.failed == []


def test_batched_answer_that_breaks_a_members_format_asks_that_member_again_alone() -> None:
    plan = _plan(4, check=_ans_only)
    (req,) = plan.start()
    assert req.packed is not None
    answers = {a: f"ans:{m.input}" for a, m in zip(req.packed.aliases, req.members, strict=True)}
    answers[req.packed.aliases[2]] = "bad"
    step = plan.on_answer(req, orjson.dumps(answers).decode(), "stop")
    assert set(_answered(step)) == {"job0", "job1", "job3"} and step.failed == []
    assert step.verdict is not None and step.verdict.kind is AnswerKind.COMPLETE
    (again,) = step.requests
    assert [m.ref for m in again.members] == ["job2"] and again.packed is None and again.delay_s == 0
    last = plan.on_answer(again, "still bad", "stop")
    assert [(m.ref, kind) for m, kind, _ in last.failed] == [("job2", ErrorKind.OUTPUT_INVALID)]
    assert plan.done and plan.attempts(plan.members[2]) == 2


# --- property: any model behaviour ----------------------------------------------------

ERRORS: list[ProviderError] = [
    ServerError("500"), RateLimited("429", hint=RateLimitHint(retry_after_s=2)), RequestTimeout("t"),
    Rejected("400"), QuotaExhausted("quota"), MalformedResponse("m"), AuthFailed("401"),
]


def _model(req: PlannedRequest, rnd: random.Random) -> tuple[str, str] | ProviderError:
    """A misbehaving model: errors, garbage, drops, extra aliases, truncation, swaps."""
    roll = rnd.random()
    if roll < 0.15:
        return rnd.choice(ERRORS)
    if req.packed is None:
        if roll < 0.25:
            return "bad output", "stop"  # breaks the output format (when the members have one)
        return f"ans:{req.members[0].input}", rnd.choice(["stop", "length"])
    answers = {a: f"ans:{m.input}" for a, m in zip(req.packed.aliases, req.members, strict=True)}
    behaviour = rnd.choice(
        ["ok", "ok", "drop", "extra", "garbage", "truncate", "fence", "wrap", "null", "disobey"]
    )
    if behaviour == "disobey":
        answers = {a: v if rnd.random() < 0.5 else "bad" for a, v in answers.items()}
    if behaviour == "drop":
        answers = {a: v for a, v in answers.items() if rnd.random() < 0.5}
    elif behaviour == "extra":
        answers["q" + str(rnd.randrange(1000))] = "injected"
    elif behaviour == "garbage":
        return rnd.choice(["", "sorry", "{", "[]", '{"a":'] ), "stop"
    elif behaviour == "null":
        answers = dict.fromkeys(answers, None)  # type: ignore[assignment]
    text = orjson.dumps(answers).decode()
    if behaviour == "truncate":
        return text[: rnd.randrange(len(text) + 1)], "length"
    if behaviour == "fence":
        text = f"Here:\n```json\n{text}\n```"
    elif behaviour == "wrap":
        text = orjson.dumps({"answers": answers}).decode()
    return text, "stop"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 30), st.integers(0, 2**32), st.integers(1, 4), st.booleans())
def test_any_model_behaviour_ends_every_member_exactly_once(
    n: int, seed: int, max_attempts: int, with_format: bool
) -> None:
    rnd = random.Random(seed)
    policy = RetryPolicy(max_attempts=max_attempts, backoff_initial_s=0.1, backoff_max_s=1,
                         quota_cooldown_s=10, quota_max_wait_s=25)
    plan = _plan(n, policy=policy, seed=seed, check=_ans_only if with_format else None)
    queue = plan.start()
    outcomes: dict[object, list[str]] = {m.ref: [] for m in plan.members}
    inputs = {m.ref: m.input for m in plan.members}
    sent = retries = 0
    for _ in range(10_000):  # bounded: the plan must finish well before
        if not queue:
            break
        req = queue.pop(rnd.randrange(len(queue)))  # outcomes arrive in any order
        sent += 1
        if req.delay_s > 0:  # a re-send (backoff or quota pause); splits and re-asks go at once
            retries += 1
        outcome = _model(req, rnd)
        if isinstance(outcome, ProviderError):
            step = plan.on_error(req, outcome)
        else:
            step = plan.on_answer(req, *outcome)
        for m, text, by in step.answered:
            assert m in by.members
            if with_format:
                assert text == f"ans:{inputs[m.ref]}"  # never another member's answer, never a bad one
            else:
                assert text in (f"ans:{inputs[m.ref]}", "bad", "bad output")  # taken as it came
            outcomes[m.ref].append("answered")
        for m, kind, _ in step.failed:
            assert kind in {ErrorKind.RETRIES_EXHAUSTED, ErrorKind.AUTH_FAILED, ErrorKind.QUOTA_EXHAUSTED,
                            ErrorKind.PROVIDER_REJECTED, ErrorKind.OUTPUT_INVALID}
            assert with_format or kind is not ErrorKind.OUTPUT_INVALID
            outcomes[m.ref].append(kind)
        for r in step.requests:
            assert r.members and all(outcomes[m.ref] == [] for m in r.members)
            assert r.batched == (len(r.members) > 1)
            assert r.attempt <= max_attempts
        queue += step.requests
    assert not queue and plan.done and plan.outstanding == []
    assert all(len(o) == 1 for o in outcomes.values()), outcomes
    assert sent == plan.requests_sent
    assert sent - retries <= 2 * n - 1
    for m in plan.members:
        assert 1 <= plan.attempts(m) <= sent


def test_released_members_leave_the_plan_without_an_outcome_and_the_rest_get_a_request() -> None:
    plan = _plan(4)
    (req,) = plan.start()
    moved = list(req.members[:3])
    rest = plan.release(req, moved)
    assert rest is not None and rest.members == (req.members[3],) and rest.packed is None
    assert rest.attempt == req.attempt and plan.outstanding == [rest]
    with pytest.raises(ValueError):
        plan.release(req, moved)  # withdrawn once
    step = plan.on_answer(rest, "fine", "stop")
    assert [m for m, _, _ in step.answered] == [req.members[3]] and not step.failed
    assert plan.done and all(plan.attempts(m) == 0 for m in moved)


def test_releasing_every_member_ends_the_plan() -> None:
    plan = _plan(2)
    (req,) = plan.start()
    assert plan.release(req, req.members) is None
    assert plan.done and plan.outstanding == []
