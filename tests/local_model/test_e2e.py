"""End to end with the real local model: Kafka -> promptbus -> llama.cpp server (SmolLM2) -> results.

Nothing is asserted about the model's labels; only that every job gets exactly one non-empty
answer and that prompt batching was used (and paid: fewer provider requests than jobs).
"""

from __future__ import annotations

import pytest

from consumer import localmodel
from consumer.testing.harness import (
    InProcessService,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)

pytestmark = pytest.mark.integration

LABELS = {"type": "string", "enum": ["positive", "negative"]}
TEXTS = [
    "I love this phone, it is fantastic.",
    "The service was slow and rude.",
    "What a wonderful concert!",
    "The package arrived broken.",
    "My new shoes are very comfortable.",
    "This app crashes all the time.",
    "The view from the hotel was stunning.",
    "The soup was cold and salty.",
    "Best holiday I ever had.",
    "I want my money back.",
    "The staff were kind and helpful.",
    "The movie was a waste of time.",
]


async def test_twelve_batched_jobs_through_kafka_and_the_real_model(
    kafka_bootstrap: str, local_server: localmodel.ServerHandle
) -> None:
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=2))
    tiers = tier_file_dict(local_server.base_url, max_items=4, limiter="gradient", timeout_s=120)
    tiers["tiers"]["small"]["model"] = localmodel.MODEL_ALIAS
    tiers["tiers"]["small"]["options"] = {"temperature": 0, "max_tokens": 8}
    tiers["tiers"]["small"]["batching"].update({"max_wait_ms": 2000, "structured": "auto"})
    jobs = [
        job(i, batch=True, text=t, options={"response_format": {"type": "json_object", "schema": LABELS}})
        for i, t in enumerate(TEXTS)
    ]
    service = InProcessService(settings, tiers)
    async with service:
        await produce(settings, jobs)
        outcomes = await wait_for_outcomes(settings, {j["id"] for j in jobs}, timeout_s=300)
    stats = service.stats_snapshot()["tiers"]["small"]

    assert not outcomes.dead, {k: v[0]["error"] for k, v in outcomes.dead.items()}
    assert set(outcomes.results) == {j["id"] for j in jobs}
    assert outcomes.duplicates() == {}
    for j in jobs:
        (result,) = outcomes.results[j["id"]]
        assert result["output"].strip(), f"empty answer for {j['id']}"
        assert result["model"] == localmodel.MODEL_ALIAS
    assert stats["batched_requests"] >= 1, "at least one batched request was attempted"
    assert stats["provider_requests"] < len(jobs), stats
