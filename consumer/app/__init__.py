"""Composition root: builds every part of one promptbus instance from Settings and the tier file,
wires them and starts them in order. It decides nothing about jobs: the parts do.

`build_service` makes the parts, each given what it needs in its constructor, and returns them
in start order (`Service.parts`); what it opens that is not started (telemetry, HTTP clients,
providers) it closes through the exit stack it is given. `run_service` is the start sequence:
each part starts and its stop is registered at once (`start_part`), so a part that fails to
start stops everything started before it, in reverse order, and a SIGTERM during the start
ends it too (a start waits for nothing once `stop` is set); then the pipeline runs until
SIGTERM/SIGINT (or `stop`), drains and commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from consumer.app.sources import build_memo, build_sources, enriched_topics, source_topics
from consumer.app.tiers import connection_name, fleet_quotas, open_tiers
from consumer.core.errors import ConfigError
from consumer.core.lanes import Lane
from consumer.core.tenants import TenantPolicies, TenantTopics
from consumer.kafka.assignment import Assignment
from consumer.kafka.board import TopicBoard
from consumer.kafka.edges import KafkaEdges, ServiceEdges, ServiceIntake
from consumer.kafka.handover import TopicHandOverBoard
from consumer.kafka.publisher import SidePublisher
from consumer.kafka.sink import AtLeastOnceSink, ExactlyOnceSink, OutcomeSink
from consumer.kafka.topicreader import TopicReader
from consumer.providers.base import BatchProvider, CompletionProvider
from consumer.providers.factory import build_batch_provider, check_tier, make_http_client
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.budgets import TenantBudgets
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.deployments import Deployment
from consumer.runtime.evidence import RememberedEvidence
from consumer.runtime.heap import tune_gc
from consumer.runtime.lag import LagMonitor
from consumer.runtime.metrics import MetricsServer, build_app, register_otel_metrics
from consumer.runtime.offline import BatchTracker, OfflineCollector, provider_key
from consumer.runtime.outcomes import RecordLimits
from consumer.runtime.pipeline import Pipeline
from consumer.runtime.prober import CircuitProber
from consumer.runtime.quotas import FleetQuota, QuotaSharing
from consumer.runtime.reachability import ReachabilityCheck
from consumer.runtime.sources import SourceIntake
from consumer.runtime.stats import ServiceStats
from consumer.runtime.tenancy import TenantGate
from consumer.runtime.tiers import TierRuntime
from consumer.settings import Settings, TierConfig, TierFile
from consumer.telemetry import Telemetry, meter_provider_from_env, service_resource
from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)


class Part(Protocol):
    """What the service starts in order before its pipeline runs, and stops in reverse."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Service:
    """One promptbus instance, built and not started.

    instance: its id (the stats snapshots of each run add up to lifetime totals); stats: its
    counters; pipeline: the loop `run_service` runs once every part has started; parts: in
    start order (stopped in reverse).
    """

    instance: str
    stats: ServiceStats
    pipeline: Pipeline
    parts: tuple[Part, ...]


def instance_id() -> str:
    """Unique per process run: stats snapshots of each run add up to lifetime totals."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def validate_config(tier_file: TierFile, *, source: str | None = None, jobs_topic: str | None = None) -> None:
    """Everything building the service refuses in the tier file, before anything is built:
    one ConfigError naming every bad key, each with `source` (the file) when given
    (`promptbus run` and `check-config` both ask). `jobs_topic`: PROMPTBUS_JOBS_TOPIC, read
    when there are no lanes (None: bound topics are not checked against what is read)."""
    problems = []
    bound = tier_file.bound_topics_problem(jobs_topic) if jobs_topic is not None else None
    if bound is not None:
        key, reason = bound
        problems.append(ConfigError(key, f"{reason} (in {source})" if source else reason))
    for name, tier in tier_file.tiers.items():
        try:
            check_tier(name, tier)
        except ConfigError as exc:
            problems.append(ConfigError(exc.key, f"{exc.reason} (in {source})") if source else exc)
    if problems:
        raise ConfigError(problems[0].key, problems[0].reason, more=tuple(problems[1:]))


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
    source_range: Mapping[int, int] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or `stop`), drain, commit, return 0.

    edges, providers, tracer_provider, meter_provider: as `build_service`. on_started: called
    with the `Service` once every part runs (tests and benchmarks read its stats and pipeline).
    """
    stop = stop or asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        service = await build_service(
            settings,
            tier_file,
            stack,
            edges=edges,
            providers=providers,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            source_range=source_range,
        )
        if install_signal_handlers:
            stop_on_signals(stop)
        for part in service.parts:
            if not await start_part(stack, part, stop):
                log.info("promptbus %s stopped while starting; it took no job", service.instance)
                return 0
        tune_gc()  # after start-up: what exists now lives as long as the service
        if on_started is not None:
            on_started(service)
        log.info(
            "promptbus %s running: group %s, %s, tiers %s",
            service.instance,
            settings.group_id,
            settings.processing_guarantee,
            ", ".join(sorted(tier_file.tiers)),
        )
        await service.pipeline.run(stop)
    log.info("promptbus %s stopped", service.instance)
    return 0


async def start_part(stack: contextlib.AsyncExitStack, part: Part, stop: asyncio.Event) -> bool:
    """Start `part` and register its stop on `stack` (so it stops when the stack closes, before
    whatever was registered earlier); True once it runs.

    False: `stop` was set first. A start can wait as long as the cluster makes it (a group
    join waits out a rebalance), and a SIGTERM must still end the instance: the start is
    cancelled and the part stopped, which closes what it had opened.
    """
    if stop.is_set():
        return False
    starting = asyncio.ensure_future(part.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        starting.cancel()
        raise
    finally:
        stopping.cancel()
    if not starting.done():
        await cancel_and_wait(starting)
        await part.stop()
        return False
    starting.result()  # its error, if it failed
    stack.push_async_callback(part.stop)
    return True


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stop`: the pipeline drains and the service ends."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def build_service(
    settings: Settings,
    tier_file: TierFile,
    stack: contextlib.AsyncExitStack,
    *,
    edges: ServiceEdges | None = None,
    providers: dict[str, CompletionProvider] | None = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    source_range: Mapping[int, int] | None = None,
) -> Service:
    """Every part of one instance, in start order; what is opened here and not started is
    closed by `stack`.

    source_range: a backfill of the tier file's one source: per partition of its topic, the
    first offset past the range; the lanes' topics are not read (None: the service).

    edges: where Kafka is (default `KafkaEdges`: the brokers the settings name); providers:
    replace the HTTP adapters of the tiers they name (tests, benchmarks); tracer_provider,
    meter_provider: injected telemetry (else from OTEL_* variables).
    """
    edges = edges if edges is not None else KafkaEdges()
    instance = instance_id()
    stats = ServiceStats(instance=instance, group=settings.group_id)
    telemetry = open_telemetry(stack, stats, tracer_provider, meter_provider)
    lanes = tier_file.lane_list(settings.jobs_topic, settings.max_inflight)
    tenant_topics = tier_file.tenant_topics(settings.results_topic, settings.dlq_topic)
    limits, remembered = await prepare_topics(
        settings, edges, lanes, instance, enriched_topics(tier_file), tenant_topics
    )
    quotas = fleet_quotas(tier_file)
    tiers, clients = await open_tiers(stack, tier_file, stats, providers, remembered, quotas)
    read_lanes = source_range is None  # a backfill reads its one source only
    kafka = KafkaClients.build(
        settings, edges, instance, lanes, source_topics(tier_file), read_lanes=read_lanes
    )
    memo = build_memo(settings, edges, tier_file, instance, kafka.side_producer)
    sources = build_sources(settings, tier_file, stats, lanes, stack, memo, source_range)
    policies = tier_file.tenant_policies()
    ledger = TenantLedger(policies, stats)
    outcomes = OutcomeWriter(
        settings, kafka.sink, stats, telemetry, limits, ledger=ledger, tenants=tenant_topics
    )
    budgets = build_budgets(settings, edges, policies, instance, kafka.side_producer)
    gate = TenantGate(ledger, budgets, outcomes) if budgets is not None else None
    collector, offline_parts = build_offline(
        settings, tier_file, outcomes, kafka, clients, limits, edges, gate, sources
    )
    pipeline = Pipeline(
        settings,
        tiers,
        kafka.intake,
        kafka.sink,
        outcomes,
        stats,
        telemetry,
        offline=collector,
        lanes=lanes,
        tenants=policies,
        gate=gate,
        sources=sources,
        handovers=kafka.handovers,
        rng=random.Random(),
    )
    parts: list[Part] = [
        kafka.sink,
        kafka.side_producer,
        # what old owners are finishing is known before any partition is assigned
        *([kafka.handovers] if kafka.handovers is not None else []),
        *quota_sharing(settings, edges, kafka.side_producer, stats, quotas),
        *offline_parts,
        *side_publishers(settings, kafka.side_producer, stats, remembered, tiers),
        # what the group spent today is read before any job is admitted
        *([budgets] if budgets is not None else []),
        # what each source key's last enrichment read and answered, before any record is admitted
        *([memo] if memo is not None else []),
    ]
    if settings.metrics_port is not None:
        app = build_app(stats, pipeline.ready.is_set)
        parts.append(MetricsServer(app, settings.metrics_port, host=settings.metrics_host))
    parts += reading_parts(kafka.intake, pipeline, stats, tiers)
    return Service(instance, stats, pipeline, tuple(parts))


def reading_parts(
    intake: ServiceIntake, pipeline: Pipeline, stats: ServiceStats, tiers: dict[str, TierRuntime]
) -> list[Part]:
    """The parts started last, once everything they feed runs: the intake's reading, the lag
    monitor, the providers' reachability check and the circuits' prober."""
    return [
        _Reading(intake, pipeline),
        LagMonitor(intake, stats),
        ReachabilityCheck(
            {where: d.provider for where, d in _deployments(tiers)},
            {where: d.config.resolved_base_url for where, d in _deployments(tiers)},
        ),
        CircuitProber(tiers, time.monotonic),
    ]


def open_telemetry(
    stack: contextlib.AsyncExitStack, stats: ServiceStats, tracer_provider: Any, meter_provider: Any
) -> Telemetry:
    """Tracing (an injected tracer provider, else OTEL_TRACES_EXPORTER's), and `stats` and the
    GenAI client histograms as OpenTelemetry instruments when metrics are exported; shut down
    when `stack` closes."""
    resource = service_resource(stats.instance)  # what every exported signal says it comes from
    if meter_provider is None:  # made here from OTEL_* (an injected one stays its owner's)
        meter_provider = meter_provider_from_env(resource)
        if meter_provider is not None:
            stack.callback(meter_provider.shutdown)  # exports what the last interval counted
    if meter_provider is not None:
        register_otel_metrics(meter_provider, stats)
    telemetry = Telemetry(tracer_provider, meter_provider, group_id=stats.group, resource=resource)
    stack.callback(telemetry.shutdown)
    return telemetry


async def prepare_topics(
    settings: Settings,
    edges: ServiceEdges,
    lanes: Sequence[Lane],
    instance: str,
    enriched_topics: Sequence[str],
    tenants: TenantTopics,
) -> tuple[RecordLimits, RememberedEvidence]:
    """Create the topics that are missing (the lanes' and the sources' outputs too, not the
    sources' own: they are a company's; the tenants' results and dead-letter topics); read the
    output topics' record size limits and the batching evidence earlier runs left
    (`consumer.runtime.evidence`)."""
    report = await edges.ensure_topics(
        settings, [lane.topic for lane in lanes], enriched_topics, tenants.output_topics
    )
    for topic, state in report.items():
        log.info("topic %s: %s", topic, state)
    if settings.jobs_topic not in {lane.topic for lane in lanes}:
        log.warning(
            "PROMPTBUS_JOBS_TOPIC %r is read by no lane (lanes: %s): jobs published there wait unread",
            settings.jobs_topic,
            ", ".join(lane.name for lane in lanes),
        )
    outputs = [*tenants.output_topics, settings.batches_topic]
    record_bytes, latest_evidence = await asyncio.gather(
        edges.max_record_bytes(settings, outputs), edges.read_latest(settings, settings.batching_topic)
    )
    limits = RecordLimits.of_topics(
        record_bytes,
        results=tenants.own_results_topics,
        dead_letters=tenants.own_dead_letter_topics,
        batches=settings.batches_topic,
    )
    return limits, RememberedEvidence.read(latest_evidence, instance=instance)


def quota_sharing(
    settings: Settings, edges: ServiceEdges, producer: Any, stats: ServiceStats, quotas: dict[str, FleetQuota]
) -> list[Part]:
    """The part that splits the quotas over the group, on its board (the quotas topic); none
    without quotas. It starts before the intake, so an instance knows the group's shares before
    its first request."""
    if not quotas:
        return []
    board = group_board(settings, edges, producer, stats.instance, settings.quotas_topic, "quotas")
    return [QuotaSharing(board, quotas, session_timeout_s=settings.session_timeout_s, stats=stats)]


def group_board(
    settings: Settings, edges: ServiceEdges, producer: Any, instance: str, topic: str, role: str
) -> TopicBoard:
    """The group's board on the compacted `topic` (fleet quotas, tenants' budgets): this
    instance's records written with `producer`, every instance's read by a follower of its own."""
    follower = edges.follower(settings, f"promptbus-{instance}-{role}", topic)
    return TopicBoard(follower, producer, topic=topic, group=settings.group_id, instance=instance)


@dataclass(frozen=True)
class KafkaClients:
    """An instance's Kafka clients, made through its edges.

    intake: the consumer-group member reading the lanes' topics; sink: where outcomes are
    produced and input offsets committed (by the processing guarantee); side_producer: the
    records beside the outcomes (stats, batching evidence, offline batches); make_producer:
    more producers (transactional ones for exactly_once); make_batch_reader: the offline
    tracker's reader of the batches topic.
    """

    intake: ServiceIntake
    sink: OutcomeSink
    side_producer: Any
    make_producer: Callable[..., Any]
    make_batch_reader: Callable[[], TopicReader]
    #: the group's hand-overs of in-flight work at rebalances (at_least_once; None: none)
    handovers: TopicHandOverBoard | None = None

    @classmethod
    def build(
        cls,
        settings: Settings,
        edges: ServiceEdges,
        instance: str,
        lanes: Sequence[Lane],
        source_topics: Sequence[str] = (),
        *,
        read_lanes: bool = True,
    ) -> KafkaClients:
        """read_lanes: the lanes' topics are read with the sources' (False: the sources' only,
        a backfill's)."""
        client_id = f"promptbus-{instance}"
        # the owned partitions' state, one object for the intake and the sink
        owned = Assignment()
        topics = [*(lane.topic for lane in lanes if read_lanes), *source_topics]
        intake = edges.intake(settings, client_id, owned, topics)

        def make_producer(*, transactional_id: str | None) -> Any:
            return edges.producer(settings, client_id, transactional_id)

        def make_batch_reader() -> TopicReader:
            # its own group: one instance of the service's group tracks at a time
            group_id = f"{settings.group_id}.batches"
            return edges.topic_reader(settings, f"{client_id}-tracker", settings.batches_topic, group_id)

        side_producer = make_producer(transactional_id=None)
        sink: OutcomeSink
        handovers = None
        if settings.processing_guarantee == "exactly_once":
            # no hand-over: a moved partition's transactions are fenced (its producer's id is
            # the partition's), so only its new owner can write its outcomes
            sink = ExactlyOnceSink(make_producer, settings.group_id, intake.commit, intake.rejoin, owned)
        else:
            if settings.handover_timeout_s > 0:
                board = group_board(
                    settings, edges, side_producer, instance, settings.handover_topic, "handover"
                )
                handovers = TopicHandOverBoard(board)
            sink = AtLeastOnceSink(
                make_producer(transactional_id=None),
                intake.commit,
                owned,
                handovers=handovers,
                handover_timeout_s=settings.handover_timeout_s,
            )
        return cls(intake, sink, side_producer, make_producer, make_batch_reader, handovers)


def build_offline(
    settings: Settings,
    tier_file: TierFile,
    outcomes: OutcomeWriter,
    kafka: KafkaClients,
    clients: list[Any],
    limits: RecordLimits,
    edges: ServiceEdges,
    gate: TenantGate | None = None,
    sources: SourceIntake | None = None,
) -> tuple[OfflineCollector | None, list[Part]]:
    """Collector and tracker for tiers with offline.enabled (none when no tier allows it).

    Returns the collector (where the pipeline sends offline jobs) and the parts to start and
    stop in order; the HTTP clients made are added to `clients`. With a tier's
    `offline.max_enqueued_tokens` the collector follows the batches topic (what is enqueued).
    `sources`: the tier file's, whose offline jobs the tracker writes back enriched.
    """
    offline_tiers = {n: t for n, t in tier_file.tiers.items() if t.offline.enabled}
    if not offline_tiers:
        return None, []
    batch_providers, deployments = offline_providers(offline_tiers, clients)
    max_enqueued = {
        n: t.offline.max_enqueued_tokens for n, t in offline_tiers.items() if t.offline.max_enqueued_tokens
    }
    followed = (
        edges.follower(settings, f"promptbus-{outcomes.stats.instance}-batches", settings.batches_topic)
        if max_enqueued
        else None
    )
    collector = OfflineCollector(
        settings, batch_providers, kafka.side_producer, outcomes, batches=followed, deployments=deployments,
        gate=gate,
    )
    exactly_once = settings.processing_guarantee == "exactly_once"
    tracker_producer = (
        kafka.make_producer(transactional_id=f"{settings.group_id}.batch-tracker")
        if exactly_once
        else kafka.side_producer
    )
    tracker = BatchTracker(
        settings,
        batch_providers,
        tracker_producer,
        kafka.make_batch_reader(),
        poll_s_by_tier={n: t.offline.poll_s for n, t in offline_tiers.items()},
        options_by_tier={n: t.options for n, t in offline_tiers.items()},
        limits=limits,
        transactional=exactly_once,
        stats=outcomes.stats,
        pricing_by_tier={n: t.pricing.pricing() for n, t in offline_tiers.items() if t.pricing is not None},
        max_enqueued_tokens_by_tier=max_enqueued,
        ledger=outcomes.ledger,
        sources={s.name: s for s in sources.sources} if sources is not None else None,
        tenants=outcomes.tenants,
    )
    # exactly_once: the tracker's own transactional producer starts first and stops last
    return collector, [tracker_producer, collector, tracker] if exactly_once else [collector, tracker]


def offline_providers(
    offline_tiers: dict[str, TierConfig], clients: list[Any]
) -> tuple[dict[str, BatchProvider], dict[str, list[tuple[str, str]]]]:
    """The Batch API adapters of the offline tiers, by `provider_key`: each deployment's, and
    each tier's own (a tier with `deployments` too, when its own key is set: batches recorded
    before it had deployments are read back there); and per tier with deployments, each
    one's name and model. The HTTP clients made are added to `clients`."""
    providers: dict[str, BatchProvider] = {}
    deployments: dict[str, list[tuple[str, str]]] = {}
    for name, config in offline_tiers.items():
        places = [(None, name, config)] + [
            (dep, where, dep_config)
            for dep, where, _weight, dep_config in config.deployment_configs(name)
            if dep is not None
        ]
        for dep, where, dep_config in places:
            if dep is None and config.deployments and config.api_key_env and config.api_key() is None:
                continue  # the tier's own key is unset: only its deployments' are used
            client = make_http_client(dep_config, where, name=connection_name(name, dep))
            clients.append(client)
            providers[provider_key(name, dep)] = build_batch_provider(where, dep_config, client)
        if config.deployments:
            deployments[name] = [(d.name, d.model or config.model) for d in config.deployments]
    return providers, deployments


def build_budgets(
    settings: Settings, edges: ServiceEdges, policies: TenantPolicies, instance: str, producer: Any
) -> TenantBudgets | None:
    """The tenants' daily budgets, shared by the group's instances over the budgets topic (None
    when no tenant has a budget)."""
    if not policies.budgeted:
        return None
    board = group_board(settings, edges, producer, instance, settings.budgets_topic, "budgets")
    return TenantBudgets(policies, instance, board, publish_interval_s=settings.stats_interval_s)


def side_publishers(
    settings: Settings,
    producer: Any,
    stats: ServiceStats,
    remembered: RememberedEvidence,
    tiers: dict[str, TierRuntime],
) -> list[SidePublisher]:
    """What an instance publishes to compacted topics every stats interval and at stop: its
    stats snapshot (key: its instance id) and what its tiers' batch sizes learnt."""
    stats_key = stats.instance.encode()
    return [
        SidePublisher(
            producer,
            settings.stats_topic,
            lambda: [(stats_key, stats.snapshot())],
            settings.stats_interval_s,
            what="stats",
        ),
        SidePublisher(
            producer,
            settings.batching_topic,
            lambda: remembered.records(tiers),
            settings.stats_interval_s,
            what="batching evidence",
        ),
    ]


@dataclass(frozen=True)
class _Reading:
    """The intake as a part: once started it reads for the pipeline (its rebalance handler)."""

    intake: ServiceIntake
    pipeline: Pipeline

    async def start(self) -> None:
        await self.intake.start(self.pipeline)

    async def stop(self) -> None:
        await self.intake.stop()


def _deployments(tiers: dict[str, TierRuntime]) -> list[tuple[str, Deployment]]:
    """Every deployment of every tier, named as logs say it (`TIER` or `TIER/DEPLOYMENT`)."""
    return [
        (name if d.name is None else f"{name}/{d.name}", d)
        for name, t in tiers.items()
        for d in t.deployments
    ]
