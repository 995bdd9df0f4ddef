"""Embed jobs' pure rules: the message model, windows bounded by the provider's limits, and
the split rule (one bad input fails only itself)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.completion import CHARS_PER_TOKEN
from consumer.core.content import job_content
from consumer.core.embed import (
    EmbedLimits,
    EmbedPlan,
    embed_dedupe_key,
    embed_options,
    embed_pack_key,
    embed_window_limits,
    too_long,
)
from consumer.core.errors import ErrorKind, JobError, MalformedResponse, Rejected, ServerError
from consumer.core.jobs import decode_job
from consumer.core.plan import Member
from consumer.core.retry import RetryPolicy
from consumer.core.window import CollectionWindows, PackKey, WindowLimits, options_key

RETRY = RetryPolicy(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0)


def test_an_embed_job_has_input_and_no_prompt() -> None:
    job = decode_job(
        b'{"id": "a", "tier": "t", "kind": "embed", "input": "hi", "options": {"dimensions": 8}}'
    )
    assert (job.kind, job.input, job.options) == ("embed", "hi", {"dimensions": 8})
    assert decode_job(b'{"id": "a", "tier": "t", "prompt": "p"}').kind == "chat"
    for raw, words in [
        (b'{"id": "a", "tier": "t", "kind": "embed"}', "needs 'input'"),
        (b'{"id": "a", "tier": "t", "kind": "embed", "input": "x", "prompt": "p"}', "not 'prompt'"),
        (b'{"id": "a", "tier": "t", "prompt": "p", "input": "x"}', "only allowed with kind 'embed'"),
        (
            b'{"id": "a", "tier": "t", "kind": "embed", "input": "x", "options": {"dimensions": 0}}',
            "dimensions",
        ),
    ]:
        with pytest.raises(JobError, match=words) as caught:
            decode_job(raw)
        assert caught.value.kind is ErrorKind.INVALID_JOB


def test_embed_options_leave_the_tiers_chat_options_out() -> None:
    job = decode_job(b'{"id": "a", "tier": "t", "kind": "embed", "input": "hi"}')
    content = job_content(job, {"temperature": 0, "max_tokens": 5, "dimensions": 32})
    assert (content.text, content.messages, content.options) == ("hi", (), {"dimensions": 32})
    assert embed_options({"dimensions": 32}, {"dimensions": 8}) == {"dimensions": 8}


def test_dedupe_keys_name_model_options_and_text() -> None:
    key = embed_dedupe_key("t", "m", {"dimensions": 8}, "hello")
    assert key == embed_dedupe_key("t", "m", {"dimensions": 8}, "hello")
    assert key != embed_dedupe_key("t", "m", {"dimensions": 8}, "hello!")
    assert key != embed_dedupe_key("t", "m", {}, "hello")


def test_an_embed_window_never_shares_a_chat_key() -> None:
    key = embed_pack_key("t", {"dimensions": 8}, "online")
    assert key.options_key == options_key({"dimensions": 8})
    # a chat batch key's variable is a template's ${name}, never the embed marker
    assert key != PackKey("t", "", "input", key.options_key, "online")


texts = st.lists(st.text(alphabet="ab ", max_size=60), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(1, 10), st.integers(1, 8), st.integers(5, 80))
def test_windows_hold_at_most_what_one_request_takes(
    inputs: list[str], max_items: int, max_inputs: int, max_request_tokens: int
) -> None:
    limits = EmbedLimits(max_inputs, max_request_tokens, 10_000)
    window = embed_window_limits(WindowLimits(max_items, 10**9, 100, 1000), limits)
    windows: CollectionWindows[int] = CollectionWindows()
    key = embed_pack_key("t", {}, "online")
    flushes = []
    for i, text in enumerate(inputs):
        flushes += windows.add(key, i, input_chars=len(text), partition=0, limits=window, now_s=0.0)
    flushes += windows.drain_all()
    seen = [i for f in flushes for i in f.items]
    assert sorted(seen) == list(range(len(inputs)))  # each job flushed exactly once
    for f in flushes:
        assert len(f.items) <= min(max_items, max_inputs)
        chars = sum(len(inputs[i]) for i in f.items)
        # several inputs share a request only within its token budget; one alone always goes
        assert len(f.items) == 1 or chars <= max_request_tokens * CHARS_PER_TOKEN


def _run(
    plan: EmbedPlan, bad: set[int], rng: random.Random
) -> tuple[dict[int, tuple[float, ...]], dict[int, ErrorKind], int]:
    """Answer the plan like a provider that refuses any request holding a bad input (400),
    answers some requests with a 5xx first and some with the wrong number of vectors."""
    vectors: dict[int, tuple[float, ...]] = {}
    failed: dict[int, ErrorKind] = {}
    step = plan.begin()
    pending = list(step.requests)
    failed.update({m.ref: k for m, k, _ in step.failed})  # type: ignore[misc]
    sent = 0
    while pending:
        req = pending.pop(rng.randrange(len(pending)))
        sent += 1
        refs = [m.ref for m in req.members]
        roll = rng.random()
        if roll < 0.1 and req.attempt == 1:
            step = plan.on_error(req, ServerError("503", status_code=503))
        elif any(r in bad for r in refs):
            step = plan.on_error(req, Rejected("400 bad input", status_code=400))
        elif roll < 0.2 and len(refs) > 1:
            step = plan.on_vectors(req, [(1.0,)] * (len(refs) - 1))
        else:
            step = plan.on_vectors(req, [(float(r), 1.0) for r in refs])  # type: ignore[arg-type]
        for m, _, _ in step.answered:
            assert m.ref not in vectors and m.ref not in failed
            vectors[m.ref] = plan.embedding(m)  # type: ignore[index]
        for m, kind, _ in step.failed:
            assert m.ref not in vectors and m.ref not in failed
            failed[m.ref] = kind  # type: ignore[index]
        pending += step.requests
    return vectors, failed, sent


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40),
    st.sets(st.integers(0, 39), max_size=4),
    st.sets(st.integers(0, 39), max_size=3),
    st.integers(0, 2**32),
)
def test_one_bad_input_fails_only_itself(n: int, bad: set[int], long: set[int], seed: int) -> None:
    bad = {b for b in bad if b < n}
    long = {x for x in long if x < n} - bad
    limits = EmbedLimits(2048, 10**6, 10)
    members = [Member(i, "x" * 100 if i in long else f"text {i}") for i in range(n)]
    rng = random.Random(seed)
    plan = EmbedPlan(members, limits=limits, retry=RETRY, rng=rng)
    vectors, failed, sent = _run(plan, bad, random.Random(seed + 1))
    assert plan.done
    assert set(failed) == bad | long  # only the bad and the too long ones fail
    assert all(failed[i] is ErrorKind.PROVIDER_REJECTED for i in failed)
    assert all(vectors[i] == (float(i), 1.0) for i in vectors)  # each vector is its own input's
    assert set(vectors) == set(range(n)) - bad - long
    if not bad and not long:
        assert sent >= 1


def test_an_input_too_long_fails_alone_before_anything_is_sent() -> None:
    limits = EmbedLimits(2048, 10**6, 8)
    assert too_long("x" * 100, limits) is not None and too_long("short", limits) is None
    plan = EmbedPlan(
        [Member("a", "short"), Member("b", "x" * 100), Member("c", "also short")],
        limits=limits,
        retry=RETRY,
        rng=random.Random(0),
    )
    step = plan.begin()
    assert [(m.ref, k) for m, k, _ in step.failed] == [("b", ErrorKind.PROVIDER_REJECTED)]
    assert "per input" in step.failed[0][2]
    (req,) = step.requests
    assert [m.ref for m in req.members] == ["a", "c"]
    answered = plan.on_vectors(req, [(0.1,), (0.2,)])
    assert [m.ref for m, _, _ in answered.answered] == ["a", "c"]
    assert plan.done


def test_a_malformed_answer_to_one_input_is_retried_then_fails() -> None:
    plan = EmbedPlan([Member("a", "x")], limits=EmbedLimits(1, 100, 100), retry=RETRY, rng=random.Random(0))
    (req,) = plan.begin().requests
    step = plan.on_vectors(req, [])
    (again,) = step.requests
    assert again.attempt == 2 and not step.failed
    step = plan.on_error(again, MalformedResponse("x"))
    step = plan.on_vectors(step.requests[0], [])
    assert [k for _, k, _ in step.failed] == [ErrorKind.RETRIES_EXHAUSTED]
