"""Settings: the environment (pydantic-settings, prefix PROMPTBUS_) and the tier file (YAML).

Both are loaded once at startup, frozen, and passed down. A bad value stops startup with a
`ConfigError` naming the dotted key and the reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from consumer.core.cost import Pricing
from consumer.core.errors import ConfigError, JobError
from consumer.core.output import output_format

ProviderName = Literal["openai", "anthropic", "openai_compat"]

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingConfig(_Strict):
    """Prompt batching for a tier (DESIGN.md "Prompt batching rules")."""

    enabled: bool = False
    max_items: int = Field(20, ge=1, le=1000)
    max_input_chars: int = Field(32000, ge=1)
    window_ms: int = Field(100, ge=0)
    max_wait_ms: int = Field(2000, ge=0)
    #: cap of a batched request's max_tokens (the model's output limit); the members' own
    #: max_tokens add up to the batched request's budget, plus JSON overhead
    max_output_tokens: int | None = Field(None, ge=1)
    #: how the batched answer's shape is enforced: auto uses what the provider supports
    structured: Literal["auto", "json_schema", "json_object", "tool", "off"] = "auto"
    #: sizes up to this are trusted without measurement (<= max_items); None: max_items when
    #: verify_fraction is 0 (only the answers' shape can be checked), else 1 (measure first)
    initial_items: int | None = Field(None, ge=1)
    #: share of batched jobs also asked alone, to measure agreement (> 0: sizes above
    #: initial_items must prove their agreement before they are used)
    verify_fraction: float = Field(0.0, ge=0.0, le=1.0)
    #: the share of valid answers and of agreeing answers a batch size must show
    min_agreement: float = Field(0.8, ge=0.0, le=1.0)
    #: one-sided confidence of the Wilson lower bound that proves a batch size
    agreement_confidence: float = Field(0.9, ge=0.5, lt=1.0)
    #: share of jobs sent at a batch size not in use yet, to measure it (0: never)
    probe_fraction: float = Field(0.1, ge=0.0, le=1.0)
    #: what the provider charges for, besides requests under a learnt request budget:
    #: auto = tokens for openai and anthropic, nothing for openai_compat (a local server);
    #: batching that is slower than single requests is kept only where it saves a charge
    charges: Literal["auto", "tokens", "nothing"] = "auto"

    @model_validator(mode="after")
    def _check_waits(self) -> BatchingConfig:
        if self.max_wait_ms < self.window_ms:
            raise ValueError("max_wait_ms must be >= window_ms")
        if self.initial_items is not None and self.initial_items > self.max_items:
            raise ValueError("initial_items must be <= max_items")
        return self


class LimiterConfig(_Strict):
    """Adaptive concurrency: aimd for providers that send 429s, gradient for local servers."""

    algorithm: Literal["aimd", "gradient", "fixed"] = "aimd"
    initial: int = Field(4, ge=1)
    min: int = Field(1, ge=1)
    max: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _check_bounds(self) -> LimiterConfig:
        if not self.min <= self.initial <= self.max:
            raise ValueError("must satisfy min <= initial <= max")
        return self


class RetryConfig(_Strict):
    max_attempts: int = Field(5, ge=1)
    backoff_initial_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)
    #: quota exhausted: pause the tier this long, then try again ...
    quota_cooldown_s: float = Field(60.0, ge=0)
    #: ... until this much pausing in a row has passed; then its jobs fail (quota_exhausted)
    quota_max_wait_s: float = Field(600.0, ge=0)
    #: a provider outage lasting this long dead-letters the jobs it holds (retries_exhausted);
    #: None: held jobs wait for the provider as long as it takes (their deadlines still apply)
    max_outage_s: float | None = Field(None, gt=0)
    #: this many outage errors in a row (connection, timeout, 5xx, overloaded) open the circuit
    circuit_failures: int = Field(5, ge=1)
    #: while open, one probe request after this long, the wait doubling up to circuit_probe_max_s
    circuit_probe_s: float = Field(1.0, gt=0)
    circuit_probe_max_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _probe_waits_in_order(self) -> RetryConfig:
        if self.circuit_probe_max_s < self.circuit_probe_s:
            raise ValueError("circuit_probe_max_s must be at least circuit_probe_s")
        return self


class OfflineConfig(_Strict):
    enabled: bool = False
    poll_s: float = Field(60.0, gt=0)
    completion_window: str = "24h"
    #: offline jobs collected this long (or up to max_items) before one Batch API submission
    collect_s: float = Field(5.0, ge=0)
    max_items: int = Field(10000, ge=1)


class PricingConfig(_Strict):
    """A tier's prices, USD per million tokens (`consumer.core.cost`): what stats and
    `/metrics` show as the tier's cost."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    #: tokens read from the provider's prompt cache; unset: billed at input_per_mtok
    cached_input_per_mtok: float | None = Field(None, ge=0)
    #: tokens written to the prompt cache (Anthropic); unset: billed at input_per_mtok
    cache_write_per_mtok: float | None = Field(None, ge=0)
    #: the Batch API's discount on offline jobs (0.5: half price)
    batch_discount: float = Field(0.0, ge=0, lt=1)

    def pricing(self) -> Pricing:
        """The core's value object of these prices."""
        return Pricing(
            input_per_mtok=self.input_per_mtok,
            output_per_mtok=self.output_per_mtok,
            cached_input_per_mtok=self.cached_input_per_mtok,
            cache_write_per_mtok=self.cache_write_per_mtok,
            batch_discount=self.batch_discount,
        )


class TierConfig(_Strict):
    provider: ProviderName
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(60.0, gt=0)
    batching: BatchingConfig = BatchingConfig()
    limiter: LimiterConfig = LimiterConfig()
    retry: RetryConfig = RetryConfig()
    offline: OfflineConfig = OfflineConfig()
    #: provider prompt caching of the shared prefix: auto marks it (Anthropic cache_control,
    #: OpenAI prompt_cache_key) where the provider caches; off sends requests unmarked
    prompt_cache: Literal["auto", "off"] = "auto"
    #: identical deterministic requests (temperature 0 or a seed) share one answer while one
    #: is in flight or answered within dedupe_window_s
    dedupe: bool = False
    dedupe_window_s: float = Field(60.0, ge=0)
    #: prices for the tier's cost in stats and metrics; none: tokens only
    pricing: PricingConfig | None = None

    @field_validator("options")
    @classmethod
    def _check_response_format(cls, options: dict[str, Any]) -> dict[str, Any]:
        # a bad schema here would make every job of the tier an invalid_job: refuse to start
        try:
            output_format(options)
        except JobError as exc:
            raise ValueError(str(exc)) from None
        return options

    @model_validator(mode="after")
    def _check_provider(self) -> TierConfig:
        if self.base_url is None and self.provider == "openai_compat":
            raise ValueError("base_url is required for provider openai_compat")
        if self.offline.enabled and self.provider == "openai_compat":
            raise ValueError("offline.enabled: openai_compat has no Batch API; use online mode")
        return self

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


class TierFile(_Strict):
    tiers: dict[str, TierConfig] = Field(min_length=1)


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def parse_tier_file(data: Any, *, source: str = "tier file") -> TierFile:
    """Validate already-parsed YAML; raise ConfigError naming the first bad key."""
    try:
        return TierFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(_dotted(err["loc"]), f"{err['msg']} (in {source})") from None


def load_tier_file(path: str | os.PathLike[str]) -> TierFile:
    """Read and validate a YAML tier file; raise ConfigError naming the bad key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {p}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("(yaml)", f"{p} is not valid YAML: {exc}") from None
    return parse_tier_file(data, source=str(p))


class KafkaSecurity(BaseModel):
    model_config = ConfigDict(frozen=True)

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None


class Settings(BaseSettings):
    """Environment settings (PROMPTBUS_*, nested with __)."""

    model_config = SettingsConfigDict(
        env_prefix="PROMPTBUS_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    kafka_bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        validation_alias=AliasChoices("PROMPTBUS_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
    )
    group_id: str = "promptbus"
    jobs_topic: str = "promptbus.jobs"
    results_topic: str = "promptbus.results"
    dlq_topic: str = "promptbus.dlq"
    batches_topic: str = "promptbus.batches"
    stats_topic: str = "promptbus.stats"
    #: what each tier's adaptive batch size measured (compacted): a restarted or new instance
    #: starts from it
    batching_topic: str = "promptbus.batching"
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    #: Input records held (windows, requests, unacked outcomes) before partitions pause. Sized
    #: so 64 concurrent requests of 50 items plus open windows fit, and so a fast provider is
    #: not held to max_inflight / (produce round trip): at 2,000 the service ran at ~60% of
    #: its speed at 10,000 (bench/pipeline_bench.py). A few KB each.
    max_inflight: int = Field(10_000, ge=1)
    #: a job record larger than this is dead-lettered (invalid_job) with its bytes, unread
    max_job_bytes: int = Field(1024 * 1024, ge=1)
    shutdown_timeout_s: float = Field(30.0, ge=0)
    revoke_timeout_s: float = Field(10.0, ge=0)
    #: exactly_once: the broker aborts a transaction open longer than this and fences its
    #: producer (the partition is then assigned afresh). Transactions close every 0.2 s.
    transaction_timeout_s: float = Field(60.0, gt=0)
    #: partitions of the topics promptbus creates: 12 is shared evenly by 1, 2, 3, 4, 6 or 12
    #: replicas (a group has at most as many working members as partitions)
    topic_partitions: int = Field(12, ge=1)
    topic_replication: int = Field(1, ge=1)
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    stats_interval_s: float = Field(2.0, gt=0)
    config: str | None = None
    kafka: KafkaSecurity = KafkaSecurity()


def _env_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable behind a Settings error location (nested with __)."""
    return "PROMPTBUS_" + "__".join(str(part).upper() for part in loc)


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment; raise ConfigError naming the variable and the reason
    (never its value: it may be a password)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        raise ConfigError(_env_name(err["loc"]), str(err["msg"])) from None
