"""The service end to end, in-process: the simulator over real HTTP, each case on the in-memory
edges and on the real broker (`make_bus`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from consumer.testing.harness import job, tier_file_dict
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for


async def test_thousand_mixed_jobs_each_get_their_own_answer(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=4)
    async with SimulatorServer(SimulatorConfig(latency_ms=5, jitter_ms=3, seed=1)) as base_url:
        service = bus.service(tier_file_dict(base_url + "/v1", max_items=10))
        async with service:
            jobs = [job(i, batch=(i % 3 != 0)) for i in range(1000)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=120)
        stats = service.stats_snapshot()

    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == {j["id"] for j in jobs}
    assert outcomes.duplicates() == {}
    for j in jobs:
        (result,) = outcomes.results[j["id"]]
        assert result["output"] == answer_for(j["variables"]["text"]), j["id"]
        assert result["source"]["topic"] == bus.settings.jobs_topic
    batched = [r[0] for r in outcomes.results.values() if r[0]["batch"] is not None]
    assert batched, "no job was answered from a batched request"
    assert all(r["batch"]["size"] > 1 for r in batched)
    tier = stats["tiers"]["small"]
    assert tier["requests_saved"] > 0
    assert tier["provider_requests"] < len(jobs)


async def test_batch_size_adapts_down_when_batched_answers_keep_failing(make_bus: Callable[..., Any]) -> None:
    """A model that drops ids from every batched answer: the tier falls back to ordinary requests."""
    bus = make_bus(partitions=1)
    sim = SimulatorConfig(missing_rate=1.0, ignore_structured=True)
    async with SimulatorServer(sim) as base_url:
        service = bus.service(tier_file_dict(base_url + "/v1", max_items=8))
        async with service:
            first = [job(i, batch=True) for i in range(40)]
            for wave in range(5):  # waves, so later windows are formed after earlier verdicts
                await bus.produce(first[wave * 8 : wave * 8 + 8])
                ids = {j["id"] for j in first[: wave * 8 + 8]}
                outcomes = await bus.wait_for_outcomes(ids, timeout_s=60)
        stats = service.stats_snapshot()
    assert set(outcomes.results) == {j["id"] for j in first}, "re-asks deliver every id"
    for j in first:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
    tier = stats["tiers"]["small"]
    assert tier["batch_size"] == 1, "after repeated invalid answers the size falls to 1"
    assert tier["reasks"] > 0


async def test_verify_fraction_measures_agreement(make_bus: Callable[..., Any]) -> None:
    """Half of each answered packed request's members are asked alone too, and the answers
    compared. The size is trusted up to max_items and packing counts as saving tokens, so no
    timing measurement can stop the packing (or the verifying) midway: every packed request
    is verified, the count follows from the configuration."""
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig()) as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=5)
        tiers["tiers"]["small"]["batching"].update(verify_fraction=0.5, initial_items=5, charges="tokens")
        service = bus.service(tiers)
        async with service:
            jobs = [job(i, batch=True) for i in range(40)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
            # verification requests run after the results: wait (bounded) until none runs
            assert await service.wait_idle(), "the service kept running requests"
            stats = service.stats_snapshot()
    assert len(outcomes.results) == 40 and outcomes.duplicates() == {}
    tier = stats["tiers"]["small"]
    # at least one member (half of 2 or more) of every packed request is asked alone
    assert tier["batched_requests"] > 0 and tier["verify_requests"] >= tier["batched_requests"], tier
    assert tier["verify_compared"] == tier["verify_agreed"] == tier["verify_requests"], (
        "the simulator answers alike both ways"
    )
    assert sum(c["compared"] for c in stats["agreement"]["small"].values()) == tier["verify_compared"]
    # the extra requests are counted as provider requests
    assert tier["provider_requests"] >= tier["verify_requests"] + tier["batched_requests"]


LABEL_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["positive", "negative", "neutral"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def _schema_option(schema: Mapping[str, object]) -> dict[str, object]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "label", "schema": schema}}}


async def test_outputs_are_checked_against_the_jobs_response_format(make_bus: Callable[..., Any]) -> None:
    """A server that honours structured output: every answer obeys the job's schema and is its
    result. One that ignores it: a batched member's answer that breaks the schema is asked again
    alone, and when that answer breaks it too the job is dead-lettered `output_invalid` with
    the reason; jobs whose schema the answers obey are results all the same."""
    obeyed = [job(i, batch=True, options=_schema_option(LABEL_SCHEMA)) for i in range(6)]
    # a plain JSON object: each alias's value must be an object, not the default string
    objects = [
        job(50 + i, batch=True, options={"response_format": {"type": "json_object"}}) for i in range(6)
    ]
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig(seed=1)) as base_url:
        async with bus.service(tier_file_dict(base_url + "/v1", max_items=3)):
            await bus.produce(obeyed + objects)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in obeyed + objects}, timeout_s=60)
    assert not outcomes.dead, outcomes.dead
    for j in obeyed:
        (result,) = outcomes.results[j["id"]]
        assert orjson.loads(result["output"])["label"] in ("positive", "negative", "neutral")
    for j in obeyed + objects:
        (result,) = outcomes.results[j["id"]]
        assert isinstance(orjson.loads(result["output"]), dict)
        assert result["attempts"] == 1 and result["batch"]["size"] > 1  # obeyed in the batch

    bus = make_bus(partitions=1)
    broken = [job(100 + i, batch=True, options=_schema_option(LABEL_SCHEMA)) for i in range(6)]
    broken_alone = [job(200 + i, batch=False, options=_schema_option(LABEL_SCHEMA)) for i in range(2)]
    prefixed = {"type": "string", "pattern": "^sim:[0-9a-f]{12}$"}  # what the simulator answers
    kept = [job(300 + i, batch=True, options=_schema_option(prefixed)) for i in range(6)]
    jobs = broken + broken_alone + kept
    async with SimulatorServer(SimulatorConfig(seed=1, ignore_structured=True)) as base_url:
        service = bus.service(tier_file_dict(base_url + "/v1", max_items=3))
        async with service:
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        stats = service.stats_snapshot()

    assert outcomes.duplicates() == {}
    assert set(outcomes.results) == {j["id"] for j in kept}
    for j in kept:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
    assert set(outcomes.dead) == {j["id"] for j in broken + broken_alone}
    for j in broken + broken_alone:
        (dead,) = outcomes.dead[j["id"]]
        assert dead["error"]["kind"] == "output_invalid"
        assert dead["error"]["message"].startswith("output is not JSON ("), dead["error"]
        assert dead["job"]["id"] == j["id"]
        assert dead["attempts"] == (2 if j["batch"] else 1)  # batched: asked again alone first
    tier = stats["tiers"]["small"]
    assert tier["reasks"] >= len(broken) // 3  # at least one re-ask per batched request
    assert stats["dead_letters"] == {"output_invalid": len(broken) + len(broken_alone)}
