"""The service in-process for tests and benchmarks: unique topics, producing jobs, collecting
outcomes, and the same service on the real broker (`KafkaBus`) or the in-memory edges
(`MemoryBus`). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from consumer.app import run_service
from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import job_producer, read_topic, submit_jobs
from consumer.providers.base import CompletionProvider
from consumer.settings import Settings, parse_tier_file


def service_env(
    bootstrap: str, *, partitions: int = 4, guarantee: str = "at_least_once", **extra: Any
) -> dict[str, str]:
    """PROMPTBUS_* variables for one test: unique topics and group."""
    sfx = uuid.uuid4().hex[:8]
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "PROMPTBUS_GROUP_ID": f"pb-{sfx}",
        "PROMPTBUS_JOBS_TOPIC": f"jobs-{sfx}",
        "PROMPTBUS_RESULTS_TOPIC": f"results-{sfx}",
        "PROMPTBUS_DLQ_TOPIC": f"dlq-{sfx}",
        "PROMPTBUS_BATCHES_TOPIC": f"batches-{sfx}",
        "PROMPTBUS_STATS_TOPIC": f"stats-{sfx}",
        "PROMPTBUS_BATCHING_TOPIC": f"batching-{sfx}",
        "PROMPTBUS_BUDGETS_TOPIC": f"budgets-{sfx}",
        "PROMPTBUS_QUOTAS_TOPIC": f"quotas-{sfx}",
        "PROMPTBUS_HANDOVER_TOPIC": f"handover-{sfx}",
        "PROMPTBUS_ENRICHMENTS_TOPIC": f"enrichments-{sfx}",
        "PROMPTBUS_TOPIC_PARTITIONS": str(partitions),
        "PROMPTBUS_PROCESSING_GUARANTEE": guarantee,
        "PROMPTBUS_STATS_INTERVAL_S": "0.5",
        "PROMPTBUS_SHUTDOWN_TIMEOUT_S": "10",
        "PROMPTBUS_REVOKE_TIMEOUT_S": "5",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def settings_from_env(env: Mapping[str, str]) -> Settings:
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tier_file_dict(
    base_url: str,
    *,
    batching: bool = True,
    max_items: int = 10,
    limiter: str | Mapping[str, Any] = "aimd",
    provider: str = "openai_compat",
    **tier: Any,
) -> dict[str, Any]:
    """A tier file of one tier `small` on `base_url` (batching window 50 ms, at most 500 ms).

    limiter: an algorithm (initial 8, 1..64) or the whole `limiter` section; other keywords
    are the tier's own keys (`timeout_s` 5 and a quick `retry` unless given).
    """
    if isinstance(limiter, str):
        limits = {"algorithm": limiter, "initial": 8, "min": 1, "max": 64}
    else:
        limits = dict(limiter)
    return {
        "tiers": {
            "small": {
                "provider": provider,
                "base_url": base_url,
                "model": "sim-model",
                "timeout_s": tier.pop("timeout_s", 5),
                "batching": {
                    "enabled": batching,
                    "max_items": max_items,
                    "window_ms": 50,
                    "max_wait_ms": 500,
                },
                "limiter": limits,
                "retry": tier.pop(
                    "retry", {"max_attempts": 6, "backoff_initial_s": 0.05, "backoff_max_s": 1}
                ),
                **tier,
            }
        }
    }


async def until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Wait (bounded, polling) until `condition()` holds; whether it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


#: two requests in flight at most: a backlog of a few hundred jobs lasts seconds
SLOW_LIMITER = {"algorithm": "fixed", "initial": 2, "min": 1, "max": 2}


def slow_tier(sim_url: str, **tier: Any) -> dict[str, Any]:
    """The tier on the simulator at `sim_url`, held to 2 concurrent requests of up to 5 items,
    so a backlog lasts across a kill or a broker failover."""
    return tier_file_dict(sim_url + "/v1", max_items=5, limiter=SLOW_LIMITER, **tier)


async def create_topics(settings: Settings) -> None:
    await ensure_topics(settings)


def job(i: int, *, batch: bool, tier: str = "small", text: str | None = None, **extra: Any) -> dict[str, Any]:
    """A classification job whose input is after a data-marker line (the simulator reads it there)."""
    return {
        "id": f"job-{i}",
        "tier": tier,
        "prompt": "Classify the sentiment of the text.\nTEXT:\n${text}",
        "variables": {"text": text if text is not None else f"text number {i}"},
        "batch": batch,
        **extra,
    }


async def produce(
    settings: Settings, jobs: Iterable[dict[str, Any] | bytes], headers: Sequence[tuple[str, bytes]] = ()
) -> int:
    def encode(j: dict[str, Any] | bytes) -> bytes:
        return j if isinstance(j, bytes) else orjson.dumps(j)

    def key_of(value: bytes) -> bytes | None:
        with contextlib.suppress(Exception):
            jid = orjson.loads(value).get("id")
            if isinstance(jid, str):
                return jid.encode()
        return None

    return await submit_jobs(settings, (encode(j) for j in jobs), key_of=key_of, headers=headers)


def mixed_jobs(count: int, *, batch_every: int = 2) -> list[dict[str, Any]]:
    """`count` jobs, every `batch_every`-th one unbatched, the rest batch-eligible."""
    return [job(i, batch=(i % batch_every != 0)) for i in range(count)]


@dataclass
class JobStream:
    """Produce `jobs` as a steady stream: `chunk` jobs every `interval_s`, until the jobs run
    out or `stop` is set. `sent` holds the jobs acknowledged so far (`sent_ms` when), `chunks`
    the chunks sent."""

    settings: Settings
    jobs: list[dict[str, Any]]
    chunk: int
    interval_s: float
    sent: list[dict[str, Any]] = field(default_factory=list)
    #: when each of `sent` was acknowledged (ms since the epoch), in the same order
    sent_ms: list[int] = field(default_factory=list)
    chunks: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        producer = job_producer(self.settings)
        await producer.start()
        try:
            for start in range(0, len(self.jobs), self.chunk):
                if self.stop.is_set():
                    break
                batch = self.jobs[start : start + self.chunk]
                futures = [
                    await producer.send(self.settings.jobs_topic, orjson.dumps(j), key=j["id"].encode())
                    for j in batch
                ]
                await asyncio.gather(*futures)
                self.sent += batch
                self.sent_ms += [int(time.time() * 1000)] * len(batch)
                self.chunks += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.interval_s)
        finally:
            await producer.stop()


@dataclass
class Outcomes:
    """Every result and dead letter read, per job id (duplicates kept to count them)."""

    results: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    dead: dict[Any, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def ids(self) -> set[Any]:
        return set(self.results) | set(self.dead)

    def duplicates(self) -> dict[Any, int]:
        """Outcome records per id, of the ids with more than one (results and dead letters)."""
        counts: dict[Any, int] = defaultdict(int)
        for jid, rs in self.results.items():
            counts[jid] += len(rs)
        for jid, ds in self.dead.items():
            counts[jid] += len(ds)
        return {k: v for k, v in counts.items() if v > 1}

    def duplicate_count(self) -> int:
        """Outcome records beyond the first per id."""
        return sum(n - 1 for n in self.duplicates().values())


async def read_outcomes(settings: Settings) -> Outcomes:
    out = Outcomes()
    async for _, value in read_topic(settings, settings.results_topic, from_beginning=True, follow=False):
        if value is not None:
            r = orjson.loads(value)
            out.results[r["id"]].append(r)
    async for _, value in read_topic(settings, settings.dlq_topic, from_beginning=True, follow=False):
        if value is not None:
            d = orjson.loads(value)
            out.dead[d["id"]].append(d)
    return out


async def wait_for_outcomes(
    settings: Settings, expected: set[Any], *, timeout_s: float, dead_expected: int = 0
) -> Outcomes:
    """Poll the result and dead-letter topics until every expected id has an outcome (bounded)."""
    deadline = time.monotonic() + timeout_s
    outcomes = Outcomes()
    while time.monotonic() < deadline:
        outcomes = await read_outcomes(settings)
        if expected <= outcomes.ids() and sum(len(v) for v in outcomes.dead.values()) >= dead_expected:
            return outcomes
        await asyncio.sleep(0.5)
    return outcomes


class InProcessService:
    """`async with InProcessService(settings, tiers) as svc:` runs `run_service` in this loop.

    edges: where Kafka is (default: the real brokers the settings name; `MemoryEdges` for none).
    """

    def __init__(
        self,
        settings: Settings,
        tier_file: dict[str, Any],
        providers: dict[str, CompletionProvider] | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        edges: Any = None,
    ) -> None:
        self.edges = edges
        self.settings = settings
        self.tier_file = parse_tier_file(tier_file)
        self.providers = providers
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] | None = None
        self.stats: Any = None

    def stats_snapshot(self) -> dict[str, Any]:
        assert self.stats is not None, "the service did not start"
        return dict(self.stats.snapshot())

    async def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """True once no request plan or verification runs (bounded): what the service does
        after a result, such as a verification request, is done by then."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.pipeline.running == 0:
                return True
            await asyncio.sleep(0.02)
        return self.pipeline.running == 0

    def _started(self, service: Any) -> None:
        self.stats = service.stats
        self.pipeline = service.pipeline

    async def __aenter__(self) -> InProcessService:
        """Start the service and wait (bounded) until it has joined the group."""
        self.task = asyncio.create_task(
            run_service(
                self.settings,
                self.tier_file,
                stop=self.stop,
                providers=self.providers,
                tracer_provider=self.tracer_provider,
                meter_provider=self.meter_provider,
                install_signal_handlers=False,
                on_started=self._started,
                edges=self.edges,
            )
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.task.done():
                self.task.result()  # raises what stopped it
                raise RuntimeError("service exited during start")
            if self.stats is not None and self.pipeline.ready.is_set():
                return self
            await asyncio.sleep(0.05)
        await self.__aexit__(None, None, None)
        raise TimeoutError("service did not start within 60 s")

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, timeout=60)


async def produce_raw(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    """Write (key, value) records as they are: what a tool other than promptbus might write."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


class KafkaBus:
    """Service tests on the real broker: unique topics and group per bus."""

    name = "kafka"

    def __init__(self, bootstrap: str, *, partitions: int = 4, **env: Any) -> None:
        from consumer.kafka.edges import KafkaEdges

        #: the PROMPTBUS_* variables of this bus (a `ServiceProcess` started with them shares it)
        self.env = service_env(bootstrap, partitions=partitions, **env)
        self.settings = settings_from_env(self.env)
        #: the service's edges to this bus (the real brokers)
        self.edges = KafkaEdges()

    def service(self, tier_file: dict[str, Any], **kwargs: Any) -> InProcessService:
        return InProcessService(self.settings, tier_file, **kwargs)

    async def produce(
        self,
        jobs: Iterable[dict[str, Any] | bytes],
        *,
        topic: str | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> int:
        """Produce to the jobs topic, or to `topic` (a lane's), with `headers` on each record."""
        settings = self.settings if topic is None else self.settings.model_copy(update={"jobs_topic": topic})
        return await produce(settings, jobs, headers)

    async def outcomes(self) -> Outcomes:
        return await read_outcomes(self.settings)

    async def read(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of every record of `topic` now."""
        return [kv async for kv in read_topic(self.settings, topic, from_beginning=True, follow=False)]

    async def produce_raw(self, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Write (key, value) records as they are: what a tool other than promptbus might write."""
        await produce_raw(self.settings.kafka_bootstrap_servers, topic, records)

    async def committed(self, partition: int) -> int:
        """The group's committed offset of one jobs partition (-1: none yet)."""
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.structs import TopicPartition

        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap_servers)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(self.settings.group_id)
        finally:
            await admin.close()
        meta = offsets.get(TopicPartition(self.settings.jobs_topic, partition))
        return meta.offset if meta is not None else -1

    async def wait_for_outcomes(
        self, expected: set[Any], *, timeout_s: float, dead_expected: int = 0
    ) -> Outcomes:
        return await wait_for_outcomes(
            self.settings, expected, timeout_s=timeout_s, dead_expected=dead_expected
        )


class MemoryBus:
    """The same service tests on the in-memory edges (`consumer.testing.memory`): no broker."""

    name = "memory"

    def __init__(self, *, partitions: int = 4, **env: Any) -> None:
        from consumer.testing.memory import MemoryBroker, memory_edges

        self.broker = MemoryBroker(partitions=partitions)
        self.edges = memory_edges(self.broker)
        self.settings = settings_from_env(service_env("memory:0", partitions=partitions, **env))

    def service(self, tier_file: dict[str, Any], **kwargs: Any) -> InProcessService:
        return InProcessService(self.settings, tier_file, edges=self.edges, **kwargs)

    async def produce(
        self,
        jobs: Iterable[dict[str, Any] | bytes],
        *,
        topic: str | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> int:
        """Append to the jobs topic, or to `topic` (a lane's), with `headers` on each record."""
        n = 0
        for j in jobs:
            value = j if isinstance(j, bytes) else orjson.dumps(j)
            key = None
            with contextlib.suppress(Exception):
                jid = orjson.loads(value).get("id")
                key = jid.encode() if isinstance(jid, str) else None
            self.broker.append(topic or self.settings.jobs_topic, key, value, headers)
            n += 1
        return n

    async def read(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of every record of `topic` now."""
        return [(r.key, r.value) for r in self.broker.records(topic)]

    async def produce_raw(self, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Write (key, value) records as they are: what a tool other than promptbus might write."""
        for key, value in records:
            self.broker.append(topic, key, value)

    async def committed(self, partition: int) -> int:
        """The group's committed offset of one jobs partition (-1: none yet)."""
        from consumer.kafka.records import TopicPartition

        group = self.broker.committed.get(self.settings.group_id, {})
        return group.get(TopicPartition(self.settings.jobs_topic, partition), -1)

    async def outcomes(self) -> Outcomes:
        out = Outcomes()
        for record in self.broker.records(self.settings.results_topic):
            if record.value is not None:
                r = orjson.loads(record.value)
                out.results[r["id"]].append(r)
        for record in self.broker.records(self.settings.dlq_topic):
            if record.value is not None:
                d = orjson.loads(record.value)
                out.dead[d["id"]].append(d)
        return out

    async def wait_for_outcomes(
        self, expected: set[Any], *, timeout_s: float, dead_expected: int = 0
    ) -> Outcomes:
        deadline = time.monotonic() + timeout_s
        outcomes = Outcomes()
        while time.monotonic() < deadline:
            outcomes = await self.outcomes()
            if expected <= outcomes.ids() and sum(len(v) for v in outcomes.dead.values()) >= dead_expected:
                return outcomes
            await asyncio.sleep(0.05)
        return outcomes
