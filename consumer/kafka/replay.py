"""`promptbus replay --dlq`: publish dead letters' jobs again, each to the topic it was read from.

Each dead letter picked by the filter (`ReplayFilter`: kinds, tier, failed at or after a time)
becomes one job record: the dead letter's parsed `job` as JSON, or, when the job was never
parsed, the original bytes from `raw`. Its key is the job id, its tenant the dead letter's
(`promptbus-tenant`, which a tenant field of the job itself overrides), and the header
`promptbus-replay-of: topic/partition/offset` names the dead letter it came from. A job
that admission would refuse again for its own content (not a job, its template and variables
do not fit: `consumer.core.content`) is skipped as `still_invalid`, with the dead letter's words.

The command keeps its place in a consumer group of its own (`<group>.replay`, partitions
assigned by hand, so no rebalance wait): it reads from the committed positions up to the end
offsets it saw at start, then stops, and commits each round's positions only after that
round's records are acknowledged. So a second run replays only what was dead-lettered since.
The place moves past every dead letter read, replayed or not: one the filter left out is not
replayed by a later run either (a committed position cannot keep holes). To go over them
again, reset the replay group's offsets and run with a filter that picks them: the command's
summary prints both commands (`left_behind_lines`). `--dry-run` produces nothing and commits
nothing.

`plan_replay` decides about one dead letter without I/O; `replay_dead_letters` does the
Kafka part.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from consumer.core.content import check_job
from consumer.core.errors import JobError
from consumer.core.tenants import TENANT_HEADER, tenant_problem
from consumer.kafka.clients import job_producer, topic_partitions
from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.settings import Settings

log = logging.getLogger(__name__)

REPLAY_HEADER = "promptbus-replay-of"
#: dead letters read per round; a round's records are acknowledged before its commit
ROUND_RECORDS = 500
#: a partition that delivers nothing towards its end offset for this long stops the run
IDLE_LIMIT_S = 30.0
FETCH_TIMEOUT_MS = 1000


def replay_group(settings: Settings) -> str:
    """The consumer group that keeps the replay command's place in the dead-letter topic."""
    return f"{settings.group_id}.replay"


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters to replay: all of them unless narrowed."""

    #: error kinds to replay (empty: every kind)
    kinds: frozenset[str] = frozenset()
    #: only jobs of this tier (None: any tier)
    tier: str | None = None
    #: only dead letters that failed at or after this time (None: any time)
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    """One dead letter's job, to be produced to the jobs topic again."""

    kind: str
    job_id: str | None
    #: topic/partition/offset of the dead letter
    dead_letter: str
    record: OutRecord


@dataclass(frozen=True, slots=True)
class Skip:
    """A dead letter that is not replayed, and why (`reason`: kind, tier, older, or a problem)."""

    reason: str
    dead_letter: str
    #: set when the dead letter cannot be replayed at all (not a filter's choice)
    problem: str | None = None
    #: the dead letter's error kind, when a filter left it out (kind, tier, older)
    kind: str | None = None


@dataclass
class ReplayReport:
    """What one run replayed (or, dry run, would replay) and skipped."""

    dry_run: bool
    replayed: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    replays: list[Replay] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: the error kinds of the dead letters a filter left out (behind the replay group's place)
    left_out: Counter[str] = field(default_factory=Counter)
    #: set when the run stopped before the end offsets it saw at start
    incomplete: str | None = None

    def add(self, decision: Replay | Skip) -> None:
        if isinstance(decision, Replay):
            self.replayed[decision.kind] += 1
            self.replays.append(decision)
        else:
            self.skipped[decision.reason] += 1
            if decision.kind is not None:
                self.left_out[decision.kind] += 1
            if decision.problem is not None:
                self.problems.append(f"{decision.dead_letter}: {decision.problem}")

    def summary(self) -> list[str]:
        """Lines for the terminal: counts by kind, then skips by reason."""
        verb = "would replay" if self.dry_run else "replayed"
        total = sum(self.replayed.values())
        by_kind = ", ".join(f"{k}={n}" for k, n in sorted(self.replayed.items()))
        lines = [f"{verb} {total} dead letters" + (f": {by_kind}" if by_kind else "")]
        if self.skipped:
            by_reason = ", ".join(f"{k}={n}" for k, n in sorted(self.skipped.items()))
            lines.append(f"skipped {sum(self.skipped.values())}: {by_reason}")
        return lines


def left_behind_lines(report: ReplayReport, settings: Settings) -> list[str]:
    """What became of the dead letters a filter left out, for the terminal: a real run's place
    is past them for good, so the lines say so and give the two commands that replay them
    anyway (move the replay group's place back to the earliest, run with their kinds). None
    when no filter left any out."""
    n = sum(report.left_out.values())
    if not n:
        return []
    if report.dry_run:
        return [f"a dry run moves nothing; without --dry-run the {n} a filter left out are behind for good"]
    group = replay_group(settings)
    config = "" if settings.kafka.security_protocol == "PLAINTEXT" else " --command-config CLIENT.properties"
    kinds = " ".join(f"--kind {k}" for k in sorted(report.left_out))
    return [
        f"the {n} a filter left out are now behind the replay group's place ({group}) for good: "
        "no later run reads them; to replay them anyway, move its place back to the start and run "
        "again with their kinds (dead letters of those kinds replayed before are replayed again too):",
        f"  kafka-consumer-groups.sh --bootstrap-server {settings.kafka_bootstrap_servers}{config} "
        f"--group {group} --topic {settings.dlq_topic} --reset-offsets --to-earliest --execute",
        f"  promptbus replay --dlq {kinds}",
    ]


def plan_replay(
    value: bytes | None, where: SourceOffset, timestamp_ms: int, flt: ReplayFilter, jobs_topic: str
) -> Replay | Skip:
    """Replay or skip one dead-letter record (`where` it is, its record timestamp). No I/O.

    A replayed job goes to the topic it was read from (its lane's; the dead letter's
    `source.topic`), `jobs_topic` when the dead letter does not say."""
    at = where.header_value().decode()
    dead = _loads(value)
    error = dead.get("error") if dead is not None else None
    kind = error.get("kind") if isinstance(error, dict) else None
    if dead is None or not isinstance(kind, str):
        return Skip("not_a_dead_letter", at, "not a promptbus dead letter")
    if flt.kinds and kind not in flt.kinds:
        return Skip("kind", at, kind=kind)
    if flt.since is not None and _failed_at(dead, timestamp_ms) < flt.since.timestamp():
        return Skip("older", at, kind=kind)
    job = dead.get("job")
    raw: bytes | None = None
    if isinstance(job, dict):
        payload = orjson.dumps(job)
    elif isinstance(dead.get("raw"), str):
        try:
            raw = base64.b64decode(dead["raw"], validate=True)
        except (binascii.Error, ValueError):
            return Skip("no_input", at, "its raw is not base64")
        payload = raw
        job = _loads(raw)  # the tier, when the bytes are a JSON object
    else:
        return Skip("no_input", at, "it holds no copy of the input (left out for size; see its message)")
    if flt.tier is not None and (job is None or job.get("tier") != flt.tier):
        return Skip("tier", at, kind=kind)
    try:
        check_job(payload)  # admission's own-content check: the same words as the dead letter
    except JobError as exc:
        return Skip("still_invalid", at, f"it would be dead-lettered again: {exc.kind.value}: {exc}")
    job_id = dead.get("id")
    if not isinstance(job_id, str) and job is not None and isinstance(job.get("id"), str):
        job_id = job["id"]
    key = job_id.encode() if isinstance(job_id, str) else None
    # back to the topic the job was read from: with lanes, its own lane's
    source = dead.get("source")
    topic = source.get("topic") if isinstance(source, dict) else None
    to_topic = topic if isinstance(topic, str) and topic else jobs_topic
    headers: tuple[tuple[str, bytes], ...] = ((REPLAY_HEADER, at.encode()),)
    tenant = dead.get("tenant")
    if isinstance(tenant, str) and tenant_problem(tenant) is None:
        # the tenant its record's header named, when its job has no tenant field of its own
        headers = (*headers, (TENANT_HEADER, tenant.encode()))
    record = OutRecord(to_topic, key, payload, headers)
    return Replay(kind, job_id if isinstance(job_id, str) else None, at, record)


def _loads(value: bytes | None) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _failed_at(dead: dict[str, Any], timestamp_ms: int) -> float:
    """When the job failed (epoch seconds): its `failed_at`, else the record's timestamp."""
    text = dead.get("failed_at")
    if isinstance(text, str):
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            if when.tzinfo is not None:
                return when.timestamp()
    return timestamp_ms / 1000.0


async def replay_dead_letters(
    settings: Settings, flt: ReplayFilter, *, dry_run: bool = False
) -> ReplayReport:
    """Replay the dead letters past the replay group's place, up to the end offsets seen at start."""
    report = ReplayReport(dry_run=dry_run)
    partitions = await topic_partitions(settings, settings.dlq_topic)
    if not partitions:
        return report
    tps = [TopicPartition(settings.dlq_topic, p) for p in partitions]
    consumer = AIOKafkaConsumer(
        group_id=replay_group(settings),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        **client_kwargs(settings),
    )
    producer = None if dry_run else job_producer(settings)
    await consumer.start()
    try:
        if producer is not None:
            await producer.start()
        consumer.assign(tps)
        end: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        await _read_rounds(consumer, producer, tps, end, flt, settings.jobs_topic, report)
    finally:
        if producer is not None:
            await producer.stop()
        await consumer.stop()
    return report


async def _read_rounds(
    consumer: AIOKafkaConsumer,
    producer: Any,
    tps: list[TopicPartition],
    end: dict[TopicPartition, int],
    flt: ReplayFilter,
    jobs_topic: str,
    report: ReplayReport,
) -> None:
    """Step 1: read a round of dead letters below the end offsets. Step 2: produce their jobs.
    Step 3: wait for every ack. Step 4: commit the round's positions. Until every partition
    is read up to its end offset."""
    committed = {tp: await consumer.position(tp) for tp in tps}  # the group's place (or earliest)
    remaining = {tp for tp in tps if committed[tp] < end[tp]}
    idle_since = time.monotonic()
    while remaining:
        batches = await consumer.getmany(*remaining, timeout_ms=FETCH_TIMEOUT_MS, max_records=ROUND_RECORDS)
        sends = []
        for tp, records in batches.items():
            for r in records:
                if r.offset >= end[tp]:
                    break  # dead-lettered after the run started: the next run's
                decision = plan_replay(r.value, SourceOffset(tp, r.offset), r.timestamp, flt, jobs_topic)
                report.add(decision)
                if isinstance(decision, Replay) and producer is not None:
                    rec = decision.record
                    sends.append(
                        await producer.send(rec.topic, rec.value, key=rec.key, headers=list(rec.headers))
                    )
        if sends:
            await asyncio.gather(*sends)
        # every record below the position was read (and, past the end, left for the next run)
        positions = {tp: min(await consumer.position(tp), end[tp]) for tp in remaining}
        moved = {tp: pos for tp, pos in positions.items() if pos > committed[tp]}
        if moved:
            idle_since = time.monotonic()
            if producer is not None:
                await consumer.commit(moved)
            committed.update(moved)
        remaining = {tp for tp in remaining if committed[tp] < end[tp]}
        if remaining and time.monotonic() - idle_since > IDLE_LIMIT_S:
            stuck = ", ".join(sorted(f"{tp.topic}/{tp.partition}" for tp in remaining))
            report.incomplete = (
                f"no progress for {IDLE_LIMIT_S:.0f} s on {stuck}; "
                "stopped before the end offsets seen at start (run it again)"
            )
            return
