"""Building clients and providers from a tier."""

from __future__ import annotations

import httpx
import pytest

from consumer.core.errors import ConfigError, NotSupportedError
from consumer.providers.anthropic import AnthropicProvider
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from consumer.providers.factory import build_batch_provider, build_provider, make_http_client
from consumer.providers.openai import OpenAIProvider
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.settings import TierConfig
from tests.providers.conftest import SECRET


def tier(**kw: object) -> TierConfig:
    data: dict[str, object] = {"provider": "openai", "model": "m", **kw}
    return TierConfig.model_validate(data)


def never_called(request: httpx.Request) -> httpx.Response:
    raise AssertionError("no request may be sent")


NO_NET = httpx.AsyncClient(transport=httpx.MockTransport(never_called))


async def test_http_client_timeouts_and_pool() -> None:
    client = make_http_client(tier(timeout_s=7.5, limiter={"initial": 2, "max": 12}))
    try:
        assert client.timeout.read == 7.5 and client.timeout.connect == 7.5
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert pool._max_connections == 16  # limiter max + headroom for polling
    finally:
        await client.aclose()


def test_provider_per_kind_and_auto_structured_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_KEY", SECRET)
    p = build_provider("a", tier(api_key_env="SIM_KEY"), NO_NET)
    assert isinstance(p, OpenAIProvider) and p.structured_mode == "json_schema" and p.name == "openai"
    assert p.http.base_url == "https://api.openai.com/v1"
    p = build_provider("b", tier(provider="anthropic", api_key_env="SIM_KEY"), NO_NET)
    assert isinstance(p, AnthropicProvider) and p.structured_mode == "tool"
    p = build_provider("c", tier(provider="openai_compat", base_url="http://127.0.0.1:9/v1"), NO_NET)
    assert isinstance(p, OpenAICompatProvider) and p.structured_mode == "json_object"
    p = build_provider(
        "d",
        tier(provider="openai_compat", base_url="http://h/v1", batching={"structured": "json_schema"}),
        NO_NET,
    )
    assert p.structured_mode == "json_schema"  # type: ignore[attr-defined]
    p = build_provider("e", tier(batching={"structured": "off"}), NO_NET)
    assert p.structured_mode == "off"  # type: ignore[attr-defined]
    assert SECRET not in repr(p)


def test_unset_key_env_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        build_provider("fast", tier(api_key_env="NOPE_KEY"), NO_NET)
    assert info.value.key == "tiers.fast.api_key_env"
    assert "NOPE_KEY" in info.value.reason


def test_anthropic_with_a_response_format_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        build_provider("x", tier(provider="anthropic", batching={"structured": "json_schema"}), NO_NET)
    assert info.value.key == "tiers.x.batching.structured"


def test_batch_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_KEY", SECRET)
    b = build_batch_provider("a", tier(api_key_env="SIM_KEY", offline={"completion_window": "24h"}), NO_NET)
    assert isinstance(b, OpenAIBatchProvider) and b.completion_window == "24h"
    b = build_batch_provider("b", tier(provider="anthropic", api_key_env="SIM_KEY"), NO_NET)
    assert isinstance(b, AnthropicBatchProvider)


def test_openai_compat_has_no_batch_api() -> None:
    with pytest.raises(NotSupportedError, match="no Batch API; use online mode"):
        build_batch_provider(
            "local", tier(provider="openai_compat", base_url="http://127.0.0.1:9/v1"), NO_NET
        )


@pytest.mark.parametrize("url", ["ftp://h/v1", "not a url", "http:///v1"])
def test_bad_base_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_provider("t", tier(provider="openai_compat", base_url=url), NO_NET)
    assert info.value.key == "tiers.t.base_url"
