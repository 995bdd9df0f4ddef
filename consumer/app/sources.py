"""The sources' part of the composition root: each source's codec (one registry client for all),
lane, counters and memo, and the topics the sources read and write."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from consumer.core.errors import ConfigError
from consumer.core.lanes import Lane
from consumer.kafka.edges import ServiceEdges
from consumer.kafka.records import TopicPartition
from consumer.registry.client import RegistryClient
from consumer.registry.codecs import SourceCodec
from consumer.runtime.memo import EnrichmentMemo
from consumer.runtime.sources import SourceIntake, SourceRuntime
from consumer.runtime.stats import ServiceStats
from consumer.settings import Settings, TierFile

__all__ = ["build_memo", "build_sources", "enriched_topics", "source_topics"]


def source_topics(tier_file: TierFile) -> list[str]:
    """The topics the sources read (a company's: never created here)."""
    return [source.topic for source in (tier_file.sources or {}).values()]


def enriched_topics(tier_file: TierFile) -> list[str]:
    """The topics the sources write their enriched records to."""
    return [source.into.topic for source in (tier_file.sources or {}).values()]


def build_memo(
    settings: Settings, edges: ServiceEdges, tier_file: TierFile, instance: str, producer: Any
) -> EnrichmentMemo | None:
    """The memo of the sources' last enrichments (None: no source skips unchanged updates)."""
    if not any(source.unchanged == "skip" for source in (tier_file.sources or {}).values()):
        return None
    # read at start and caught up when partitions are assigned (`consumer.runtime.memo`)
    topic = settings.enrichments_topic
    follower = edges.follower(settings, f"promptbus-{instance}-memo", topic, follow=False)
    return EnrichmentMemo(follower, producer, topic)


def build_sources(
    settings: Settings,
    tier_file: TierFile,
    stats: ServiceStats,
    lanes: Sequence[Lane],
    stack: contextlib.AsyncExitStack,
    memo: EnrichmentMemo | None = None,
    source_range: Mapping[int, int] | None = None,
) -> SourceIntake | None:
    """The tier file's sources (None: it has none): each with its codec (through the Schema
    Registry the settings name, one client for all, closed with `stack`) and its lane (the one
    it names, else the lowest)."""
    if not tier_file.sources:
        return None
    jobs_topics = {lane.topic for lane in lanes}
    by_name = {lane.name: lane for lane in lanes}
    registry: RegistryClient | None = None
    runtimes = []
    for name, config in tier_file.sources.items():
        if config.topic in jobs_topics:
            raise ConfigError(f"sources.{name}.topic", f"{config.topic} is a job topic this service reads")
        if config.format != "json" and registry is None:
            url = settings.schema_registry.url
            if url is None:
                raise ConfigError(
                    f"sources.{name}.format",
                    f"{config.format} needs a Schema Registry: set PROMPTBUS_SCHEMA_REGISTRY__URL",
                )
            registry = RegistryClient.from_settings(settings.schema_registry)
            stack.push_async_callback(registry.aclose)
        codec = SourceCodec(
            config.format,
            registry,
            out_topic=config.into.topic,
            out_format=config.into.format,
            fields=config.output_fields(),
            schemas=config.output_schemas(),
        )
        lane = by_name[config.lane] if config.lane is not None else lanes[-1]
        runtimes.append(SourceRuntime(name, config, codec, lane, stats.source(name), memo))
    stop_at = None
    if source_range is not None:
        (only,) = runtimes  # a backfill runs one source
        stop_at = {TopicPartition(only.topic, p): end for p, end in source_range.items()}
    intake = SourceIntake(runtimes, stop_at=stop_at)
    stack.push_async_callback(intake.aclose)
    return intake


