"""Tenants end to end, on the in-memory edges and on the real broker: who a job belongs to,
one tenant's flood never ahead of another's few, packed prompts and dedupe never mixing
tenants, and daily budgets (dead-lettered past them, or held without holding up anyone)."""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from consumer.core.completion import Completion, CompletionRequest, Usage
from consumer.core.tenants import TENANT_HEADER
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import job, tier_file_dict, until
from consumer.testing.simulator import batched_answer, parse_batch_items

PRICING = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}  # $0.001 a token: easy sums


def tiers(**tier: Any) -> dict[str, Any]:
    return tier_file_dict("http://127.0.0.1:9", **tier)


def _tenant_of_request(request: CompletionRequest) -> set[str]:
    """The tenants whose inputs a request carries (each test input names its tenant)."""
    text = request.messages[-1].content
    return {name for name in ("alpha", "beta") if f"{name} says" in text}


async def test_a_jobs_tenant_is_its_field_else_its_header_else_default_and_a_bad_one_is_refused(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(lambda _r: text_completion("ok"), name="small")
    field_job = {**job(1, batch=False), "tenant": "alpha"}
    header_job = job(2, batch=False)
    both_job = {**job(3, batch=False), "tenant": "alpha"}
    plain_job = job(4, batch=False)
    bad_field = {**job(5, batch=False), "tenant": "no spaces"}
    bad_header = job(6, batch=False)
    async with bus.service(tiers(batching=False), providers={"small": provider}) as svc:
        await bus.produce([field_job, plain_job, bad_field])
        await bus.produce([header_job, both_job], headers=[(TENANT_HEADER, b"beta.team-1")])
        await bus.produce([bad_header], headers=[(TENANT_HEADER, b"x" * 65)])
        ids = {f"job-{i}" for i in range(1, 7)}
        outcomes = await bus.wait_for_outcomes(ids, timeout_s=30)
        assert await until(lambda: svc.stats.tenants["other"].results == 3, 10)
        tenants = svc.stats_snapshot()["tenants"]
    tenant = {jid: rs[0]["tenant"] for jid, rs in outcomes.results.items()}
    assert tenant == {"job-1": "alpha", "job-2": "beta.team-1", "job-3": "alpha", "job-4": "default"}
    for jid, raw in (("job-5", bad_field), ("job-6", bad_header)):
        (dead,) = outcomes.dead[jid]
        assert dead["error"]["kind"] == "invalid_job" and "tenant" in dead["error"]["message"]
        assert orjson.loads(base64.b64decode(dead["raw"])) == raw  # the original bytes
        assert dead["tenant"] is None
    # no tenants section: alpha and beta.team-1 are 'other', the job without one 'default'
    assert tenants["other"]["results"] == 3 and tenants["default"]["results"] == 1


async def test_one_tenants_flood_does_not_hold_up_another_tenants_few(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=2)

    async def slow(request: CompletionRequest) -> Completion:
        await asyncio.sleep(0.01)
        return text_completion("ok")

    provider = FakeProvider(slow, name="small")
    tier_file = tiers(batching=False, limiter="fixed")
    tier_file["tiers"]["small"]["limiter"] = {"algorithm": "fixed", "initial": 2, "min": 1, "max": 2}
    alpha = [{**job(i, batch=False, text=f"alpha says {i}"), "tenant": "alpha"} for i in range(300)]
    beta = [{**job(1000 + i, batch=False, text=f"beta says {i}"), "tenant": "beta"} for i in range(5)]
    async with bus.service(tier_file, providers={"small": provider}):
        await bus.produce(alpha)
        assert await until(lambda: len(provider.requests) >= 20, 30), "alpha's backlog did not start"
        sent_before = len(provider.requests)
        await bus.produce(beta)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in alpha + beta}, timeout_s=90)
    assert len(outcomes.results) == len(alpha) + len(beta)
    order = [_tenant_of_request(r) for r in provider.requests]
    beta_at = [n for n, t in enumerate(order) if t == {"beta"}]
    assert len(beta_at) == len(beta)
    # alpha had over 250 jobs waiting when beta's came: beta's went within a few slots of their
    # arrival (its produce and read take some of alpha's slots), not behind the backlog
    assert max(beta_at) < sent_before + 60, (sent_before, beta_at)


async def test_packed_prompts_and_dedupe_never_mix_tenants(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    sent = itertools.count()

    def answer(request: CompletionRequest) -> Completion:
        items = parse_batch_items(request.messages[-1].content)
        text = orjson.dumps(batched_answer(items)).decode() if items is not None else "positive"
        return replace(text_completion(text), request_id=f"req-{next(sent)}")

    provider = FakeProvider(answer, name="small")
    tier_file = tiers(max_items=10, dedupe=True, options={"temperature": 0})
    jobs = [
        # both tenants send the same five texts: equal requests, which dedupe shares only
        # within a tenant, and which would pack together but for the tenant
        {**job(i, batch=True, text=f"the same text {i % 5}"), "id": f"{name}-{i}", "tenant": name}
        for i in range(20)
        for name in ("alpha", "beta")
    ]
    async with bus.service(tier_file, providers={"small": provider}):
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    assert len(outcomes.results) == len(jobs) and not outcomes.dead
    by_request: dict[str, set[str]] = {}
    for jid, (result, *_) in outcomes.results.items():
        assert result["tenant"] == jid.split("-")[0]
        if result["dedupe_of"] is not None:
            assert result["dedupe_of"].split("-")[0] == result["tenant"], "deduped across tenants"
        else:
            by_request.setdefault(result["batch"]["request_id"] if result["batch"] else jid, set()).add(
                result["tenant"]
            )
    assert any(len(tenants) for rid, tenants in by_request.items() if rid.startswith("req-")), "no pack"
    assert all(len(tenants) == 1 for tenants in by_request.values()), by_request
    # each tenant asked each of the five texts itself: ten asked, thirty deduped
    asked = [r[0] for r in outcomes.results.values() if r[0]["dedupe_of"] is None]
    assert sorted(r["tenant"] for r in asked) == ["alpha"] * 5 + ["beta"] * 5


def _priced(tokens: int) -> Callable[[CompletionRequest], Completion]:
    """Every answer uses `tokens` (input + output), so each costs tokens * $0.001."""
    usage = Usage(tokens // 2, tokens - tokens // 2)
    return lambda _r: replace(text_completion("ok"), usage=usage)


async def test_a_dead_letter_tenant_past_its_budget_gets_budget_exhausted_and_others_go_on(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(_priced(20), name="small")  # $0.02 an answer
    tier_file = tiers(batching=False, pricing=PRICING, options={"max_tokens": 20})
    tier_file["tenants"] = {
        "capped": {"budget": {"usd_per_day": 0.25}, "on_exhausted": "dead_letter"},
        "free": {"weight": 2},
    }
    capped = [{**job(i, batch=False, text="hi"), "id": f"capped-{i}", "tenant": "capped"} for i in range(40)]
    free = [{**job(i, batch=False, text="hi"), "id": f"free-{i}", "tenant": "free"} for i in range(20)]
    async with bus.service(tier_file, providers={"small": provider}) as svc:
        await bus.produce(capped + free)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in capped + free}, timeout_s=60)
        stats = svc.stats_snapshot()["tenants"]
    answered = [j for j in capped if j["id"] in outcomes.results]
    refused = [outcomes.dead[j["id"]][0] for j in capped if j["id"] in outcomes.dead]
    assert len(answered) + len(refused) == len(capped) and refused
    assert {d["error"]["kind"] for d in refused} == {"budget_exhausted"}
    assert all(d["tenant"] == "capped" and not d["error"]["retryable"] for d in refused)
    assert "daily budget" in refused[0]["error"]["message"]
    # spent: $0.02 an answer within $0.25; the estimate (the prompt and max_tokens) is larger,
    # so the budget is never passed
    assert 0.02 * len(answered) <= 0.25 and len(answered) >= 6
    assert all(f["id"] in outcomes.results for f in free), "another tenant was held up"
    assert stats["capped"]["dead_letters"] == len(refused) and stats["free"]["results"] == len(free)
    assert abs(stats["capped"]["cost_usd"] - 0.02 * len(answered)) < 1e-9
    assert stats["capped"]["budget_usd"] == 0.25


async def test_a_held_tenant_waits_without_holding_up_others_then_goes_on_with_a_larger_budget(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(_priced(20), name="small")
    tier_file = tiers(batching=False, pricing=PRICING, options={"max_tokens": 20})
    tier_file["tenants"] = {"held": {"budget": {"usd_per_day": 0.2}}}  # on_exhausted: hold
    held = [{**job(i, batch=False, text="hi"), "id": f"held-{i}", "tenant": "held"} for i in range(30)]
    others = [{**job(i, batch=False, text="hi"), "id": f"other-{i}"} for i in range(30)]
    all_ids = {j["id"] for j in held + others}
    async with bus.service(tier_file, providers={"small": provider}) as svc:
        await bus.produce(held + others)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in others}, timeout_s=60)
        account = svc.stats.tenants["held"]
        # settled: each of the tenant's jobs answered within its budget or held for more
        assert await until(lambda: account.held > 0 and account.held + account.results == len(held), 10)
        waiting, answered = account.held, account.results
        first = await bus.outcomes()
    answered_first = {j["id"] for j in held} & set(first.results)
    assert {j["id"] for j in others} <= set(outcomes.results), "the held tenant held up the others"
    assert not any(jid.startswith("held-") for jid in first.dead), "held jobs are not dead letters"
    assert 0 < answered < len(held) and waiting == len(held) - answered
    assert len(answered_first) <= answered  # the results topic shows no more than were answered
    # a restart with a larger budget: the held jobs were never committed, so they are read
    # again, and go on
    tier_file["tenants"]["held"]["budget"]["usd_per_day"] = 100.0
    async with bus.service(tier_file, providers={"small": provider}):
        outcomes = await bus.wait_for_outcomes(all_ids, timeout_s=60)
    assert all_ids <= set(outcomes.results) and not outcomes.dead
