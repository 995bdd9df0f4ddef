"""Bound tenants end to end, on the in-memory edges and on the real broker (exactly-once): a
bound topic's jobs are its tenant's, a false claim is a `tenant_mismatch` dead letter in the
bound tenant's own dead-letter topic, and each tenant's outcomes reach its own topics only."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import orjson

from consumer.core.tenants import TENANT_HEADER
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import job, tier_file_dict, until


async def _values(bus: Any, topic: str) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _k, v in await bus.read(topic) if v is not None]


async def test_bound_tenants_own_their_topics_and_their_outcomes_go_to_their_own_topics(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    if bus.name == "kafka":  # on the broker, the exactly-once sink (the memory edges have no transactions)
        bus = make_bus(partitions=1, guarantee="exactly_once")
    s = bus.settings
    topic_a, topic_b = f"{s.jobs_topic}.team-a", f"{s.jobs_topic}.team-b"
    out = {name: (f"{s.results_topic}.{name}", f"{s.dlq_topic}.{name}") for name in ("team-a", "team-b")}
    tier_file = tier_file_dict("http://127.0.0.1:9", batching=False)
    tier_file["lanes"] = {"a": {"topic": topic_a}, "b": {"topic": topic_b}, "shared": {"topic": s.jobs_topic}}
    tier_file["tenants"] = {
        name: {"topics": [topic], "results_topic": out[name][0], "dead_letter_topic": out[name][1]}
        for name, topic in (("team-a", topic_a), ("team-b", topic_b))
    }
    provider = FakeProvider(lambda _r: text_completion("ok"), name="small")
    a_own = job(1, batch=False)  # names no tenant: team-a's, by its topic
    a_claims_b = {**job(2, batch=False), "tenant": "team-b"}
    a_header_b = job(3, batch=False)
    shared_claims_a = {**job(4, batch=False), "tenant": "team-a"}
    shared_unbound = {**job(5, batch=False), "tenant": "carol"}
    b_own = {**job(6, batch=False), "tenant": "team-b"}
    async with bus.service(tier_file, providers={"small": provider}) as svc:
        await bus.produce([a_own, a_claims_b, b"{not json"], topic=topic_a)
        await bus.produce([a_header_b], topic=topic_a, headers=[(TENANT_HEADER, b"team-b")])
        await bus.produce([shared_claims_a, shared_unbound])
        await bus.produce([b_own], topic=topic_b)

        topics = (*out["team-a"], *out["team-b"], s.results_topic, s.dlq_topic)
        counts: list[int] = []
        for _ in range(600):  # bounded: until every outcome is there
            counts = [len(await _values(bus, t)) for t in topics]
            if counts == [1, 3, 1, 0, 1, 1]:
                break
            await asyncio.sleep(0.05)
        assert counts == [1, 3, 1, 0, 1, 1]
        assert await until(lambda: svc.stats.tenants["team-b"].results == 1, 10)
        tenants = svc.stats_snapshot()["tenants"]
    (a_result,) = await _values(bus, out["team-a"][0])
    assert a_result["id"] == "job-1" and a_result["tenant"] == "team-a"
    dead_a = {d["id"]: d for d in await _values(bus, out["team-a"][1])}
    assert set(dead_a) == {"job-2", "job-3", None}
    # a record that is no job at all (no id either) is its topic's tenant's too
    assert dead_a[None]["error"]["kind"] == "invalid_job" and dead_a[None]["tenant"] == "team-a"
    for jid, raw in (("job-2", a_claims_b), ("job-3", a_header_b)):
        dead = dead_a[jid]
        assert dead["error"]["kind"] == "tenant_mismatch" and dead["tenant"] == "team-a"
        assert "bound to tenant 'team-a'" in dead["error"]["message"] and "team-b" in dead["error"]["message"]
        assert orjson.loads(base64.b64decode(dead["raw"])) == raw  # the original bytes
    (b_result,) = await _values(bus, out["team-b"][0])
    assert b_result["id"] == "job-6" and b_result["tenant"] == "team-b"
    (service_dead,) = await _values(bus, s.dlq_topic)
    assert service_dead["id"] == "job-4" and service_dead["error"]["kind"] == "tenant_mismatch"
    assert service_dead["tenant"] == "default"
    (service_result,) = await _values(bus, s.results_topic)
    assert service_result["id"] == "job-5" and service_result["tenant"] == "carol"
    # the claims were never sent: only the three admitted jobs reached the provider
    assert len(provider.requests) == 3
    assert tenants["team-b"]["results"] == 1 and tenants["team-b"]["dead_letters"] == 0
    assert tenants["team-a"]["results"] == 1 and tenants["team-a"]["dead_letters"] == 3
    assert tenants["team-a"]["mismatched"] == 2 and tenants["team-b"]["mismatched"] == 0
    assert tenants["default"]["mismatched"] == 1
    from consumer.cli.stats import format_tenants

    (line,) = format_tenants({"tenants": tenants}, only="team-a")
    assert line.startswith("tenant team-a: results=1 dead_letters=3 (tenant_mismatch=2) tokens in=")
