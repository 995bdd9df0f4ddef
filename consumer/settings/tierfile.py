"""The tier file: its top-level sections (`TierFile`), the checks across them, and reading it
from YAML (`load_tier_file`, `parse_tier_file`): a bad file is one ConfigError naming the
dotted key and the reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from consumer.core.errors import ConfigError
from consumer.core.fallback import chain_problem
from consumer.core.lanes import Lane
from consumer.core.tenants import TenantPolicies
from consumer.settings.base import StrictModel
from consumer.settings.lanes import LaneConfig, lane_list, lanes_problem
from consumer.settings.quotas import QuotaConfig
from consumer.settings.sources import SourceConfig, sources_problem
from consumer.settings.tenants import TenantConfig, tenant_policies, tenants_problem
from consumer.settings.tiers import TierConfig
from consumer.yaml12 import YAMLError, load_yaml


class KeyedProblem(ValueError):
    """A tier file problem that names its own dotted key (a check across tiers)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


class TierFile(StrictModel):
    tiers: dict[str, TierConfig] = Field(
        min_length=1, description="tier name -> its configuration; a job names its tier"
    )
    lanes: dict[str, LaneConfig] | None = Field(
        None,
        min_length=1,
        description="lane name -> its job topic and share, highest priority first; unset: one lane "
        "on PROMPTBUS_JOBS_TOPIC",
    )
    tenants: dict[str, TenantConfig] | None = Field(
        None,
        description="tenant name -> its weight, daily budget and on_exhausted; 'default' is the policy of "
        "jobs without a tenant and of tenants not named; unset: every tenant weight 1, no budget",
    )
    quotas: dict[str, QuotaConfig] | None = Field(
        None,
        min_length=1,
        description="quota name -> what one API key and model may spend per minute, shared by every "
        "instance of the group; a tier names one with quota: NAME",
    )
    sources: dict[str, SourceConfig] | None = Field(
        None,
        min_length=1,
        description="source name -> an existing topic read into one tier, each record written back "
        "enriched under its key (docs/sources.md)",
    )

    @model_validator(mode="after")
    def _check_lanes(self) -> TierFile:
        problem = lanes_problem(self.lanes) if self.lanes else None
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_sources(self) -> TierFile:
        if self.sources:
            lane_topics = {name: lane.topic for name, lane in (self.lanes or {}).items()}
            problem = sources_problem(self.sources, self.tiers, lane_topics)
            if problem is not None:
                raise KeyedProblem(*problem)
        return self

    @model_validator(mode="after")
    def _check_tenants(self) -> TierFile:
        problem = tenants_problem(self.tenants) if self.tenants else None
        if problem is not None:
            raise KeyedProblem(*problem)
        return self

    @model_validator(mode="after")
    def _check_quotas(self) -> TierFile:
        known = self.quotas or {}
        where = f"(quotas: {', '.join(sorted(known))})" if known else "(the tier file has no quotas)"
        for name, tier in self.tiers.items():
            named = [(f"tiers.{name}.quota", tier.quota)] + [
                (f"tiers.{name}.deployments.{i}.quota", d.quota) for i, d in enumerate(tier.deployments or ())
            ]
            for key, quota in named:
                if quota is not None and quota not in known:
                    raise KeyedProblem(key, f"unknown quota {quota!r} {where}")
        return self

    @model_validator(mode="after")
    def _check_deployments(self) -> TierFile:
        for name, tier in self.tiers.items():
            seen: set[str] = set()
            for i, d in enumerate(tier.deployments or ()):
                if d.name in seen:
                    raise KeyedProblem(
                        f"tiers.{name}.deployments.{i}.name",
                        f"deployment name {d.name!r} is used twice in the tier",
                    )
                seen.add(d.name)
                if d.base_url is None and tier.base_url is None and tier.provider == "openai_compat":
                    raise KeyedProblem(
                        f"tiers.{name}.deployments.{i}.base_url",
                        "required for provider openai_compat: neither the deployment nor the tier sets one",
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
        """The service's lanes, highest first (`consumer.settings.lanes.lane_list`)."""
        return lane_list(self.lanes, jobs_topic, max_inflight)

    def tenant_policies(self) -> TenantPolicies:
        """The service's tenants (`consumer.settings.tenants.tenant_policies`)."""
        return tenant_policies(self.tenants)

    def unpriced_usd_budget(self) -> list[str]:
        """The tiers without `pricing` while some tenant has a USD budget: their spend counts as
        0 against it (check-config says so)."""
        if not any(p.usd_per_day is not None for p in self.tenant_policies().budgeted):
            return []
        return [name for name, tier in self.tiers.items() if tier.pricing is None]


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
