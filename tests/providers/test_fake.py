"""The in-memory fakes the runtime's tests use."""

from __future__ import annotations

import asyncio

import pytest

from consumer.core.completion import Completion, CompletionRequest
from consumer.core.errors import RateLimited
from consumer.core.offline import BatchItemResult, BatchRequest, BatchStatus
from consumer.providers.base import BatchProvider, CompletionProvider
from consumer.providers.fake import FakeBatchProvider, FakeProvider, text_completion
from tests.providers.recording import make_request


def echo(request: CompletionRequest) -> Completion:
    return text_completion(request.messages[-1].content.upper())


async def test_fake_provider_sync_async_and_errors() -> None:
    provider = FakeProvider(echo)
    assert isinstance(provider, CompletionProvider)
    assert (await provider.complete(make_request("hi"))).text == "HI"

    async def slow(request: CompletionRequest) -> Completion:
        await asyncio.sleep(0)
        return text_completion("late")

    assert (await FakeProvider(slow).complete(make_request())).text == "late"
    failing = FakeProvider(lambda r: RateLimited("slow down", status_code=429))
    with pytest.raises(RateLimited):
        await failing.complete(make_request())
    assert len(failing.requests) == 1
    await failing.aclose()
    assert failing.closed


async def test_fake_batch_provider_flow() -> None:
    def handler(request: CompletionRequest) -> Completion | RateLimited:
        text = request.messages[-1].content
        return RateLimited("no") if text.endswith("bad") else text_completion(text + "!")

    provider = FakeBatchProvider(handler, polls_until_done=1, max_requests=2)
    assert isinstance(provider, BatchProvider)
    reqs = [BatchRequest(f"c{i}", make_request(f"x{i}")) for i in range(2)] + [
        BatchRequest("c9", make_request("bad"))
    ]
    jobs = await provider.submit(reqs)
    assert len(jobs) == 2
    assert (await provider.status(jobs[0].id)).status is BatchStatus.RUNNING
    done = await provider.status(jobs[0].id)
    assert done.status is BatchStatus.COMPLETED and done.completed == 2
    assert [r.completion.text for r in await provider.results(jobs[0].id) if r.completion] == ["x0!", "x1!"]
    await provider.finish(jobs[1].id)
    [bad] = await provider.results(jobs[1].id)
    assert isinstance(bad.error, RateLimited)
    with pytest.raises(ValueError):
        await provider.submit([BatchRequest("d", make_request()), BatchRequest("d", make_request())])


async def test_fake_batch_expire_and_cancel() -> None:
    provider = FakeBatchProvider(
        lambda r: BatchItemResult("custom", completion=text_completion("z")), polls_until_done=5
    )
    [a] = await provider.submit([BatchRequest("a", make_request())])
    [b] = await provider.submit([BatchRequest("b", make_request())])
    await provider.expire(a.id)
    assert (await provider.status(a.id)).status is BatchStatus.EXPIRED
    assert all(r.expired for r in await provider.results(a.id))
    assert (await provider.cancel(b.id)).status is BatchStatus.CANCELLED
    assert not any(r.ok for r in await provider.results(b.id))
