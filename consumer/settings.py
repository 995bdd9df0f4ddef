"""Settings: the environment (pydantic-settings, prefix PROMPTBUS_) and the tier file (YAML).

Both are loaded once at startup, frozen, and passed down. A bad value stops startup with a
`ConfigError` naming the dotted key and the reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

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
from consumer.core.fallback import FallbackCause, FallbackRule, chain_problem
from consumer.core.lanes import DEFAULT_LANE_NAME, DEFAULT_MIN_SHARE, Lane
from consumer.core.output import output_format
from consumer.core.routing import ModePolicy, parse_duration_s
from consumer.yaml12 import YAMLError, load_yaml

ProviderName = Literal["openai", "anthropic", "openai_compat"]

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingConfig(_Strict):
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


class LimiterConfig(_Strict):
    """Adaptive concurrency: aimd for providers that send 429s, gradient for local servers."""

    algorithm: Literal["aimd", "gradient", "fixed"] = Field(
        "aimd", description="aimd for providers that send 429s, gradient for local servers, or fixed"
    )
    initial: int = Field(4, ge=1, description="concurrency limit at start")
    min: int = Field(1, ge=1, description="lowest limit")
    max: int = Field(64, ge=1, description="highest limit")

    @model_validator(mode="after")
    def _check_bounds(self) -> LimiterConfig:
        if not self.min <= self.initial <= self.max:
            raise ValueError("must satisfy min <= initial <= max")
        return self


class RetryConfig(_Strict):
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


class OfflineConfig(_Strict):
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


class FallbackConfig(_Strict):
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


class PricingConfig(_Strict):
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


class TierConfig(_Strict):
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
        if self.base_url is None and self.provider == "openai_compat":
            raise ValueError("base_url is required for provider openai_compat")
        if self.offline.enabled and self.provider == "openai_compat":
            raise ValueError("offline.enabled: openai_compat has no Batch API; use online mode")
        if self.default_mode == "offline" and not self.offline.enabled:
            raise ValueError("default_mode offline needs offline.enabled: true")
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


class LaneConfig(_Strict):
    """One lane of the tier file (`consumer.core.lanes`): a job topic and its priority, which
    is its place in the `lanes` mapping (the first is the highest)."""

    topic: str = Field(min_length=1, description="the Kafka topic this lane's jobs are read from")
    min_share: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="the share of each tier's requests this lane keeps while it has work waiting; "
        "unset: 0 for the first lane (it wins every slot no other lane is owed), else "
        "DEFAULT_MIN_SHARE (0.05)",
    )
    max_inflight: int | None = Field(
        None, ge=1, description="records of this lane held before its partitions pause; unset: "
        "PROMPTBUS_MAX_INFLIGHT"
    )
    max_wait_ms: float | None = Field(
        None,
        gt=0,
        description="a collection window holding a job of this lane flushes at most this long "
        "after the job arrived; unset: the tier's batching.max_wait_ms",
    )


class KeyedProblem(ValueError):
    """A tier file problem that names its own dotted key (a check across tiers)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


class TierFile(_Strict):
    tiers: dict[str, TierConfig] = Field(
        min_length=1, description="tier name -> its configuration; a job names its tier"
    )
    lanes: dict[str, LaneConfig] | None = Field(
        None,
        min_length=1,
        description="lane name -> its job topic and share, highest priority first; unset: one lane "
        "on PROMPTBUS_JOBS_TOPIC",
    )

    @model_validator(mode="after")
    def _check_lanes(self) -> TierFile:
        if not self.lanes:
            return self
        topics = [lane.topic for lane in self.lanes.values()]
        for name, lane in self.lanes.items():
            if topics.count(lane.topic) > 1:
                raise ValueError(f"lanes.{name}.topic: {lane.topic} is the topic of another lane too")
        shares = sum(_min_share(lane, rank) for rank, lane in enumerate(self.lanes.values()))
        if shares >= 1.0:
            raise ValueError(
                f"lanes: the min_share of all lanes add up to {shares:g} (lanes below the first "
                f"default to {DEFAULT_MIN_SHARE}); they must add up to less than 1"
            )
        return self

    @model_validator(mode="after")
    def _check_fallbacks(self) -> TierFile:
        rules = {name: t.fallback.rule() if t.fallback else None for name, t in self.tiers.items()}
        problem = chain_problem(rules)
        if problem is not None:
            raise KeyedProblem(f"tiers.{problem[0]}.fallback.tier", problem[1])
        for name, tier in self.tiers.items():
            if tier.fallback is None:
                continue
            other = self.tiers[tier.fallback.tier]
            if tier.default_mode == "offline" and not other.offline.enabled:
                raise KeyedProblem(
                    f"tiers.{name}.fallback.tier",
                    f"tier '{tier.fallback.tier}' cannot take this tier's jobs: they are offline"
                    " (default_mode offline) and it has offline.enabled false",
                )
        return self

    def lane_list(self, jobs_topic: str, max_inflight: int) -> tuple[Lane, ...]:
        """The service's lanes, highest first: those of the tier file, or one lane named
        `default` on `jobs_topic` (PROMPTBUS_JOBS_TOPIC). `max_inflight`: the service's
        PROMPTBUS_MAX_INFLIGHT, the bound of a lane that names none."""
        if not self.lanes:
            return (Lane(DEFAULT_LANE_NAME, jobs_topic, max_inflight=max_inflight),)
        return tuple(
            Lane(
                name,
                lane.topic,
                rank=rank,
                min_share=_min_share(lane, rank),
                max_inflight=lane.max_inflight if lane.max_inflight is not None else max_inflight,
                max_wait_ms=lane.max_wait_ms,
            )
            for rank, (name, lane) in enumerate(self.lanes.items())
        )


def _min_share(lane: LaneConfig, rank: int) -> float:
    if lane.min_share is not None:
        return lane.min_share
    return 0.0 if rank == 0 else DEFAULT_MIN_SHARE


def lane_topic(tier_file: TierFile | None, lane: str | None, jobs_topic: str) -> str:
    """The topic a producer publishes a job of `lane` to (`submit --lane`, the client's
    `lane=`): that lane's topic in the tier file; `jobs_topic` when no lane is named. An
    unknown lane, or a lane named without a tier file that has lanes, is a ConfigError."""
    if lane is None:
        return jobs_topic
    lanes = tier_file.lanes if tier_file is not None else None
    if not lanes:
        raise ConfigError("--lane", f"lane {lane!r} is unknown: the tier file configures no lanes")
    if lane not in lanes:
        raise ConfigError("--lane", f"lane {lane!r} is unknown (lanes: {', '.join(lanes)})")
    return lanes[lane].topic


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def parse_tier_file(data: Any, *, source: str = "tier file") -> TierFile:
    """Validate already-parsed YAML; raise ConfigError naming the first bad key."""
    try:
        return TierFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, KeyedProblem):
            raise ConfigError(cause.key, f"{cause} (in {source})") from None
        raise ConfigError(_dotted(err["loc"]), f"{err['msg']} (in {source})") from None


def load_tier_file(path: str | os.PathLike[str]) -> TierFile:
    """Read and validate a YAML tier file; raise ConfigError naming the bad key. Plain
    scalars are read by the YAML 1.2 core schema (`consumer.yaml12`): `on:` is the key `on`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {p}: {exc.strerror}") from None
    try:
        data = load_yaml(text)
    except YAMLError as exc:
        raise ConfigError("(yaml)", f"{p} is not valid YAML: {exc}") from None
    return parse_tier_file(data, source=str(p))


class KafkaSecurity(BaseModel):
    model_config = ConfigDict(frozen=True)

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="how clients reach the brokers"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism, with a SASL protocol"
    )
    sasl_username: str | None = Field(None, description="SASL user")
    sasl_password: SecretStr | None = Field(None, description="SASL password; held as a secret, never logged")
    ssl_cafile: str | None = Field(None, description="CA file that signs the brokers' certificates")


class Settings(BaseSettings):
    """Environment settings (PROMPTBUS_*, nested with __)."""

    model_config = SettingsConfigDict(
        env_prefix="PROMPTBUS_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    kafka_bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="brokers, host:port[,host:port...]",
        validation_alias=AliasChoices("PROMPTBUS_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
    )
    group_id: str = Field(
        "promptbus",
        description="consumer group; instances with the same id share the jobs topic's partitions",
    )
    jobs_topic: str = Field("promptbus.jobs", description="where jobs are read")
    results_topic: str = Field("promptbus.results", description="where results are written")
    dlq_topic: str = Field("promptbus.dlq", description="where dead letters are written")
    batches_topic: str = Field("promptbus.batches", description="compacted: offline batches being tracked")
    stats_topic: str = Field("promptbus.stats", description="compacted: each instance's stats snapshot")
    batching_topic: str = Field(
        "promptbus.batching",
        description=(
            "compacted: what each tier's adaptive batch size measured; a restarted or new instance starts"
            " from it (a new name: every tier learns afresh)"
        ),
    )
    processing_guarantee: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="at_least_once, or exactly_once (transactions; readers use read_committed)",
    )
    # Input records held (windows, requests, unacked outcomes) before partitions pause. Sized
    # so 64 concurrent requests of 50 items plus open windows fit, and so a fast provider is
    # not held to max_inflight / (produce round trip): at 2,000 the service ran at ~60% of
    # its speed at 10,000 (bench/pipeline_bench.py). A few KB each.
    max_inflight: int = Field(
        10_000,
        ge=1,
        description="input records held (windows, requests, unacknowledged outcomes) before partitions pause",
    )
    max_job_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="a larger job record is dead-lettered invalid_job with its bytes, unread",
    )
    shutdown_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM/SIGINT, how long in-flight requests may finish"
    )
    revoke_timeout_s: float = Field(
        10.0, ge=0, description="on a partition revoke, how long in-flight work may finish"
    )
    transaction_timeout_s: float = Field(
        60.0,
        gt=0,
        description=(
            "exactly_once: the broker aborts a transaction open longer than this and fences its producer"
        ),
    )
    topic_partitions: int = Field(
        12,
        ge=1,
        description="partitions of topics created at start when missing: 12 is shared evenly by 1, 2, 3, "
        "4, 6 or 12 instances (a group has at most as many working members as partitions)",
    )
    topic_replication: int = Field(1, ge=1, description="replication factor of topics created at start")
    metrics_port: int | None = Field(
        None, description="port of /metrics, /healthz and /readyz; unset: not served"
    )
    metrics_host: str = Field("0.0.0.0", description="address the metrics port listens on")
    stats_interval_s: float = Field(
        2.0, gt=0, description="how often an instance publishes its stats snapshot (and batching evidence)"
    )
    config: str | None = Field(None, description="the tier file, instead of --config")
    kafka: KafkaSecurity = Field(
        KafkaSecurity(), description="Kafka client security (nested: PROMPTBUS_KAFKA__...)"
    )


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
