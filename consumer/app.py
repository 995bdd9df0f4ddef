"""Composition root: builds every part from Settings and the tier file and wires them. No logic."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import signal
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from consumer.kafka.admin import ensure_topics, max_record_bytes
from consumer.kafka.assignment import Assignment
from consumer.kafka.clients import read_latest
from consumer.kafka.intake import JobIntake, KafkaIntake
from consumer.kafka.publisher import SidePublisher
from consumer.kafka.sink import AtLeastOnceSink, ExactlyOnceSink, OutcomeSink, kafka_producer_factory
from consumer.kafka.topicreader import KafkaTopicReader, TopicReader
from consumer.providers.base import CompletionProvider
from consumer.providers.factory import build_batch_provider, build_provider, check_tier, make_http_client
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.evidence import RememberedEvidence
from consumer.runtime.lag import LagMonitor
from consumer.runtime.metrics import MetricsServer, build_app, register_otel_metrics
from consumer.runtime.offline import BatchTracker, OfflineCollector
from consumer.runtime.outcomes import RecordLimits
from consumer.runtime.pipeline import Pipeline
from consumer.runtime.reachability import check_tier_providers
from consumer.runtime.stats import ServiceStats
from consumer.runtime.tiers import TierRuntime
from consumer.settings import Settings, TierFile
from consumer.telemetry import Telemetry, meter_provider_from_env, service_resource

log = logging.getLogger(__name__)


def instance_id() -> str:
    """Unique per process run: stats snapshots of each run add up to lifetime totals."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ServiceIntake(JobIntake, Protocol):
    """The intake the sinks commit through (`rejoin`: ask the group for a new assignment)."""

    def rejoin(self) -> None: ...


class ServiceEdges(Protocol):
    """The service's edges to Kafka: topics, the jobs intake, producers, the offline tracker's
    reader.

    `KafkaEdges` is the real one; `consumer.testing.memory.MemoryEdges` keeps everything in
    memory (tests run the whole service on it without a broker).
    """

    async def ensure_topics(self, settings: Settings, lane_topics: Sequence[str] = ()) -> dict[str, str]: ...

    async def max_record_bytes(self, settings: Settings, topics: list[str]) -> dict[str, int]: ...

    def intake(
        self, settings: Settings, client_id: str, owned: Assignment, topics: Sequence[str] = ()
    ) -> ServiceIntake:
        """The consumer-group member reading `topics` (the lanes'; none: the jobs topic)."""
        ...

    def producer(self, settings: Settings, client_id: str, transactional_id: str | None) -> Any: ...

    def topic_reader(self, settings: Settings, client_id: str, topic: str, group_id: str) -> TopicReader:
        """`topic` read by one member of `group_id` at a time, from its beginning."""
        ...

    async def read_latest(self, settings: Settings, topic: str) -> dict[bytes, bytes]:
        """The latest value of every key of a compacted topic."""
        ...


class KafkaEdges:
    """The real edges: aiokafka's admin client, consumer and producers."""

    async def ensure_topics(self, settings: Settings, lane_topics: Sequence[str] = ()) -> dict[str, str]:
        return await ensure_topics(settings, lane_topics=lane_topics)

    async def max_record_bytes(self, settings: Settings, topics: list[str]) -> dict[str, int]:
        return await max_record_bytes(settings, topics)

    def intake(
        self, settings: Settings, client_id: str, owned: Assignment, topics: Sequence[str] = ()
    ) -> KafkaIntake:
        return KafkaIntake(settings, client_id=client_id, assignment=owned, topics=topics)

    def producer(self, settings: Settings, client_id: str, transactional_id: str | None) -> Any:
        return kafka_producer_factory(settings, client_id)(transactional_id=transactional_id)

    def topic_reader(self, settings: Settings, client_id: str, topic: str, group_id: str) -> KafkaTopicReader:
        return KafkaTopicReader(settings, topic=topic, group_id=group_id, client_id=client_id)

    async def read_latest(self, settings: Settings, topic: str) -> dict[bytes, bytes]:
        return await read_latest(settings, topic)


@dataclass
class Service:
    """Everything one running promptbus instance owns, for orderly start and stop."""

    settings: Settings
    tier_file: TierFile
    stats: ServiceStats
    pipeline: Pipeline
    sink: OutcomeSink


def validate_config(tier_file: TierFile) -> None:
    """Everything building the service refuses in the tier file, before anything is built:
    ConfigError naming the first bad key (`promptbus run` and `check-config` both ask)."""
    for name, tier in tier_file.tiers.items():
        check_tier(name, tier)


async def build_tiers(
    tier_file: TierFile,
    stats: ServiceStats,
    providers: dict[str, CompletionProvider] | None = None,
    remembered: RememberedEvidence | None = None,
) -> tuple[dict[str, TierRuntime], list[Any]]:
    """One TierRuntime per configured tier; also returns the HTTP clients to close.

    `providers` replaces the HTTP adapters of the tiers it names (tests and benchmarks);
    `remembered`: the batching evidence earlier runs left (see `consumer.runtime.evidence`).
    A tier that cannot be built (ConfigError) closes the clients made so far before it raises.
    """
    tiers: dict[str, TierRuntime] = {}
    clients: list[Any] = []
    try:
        for name, config in tier_file.tiers.items():
            if providers and name in providers:
                tiers[name] = TierRuntime.build(name, config, providers[name], stats.tier(name), remembered)
                continue
            client = make_http_client(config)
            clients.append(client)
            provider = build_provider(name, config, client)
            tiers[name] = TierRuntime.build(name, config, provider, stats.tier(name), remembered)
    except BaseException:
        for client in clients:
            await client.close()
        raise
    return tiers, clients


def build_offline(
    settings: Settings,
    tier_file: TierFile,
    outcomes: OutcomeWriter,
    side_producer: Any,
    make_producer: Any,
    make_reader: Callable[[], TopicReader],
    clients: list[Any],
    limits: RecordLimits,
) -> tuple[OfflineCollector | None, list[Any]]:
    """Collector and tracker for tiers with offline.enabled (none when no tier allows it).

    `make_reader`: the tracker's reader of the batches topic. Returns the collector (where the
    pipeline sends offline jobs) and the parts to start and stop in order; the HTTP clients
    made are added to `clients`.
    """
    offline_tiers = {n: t for n, t in tier_file.tiers.items() if t.offline.enabled}
    if not offline_tiers:
        return None, []
    batch_providers = {}
    for name, config in offline_tiers.items():
        client = make_http_client(config)
        clients.append(client)
        batch_providers[name] = build_batch_provider(name, config, client)
    collector = OfflineCollector(settings, batch_providers, side_producer, outcomes)
    exactly_once = settings.processing_guarantee == "exactly_once"
    tracker_producer = (
        make_producer(transactional_id=f"{settings.group_id}.batch-tracker")
        if exactly_once
        else side_producer
    )
    tracker = BatchTracker(
        settings,
        batch_providers,
        tracker_producer,
        make_reader(),
        poll_s_by_tier={n: t.offline.poll_s for n, t in offline_tiers.items()},
        options_by_tier={n: t.options for n, t in offline_tiers.items()},
        limits=limits,
        transactional=exactly_once,
        stats=outcomes.stats,
        pricing_by_tier={n: t.pricing.pricing() for n, t in offline_tiers.items() if t.pricing is not None},
    )
    parts: list[Any] = [collector, tracker]
    if exactly_once:
        parts.insert(0, _ProducerPart(tracker_producer))
    return collector, parts


@dataclass
class _ProducerPart:
    producer: Any

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()


#: young-generation collections run after this many net allocations of tracked objects
#: (allocations minus deallocations). A job's objects die by reference counting and almost
#: none are left in cycles, so the count grows only with what is alive or cyclic garbage: a
#: collection runs once that many more are, which still bounds the garbage. The threshold is
#: high enough that a steady service does not collect while its in-flight jobs come and go
#: (each collection would walk their objects); bench/README.md has the measurements.
GC_GEN0_THRESHOLD = 100_000


def tune_gc() -> None:
    """Garbage collection settings for a long-running service (idempotent).

    Every job allocates many short-lived objects and almost none of them form cycles, while
    the heap holds a large, static part (libraries, clients). With CPython's defaults the
    collector runs often and each full pass walks that whole static heap, a large share of
    the service's CPU (bench/pipeline_bench.py measures it). Objects alive now move to the
    permanent generation (`gc.freeze`), and the young generation is collected only when
    `GC_GEN0_THRESHOLD` more objects are alive than at the last collection.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


async def run_service(
    settings: Settings,
    tier_file: TierFile,
    *,
    stop: asyncio.Event | None = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    install_signal_handlers: bool = True,
    providers: dict[str, CompletionProvider] | None = None,
    on_started: Callable[[Service], None] | None = None,
    edges: ServiceEdges | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or `stop`), drain, commit, return 0.

    edges: where Kafka is (default `KafkaEdges`: the brokers the settings name).

    Every part is started here and its stop registered at once (one AsyncExitStack), so a
    part that fails to start stops everything started before it, in reverse order.
    """
    stop = stop or asyncio.Event()
    edges = edges if edges is not None else KafkaEdges()
    instance = instance_id()
    stats = ServiceStats(instance=instance, group=settings.group_id)
    async with contextlib.AsyncExitStack() as parts:
        resource = service_resource(instance)  # what every exported signal says it comes from
        if meter_provider is None:  # made here from OTEL_* (an injected one stays its owner's)
            meter_provider = meter_provider_from_env(resource)
            if meter_provider is not None:
                parts.callback(meter_provider.shutdown)  # exports what the last interval counted
        if meter_provider is not None:
            register_otel_metrics(meter_provider, stats)
        telemetry = Telemetry(tracer_provider, meter_provider, group_id=settings.group_id, resource=resource)
        parts.callback(telemetry.shutdown)

        lanes = tier_file.lane_list(settings.jobs_topic, settings.max_inflight)
        lane_topics = [lane.topic for lane in lanes]
        report = await edges.ensure_topics(settings, lane_topics)
        for topic, state in report.items():
            log.info("topic %s: %s", topic, state)
        outputs = [settings.results_topic, settings.dlq_topic]
        record_bytes, latest_evidence = await asyncio.gather(
            edges.max_record_bytes(settings, outputs), edges.read_latest(settings, settings.batching_topic)
        )
        limits = RecordLimits.of_topics(
            record_bytes, results=settings.results_topic, dead_letters=settings.dlq_topic
        )
        remembered = RememberedEvidence.read(latest_evidence, instance=instance)

        clients: list[Any] = []
        parts.push_async_callback(_close_all, clients)
        tiers, tier_clients = await build_tiers(tier_file, stats, providers, remembered)
        clients.extend(tier_clients)
        for tier in tiers.values():
            parts.push_async_callback(tier.provider.aclose)

        client_id = f"promptbus-{instance}"
        # the owned partitions' state, one object for the intake and the sink
        owned = Assignment()
        intake = edges.intake(settings, client_id, owned, lane_topics)

        def make_producer(*, transactional_id: str | None) -> Any:
            return edges.producer(settings, client_id, transactional_id)

        def make_batch_reader() -> TopicReader:
            # its own group: one instance of the service's group tracks at a time
            group_id = f"{settings.group_id}.batches"
            return edges.topic_reader(settings, f"{client_id}-tracker", settings.batches_topic, group_id)

        sink: OutcomeSink
        if settings.processing_guarantee == "exactly_once":
            sink = ExactlyOnceSink(make_producer, settings.group_id, intake.commit, intake.rejoin, owned)
        else:
            sink = AtLeastOnceSink(make_producer(transactional_id=None), intake.commit, owned)
        side_producer = make_producer(transactional_id=None)
        outcomes = OutcomeWriter(settings, sink, stats, telemetry, limits)
        collector, offline_parts = build_offline(
            settings, tier_file, outcomes, side_producer, make_producer, make_batch_reader, clients, limits
        )
        pipeline = Pipeline(
            settings,
            tiers,
            intake,
            sink,
            outcomes,
            stats,
            telemetry,
            offline=collector,
            lanes=lanes,
            rng=random.Random(),
        )
        stats_key = instance.encode()
        publishers = [
            SidePublisher(
                side_producer,
                settings.stats_topic,
                lambda: [(stats_key, stats.snapshot())],
                settings.stats_interval_s,
                what="stats",
            ),
            SidePublisher(
                side_producer,
                settings.batching_topic,
                lambda: remembered.records(tiers),
                settings.stats_interval_s,
                what="batching evidence",
            ),
        ]

        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)

        await sink.start()
        parts.push_async_callback(sink.stop)
        await side_producer.start()
        parts.push_async_callback(side_producer.stop)
        for part in offline_parts:
            await part.start()
            parts.push_async_callback(part.stop)
        for publisher in publishers:
            publisher.start()
            parts.push_async_callback(publisher.stop)
        if settings.metrics_port is not None:
            metrics = MetricsServer(
                build_app(stats, pipeline.ready.is_set), settings.metrics_port, host=settings.metrics_host
            )
            await metrics.start()
            parts.push_async_callback(metrics.stop)
        await intake.start(pipeline)
        parts.push_async_callback(intake.stop)
        lag = LagMonitor(intake, stats)
        lag.start()
        parts.push_async_callback(lag.stop)
        reachability = asyncio.create_task(
            check_tier_providers(
                {n: t.provider for n, t in tiers.items()},
                {n: t.config.resolved_base_url for n, t in tiers.items()},
            )
        )
        parts.push_async_callback(_cancel, reachability)

        tune_gc()  # after start-up: what exists now lives as long as the service
        if on_started is not None:
            on_started(Service(settings, tier_file, stats, pipeline, sink))
        log.info(
            "promptbus %s running: group %s, %s, tiers %s",
            instance,
            settings.group_id,
            settings.processing_guarantee,
            ", ".join(sorted(tiers)),
        )
        await pipeline.run(stop)
    log.info("promptbus %s stopped", instance)
    return 0


async def _close_all(clients: list[Any]) -> None:
    for client in clients:
        await client.close()


async def _cancel(task: asyncio.Task[Any]) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
