"""Embed jobs end to end with the real local model: Kafka -> promptbus (windowed array
requests) -> llama.cpp's server with SmolLM2 mean-pooled (`local-model serve --embeddings`)."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from consumer import localmodel
from consumer.testing.harness import (
    InProcessService,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)

pytestmark = pytest.mark.integration

TEXTS = [
    "The cat sat on the mat.",
    "A kitten rested on the rug.",
    "Stock markets fell sharply today.",
    "Quarterly earnings beat expectations.",
    "The cat sat on the mat.",
    "Rain is expected tomorrow.",
]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


async def test_embed_jobs_through_kafka_and_the_real_model(
    kafka_bootstrap: str, embed_server: localmodel.ServerHandle
) -> None:
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=2))
    tiers = tier_file_dict(embed_server.base_url, max_items=4, timeout_s=120)
    tiers["tiers"]["small"]["model"] = localmodel.EMBED_MODEL_ALIAS
    jobs = [{"id": f"e-{i}", "tier": "small", "kind": "embed", "input": t} for i, t in enumerate(TEXTS)]
    service = InProcessService(settings, tiers)
    async with service:
        await produce(settings, jobs)
        outcomes = await wait_for_outcomes(settings, {j["id"] for j in jobs}, timeout_s=300)
    stats = service.stats_snapshot()["tiers"]["small"]
    assert not outcomes.dead, {k: v[0]["error"] for k, v in outcomes.dead.items()}
    vectors = {jid: r[0]["embedding"] for jid, r in outcomes.results.items()}
    assert set(vectors) == {j["id"] for j in jobs}
    sizes = {len(v) for v in vectors.values()}
    assert len(sizes) == 1 and sizes.pop() > 0
    assert all(outcomes.results[j][0]["dimensions"] == len(vectors[j]) for j in vectors)
    # the same text gives the same vector whatever request carried it
    assert cosine(vectors["e-0"], vectors["e-4"]) > 0.999
    assert stats["provider_requests"] < len(jobs), "embed jobs shared array requests"
    # each vector is its own input's: it matches the server's answer for that text alone
    async with httpx.AsyncClient(base_url=embed_server.base_url, timeout=120) as client:
        for j in jobs:
            alone = await client.post(
                "/embeddings", json={"model": localmodel.EMBED_MODEL_ALIAS, "input": j["input"]}
            )
            assert cosine(alone.json()["data"][0]["embedding"], vectors[j["id"]]) > 0.999, j["id"]


def test_status_and_stop_find_the_embedding_server(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMPTBUS_LOCAL_STATE_DIR", str(tmp_path))
    handle = localmodel.serve(port=0, wait_s=120, model_path=model_path, directory=tmp_path, embeddings=True)
    try:
        port = handle.info.port
        current = localmodel.status(port, tmp_path)
        assert current.running and current.answering and localmodel.EMBED_MODEL_ALIAS in current.models
        assert localmodel.stop(port, tmp_path)
        assert not localmodel.status(port, tmp_path).running
    finally:
        handle.stop()
