"""At start every tier's provider is asked a listing that costs nothing; one WARNING per unreachable tier."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import SecretStr

from consumer.core.errors import AuthFailed, ConnectionFailed
from consumer.providers.factory import make_http_client
from consumer.providers.fake import FakeProvider, text_completion
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.runtime.reachability import check_tier_providers
from consumer.settings import TierConfig
from consumer.testing.ports import free_port

TIER = TierConfig(provider="openai_compat", model="m", base_url="http://127.0.0.1:9/v1", timeout_s=5)


async def test_an_unreachable_tier_is_one_warning_naming_tier_and_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    up = FakeProvider(lambda r: text_completion("x"))
    down = FakeProvider(lambda r: text_completion("x"), unreachable=ConnectionFailed("connection refused"))
    with caplog.at_level(logging.INFO, logger="consumer.runtime.reachability"):
        found = await check_tier_providers(
            {"up": up, "down": down}, {"up": "http://127.0.0.1:1/v1", "down": "http://127.0.0.1:2/v1"}
        )
    assert found == {"up": None, "down": "connection refused"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["tier down: provider at http://127.0.0.1:2/v1 cannot be reached: connection refused"]
    assert up.requests == [] and down.requests == []  # the check never asks for a completion


async def test_the_http_adapter_asks_the_models_listing_and_names_a_refused_port() -> None:
    port = free_port()
    provider = OpenAICompatProvider(make_http_client(TIER), base_url=f"http://127.0.0.1:{port}/v1")
    try:
        with pytest.raises(ConnectionFailed):
            await provider.check_reachable()
    finally:
        await provider.aclose()


async def test_the_listing_answered_is_reachable_and_a_refused_key_is_not(
    aiohttp_listing_server: tuple[str, list[str]],
) -> None:
    base_url, seen = aiohttp_listing_server
    transport = make_http_client(TIER)
    try:
        ok = OpenAICompatProvider(transport, base_url=base_url, owns_client=False)
        assert await ok.check_reachable() == f"{base_url}/models"
        bad = OpenAICompatProvider(
            transport, base_url=base_url, api_key=SecretStr("wrong"), owns_client=False
        )
        with pytest.raises(AuthFailed) as caught:
            await bad.check_reachable()
        assert "wrong" not in str(caught.value)
    finally:
        await transport.close()
    assert seen == ["GET /v1/models", "GET /v1/models"]


@pytest.fixture()
async def aiohttp_listing_server():  # type: ignore[no-untyped-def]
    from aiohttp import web

    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        if request.headers.get("Authorization") == "Bearer wrong":
            return web.json_response({"error": {"message": "bad key", "type": "invalid_api_key"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        await runner.cleanup()


async def test_the_service_checks_each_tier_once_at_start_and_still_starts(
    make_bus: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """One tier on the simulator, one on a port nothing listens on: one WARNING, for that tier;
    the reachable tier's jobs are answered all the same."""
    from consumer.testing.harness import job, tier_file_dict
    from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

    bus = make_bus(partitions=1)
    dead_url = f"http://127.0.0.1:{free_port()}/v1"
    caplog.set_level(logging.INFO, logger="consumer.runtime.reachability")
    async with SimulatorServer(SimulatorConfig(seed=1)) as base_url:
        tiers = tier_file_dict(base_url + "/v1")
        tiers["tiers"]["down"] = {**tiers["tiers"]["small"], "base_url": dead_url}
        async with bus.service(tiers):
            jobs = [job(i, batch=False) for i in range(5)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"tier down: provider at {dead_url} cannot be reached")
    infos = [r.getMessage() for r in caplog.records]
    assert f"tier small: provider at {base_url}/v1 is reachable" in infos
    assert {jid: r[0]["output"] for jid, r in outcomes.results.items()} == {
        j["id"]: answer_for(j["variables"]["text"]) for j in jobs
    }
