"""Embed jobs through the service: windowed into array requests against the simulator's
`/v1/embeddings`, each vector its own input's, one too-long input failing alone, identical
inputs embedded once, and a provider without embeddings refused at admission."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from consumer.core.completion import Usage
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.providers.fake import FakeProvider
from consumer.testing.harness import tier_file_dict
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from consumer.testing.simulator.embeddings import MAX_INPUT_TOKENS, embedding_vector


def embed_job(i: int, text: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": f"emb-{i}", "tier": "small", "kind": "embed", "input": text or f"text number {i}", **extra}


async def test_embed_jobs_share_array_requests_and_get_their_own_vectors(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=2)
    async with SimulatorServer(SimulatorConfig(latency_ms=5, seed=2)) as base_url:
        service = bus.service(tier_file_dict(base_url + "/v1", max_items=16, options={"temperature": 0}))
        async with service:
            jobs = [embed_job(i, options={"dimensions": 12}) for i in range(200)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        stats = service.stats_snapshot()
    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert outcomes.duplicates() == {}
    for j in jobs:
        (result,) = outcomes.results[j["id"]]
        assert result["output"] is None and result["dimensions"] == 12
        assert result["embedding"] == embedding_vector(j["input"], "sim-model", 12), j["id"]
        assert result["usage"]["input_tokens"] > 0
    tier = stats["tiers"]["small"]
    assert tier["provider_requests"] < len(jobs) / 4, "embed jobs went out as array requests"
    assert any(r[0]["batch"] and r[0]["batch"]["size"] > 1 for r in outcomes.results.values())


async def test_an_oversized_input_fails_alone(make_bus: Callable[..., Any]) -> None:
    """One input over the model's tokens per input, in a window with others: it is dead-lettered
    provider_rejected, the others answered (the too-long check before sending, and the
    provider's own 400 split down to the input that caused it)."""
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig(seed=4)) as base_url:
        service = bus.service(tier_file_dict(base_url + "/v1", max_items=8))
        async with service:
            long = "word " * (MAX_INPUT_TOKENS * 2)  # over the limits of both the plan and the simulator
            near = "x" * (MAX_INPUT_TOKENS * 4 + 40)  # passes the plan's estimate, refused by the provider
            jobs = [embed_job(i) for i in range(6)]
            jobs[2] = embed_job(2, long)
            jobs[4] = embed_job(4, near)
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    assert set(outcomes.dead) == {"emb-2", "emb-4"}
    for jid in ("emb-2", "emb-4"):
        (dead,) = outcomes.dead[jid]
        assert dead["error"]["kind"] == "provider_rejected", dead["error"]
    assert set(outcomes.results) == {f"emb-{i}" for i in (0, 1, 3, 5)}
    for jid, (result,) in outcomes.results.items():
        text = next(j["input"] for j in jobs if j["id"] == jid)
        assert result["embedding"] == embedding_vector(text, "sim-model")


async def test_identical_inputs_are_embedded_once(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig(latency_ms=20)) as base_url:
        service = bus.service(tier_file_dict(base_url + "/v1", batching=False, dedupe=True))
        async with service:
            jobs = [embed_job(i, "the same text") for i in range(10)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        stats = service.stats_snapshot()
    assert len(outcomes.results) == 10 and not outcomes.dead
    want = embedding_vector("the same text", "sim-model")
    assert all(r[0]["embedding"] == want for r in outcomes.results.values())
    assert stats["tiers"]["small"]["provider_requests"] < 10
    assert sum(1 for r in outcomes.results.values() if r[0]["dedupe_of"]) >= 1


async def test_a_tier_without_embeddings_refuses_embed_jobs(
    make_bus: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_ANTHROPIC_KEY", "sim-key")
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig()) as base_url:
        service = bus.service(tier_file_dict(base_url, provider="anthropic", api_key_env="SIM_ANTHROPIC_KEY"))
        async with service:
            await bus.produce([embed_job(0)])
            outcomes = await bus.wait_for_outcomes({"emb-0"}, timeout_s=30)
    (dead,) = outcomes.dead["emb-0"]
    assert dead["error"]["kind"] == "invalid_job"
    assert "no embeddings endpoint" in dead["error"]["message"]


async def test_the_fake_provider_embeds_in_memory(make_bus: Callable[..., Any]) -> None:
    """The in-memory provider (what the embed benchmark's fake variant runs on) answers embed
    jobs as array requests: each job gets the vector its handler made for its own input."""

    def handler(request: EmbeddingRequest) -> Embeddings:
        vectors = tuple([float(len(text)), 0.5] for text in request.inputs)
        usage = Usage(input_tokens=len(request.inputs))
        return Embeddings(vectors=vectors, usage=usage, provider="fake", model="m")

    no_chat = AssertionError("no chat request")
    fake = FakeProvider(lambda _r: no_chat, name="openai_compat", embed_handler=handler)
    bus = make_bus(partitions=2)
    service = bus.service(tier_file_dict("http://127.0.0.1:9/v1", max_items=8), providers={"small": fake})
    async with service:
        jobs = [embed_job(i, "x" * (i + 1)) for i in range(40)]
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    assert not outcomes.dead and outcomes.duplicates() == {}
    for j in jobs:
        (result,) = outcomes.results[j["id"]]
        assert result["embedding"] == [float(len(j["input"])), 0.5], j["id"]
    assert not fake.requests, "embed jobs never go to the chat endpoint"
    assert sum(len(r.inputs) for r in fake.embed_requests) == len(jobs)
    assert len(fake.embed_requests) < len(jobs), "windowed into array requests"


async def test_a_fake_provider_without_an_embed_handler_fails_the_call() -> None:
    fake = FakeProvider(lambda _r: AssertionError("no chat request"))
    with pytest.raises(TypeError, match="no embed_handler"):
        await fake.embed(EmbeddingRequest(("text",), "m"))
    assert fake.embed_requests == []
