"""Builds HTTP clients and providers from a tier (`consumer.settings.TierConfig`).

Each provider gets its own `httpx.AsyncClient` from `make_http_client` and owns it
(`aclose()` closes it). The API key is read from the env var the tier names, at build time.
"""

from __future__ import annotations

import httpx
from pydantic import SecretStr

from consumer.core.errors import ConfigError, NotSupportedError
from consumer.providers.anthropic import ANTHROPIC_STRUCTURED_MODES, AnthropicProvider
from consumer.providers.base import BatchProvider, CompletionProvider
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from consumer.providers.openai import OpenAIProvider
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.providers.structured import StructuredMode
from consumer.settings import TierConfig

#: connect timeout cap: a provider that does not accept a connection in this long is down
CONNECT_TIMEOUT_S = 10.0
#: connections beyond the limiter's max, for batch polling and file downloads sharing the pool
POOL_HEADROOM = 4

#: what `batching.structured: auto` means per provider
NATURAL_STRUCTURED_MODE: dict[str, StructuredMode] = {
    "openai": "json_schema",
    "anthropic": "tool",
    "openai_compat": "json_object",
}


def make_http_client(tier: TierConfig) -> httpx.AsyncClient:
    """A client with the tier's timeout and a pool sized from its limiter's max."""
    timeout = httpx.Timeout(tier.timeout_s, connect=min(CONNECT_TIMEOUT_S, tier.timeout_s))
    size = tier.limiter.max + POOL_HEADROOM
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


def api_key_for(tier_name: str, tier: TierConfig) -> SecretStr | None:
    """The tier's key; ConfigError when the tier names an env var that is unset or empty."""
    key = tier.api_key()
    if tier.api_key_env and key is None:
        raise ConfigError(
            f"tiers.{tier_name}.api_key_env", f"environment variable {tier.api_key_env} is not set"
        )
    return key


def structured_mode_for(tier_name: str, tier: TierConfig) -> StructuredMode:
    """`batching.structured` resolved for the tier's provider (auto -> the provider's natural mode)."""
    wanted = tier.batching.structured
    mode: StructuredMode = NATURAL_STRUCTURED_MODE[tier.provider] if wanted == "auto" else wanted
    if tier.provider == "anthropic" and mode not in ANTHROPIC_STRUCTURED_MODES:
        raise ConfigError(
            f"tiers.{tier_name}.batching.structured",
            f"anthropic supports {' or '.join(ANTHROPIC_STRUCTURED_MODES)} (or auto), not {mode}",
        )
    return mode


def base_url_for(tier_name: str, tier: TierConfig) -> str:
    """The tier's base URL; ConfigError when it is not an http(s) URL with a host."""
    base_url = tier.resolved_base_url
    try:
        parsed = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"tiers.{tier_name}.base_url", f"not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"tiers.{tier_name}.base_url", f"must be an http(s) URL with a host, got {base_url!r}"
        )
    return base_url


def build_provider(tier_name: str, tier: TierConfig, client: httpx.AsyncClient) -> CompletionProvider:
    """The online adapter for a tier. Its `name` is the provider name (openai, anthropic, openai_compat)."""
    key = api_key_for(tier_name, tier)
    mode = structured_mode_for(tier_name, tier)
    base_url = base_url_for(tier_name, tier)
    if tier.provider == "openai":
        return OpenAIProvider(client, base_url=base_url, api_key=key, structured_mode=mode)
    if tier.provider == "anthropic":
        return AnthropicProvider(client, base_url=base_url, api_key=key, structured_mode=mode)
    return OpenAICompatProvider(client, base_url=base_url, api_key=key, structured_mode=mode)


def build_batch_provider(tier_name: str, tier: TierConfig, client: httpx.AsyncClient) -> BatchProvider:
    """The offline Batch API adapter for a tier; NotSupportedError for openai_compat (no request sent)."""
    if tier.provider == "openai_compat":
        raise NotSupportedError(f"tier {tier_name}: provider openai_compat has no Batch API; use online mode")
    key = api_key_for(tier_name, tier)
    mode = structured_mode_for(tier_name, tier)
    base_url = base_url_for(tier_name, tier)
    if tier.provider == "openai":
        return OpenAIBatchProvider(
            client,
            base_url=base_url,
            api_key=key,
            structured_mode=mode,
            completion_window=tier.offline.completion_window,
        )
    return AnthropicBatchProvider(client, base_url=base_url, api_key=key, structured_mode=mode)
