"""Topic administration: create promptbus's topics at start when they are missing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.settings import Settings

log = logging.getLogger(__name__)

#: Kafka error code for "topic already exists" (another instance created it first)
TOPIC_ALREADY_EXISTS = 36


#: a compacted topic rewritten several times a second (a group's board) rolls its segments
#: this often, so compaction keeps what a starting instance reads to a few minutes of records
BOARD_SEGMENT_MS = 10 * 60 * 1000
#: the budgets topic keeps records this long (compacted too): a record of a day that ended
#: counts nothing, and every process run writes under its own key
BUDGETS_RETENTION_MS = 3 * 24 * 3600 * 1000
#: a hand-over matters until its deadline (a minute); a day's records are more than enough
HANDOVER_RETENTION_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic promptbus creates; segment_ms: how often its segments roll (None: the broker's
    default)."""

    name: str
    partitions: int
    replication: int
    compacted: bool = False
    segment_ms: int | None = None
    #: records older than this are deleted as well (None: kept while compaction keeps them)
    retention_ms: int | None = None

    def configs(self) -> dict[str, str]:
        cfg = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        if self.compacted:
            cfg["cleanup.policy"] = "compact" if self.retention_ms is None else "compact,delete"
        if self.retention_ms is not None:
            cfg["retention.ms"] = str(self.retention_ms)
        if self.segment_ms is not None:
            cfg["segment.ms"] = str(self.segment_ms)
        return cfg


def topic_specs(
    settings: Settings,
    lane_topics: Sequence[str] = (),
    enriched_topics: Sequence[str] = (),
    output_topics: Sequence[str] = (),
) -> list[TopicSpec]:
    """Every topic promptbus reads or writes; `lane_topics`: the lanes' job topics, made like
    the jobs topic and instead of it (with lanes, the jobs topic is read only as a lane's);
    `enriched_topics`: the sources' outputs, compacted (the latest enrichment of each key; a
    deleted row's tombstone forgets it); `output_topics`: the tenants' own results and
    dead-letter topics, made like the service's. batches, stats, batching, quotas, budgets and handover are
    compacted (latest per key); quotas and budgets, groups' boards, are one partition so every
    instance reads their records in the order they were written."""
    p, r = settings.topic_partitions, settings.topic_replication
    jobs = list(dict.fromkeys(lane_topics or [settings.jobs_topic]))
    outputs = dict.fromkeys((settings.results_topic, settings.dlq_topic, *output_topics))
    return [
        *(TopicSpec(topic, p, r) for topic in jobs),
        *(TopicSpec(topic, p, r) for topic in outputs if topic not in jobs),
        TopicSpec(settings.batches_topic, 1, r, compacted=True),
        TopicSpec(settings.stats_topic, 1, r, compacted=True),
        TopicSpec(settings.batching_topic, 1, r, compacted=True),
        TopicSpec(settings.quotas_topic, 1, r, compacted=True, segment_ms=BOARD_SEGMENT_MS),
        TopicSpec(settings.budgets_topic, 1, r, compacted=True, retention_ms=BUDGETS_RETENTION_MS),
        TopicSpec(settings.handover_topic, 1, r, compacted=True, retention_ms=HANDOVER_RETENTION_MS),
        *(TopicSpec(topic, p, r, compacted=True) for topic in dict.fromkeys(enriched_topics)),
        # what each source key's last enrichment read and answered (`consumer.runtime.memo`):
        # every instance reads all of it, so one partition spreads nothing it could share
        *([TopicSpec(settings.enrichments_topic, 1, r, compacted=True)] if enriched_topics else []),
    ]


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[str], timeout_s: float = 15.0) -> None:
    """New topics answer produce requests only once every partition has a leader."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        described = await admin.describe_topics(topics)
        if all(
            not t.get("error_code") and t.get("partitions") and all(p["leader"] >= 0 for p in t["partitions"])
            for t in described
        ):
            return
        await asyncio.sleep(0.1)
    log.warning("topics %s still have partitions without a leader after %.0f s", topics, timeout_s)


T = TypeVar("T")

#: an admin request meeting a retriable broker error (a broker down, a leader moving) is sent
#: again, to whichever broker the client picks next, for at most this long
ADMIN_RETRY_S = 30.0


async def with_admin(
    settings: Settings, use: Callable[[AIOKafkaAdminClient], Awaitable[T]], *, retry_s: float = ADMIN_RETRY_S
) -> T:
    """`use(admin)` on a started admin client, closed after it.

    The admin client sends metadata requests to any broker it knows: while one of a cluster's
    brokers is down (a restart, a crash) a request may go to it and fail, though the others
    answer. A retriable KafkaError therefore tries `use` again after a short pause, until
    `retry_s` has passed; any other error, and a bootstrap that fails, raise at once.
    """
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        deadline_s = time.monotonic() + retry_s
        pause_s = 0.2
        while True:
            try:
                return await use(admin)
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() + pause_s > deadline_s:
                    raise
                log.info("an admin request met %s; sending it again in %.1f s", type(exc).__name__, pause_s)
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 2.0)
    finally:
        await admin.close()


async def ensure_topics(
    settings: Settings,
    specs: list[TopicSpec] | None = None,
    *,
    lane_topics: Sequence[str] = (),
    enriched_topics: Sequence[str] = (),
    output_topics: Sequence[str] = (),
) -> dict[str, str]:
    """Create missing topics (`topic_specs` unless `specs` are given); return
    {topic: "created" | "exists"} for the startup report."""
    specs = specs if specs is not None else topic_specs(settings, lane_topics, enriched_topics, output_topics)
    return await with_admin(settings, lambda admin: _ensure(admin, specs))


async def _ensure(admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> dict[str, str]:
    """Create the `specs` topics that do not exist yet (the work of `ensure_topics`)."""
    existing = set(await admin.list_topics())
    report = {s.name: "exists" for s in specs if s.name in existing}
    missing = [s for s in specs if s.name not in existing]
    if missing:
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication, topic_configs=s.configs()) for s in missing]
        )
        for name, code, *rest in response.topic_errors:
            if code == 0:
                report[name] = "created"
            elif code == TOPIC_ALREADY_EXISTS:
                report[name] = "exists"
            else:
                message = rest[0] if rest else ""
                raise RuntimeError(f"cannot create topic {name}: error {code} {message}")
        await _wait_for_leaders(admin, [s.name for s in missing])
    return report


async def max_record_bytes(settings: Settings, topics: list[str]) -> dict[str, int]:
    """The largest record batch each topic takes: its `max.message.bytes` (the broker's
    default unless the topic overrides it), at most what the producer sends
    (MAX_MESSAGE_BYTES). A topic whose config cannot be read gets MAX_MESSAGE_BYTES."""
    limits = dict.fromkeys(topics, MAX_MESSAGE_BYTES)
    resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]
    try:
        responses = await with_admin(settings, lambda admin: admin.describe_configs(resources))
    except Exception as exc:  # a broker that refuses DescribeConfigs (ACLs): keep the producer's limit
        log.warning("cannot read the topics' max.message.bytes (%s); assuming %d", exc, MAX_MESSAGE_BYTES)
        return limits
    for response in responses:
        for error_code, _message, _type, name, entries, *_ in response.resources:
            if error_code or name not in limits:
                continue
            for entry in entries:
                if entry[0] == "max.message.bytes" and str(entry[1]).isdigit():
                    limits[name] = min(int(entry[1]), MAX_MESSAGE_BYTES)
    return limits
