"""Embeddings on the wire: the official openai SDK and our adapter against the simulator's
`/v1/embeddings` (real HTTP on 127.0.0.1), and the simulator's vectors as a function of input."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest
from openai.types import CreateEmbeddingResponse

from consumer.core.embed import EmbeddingRequest
from consumer.core.errors import Rejected
from consumer.providers.embeddings import EmbeddingProvider, build_embeddings_body
from consumer.providers.factory import build_provider, make_http_client
from consumer.settings import TierConfig
from consumer.testing.simulator import SimulatorConfig, run_simulator
from consumer.testing.simulator.embeddings import DEFAULT_DIMENSIONS, MAX_INPUT_TOKENS, embedding_vector

KEY = "sim-embed-key-0001"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with run_simulator(SimulatorConfig(seed=3, api_key=KEY)) as url:
        yield url


def test_vectors_are_unit_and_their_inputs_own() -> None:
    a, b = embedding_vector("alpha", "m"), embedding_vector("beta", "m")
    assert len(a) == DEFAULT_DIMENSIONS and a == embedding_vector("alpha", "m")
    assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-9) and a != b
    assert len(embedding_vector("alpha", "m", 8)) == 8


def test_the_openai_sdk_round_trips(sim_url: str) -> None:
    client = openai.OpenAI(base_url=sim_url + "/v1", api_key=KEY, max_retries=0)
    texts = ["the cat", "a dog", "the cat"]
    answer = client.embeddings.create(model="embed-sim", input=texts, dimensions=16)
    assert isinstance(answer, CreateEmbeddingResponse)
    # strictly the SDK's own model, not only its lenient parsing
    CreateEmbeddingResponse.model_validate(answer.model_dump(), strict=True)
    assert [d.index for d in answer.data] == [0, 1, 2]
    # the SDK asks for base64 (float32) and decodes it
    for d, text in zip(answer.data, texts, strict=True):
        assert d.embedding == pytest.approx(embedding_vector(text, "embed-sim", 16), abs=1e-6)
    floats = client.embeddings.create(model="embed-sim", input=texts, encoding_format="float")
    assert [d.embedding for d in floats.data] == [embedding_vector(t, "embed-sim") for t in texts]
    assert answer.usage.prompt_tokens > 0 and answer.model == "embed-sim"
    one = client.embeddings.create(model="embed-sim", input="a dog")
    assert one.data[0].embedding == pytest.approx(embedding_vector("a dog", "embed-sim"), abs=1e-6)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.embeddings.create(model="embed-sim", input=["ok", "x" * (MAX_INPUT_TOKENS * 4 + 8)])


async def test_our_adapter_embeds_in_order_and_maps_refusals(
    sim_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_KEY", KEY)
    for provider in ("openai", "openai_compat"):
        tier = TierConfig(
            provider=provider, base_url=sim_url + "/v1", model="embed-sim", api_key_env="SIM_KEY"
        )
        adapter = build_provider("t", tier, make_http_client(tier))
        try:
            assert isinstance(adapter, EmbeddingProvider)
            texts = ("one", "two", "three")
            answer = await adapter.embed(EmbeddingRequest(texts, "embed-sim", {"dimensions": 8}))
            assert list(answer.vectors) == [embedding_vector(t, "embed-sim", 8) for t in texts]
            assert answer.usage.input_tokens > 0 and answer.provider == provider
            with pytest.raises(Rejected) as caught:
                await adapter.embed(EmbeddingRequest(("x" * (MAX_INPUT_TOKENS * 4 + 8),), "embed-sim"))
            assert caught.value.status_code == 400
        finally:
            await adapter.aclose()


def test_the_body_asks_floats_and_passes_options() -> None:
    body = build_embeddings_body(EmbeddingRequest(("a", "b"), "m", {"dimensions": 4, "user": None}))
    assert body == {"model": "m", "input": ["a", "b"], "dimensions": 4, "encoding_format": "float"}
