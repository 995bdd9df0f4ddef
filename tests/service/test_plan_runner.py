"""The one provider call path: whatever an adapter raises, its limiter slot ends exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.limit import limit_for
from consumer.providers.fake import FakeProvider, text_completion
from consumer.runtime.limiter import AsyncLimiter
from consumer.settings import LimiterConfig
from consumer.testing.harness import job, tier_file_dict
from consumer.testing.simulator import answer_for, batched_answer, extract_input, parse_batch_items


class BreaksVerifications:
    """Answers every prompt right, except a job asked alone after a batch answered it (a
    verification): that raises a KeyError, an exception no adapter should raise (a bug)."""

    def __init__(self) -> None:
        self.answered_in_batches: set[str] = set()
        self.broken = 0

    def __call__(self, request: CompletionRequest) -> Completion | Exception:
        text = request.messages[-1].content
        items = parse_batch_items(text)
        if items is not None:
            self.answered_in_batches.update(t for _, t in items)
            return text_completion(orjson.dumps(batched_answer(items)).decode())
        if extract_input(text) in self.answered_in_batches:
            self.broken += 1
            return KeyError("an adapter bug")
        return text_completion(answer_for(extract_input(text)))


async def test_adapter_bugs_in_verification_never_wedge_a_tier(make_bus: Callable[..., Any]) -> None:
    """A tier whose limit is 2 and whose verification requests (jobs asked alone) all raise a
    KeyError: the slots those calls held are given back, so later jobs are still answered."""
    bus = make_bus(partitions=1)
    handler = BreaksVerifications()
    provider = FakeProvider(handler, name="small")
    tiers = tier_file_dict("http://127.0.0.1:9/v1", max_items=4, limiter="fixed")
    small = tiers["tiers"]["small"]
    small["limiter"] = {"algorithm": "fixed", "initial": 2, "min": 1, "max": 2}
    small["batching"]["verify_fraction"] = 1.0
    service = bus.service(tiers, providers={"small": provider})
    async with service:
        for wave in range(12):
            jobs = [job(wave * 4 + i, batch=True) for i in range(4)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=30)
            assert {j["id"] for j in jobs} <= set(outcomes.results), f"wave {wave}: the tier is wedged"
        limiter: AsyncLimiter = service.pipeline.runner("small").tier.limiter
        for _ in range(200):  # bounded: verifications still running end within a few polls
            if limiter.inflight == 0:
                break
            await asyncio.sleep(0.05)
        assert limiter.inflight == 0, "a slot leaked"
    assert handler.broken >= 2, "verifications were sent and raised, more than the tier's limit of 2"
    for jid, (result, *_) in outcomes.results.items():
        assert result["output"] == answer_for(extract_input(f"TEXT:\ntext number {jid.split('-')[1]}"))


async def test_a_slot_ends_once_whatever_the_block_raises() -> None:
    limiter = AsyncLimiter(limit_for(LimiterConfig(algorithm="fixed", initial=1, min=1, max=1)))
    for _ in range(3):
        try:
            async with limiter.slot() as token:
                assert limiter.inflight == 1
                del token
                raise KeyError("a bug")
        except KeyError:
            pass
        assert limiter.inflight == 0
    async with limiter.slot() as token:
        token.success()
        token.ignore()  # a second end is a no-op
    assert limiter.inflight == 0
