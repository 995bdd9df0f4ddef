"""Building clients and providers from a tier."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import pytest

from consumer.core.errors import ConfigError, NotSupportedError
from consumer.core.limit import DEFAULT_MAX_LIMIT
from consumer.providers.anthropic import AnthropicProvider
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from consumer.providers.factory import build_batch_provider, build_provider, make_http_client
from consumer.providers.openai import OpenAIProvider
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.providers.transport import HttpResponse, HttpTarget, KeepAliveTransport, parse_target
from consumer.settings import TierConfig
from tests.providers.recording import SECRET, recorder


def tier(**kw: object) -> TierConfig:
    data: dict[str, object] = {"provider": "openai", "model": "m", **kw}
    return TierConfig.model_validate(data)


class _NoNet:
    """A transport that records every request it is asked to send; the test fails if there is one."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def request(
        self, method: str, target: HttpTarget, headers: Mapping[str, str], body: bytes | None
    ) -> HttpResponse:
        self.started.append(f"{method} {target.url}")
        raise ConnectionError("no network in this test")

    async def close(self) -> None:
        pass


@pytest.fixture
async def no_net() -> AsyncIterator[_NoNet]:
    transport = _NoNet()
    yield transport
    assert transport.started == [], "no request may be sent"


async def test_http_client_timeouts_and_pool() -> None:
    client = make_http_client(tier(timeout_s=7.5, limiter={"initial": 2, "max": 12}))
    assert isinstance(client, KeepAliveTransport)
    try:
        assert client.timeout_s == 7.5 and client.connect_timeout_s == 7.5
        assert client.limit == 16  # limiter max + headroom
    finally:
        await client.close()
    client = make_http_client(tier(timeout_s=120))
    assert isinstance(client, KeepAliveTransport)
    try:
        assert client.timeout_s == 120 and client.connect_timeout_s == 10.0  # connect capped
        assert client.limit == DEFAULT_MAX_LIMIT + 4
    finally:
        await client.close()


async def test_http_client_keeps_connections_alive() -> None:
    """Requests in a row reuse one pooled connection (the server sees one peer port)."""
    rec = recorder(200, {})
    client = make_http_client(tier())
    try:
        for _ in range(3):
            response = await client.request("GET", parse_target(rec.base_url + "/"), {}, None)
            assert response.status == 200
    finally:
        await client.close()
    assert len(rec.requests) == 3 and len({r.peer for r in rec.requests}) == 1


async def test_provider_per_kind_and_auto_structured_mode(
    monkeypatch: pytest.MonkeyPatch,
    no_net: _NoNet,
) -> None:
    monkeypatch.setenv("SIM_KEY", SECRET)
    p = build_provider("a", tier(api_key_env="SIM_KEY"), no_net)
    assert isinstance(p, OpenAIProvider) and p.structured_mode == "json_schema" and p.name == "openai"
    assert p.http.base_url == "https://api.openai.com/v1"
    p = build_provider("b", tier(provider="anthropic", api_key_env="SIM_KEY"), no_net)
    assert isinstance(p, AnthropicProvider) and p.structured_mode == "tool"
    p = build_provider("c", tier(provider="openai_compat", base_url="http://127.0.0.1:9/v1"), no_net)
    assert isinstance(p, OpenAICompatProvider) and p.structured_mode == "json_object"
    p = build_provider(
        "d",
        tier(provider="openai_compat", base_url="http://h/v1", batching={"structured": "json_schema"}),
        no_net,
    )
    assert p.structured_mode == "json_schema"  # type: ignore[attr-defined]
    p = build_provider("e", tier(batching={"structured": "off"}), no_net)
    assert p.structured_mode == "off"  # type: ignore[attr-defined]
    assert SECRET not in repr(p)


async def test_unset_key_env_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
    no_net: _NoNet,
) -> None:
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        build_provider("fast", tier(api_key_env="NOPE_KEY"), no_net)
    assert info.value.key == "tiers.fast.api_key_env"
    assert "NOPE_KEY" in info.value.reason


async def test_anthropic_with_a_response_format_mode_is_a_config_error(no_net: _NoNet) -> None:
    with pytest.raises(ConfigError) as info:
        build_provider("x", tier(provider="anthropic", batching={"structured": "json_schema"}), no_net)
    assert info.value.key == "tiers.x.batching.structured"


async def test_batch_providers(monkeypatch: pytest.MonkeyPatch, no_net: _NoNet) -> None:
    monkeypatch.setenv("SIM_KEY", SECRET)
    b = build_batch_provider("a", tier(api_key_env="SIM_KEY", offline={"completion_window": "24h"}), no_net)
    assert isinstance(b, OpenAIBatchProvider) and b.completion_window == "24h"
    b = build_batch_provider("b", tier(provider="anthropic", api_key_env="SIM_KEY"), no_net)
    assert isinstance(b, AnthropicBatchProvider)


async def test_openai_compat_has_no_batch_api(no_net: _NoNet) -> None:
    with pytest.raises(NotSupportedError, match="no Batch API; use online mode"):
        build_batch_provider(
            "local", tier(provider="openai_compat", base_url="http://127.0.0.1:9/v1"), no_net
        )


@pytest.mark.parametrize("url", ["ftp://h/v1", "not a url", "http:///v1"])
async def test_bad_base_url_is_a_config_error(url: str, no_net: _NoNet) -> None:
    with pytest.raises(ConfigError) as info:
        build_provider("t", tier(provider="openai_compat", base_url=url), no_net)
    assert info.value.key == "tiers.t.base_url"
