"""The tier file: its top-level sections (`TierFile`), the checks across them, and reading it
from YAML (`load_tier_file`, `parse_tier_file`): a bad file is one ConfigError naming the
dotted key and the reason."""

from __future__ import annotations

import os
from difflib import get_close_matches
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from consumer.core.errors import ConfigError
from consumer.core.fallback import chain_problem
from consumer.core.lanes import Lane
from consumer.core.tenants import TenantPolicies, TenantTopics
from consumer.settings.base import StrictModel
from consumer.settings.environment import Settings
from consumer.settings.lanes import LaneConfig, lane_list, lanes_problem
from consumer.settings.quotas import QuotaConfig
from consumer.settings.sources import SourceConfig, sources_problem
from consumer.settings.tenants import TenantConfig, tenant_policies, tenant_topics, tenants_problem
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

    def tenant_topics(self, results_topic: str, dead_letter_topic: str) -> TenantTopics:
        """The tenants' bound topics and outputs (`consumer.settings.tenants.tenant_topics`)."""
        return tenant_topics(self.tenants, results_topic, dead_letter_topic)

    def bound_topics_problem(self, jobs_topic: str) -> tuple[str, str] | None:
        """(dotted key, reason) of a bound topic nothing reads (no lane, no source, and not
        `jobs_topic` when there are no lanes), or of a source whose fixed tenant is not the one
        its topic is bound to; None when nothing is wrong."""
        read = [lane.topic for lane in self.lanes.values()] if self.lanes else [jobs_topic]
        sources = self.sources or {}
        read += [source.topic for source in sources.values()]
        owners = {}
        for name, tenant in (self.tenants or {}).items():
            for i, topic in enumerate(tenant.topics or ()):
                owners[topic] = name
                if topic not in read:
                    return (
                        f"tenants.{name}.topics.{i}",
                        f"topic {topic!r} is read by no lane or source (read: {', '.join(read)})",
                    )
        for name, source in sources.items():
            owner = owners.get(source.topic)
            if owner is not None and isinstance(source.tenant, str) and source.tenant != owner:
                return (
                    f"sources.{name}.tenant",
                    f"its topic {source.topic!r} is bound to tenant {owner!r}, not {source.tenant!r}: "
                    "every job would be a dead letter tenant_mismatch",
                )
        return None

    def unpriced_usd_budget(self) -> list[str]:
        """The tiers without `pricing` while some tenant has a USD budget: their spend counts as
        0 against it (check-config says so)."""
        if not any(p.usd_per_day is not None for p in self.tenant_policies().budgeted):
            return []
        return [name for name, tier in self.tiers.items() if tier.pricing is None]


def lane_topic(tier_file: TierFile | None, lane: str | None, jobs_topic: str) -> str:
    """The topic a producer publishes a job of `lane` to (`submit --lane`, the client's
    `lane=`): that lane's topic in the tier file. A job that names no lane goes to
    `jobs_topic` unless the tier file has lanes and none reads it: then to the lowest-priority
    lane's topic (the last), where the service reads it and it jumps ahead of no one. An
    unknown lane, or a lane named without a tier file that has lanes, is a ConfigError."""
    lanes = tier_file.lanes if tier_file is not None else None
    if lane is None:
        return unlaned_topic(lanes, jobs_topic)
    if not lanes:
        raise ConfigError("--lane", f"lane {lane!r} is unknown: the tier file configures no lanes")
    if lane not in lanes:
        raise ConfigError("--lane", f"lane {lane!r} is unknown (lanes: {', '.join(lanes)})")
    return lanes[lane].topic


def tenant_settings(settings: Settings, tier_file: TierFile | None, tenant: str | None) -> Settings:
    """The settings of a client of `tenant` (`results --tenant`, `replay --tenant`, the
    client's `tenant=`): its results and dead-letter topics, and its first bound job topic as
    the jobs topic; `settings` as they are without a tenant or a tier file."""
    if tenant is None or tier_file is None:
        return settings
    tenants = tier_file.tenant_topics(settings.results_topic, settings.dlq_topic)
    config = (tier_file.tenants or {}).get(tenant)
    jobs_topic = config.topics[0] if config is not None and config.topics else settings.jobs_topic
    return settings.model_copy(
        update={
            "results_topic": tenants.results_of(tenant),
            "dlq_topic": tenants.dead_letters_of(tenant),
            "jobs_topic": jobs_topic,
        }
    )


def unlaned_topic(lanes: dict[str, LaneConfig] | None, jobs_topic: str) -> str:
    """Where a job that names no lane goes: `jobs_topic` when a lane reads it (or there are no
    lanes), else the lowest-priority lane's topic."""
    if not lanes or any(config.topic == jobs_topic for config in lanes.values()):
        return jobs_topic
    return list(lanes.values())[-1].topic


def unread_jobs_topic_note(tier_file: TierFile, jobs_topic: str) -> str | None:
    """What `run` and `check-config` say when the tier file's lanes leave PROMPTBUS_JOBS_TOPIC
    unread (None: a lane reads it, or there are no lanes)."""
    lanes = tier_file.lanes
    if unlaned_topic(lanes, jobs_topic) == jobs_topic or not lanes:
        return None
    last = list(lanes)[-1]
    return (
        f"PROMPTBUS_JOBS_TOPIC {jobs_topic!r} is read by no lane (lanes: {', '.join(lanes)}): jobs "
        f"published there wait unread; promptbus's client and CLI send a job without a lane to "
        f"lane {last!r} ({lanes[last].topic})"
    )


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


#: problems of one file said at once: enough for a few typos, not a wall of text
MAX_REPORTED_PROBLEMS = 5


def parse_tier_file(data: Any, *, source: str = "tier file") -> TierFile:
    """Validate already-parsed YAML; raise ConfigError naming every bad key (up to
    MAX_REPORTED_PROBLEMS, an unknown key first: it is often the cause of a missing one)."""
    try:
        return TierFile.model_validate(data)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda err: err["type"] != "extra_forbidden")
        problems = [_problem(err, source) for err in errors[:MAX_REPORTED_PROBLEMS]]
        if len(errors) > MAX_REPORTED_PROBLEMS:
            left = len(errors) - MAX_REPORTED_PROBLEMS
            problems.append(ConfigError("(and more)", f"{left} more problem(s) not shown (in {source})"))
        raise ConfigError(problems[0].key, problems[0].reason, more=tuple(problems[1:])) from None


def _problem(err: Any, source: str) -> ConfigError:
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, KeyedProblem):
        return ConfigError(cause.key, f"{cause} (in {source})")
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        near = get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return ConfigError(_dotted(loc), f"unknown key, not permitted here{hint} (in {source})")
    return ConfigError(_dotted(loc), f"{err['msg']} (in {source})")


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the tier file's schema allows in the mapping at `loc` (an unknown key's
    siblings, for its nearest spelling)."""
    schema = _tier_file_schema()
    node: Any = schema
    for part in loc:
        node = _resolved(node, schema)
        properties = node.get("properties", {})
        if part in properties:
            node = properties[part]
        elif isinstance(part, int) and isinstance(node.get("items"), dict):
            node = node["items"]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return []
    return list(_resolved(node, schema).get("properties", {}))


def _resolved(node: Any, schema: dict[str, Any]) -> Any:
    """`node` with its $ref followed and a nullable union reduced to the mapping it allows."""
    while True:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node:
            mappings = [n for n in node["anyOf"] if n.get("type") != "null"]
            if not mappings:
                return node
            node = mappings[0]
        else:
            return node


@cache
def _tier_file_schema() -> dict[str, Any]:
    return TierFile.model_json_schema()


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
        raise yaml_problem(p, exc) from None
    return parse_tier_file(data, source=str(p))


def yaml_problem(path: str | os.PathLike[str], exc: YAMLError) -> ConfigError:
    """A file that is not YAML, said on one line: the file, the line and column, the reason."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    reason = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
    return ConfigError(where, reason)
