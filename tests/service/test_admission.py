"""Admission refuses what the tier's provider would refuse for every request alike."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import orjson

from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import tier_file_dict


async def test_an_anthropic_chat_job_with_only_system_messages_is_dead_lettered_at_intake(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=1)
    provider = FakeProvider(lambda _r: text_completion("fine"), name="small")
    tiers = tier_file_dict("http://127.0.0.1:9", provider="anthropic", batching=False)
    system = {"role": "system", "content": "Be brief."}
    system_only = {"id": "sys-only", "tier": "small", "messages": [system]}
    with_user = {"id": "ok", "tier": "small", "messages": [system, {"role": "user", "content": "Hi"}]}
    async with bus.service(tiers, providers={"small": provider}):
        await bus.produce([system_only, with_user])
        outcomes = await bus.wait_for_outcomes({"sys-only", "ok"}, timeout_s=30)
    (dead,) = outcomes.dead["sys-only"]
    assert dead["error"]["kind"] == "invalid_job"
    assert "needs a user or assistant message" in dead["error"]["message"]
    assert orjson.loads(base64.b64decode(dead["raw"])) == system_only  # its original bytes
    assert outcomes.results["ok"][0]["output"] == "fine"
    assert len(provider.requests) == 1, "the refused job never reached the provider"
