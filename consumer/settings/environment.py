"""The environment settings (pydantic-settings, prefix PROMPTBUS_, nested with __): Kafka,
topics, the delivery guarantee, bounds and ports. Loaded once at startup, frozen."""

from __future__ import annotations

import os
from collections.abc import Mapping
from difflib import get_close_matches
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from consumer.core.errors import ConfigError


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


class SchemaRegistry(BaseModel):
    """A Confluent-compatible Schema Registry (sources in avro, protobuf or json_schema)."""

    model_config = ConfigDict(frozen=True)

    url: str | None = Field(
        None,
        description="the registry's API root (Confluent's, or Apicurio's /apis/ccompat/v7); unset: none",
    )
    username: str | None = Field(None, description="basic-auth user")
    password: SecretStr | None = Field(None, description="basic-auth password; a secret, never logged")
    timeout_s: float = Field(10.0, gt=0, description="one registry request's bound")


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
    budgets_topic: str = Field(
        "promptbus.budgets",
        description=(
            "compacted: each instance's claims on the tenants' daily budgets today, read at start so "
            "the group's spend survives restarts (only used when a tenant has a budget)"
        ),
    )
    quotas_topic: str = Field(
        "promptbus.quotas",
        description="compacted: each instance's demand on the tier file's quotas, from which the group "
        "splits them",
    )
    handover_topic: str = Field(
        "promptbus.handover",
        description=(
            "compacted: the work a partition's old owner hands to its new one at a rebalance (the"
            " offsets it still has in flight, then which of them it finished)"
        ),
    )
    processing_guarantee: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="at_least_once, or exactly_once (transactions; readers use read_committed)",
    )
    # Input records held (windows, requests, unacked outcomes) before partitions pause. Sized
    # so 64 concurrent requests of 50 items plus open windows fit, and well above what one
    # produce round trip acknowledges: the service cannot run faster than max_inflight /
    # (produce round trip). Each held record costs memory (bench/README.md has both figures).
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
        10.0,
        ge=0,
        description=(
            "on a rebalance, how long the commit of finished work may wait (in-flight work is not waited for)"
        ),
    )
    # A hand-over's deadline: the old owner's requests in flight at a rebalance normally end
    # within an answer time; this bounds how long their partition's new owner waits for them
    # when the old owner died before finishing (then it does them itself).
    handover_timeout_s: float = Field(
        60.0,
        ge=0,
        description=(
            "at_least_once, on a rebalance or a stop: how long a moved partition's new owner waits"
            " for its old owner to finish the requests it had in flight before doing them itself"
            " (0: no hand-over, the new owner does them at once)"
        ),
    )
    # Static membership (KIP-345): a member that comes back under the same name within the
    # session is given its partitions again without a rebalance (a StatefulSet pod's name).
    instance_id: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        pattern=r"^[A-Za-z0-9._-]+$",
        description=(
            "static group membership: this instance's stable name in the consumer group (one per"
            " instance, e.g. a StatefulSet pod's name); a restart under the same name within"
            " PROMPTBUS_SESSION_TIMEOUT_S is no rebalance. Unset: dynamic membership"
        ),
    )
    # The broker accepts only sessions within its group.min/max.session.timeout.ms (6 s to
    # 30 min by default). Heartbeats go every third of it (at most 1 s apart), so one lost
    # heartbeat is survived.
    session_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description=(
            "consumer-group session: an instance that stops heartbeating (crashed, frozen) keeps its"
            " partitions (and its share of a fleet quota) this long before the group gives them to the"
            " others; within the broker's group.min.session.timeout.ms and group.max.session.timeout.ms"
        ),
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
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto", description="the service's event loop: auto (uvloop where installed), uvloop, or asyncio"
    )
    kafka: KafkaSecurity = Field(
        KafkaSecurity(), description="Kafka client security (nested: PROMPTBUS_KAFKA__...)"
    )
    schema_registry: SchemaRegistry = Field(
        SchemaRegistry(),
        description="the Schema Registry of sources (nested: PROMPTBUS_SCHEMA_REGISTRY__...)",
    )
    enrichments_topic: str = Field(
        "promptbus.enrichments",
        description="compacted: per source and record key, what its last enrichment read and answered",
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


#: PROMPTBUS_ variables read outside Settings: the CLI's own (`run --log-level`) and the
#: local model's (consumer.localmodel)
OTHER_VARIABLES = ("PROMPTBUS_LOG_LEVEL", "PROMPTBUS_LOCAL_STATE_DIR", "PROMPTBUS_LOCAL_MODEL_WHEEL")


def setting_variables() -> list[str]:
    """Every PROMPTBUS_ environment variable promptbus reads: each setting's (a nested group's
    fields joined with __) and OTHER_VARIABLES."""
    names = []
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names += [str(choice) for choice in alias.choices if str(choice).startswith("PROMPTBUS_")]
            continue
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            names += [f"PROMPTBUS_{name.upper()}__{inner.upper()}" for inner in nested.model_fields]
        else:
            names.append(f"PROMPTBUS_{name.upper()}")
    return names + list(OTHER_VARIABLES)


def unknown_variables(environ: Mapping[str, str] = os.environ) -> list[str]:
    """A line per PROMPTBUS_ variable in `environ` that is no setting (pydantic-settings
    ignores it: a misspelt one would silently keep the default), with the nearest name."""
    known = setting_variables()
    lines = []
    for name in sorted(environ):
        if not name.startswith("PROMPTBUS_") or name in known:
            continue
        prefix = len("PROMPTBUS_")
        near = get_close_matches(name[prefix:], [k[prefix:] for k in known], n=1, cutoff=0.7)
        hint = f"; did you mean PROMPTBUS_{near[0]}?" if near else " (docs/configuration.md lists them)"
        lines.append(f"{name} is not a promptbus setting and is ignored{hint}")
    return lines
