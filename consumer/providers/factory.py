"""Builds HTTP clients and providers from a tier (`consumer.settings.TierConfig`).

Each provider gets its own `HttpTransport` from `make_http_client` and owns it (the
provider's `aclose()` closes it; closing it again is harmless). Its proxy (the tier's `proxy:`,
else the proxy variables) and its TLS context are resolved there, once per deployment.
The API key is read from the env var the tier names, at build time; a key file or command is a
rotating `KeySource` (`consumer.providers.keys`) primed at build time.
"""

from __future__ import annotations

import logging
import ssl

from consumer.core.errors import ConfigError, NotSupportedError
from consumer.providers.anthropic import ANTHROPIC_STRUCTURED_MODES, AnthropicProvider
from consumer.providers.base import BatchProvider, CompletionProvider
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from consumer.providers.httpapi import is_http_url
from consumer.providers.keys import ApiKey, CommandKey, FileKey, KeyUnavailable
from consumer.providers.openai import OpenAIProvider
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.providers.structured import StructuredMode
from consumer.providers.transport import HttpTransport, KeepAliveTransport
from consumer.providers.transport.route import ProxyPolicy
from consumer.providers.transport.tls import TlsOptions, ssl_context
from consumer.settings import TierConfig

log = logging.getLogger(__name__)

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


def make_http_client(tier: TierConfig, where: str = "", *, name: str = "") -> HttpTransport:
    """A keep-alive transport with the tier's timeouts and a pool sized from its limiter's max
    (`consumer.providers.transport.pool`); `where` (`small`, `small.deployments.0`) is the
    dotted key of its config errors, `name` (`tier small deployment eu`) what its proxy and
    TLS errors name (default: the key).

    Timeouts: `tier.timeout_s` between two reads of the answer (a provider that stops sending
    for that long timed out; a long download that keeps flowing does not) and for waiting on a
    free pooled connection; the TCP connect (through a proxy: the tunnel and TLS too) at most
    `CONNECT_TIMEOUT_S`. The proxy is `tier.proxy`, else the proxy variables as they are now
    (read here once, never per request); .netrc is not read.
    """
    return KeepAliveTransport(
        limit=tier.limiter.max + POOL_HEADROOM,
        timeout_s=tier.timeout_s,
        connect_timeout_s=min(CONNECT_TIMEOUT_S, tier.timeout_s),
        keepalive_s=KEEPALIVE_S,
        proxy=ProxyPolicy(tier.proxy),
        ssl_context=tier_ssl_context(where or "tier", tier),
        name=name or (f"tiers.{where}" if where else ""),
    )


def tier_ssl_context(where: str, tier: TierConfig) -> ssl.SSLContext:
    """The TLS context of the tier's `tls:`; ConfigError (`tiers.NAME.tls`) when a file of it
    is missing or not PEM. `verify: false` is warned about here, at start."""
    tls = tier.tls
    if tls is None:
        return ssl.create_default_context()
    if not tls.verify:
        log.warning(
            "tiers.%s.tls.verify is false: provider certificates and host names are NOT checked", where
        )
    options = TlsOptions(tls.ca_file, tls.system_ca, tls.client_cert_file, tls.client_key_file, tls.verify)
    try:
        return ssl_context(options)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"tiers.{where}.tls", f"cannot load its certificate files: {reason}") from None


def api_key_for(where: str, tier: TierConfig) -> ApiKey:
    """The tier's key: static (`api_key_env`, ConfigError when unset), a `FileKey` (read now;
    ConfigError when missing), a `CommandKey` (run now; a failure is logged and its requests
    wait), or None."""
    if tier.api_key_file:
        source = FileKey(tier.api_key_file, f"tiers.{where}")
        try:
            source.prime()
        except KeyUnavailable:
            raise ConfigError(
                f"tiers.{where}.api_key_file", f"{tier.api_key_file} is missing or empty"
            ) from None
        return source
    if tier.api_key_command:
        command = CommandKey(tier.api_key_command, f"tiers.{where}", timeout_s=tier.api_key_command_timeout_s)
        command.prime()
        return command
    return tier.require_api_key(where)


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
    naming the key (its API key env var set, its structured mode, its base URL), for each of
    its deployments (`tiers.NAME.deployments.I.api_key_env`, ...). Files the machine running
    the service has (a key file, TLS certificates) are read when the service builds the tier,
    not here: `check-config` may run where the secrets are not mounted."""
    structured_mode_for(tier_name, tier)
    for _name, where, _weight, config in tier.deployment_configs(tier_name):
        config.require_api_key(where)
        base_url_for(where, config)


def build_provider(tier_name: str, tier: TierConfig, client: HttpTransport) -> CompletionProvider:
    """The online adapter for a tier. Its `name` is the provider name (openai, anthropic, openai_compat)."""
    key = api_key_for(tier_name, tier)
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
