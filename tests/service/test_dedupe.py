"""Dedupe end to end (`dedupe: true`), on the in-memory edges and on the real broker
(`make_bus`): identical deterministic jobs are answered by one provider request, yet each gets
a record of its own (its id, metadata, source, `dedupe_of`), a shared failure gives each its
own dead letter, followers of an abandoned leader stay uncommitted, and followers of a leader
whose deadline passed are routed again under their own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.errors import Rejected, ServerError
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import job, tier_file_dict
from consumer.testing.simulator import answer_for, batched_answer, extract_input, parse_batch_items


def _answer(request: CompletionRequest) -> Completion:
    return text_completion(answer_for(extract_input(request.messages[-1].content)))


def _tiers(*, dedupe: bool) -> dict[str, Any]:
    return tier_file_dict(
        "http://127.0.0.1:9/v1", batching=False, options={"temperature": 0}, dedupe=dedupe
    )


def _same(i: int, **extra: Any) -> dict[str, Any]:
    return job(i, batch=False, text="the very same text", **{"metadata": {"n": i}, **extra})


async def test_ten_identical_jobs_one_request_ten_results(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=2)
    gate = asyncio.Event()

    async def held(request: CompletionRequest) -> Completion:
        await gate.wait()  # the leader stays in flight until every duplicate is read
        return _answer(request)

    provider = FakeProvider(held, name="small")
    jobs = [_same(i) for i in range(10)]
    service = bus.service(_tiers(dedupe=True), providers={"small": provider})
    async with service:
        await bus.produce(jobs)
        for _ in range(200):  # bounded: until all ten are routed (one request, nine waiting)
            if service.stats_snapshot()["tiers"]["small"]["items"] == 10:
                break
            await asyncio.sleep(0.05)
        gate.set()
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        stats = service.stats_snapshot()
    assert len(provider.requests) == 1
    assert not outcomes.dead and outcomes.duplicates() == {}
    assert set(outcomes.results) == {j["id"] for j in jobs}
    results = {jid: rs[0] for jid, rs in outcomes.results.items()}
    leaders = [r for r in results.values() if r["dedupe_of"] is None]
    assert len(leaders) == 1
    (leader,) = leaders
    for j in jobs:
        r = results[j["id"]]
        assert r["output"] == answer_for("the very same text")
        assert r["metadata"] == j["metadata"], "each job keeps its own metadata"
        if r is not leader:
            assert r["dedupe_of"] == leader["id"] and r["attempts"] == 0
            assert r["usage"]["input_tokens"] == r["usage"]["output_tokens"] == 0
    sources = {(r["source"]["partition"], r["source"]["offset"]) for r in results.values()}
    assert len(sources) == 10, "each result names its own input record"
    assert stats["tiers"]["small"]["deduped"] == 9
    assert stats["tiers"]["small"]["provider_requests"] == 1


async def test_without_dedupe_each_job_asks(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(_answer, name="small")
    jobs = [_same(i) for i in range(10)]
    async with bus.service(_tiers(dedupe=False), providers={"small": provider}):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    assert len(provider.requests) == 10
    assert all(rs[0]["dedupe_of"] is None for rs in outcomes.results.values())


async def test_metadata_does_not_matter_options_do(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(_answer, name="small")
    jobs = [
        _same(0, metadata={"who": "a"}),
        _same(1, metadata={"who": "b"}),
        _same(2, options={"max_tokens": 7}),
        job(3, batch=False, text="the very same text", options={"temperature": 0.7}),
        job(4, batch=False, text="the very same text", options={"temperature": 0.7}),
    ]
    async with bus.service(_tiers(dedupe=True), providers={"small": provider}):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    results = {jid: rs[0] for jid, rs in outcomes.results.items()}
    assert set(results) == {j["id"] for j in jobs}
    # job-0 and job-1 share; job-2 (other options) asks; job-3 and job-4 (temperature 0.7) each ask
    assert len(provider.requests) == 4
    pair = {results["job-0"]["dedupe_of"], results["job-1"]["dedupe_of"]}
    assert pair in ({None, "job-0"}, {None, "job-1"}), pair
    assert results["job-0"]["metadata"] == {"who": "a"} and results["job-1"]["metadata"] == {"who": "b"}
    assert results["job-2"]["dedupe_of"] is None
    assert results["job-3"]["dedupe_of"] is None and results["job-4"]["dedupe_of"] is None


async def test_a_shared_failure_is_a_dead_letter_each(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    gate = asyncio.Event()

    async def refused(_request: CompletionRequest) -> Exception:
        await gate.wait()
        return Rejected("small: content rejected", provider="small", status_code=400)

    provider = FakeProvider(refused, name="small")
    jobs = [_same(i) for i in range(3)]
    service = bus.service(_tiers(dedupe=True), providers={"small": provider})
    async with service:
        await bus.produce(jobs)
        for _ in range(200):
            if service.stats_snapshot()["tiers"]["small"]["items"] == 3:
                break
            await asyncio.sleep(0.05)
        gate.set()
        outcomes = await bus.wait_for_outcomes(set(), timeout_s=60, dead_expected=3)
    assert len(provider.requests) == 1
    assert set(outcomes.dead) == {j["id"] for j in jobs} and outcomes.duplicates() == {}
    kinds = {d[0]["error"]["kind"] for d in outcomes.dead.values()}
    assert kinds == {"provider_rejected"}
    note = "[shared: the identical request of job"
    shared = [d[0] for d in outcomes.dead.values() if note in d[0]["error"]["message"]]
    assert len(shared) == 2


async def test_followers_of_an_abandoned_leader_stay_uncommitted(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="1", PROMPTBUS_REVOKE_TIMEOUT_S="1")
    never = asyncio.Event()

    async def hung(request: CompletionRequest) -> Completion:
        await never.wait()  # the leader never answers: shutdown abandons it
        return _answer(request)

    provider = FakeProvider(hung, name="small")
    jobs = [_same(i) for i in range(3)] + [job(9, batch=False, text="another text")]
    service = bus.service(_tiers(dedupe=True), providers={"small": provider})
    async with service:
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes(set(), timeout_s=1)
        for _ in range(200):
            if service.stats_snapshot()["tiers"]["small"]["items"] == 4:
                break
            await asyncio.sleep(0.05)
    outcomes = await bus.outcomes()
    assert len(provider.requests) == 2  # the three duplicates' one request, and job-9's
    assert not outcomes.results and not outcomes.dead
    assert await bus.committed(0) <= 0, "nothing past the abandoned leader commits"


async def test_followers_of_a_leader_past_its_deadline_are_routed_again(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    calls = 0

    async def first_fails(request: CompletionRequest) -> Completion | Exception:
        nonlocal calls
        calls += 1
        if calls == 1:  # the leader's retry waits past its deadline (backoff below)
            return ServerError("small: 500", provider="small", status_code=500)
        return _answer(request)

    provider = FakeProvider(first_fails, name="small")
    tiers = tier_file_dict(
        "http://127.0.0.1:9/v1",
        batching=False,
        options={"temperature": 0},
        dedupe=True,
        retry={"max_attempts": 3, "backoff_initial_s": 4, "backoff_max_s": 4},
    )
    deadline = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    jobs = [_same(0, deadline=deadline), _same(1)]
    async with bus.service(tiers, providers={"small": provider}):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({"job-0", "job-1"}, timeout_s=30)
    assert outcomes.dead["job-0"][0]["error"]["kind"] == "deadline_exceeded"
    (result,) = outcomes.results["job-1"]
    assert result["dedupe_of"] is None, "its own request, not the expired leader's"
    assert result["output"] == answer_for("the very same text")
    assert len(provider.requests) == 2 and outcomes.duplicates() == {}


async def test_an_answer_is_reused_within_the_window_only(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(_answer, name="small")
    windowed = _tiers(dedupe=True)
    async with bus.service(windowed, providers={"small": provider}):
        await bus.produce([_same(0)])
        await bus.wait_for_outcomes({"job-0"}, timeout_s=60)
        await bus.produce([_same(1)])  # answered already: taken from the window at once
        outcomes = await bus.wait_for_outcomes({"job-0", "job-1"}, timeout_s=60)
    assert len(provider.requests) == 1
    assert outcomes.results["job-1"][0]["dedupe_of"] == "job-0"

    bus = make_bus(partitions=1)
    provider = FakeProvider(_answer, name="small")
    no_window = _tiers(dedupe=True)
    no_window["tiers"]["small"]["dedupe_window_s"] = 0
    async with bus.service(no_window, providers={"small": provider}):
        await bus.produce([_same(0)])
        await bus.wait_for_outcomes({"job-0"}, timeout_s=60)
        await bus.produce([_same(1)])
        outcomes = await bus.wait_for_outcomes({"job-0", "job-1"}, timeout_s=60)
    assert len(provider.requests) == 2, "window 0: only requests in flight are shared"
    assert outcomes.results["job-1"][0]["dedupe_of"] is None


async def test_batched_jobs_are_deduped_before_their_window(make_bus: Callable[..., Any]) -> None:
    def answers(request: CompletionRequest) -> Completion:
        items = parse_batch_items(request.messages[-1].content)
        if items is not None:
            return text_completion(orjson.dumps(batched_answer(items)).decode())
        return _answer(request)

    bus = make_bus(partitions=1)
    provider = FakeProvider(answers, name="small")
    tiers = tier_file_dict("http://127.0.0.1:9/v1", max_items=20, options={"temperature": 0}, dedupe=True)
    same = [job(i, batch=True, text="the very same text") for i in range(6)]
    other = [job(10 + i, batch=True) for i in range(4)]
    async with bus.service(tiers, providers={"small": provider}):
        await bus.produce(same + other)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in same + other}, timeout_s=60)
    assert set(outcomes.results) == {j["id"] for j in same + other} and not outcomes.dead
    sent_items = sum(len(parse_batch_items(r.messages[-1].content) or [None]) for r in provider.requests)
    assert sent_items == 5, "the five distinct inputs went out; the five duplicates waited"
    followers = [j["id"] for j in same if outcomes.results[j["id"]][0]["dedupe_of"] is not None]
    assert len(followers) == 5
    for j in same:
        assert outcomes.results[j["id"]][0]["output"] == answer_for("the very same text")
