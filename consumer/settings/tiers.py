"""The tier file's tier models: one `TierConfig` per tier (`tiers.NAME`) and its sections
(batching, limiter, retry, offline, fallback, pricing)."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from consumer.core.cost import Pricing
from consumer.core.errors import ConfigError, JobError
from consumer.core.fallback import FallbackCause, FallbackRule
from consumer.core.limit import AIMD_RTT_TOLERANCE, DEFAULT_MAX_LIMIT
from consumer.core.output import output_format
from consumer.core.proxy import NO_PROXY_SETTING, parse_proxy_url
from consumer.core.routing import ModePolicy, parse_duration_s
from consumer.settings.base import StrictModel

ProviderName = Literal["openai", "anthropic", "openai_compat"]

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class BatchingConfig(StrictModel):
    """Prompt batching for a tier (DESIGN.md "Prompt batching rules")."""

    enabled: bool = Field(False, description="jobs of this tier that say batch: true may share a prompt")
    max_items: int = Field(20, ge=1, le=1000, description="most jobs in one packed prompt")
    max_input_chars: int = Field(32000, ge=1, description="inputs larger together go out as several requests")
    window_ms: int = Field(100, ge=0, description="a window closes this long after its last new member ...")
    max_wait_ms: int = Field(2000, ge=0, description="... and at most this long after its first")
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "cap of a packed request's max_tokens (the members' sum plus JSON overhead); null: no cap"
        ),
    )
    structured: Literal["auto", "json_schema", "json_object", "tool", "off"] = Field(
        "auto", description="how the packed answer's shape is enforced; auto: what the provider supports"
    )
    initial_items: int | None = Field(
        None,
        ge=1,
        description=(
            "sizes trusted without measurement (<= max_items); null: max_items when verify_fraction is 0,"
            " else 1"
        ),
    )
    verify_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description=(
            "share of packed jobs also asked alone, to measure agreement (> 0: larger sizes must prove it"
            " first)"
        ),
    )
    min_agreement: float = Field(
        0.8, ge=0.0, le=1.0, description="share of valid and of agreeing answers a size must show"
    )
    agreement_confidence: float = Field(
        0.9, ge=0.5, lt=1.0, description="one-sided confidence of the Wilson lower bound that proves a size"
    )
    probe_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="share of jobs sent at the next size not in use yet, to measure it (0: never)",
    )
    charges: Literal["auto", "tokens", "nothing"] = Field(
        "auto",
        description=(
            "what the provider charges for besides requests under a learnt budget (auto: tokens for "
            "openai and anthropic, nothing for openai_compat); a slower size is kept only where it saves "
            "a charge"
        ),
    )

    @model_validator(mode="after")
    def _check_waits(self) -> BatchingConfig:
        if self.max_wait_ms < self.window_ms:
            raise ValueError("max_wait_ms must be >= window_ms")
        if self.initial_items is not None and self.initial_items > self.max_items:
            raise ValueError("initial_items must be <= max_items")
        return self


class LimiterConfig(StrictModel):
    """Adaptive concurrency: aimd for providers that send 429s, gradient for local servers."""

    algorithm: Literal["aimd", "gradient", "fixed"] = Field(
        "aimd", description="aimd for providers that send 429s, gradient for local servers, or fixed"
    )
    initial: int = Field(4, ge=1, description="concurrency limit at start")
    min: int = Field(1, ge=1, description="lowest limit")
    max: int = Field(DEFAULT_MAX_LIMIT, ge=1, description="highest limit")
    rtt_tolerance: float | None = Field(
        AIMD_RTT_TOLERANCE,
        gt=1.0,
        description=(
            "aimd on openai_compat: grow only while answers stay within this multiple of the no-load "
            "latency (a server that queues past its capacity), until the server announces a rate "
            "limit or answers 429; null: only 429s, overloads and timeouts stop it"
        ),
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> LimiterConfig:
        if not self.min <= self.initial <= self.max:
            raise ValueError("must satisfy min <= initial <= max")
        return self


class RetryConfig(StrictModel):
    max_attempts: int = Field(5, ge=1, description="attempts of one request before retries_exhausted")
    backoff_initial_s: float = Field(
        0.5, ge=0, description="first backoff (doubling, with jitter) when the answer names no wait"
    )
    backoff_max_s: float = Field(30.0, ge=0, description="cap of a backoff and of a 429's pause of the tier")
    quota_cooldown_s: float = Field(
        60.0, ge=0, description="quota exhausted: the tier pauses this long, then tries again ..."
    )
    quota_max_wait_s: float = Field(
        600.0,
        ge=0,
        description="... until this much pausing in a row has passed; then its jobs fail quota_exhausted",
    )
    max_outage_s: float | None = Field(
        None,
        gt=0,
        description=(
            "a provider outage lasting this long dead-letters the jobs it holds (retries_exhausted); "
            "null: they wait as long as it takes"
        ),
    )
    circuit_failures: int = Field(
        5,
        ge=1,
        description="outage errors in a row (connection, timeout, 5xx, overloaded) that open the circuit",
    )
    circuit_probe_s: float = Field(1.0, gt=0, description="while open, one probe request after this long ...")
    circuit_probe_max_s: float = Field(30.0, gt=0, description="... the wait doubling up to this")

    @model_validator(mode="after")
    def _probe_waits_in_order(self) -> RetryConfig:
        if self.circuit_probe_max_s < self.circuit_probe_s:
            raise ValueError("circuit_probe_max_s must be at least circuit_probe_s")
        return self


class OfflineConfig(StrictModel):
    enabled: bool = Field(
        False, description="jobs with mode offline go to the provider's Batch API (not for openai_compat)"
    )
    poll_s: float = Field(60.0, gt=0, description="how often a submitted offline batch is polled")
    completion_window: str = Field("24h", description="the Batch API's completion window")
    collect_s: float = Field(
        5.0,
        ge=0,
        description="offline jobs are collected this long (or up to max_items) before one submission",
    )
    max_items: int = Field(10000, ge=1, description="most jobs in one offline batch")
    auto_margin: str = Field(
        "1h",
        description=(
            "the slack a mode auto job's deadline must leave beyond completion_window to go offline"
        ),
    )
    max_enqueued_tokens: int | None = Field(
        None,
        gt=0,
        description=(
            "the provider's limit of input tokens in unfinished batches of this model (OpenAI's enqueued"
            " token limit, per organisation); submissions stay under it; null: no limit"
        ),
    )

    @field_validator("completion_window", "auto_margin")
    @classmethod
    def _check_duration(cls, value: str) -> str:
        parse_duration_s(value)
        return value

    @property
    def completion_window_s(self) -> float:
        return parse_duration_s(self.completion_window)

    @property
    def auto_margin_s(self) -> float:
        return parse_duration_s(self.auto_margin)


class FallbackConfig(StrictModel):
    """The tier that answers this tier's jobs while it is down (`consumer.core.fallback`)."""

    tier: str = Field(
        min_length=1, description="the tier that answers instead (its own provider, limiter, pricing)"
    )
    after_s: float = Field(30.0, ge=0, description="outage: how long the circuit is open before jobs move")
    on: tuple[Literal["outage", "quota_exhausted"], ...] = Field(
        ("outage", "quota_exhausted"), min_length=1, description="the troubles that move jobs"
    )

    def rule(self) -> FallbackRule:
        """The core's value object of this fallback."""
        return FallbackRule(self.tier, self.after_s, frozenset(FallbackCause(c) for c in self.on))


class PricingConfig(StrictModel):
    """A tier's prices, USD per million tokens (`consumer.core.cost`): what stats and
    `/metrics` show as the tier's cost."""

    input_per_mtok: float = Field(ge=0, description="uncached input tokens")
    output_per_mtok: float = Field(ge=0, description="output tokens")
    cached_input_per_mtok: float | None = Field(
        None, ge=0, description="tokens read from the prompt cache; null: input_per_mtok"
    )
    cache_write_per_mtok: float | None = Field(
        None, ge=0, description="tokens written to the prompt cache (Anthropic); null: input_per_mtok"
    )
    batch_discount: float = Field(
        0.0, ge=0, lt=1, description="the Batch API's discount on offline jobs (0.5: half price)"
    )

    def pricing(self) -> Pricing:
        """The core's value object of these prices."""
        return Pricing(
            input_per_mtok=self.input_per_mtok,
            output_per_mtok=self.output_per_mtok,
            cached_input_per_mtok=self.cached_input_per_mtok,
            cache_write_per_mtok=self.cache_write_per_mtok,
            batch_discount=self.batch_discount,
        )


_TIERS_OWN = "null: the tier's own"


class TlsConfig(StrictModel):
    """`tls:` of a tier or deployment: what its provider connections trust and present
    (docs/operations.md "Provider connections")."""

    ca_file: str | None = Field(
        None, description="PEM bundle of CA certificates trusted beside the system's (a company's CA)"
    )
    system_ca: bool = Field(
        True, description="trust the system's CAs too (SSL_CERT_FILE); false: only ca_file's"
    )
    client_cert_file: str | None = Field(
        None, description="PEM client certificate presented to gateways that require one (mTLS)"
    )
    client_key_file: str | None = Field(
        None, description="PEM private key of client_cert_file; null: in the certificate's file"
    )
    verify: bool = Field(
        True, description="check the provider's certificate and host name; false warns at start and in stats"
    )

    @model_validator(mode="after")
    def _check_files(self) -> TlsConfig:
        if not self.system_ca and not self.ca_file:
            raise ValueError("system_ca: false needs a ca_file to trust")
        if self.client_key_file and not self.client_cert_file:
            raise ValueError("client_key_file needs client_cert_file")
        return self


_PROXY_HELP = (
    "HTTP proxy of its provider connections: http://[user:password@]host:port, or none (connect "
    "directly); null: HTTPS_PROXY / HTTP_PROXY / NO_PROXY"
)
_KEY_FILE_HELP = (
    "file holding the API key (a mounted secret), re-read when it changes; instead of api_key_env"
)
_KEY_COMMAND_HELP = (
    "command (argument list) printing the API key, or JSON with token and expires_at; run at start,"
    " before expiry and on a 401; instead of api_key_env"
)
#: the key settings a tier or deployment may name (one of them)
KEY_SOURCES = ("api_key_env", "api_key_file", "api_key_command")


def _check_proxy(value: str | None) -> str | None:
    if value is None or value.strip().lower() == NO_PROXY_SETTING:
        return value
    parse_proxy_url(value)  # ValueError never repeats the URL (it may hold a password)
    return value


def _one_key_source(model: Any) -> None:
    named = [key for key in KEY_SOURCES if getattr(model, key) is not None]
    if len(named) > 1:
        raise ValueError(f"name one of {', '.join(KEY_SOURCES)}, not {' and '.join(named)}")


class DeploymentConfig(StrictModel):
    """`tiers.NAME.deployments[i]`: one endpoint (a key, a region, a replica) serving the tier,
    with its own limiter, pacing, circuit and connections; each key left out is the tier's own,
    and the provider is the tier's (docs/operations.md "Deployments")."""

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="unique within the tier; results name it (deployment) and metrics label it",
    )
    base_url: str | None = Field(None, description=f"its API base URL; {_TIERS_OWN}")
    api_key_env: str | None = Field(
        None, description=f"name of the environment variable holding its API key; {_TIERS_OWN}"
    )
    api_key_file: str | None = Field(None, min_length=1, description=f"{_KEY_FILE_HELP}; {_TIERS_OWN}")
    api_key_command: list[str] | None = Field(
        None, min_length=1, description=f"{_KEY_COMMAND_HELP}; {_TIERS_OWN}"
    )
    proxy: str | None = Field(
        None, description=f"its HTTP proxy: http://[user:password@]host:port, or none (direct); {_TIERS_OWN}"
    )
    tls: TlsConfig | None = Field(None, description=f"its TLS: CA, client certificate, verify; {_TIERS_OWN}")
    model: str | None = Field(None, min_length=1, description=f"the model id it serves; {_TIERS_OWN}")
    weight: float = Field(
        1.0, gt=0, description="its share of the requests when headroom says nothing more (equal headroom)"
    )
    limiter: LimiterConfig | None = Field(None, description=f"its concurrency limiter; {_TIERS_OWN}")
    quota: str | None = Field(
        None, min_length=1, description=f"the quota (under quotas) its requests count against; {_TIERS_OWN}"
    )

    @field_validator("proxy")
    @classmethod
    def _check_proxy_url(cls, value: str | None) -> str | None:
        return _check_proxy(value)

    @model_validator(mode="after")
    def _check_key_source(self) -> DeploymentConfig:
        _one_key_source(self)
        return self


class TierConfig(StrictModel):
    provider: ProviderName = Field(
        description="the wire format: openai, anthropic, or openai_compat (vLLM, llama.cpp, Ollama /v1, TGI)"
    )
    model: str = Field(min_length=1, description="the provider's model id")
    base_url: str | None = Field(
        None,
        description=(
            "the API's base URL; null: the public API of openai / anthropic (required for openai_compat)"
        ),
    )
    api_key_env: str | None = Field(
        None,
        description=(
            "name of the environment variable holding the API key (never the key); when named it must be set"
        ),
    )
    api_key_file: str | None = Field(None, min_length=1, description=_KEY_FILE_HELP)
    api_key_command: list[str] | None = Field(None, min_length=1, description=_KEY_COMMAND_HELP)
    api_key_command_timeout_s: float = Field(
        10.0, gt=0, description="longest run of api_key_command; past it the run failed (work held)"
    )
    proxy: str | None = Field(None, description=_PROXY_HELP)
    tls: TlsConfig | None = Field(
        None,
        description="TLS of its provider connections: CA bundle, client certificate, verify; null: system's",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="provider options merged under each job's options (e.g. temperature, response_format)",
    )
    timeout_s: float = Field(60.0, gt=0, description="timeout of one provider request")
    batching: BatchingConfig = Field(BatchingConfig(), description="prompt batching (docs/batching.md)")
    limiter: LimiterConfig = Field(LimiterConfig(), description="the tier's concurrency limiter")
    retry: RetryConfig = Field(RetryConfig(), description="retries, quota pauses and the circuit")
    offline: OfflineConfig = Field(
        OfflineConfig(), description="offline jobs through the provider's Batch API"
    )
    prompt_cache: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "auto marks the shared prefix for the provider's prompt cache (Anthropic cache_control, "
            "OpenAI prompt_cache_key); off sends requests unmarked"
        ),
    )
    dedupe: bool = Field(
        False,
        description=(
            "identical deterministic requests (temperature 0 or a seed) share one answer while one is in "
            "flight or answered within dedupe_window_s"
        ),
    )
    dedupe_window_s: float = Field(60.0, ge=0, description="how long an answer is shared after it came")
    pricing: PricingConfig | None = Field(
        None,
        description="USD per million tokens, for the tier's cost in stats and metrics; null: tokens only",
    )
    default_mode: Literal["online", "offline", "auto"] = Field(
        "online", description="the mode of jobs that name none: online, offline or auto (by deadline)"
    )
    fallback: FallbackConfig | None = Field(
        None, description="the tier that answers this tier's jobs while it is down or out of quota"
    )
    quota: str | None = Field(
        None,
        min_length=1,
        description=(
            "the quota (a name under quotas) this tier's requests count against, shared with every tier "
            "and instance that names it; null: none"
        ),
    )

    deployments: list[DeploymentConfig] | None = Field(
        None,
        min_length=1,
        description=(
            "the endpoints serving this tier (keys, regions, replicas), each request sent to the one with "
            "the most headroom; null: the tier's own keys are its one deployment"
        ),
    )

    @field_validator("proxy")
    @classmethod
    def _check_proxy_url(cls, value: str | None) -> str | None:
        return _check_proxy(value)

    @field_validator("options")
    @classmethod
    def _check_response_format(cls, options: dict[str, Any]) -> dict[str, Any]:
        # a bad schema here would make every job of the tier an invalid_job: refuse to start
        try:
            output_format(options)
        except JobError as exc:
            raise ValueError(str(exc)) from None
        return options

    def mode_policy(self) -> ModePolicy:
        """How this tier's jobs choose online or offline (`default_mode`, `mode: auto`)."""
        off = self.offline
        return ModePolicy(self.default_mode, off.enabled, off.completion_window_s, off.auto_margin_s)

    @model_validator(mode="after")
    def _check_provider(self) -> TierConfig:
        if (
            self.base_url is None
            and self.provider == "openai_compat"
            and not self.deployments  # each deployment's own is checked with its dotted key
        ):
            raise ValueError("base_url is required for provider openai_compat")
        if self.offline.enabled and self.provider == "openai_compat":
            raise ValueError("offline.enabled: openai_compat has no Batch API; use online mode")
        if self.default_mode == "offline" and not self.offline.enabled:
            raise ValueError("default_mode offline needs offline.enabled: true")
        _one_key_source(self)
        return self

    def deployment_configs(self, tier_name: str) -> list[tuple[str | None, str, float, TierConfig]]:
        """Each deployment as (name, where: the dotted key's tier part, e.g. `small.deployments.0`
        for `check_tier` and its errors, weight, the tier's config with its own keys over the
        tier's); a tier without `deployments` is its own one deployment, named None."""
        if not self.deployments:
            return [(None, tier_name, 1.0, self)]
        out: list[tuple[str | None, str, float, TierConfig]] = []
        for i, d in enumerate(self.deployments):
            own = {
                key: value
                for key in ("base_url", *KEY_SOURCES, "proxy", "tls", "model", "limiter", "quota")
                if (value := getattr(d, key)) is not None
            }
            if any(key in own for key in KEY_SOURCES):  # its own key replaces the tier's, whichever kind
                own = {**dict.fromkeys(KEY_SOURCES), **own}
            config = self.model_copy(update={**own, "deployments": None})
            out.append((d.name, f"{tier_name}.deployments.{i}", d.weight, config))
        return out

    @property
    def resolved_base_url(self) -> str:
        return (self.base_url or DEFAULT_BASE_URLS[self.provider]).rstrip("/")

    def api_key(self) -> SecretStr | None:
        """The key from the env var this tier names; None when the tier names none."""
        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        return SecretStr(value) if value else None

    def require_api_key(self, tier_name: str) -> SecretStr | None:
        """The key, as `api_key()`; ConfigError (`tiers.NAME.api_key_env`) when the tier names
        an env var that is unset or empty."""
        key = self.api_key()
        if self.api_key_env and key is None:
            raise ConfigError(
                f"tiers.{tier_name}.api_key_env", f"environment variable {self.api_key_env} is not set"
            )
        return key
