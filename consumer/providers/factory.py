"""Builds HTTP clients and providers from a tier (`consumer.settings.TierConfig`).

Each provider gets its own `HttpTransport` from `make_http_client` and owns it (the
provider's `aclose()` closes it; closing it again is harmless).
The API key is read from the env var the tier names, at build time.
"""

from __future__ import annotations

from consumer.core.errors import ConfigError, NotSupportedError
from consumer.providers.anthropic import ANTHROPIC_STRUCTURED_MODES, AnthropicProvider
from consumer.providers.base import BatchProvider, CompletionProvider
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from consumer.providers.httpapi import is_http_url
from consumer.providers.openai import OpenAIProvider
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.providers.structured import StructuredMode
from consumer.providers.transport import HttpTransport, KeepAliveTransport
from consumer.settings import TierConfig

#: connect timeout cap: a provider that does not accept a connection in this long is down
CONNECT_TIMEOUT_S = 10.0
#: connections beyond the limiter's max, for batch polling and file downloads sharing the pool
POOL_HEADROOM = 4
#: an idle pooled connection is closed after this long: below the 5 s idle timeout of common
#: servers (uvicorn, Node), so we close first and a request never races the server's close
KEEPALIVE_S = 4.0

#: what `batching.structured: auto` means per provider
NATURAL_STRUCTURED_MODE: dict[str, StructuredMode] = {
    "openai": "json_schema",
    "anthropic": "tool",
    "openai_compat": "json_object",
}


def make_http_client(tier: TierConfig) -> HttpTransport:
    """A keep-alive transport with the tier's timeouts and a pool sized from its limiter's max
    (`consumer.providers.transport.pool`).

    Timeouts: `tier.timeout_s` between two reads of the answer (a provider that stops sending
    for that long timed out; a long download that keeps flowing does not) and for waiting on a
    free pooled connection; the TCP connect itself at most `CONNECT_TIMEOUT_S`. Proxy
    variables and .netrc in the environment are not read.
    """
    return KeepAliveTransport(
        limit=tier.limiter.max + POOL_HEADROOM,
        timeout_s=tier.timeout_s,
        connect_timeout_s=min(CONNECT_TIMEOUT_S, tier.timeout_s),
        keepalive_s=KEEPALIVE_S,
    )


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
    if not is_http_url(base_url):
        raise ConfigError(
            f"tiers.{tier_name}.base_url", f"must be an http(s) URL with a host, got {base_url!r}"
        )
    return base_url


def check_tier(tier_name: str, tier: TierConfig) -> None:
    """What building the tier's adapters refuses, checked without building them: ConfigError
    naming the key (its API key env var set, its structured mode, its base URL)."""
    tier.require_api_key(tier_name)
    structured_mode_for(tier_name, tier)
    base_url_for(tier_name, tier)


def build_provider(tier_name: str, tier: TierConfig, client: HttpTransport) -> CompletionProvider:
    """The online adapter for a tier. Its `name` is the provider name (openai, anthropic, openai_compat)."""
    key = tier.require_api_key(tier_name)
    mode = structured_mode_for(tier_name, tier)
    base_url = base_url_for(tier_name, tier)
    if tier.provider == "openai":
        return OpenAIProvider(client, base_url=base_url, api_key=key, structured_mode=mode)
    if tier.provider == "anthropic":
        return AnthropicProvider(client, base_url=base_url, api_key=key, structured_mode=mode)
    return OpenAICompatProvider(client, base_url=base_url, api_key=key, structured_mode=mode)


def build_batch_provider(tier_name: str, tier: TierConfig, client: HttpTransport) -> BatchProvider:
    """The offline Batch API adapter for a tier; NotSupportedError for openai_compat (no request sent)."""
    if tier.provider == "openai_compat":
        raise NotSupportedError(f"tier {tier_name}: provider openai_compat has no Batch API; use online mode")
    key = tier.require_api_key(tier_name)
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
