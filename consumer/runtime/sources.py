"""Sources at run time: an existing topic's records read as jobs, their answers written back as
enriched records under the records' own keys.

A record of a source topic is taken in like a job record (tracked for its commit, counted in
its lane), then:

1. `SourceIntake.take` hands it on at once when its codec can decode it now (JSON, or a registry
   format whose writer schema it has learnt); else it is held, with every later record of its
   partition (their order per key must hold), while its schema is read from the registry in the
   background. A registry that is down holds them, as a provider outage holds jobs: nothing is
   dead-lettered for it, and the lane's in-flight bound pauses the partitions meanwhile.
2. Admission decodes it and maps it (`consumer.core.sources`) into an ordinary job whose context
   carries its `SourceOrigin`; a tombstone or a Debezium delete becomes a tombstone record for the
   key at once; an undecodable record is a dead letter with its key, bytes and headers.
3. Nothing after admission knows the job came from a source until its outcome is written: then
   `SourceRuntime.enriched` makes its record, the original value plus the answer's field, with the
   original key and headers (and promptbus-* ones), to the partition the producer's default
   partitioner gives that key. Per key, order holds: an answer older than the record already
   written for its key is dropped and counted (`KeyOrder`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from consumer.core.errors import ErrorKind, JobError, PromptbusError, RegistryUnavailable
from consumer.core.jobs import Job
from consumer.core.lanes import Lane
from consumer.core.sources import Change, SourceMapping, change_of, enriched_value
from consumer.kafka.intake import InRecord
from consumer.kafka.records import SOURCE_HEADER, OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import Ticket
from consumer.registry.codecs import SourceCodec, WriterKey, to_json
from consumer.runtime.memo import EnrichmentMemo, Recalled
from consumer.runtime.stats import SourceStats
from consumer.settings.sources import SourceConfig

__all__ = ["KeyOrder", "SourceIntake", "SourceOrigin", "SourceRuntime", "stored_origin", "stored_record"]

log = logging.getLogger(__name__)

TIER_HEADER = "promptbus-tier"
ATTEMPTS_HEADER = "promptbus-attempts"
#: the headers promptbus sets on an enriched record (an input's own of these names are replaced)
_OWN_HEADERS = frozenset({SOURCE_HEADER, TIER_HEADER, ATTEMPTS_HEADER, "promptbus-error-kind"})
#: how long held records wait before the registry is asked again, doubling up to the second
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0


class KeyOrder:
    """Per record key, while records of the key are in flight: the newest input offset whose
    enriched record was written. An answer for an older offset than that is stale."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        #: key -> [newest written offset (-1: none yet), records in flight]
        self._keys: dict[bytes, list[int]] = {}

    def admitted(self, key: bytes | None) -> None:
        if key is None:
            return
        entry = self._keys.get(key)
        if entry is None:
            self._keys[key] = [-1, 1]
        else:
            entry[1] += 1

    def write(self, key: bytes | None, offset: int) -> bool:
        """Whether the record for `offset` may be written (False: a newer one was)."""
        if key is None:
            return True
        entry = self._keys.get(key)
        if entry is None:  # a tombstone: nothing of the key in flight
            return True
        if entry[0] > offset:
            return False
        entry[0] = offset
        return True

    def ended(self, key: bytes | None) -> None:
        if key is None:
            return
        entry = self._keys.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._keys[key]


class SourceOrigin(NamedTuple):
    """What a source job's enriched record and dead letter are made of: its source, the input
    record (key, value bytes, headers, where it was read), its decoded value (a Debezium
    event's whole envelope: the enriched record is the original value plus the field) and the
    writer schema it was read with."""

    source: SourceRuntime
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    offset: SourceOffset
    decoded: Mapping[str, Any]
    writer: WriterKey
    #: the digest of what the job read of it (`SourceMapping.fingerprint`)
    read_digest: str
    #: the job it was mapped into (a dead letter carries it)
    job: Job


def stored_origin(origin: SourceOrigin) -> dict[str, Any]:
    """What an offline batch member keeps of its source record, so that whichever instance
    collects the batch writes its enriched record (`SourceRuntime.restored`): the source's name,
    the record's key, value bytes and headers (base64; null for none) and the digest of what the
    job read. Where the record was read is the member's own `source`."""
    return {
        "source": origin.source.name,
        "key": _b64(origin.key),
        "value": _b64(origin.value),
        "headers": [[name, _b64(value)] for name, value in origin.headers],
        "read": origin.read_digest,
    }


def stored_record(
    stored: Mapping[str, Any],
) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]:
    """The key, value and headers `stored_origin` kept of a source record."""
    headers = tuple((str(name), _unb64(value)) for name, value in stored.get("headers") or ())
    return _unb64(stored.get("key")), _unb64(stored.get("value")), headers


def _b64(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode("ascii") if data is not None else None


def _unb64(text: Any) -> bytes | None:
    return base64.b64decode(text) if isinstance(text, str) else None


class SourceRuntime:
    """One configured source: its mapping, codec, lane, counters and key order."""

    def __init__(
        self,
        name: str,
        config: SourceConfig,
        codec: SourceCodec,
        lane: Lane,
        stats: SourceStats,
        memo: EnrichmentMemo | None = None,
    ) -> None:
        """memo: where each key's last enrichment is kept (None: every record is asked)."""
        self.name = name
        self.memo = memo if config.unchanged == "skip" else None
        self.config = config
        self.mapping: SourceMapping = config.mapping(name)
        self.codec = codec
        self.lane = lane
        self.stats = stats
        self.order = KeyOrder()
        self.topic = config.topic
        self.output_topic = config.into.topic
        self._field = config.into.field
        self._tier_header = (TIER_HEADER, config.tier.encode())

    def __repr__(self) -> str:
        return f"SourceRuntime({self.name!r}, {self.topic} -> {self.output_topic})"

    def read(self, raw: bytes | None) -> tuple[Change, Any, WriterKey]:
        """A record's value decoded: the change it carries, what its enriched record is made of
        (the whole value: a Debezium event's envelope; None for a tombstone) and the writer
        schema it was read with. JobError when it cannot be decoded or is no change."""
        value, writer = self.codec.decode(raw) if raw is not None else (None, (0, ()))
        change = change_of(value, self.mapping.envelope)
        return change, value if isinstance(value, Mapping) else change.row, writer

    def restored(self, stored: Mapping[str, Any], offset: SourceOffset, job: Job) -> SourceOrigin:
        """The origin of an offline member from what its batch record kept (`stored_origin`):
        the stored value decoded again with this source's codec (whose writer schema the caller
        has prepared). JobError when it cannot be decoded (any more) or carries no row."""
        key, raw, headers = stored_record(stored)
        change, decoded, writer = self.read(raw)
        if change.row is None:
            raise JobError(ErrorKind.INVALID_JOB, f"source {self.name!r}: the stored record carries no row")
        digest = str(stored.get("read", ""))
        return SourceOrigin(self, key, raw, headers, offset, decoded, writer, digest, job)

    def headers(
        self,
        record_headers: Sequence[tuple[str, bytes | None]],
        offset: SourceOffset,
        *extra: tuple[str, bytes],
    ) -> tuple[tuple[str, bytes], ...]:
        """The input's own headers (without promptbus's names), then `promptbus-source` and `extra`."""
        if not record_headers:
            return ((SOURCE_HEADER, offset.header_value()), *extra)
        own = tuple((k, v if v is not None else b"") for k, v in record_headers if k not in _OWN_HEADERS)
        return (*own, (SOURCE_HEADER, offset.header_value()), *extra)

    def tombstone(self, record: InRecord) -> OutRecord | None:
        """The tombstone of a deleted row's key (None: a newer record of the key was written)."""
        if not self.order.write(record.key, record.source.offset):
            self.stats.stale_dropped += 1
            return None
        self.stats.tombstones += 1
        if self.memo is not None:
            self.memo.forget(self.name, record.key)
        return OutRecord(self.output_topic, record.key, None, self.headers(record.headers, record.source))

    def kept(self, key: bytes | None, read_digest: str) -> Recalled | None:
        """The key's last enrichment when it read what `read_digest` says (`unchanged: skip`):
        an update that changed nothing the prompt reads; None: ask the model."""
        if self.memo is None:
            return None
        recalled = self.memo.recall(self.name, key)
        return recalled if recalled is not None and recalled.read == read_digest else None

    def unchanged(
        self, record: InRecord, decoded: Mapping[str, Any], writer: WriterKey, kept: Recalled
    ) -> OutRecord | None:
        """The enriched record of an unchanged update, with its key's kept answer (None: a newer
        record of the key was written)."""
        if not self.order.write(record.key, record.source.offset):
            self.stats.stale_dropped += 1
            return None
        self.stats.skipped_unchanged += 1
        return self._record(
            record.key, record.headers, record.source, record.value, decoded, writer, kept.answer, 0
        )

    def enriched(
        self,
        origin: SourceOrigin,
        answer: Any,
        *,
        tier: str,
        attempts: int,
        error: Mapping[str, Any] | None = None,
    ) -> OutRecord | None:
        """The enriched record of `origin` with `answer` in its field (`error`: on_error field's
        failure); None when a newer record of its key was written already (dropped, counted).
        JobError OUTPUT_INVALID when the output's schema cannot hold the answer."""
        if not self.order.write(origin.key, origin.offset.offset):
            self.stats.stale_dropped += 1
            return None
        record = self._record(
            origin.key, origin.headers, origin.offset, origin.value, origin.decoded, origin.writer, answer,
            attempts, tier=tier, error=error,
        )
        if error is None:
            self.stats.enriched += 1
            if self.memo is not None:
                self.memo.remember(self.name, origin.key, origin.read_digest, answer)
        return record

    def _record(
        self,
        key: bytes | None,
        record_headers: Sequence[tuple[str, bytes | None]],
        offset: SourceOffset,
        raw: bytes | None,
        decoded: Mapping[str, Any],
        writer: WriterKey,
        answer: Any,
        attempts: int,
        *,
        tier: str | None = None,
        error: Mapping[str, Any] | None = None,
    ) -> OutRecord:
        """The enriched record: the decoded value (read from `raw`) plus the answer, in the
        output's format."""
        row = enriched_value(decoded, self._field, answer, error)
        if self.config.into.format == "same":
            value = self.codec.encode(row, writer, input_value=raw)
        else:
            value = to_json(row)
        own_tier = tier is None or tier == self.config.tier
        tier_header = self._tier_header if own_tier else (TIER_HEADER, (tier or "").encode())
        headers = self.headers(record_headers, offset, tier_header, (ATTEMPTS_HEADER, b"%d" % attempts))
        return OutRecord(self.output_topic, key, value, headers)

    def answer_of(self, output: str | None, embedding: Sequence[float] | None, structured: bool) -> Any:
        """What goes in the field: the embedding, the object a response_format gave, or the text."""
        if embedding is not None:
            return list(embedding)
        if structured and output is not None:
            try:
                return orjson.loads(output)
            except orjson.JSONDecodeError:
                return output
        return output


class _Held(NamedTuple):
    record: InRecord
    ticket: Ticket
    lane: Lane


#: a record ready for admission: the record, its ticket, lane and source
Ready = tuple[InRecord, Ticket, Lane, SourceRuntime]


class SourceIntake:
    """Hands a poll's source records to admission once their codecs can decode them; holds the
    others (and what follows them in their partition) while their schemas are read."""

    def __init__(
        self,
        sources: Sequence[SourceRuntime],
        *,
        rng: random.Random | None = None,
        stop_at: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """stop_at: a bounded range (a backfill): per partition, the first offset past it, whose
        records and later ones are committed without a write (None: no bound)."""
        self.by_topic: dict[str, SourceRuntime] = {s.topic: s for s in sources}
        self._stop_at = stop_at
        self._held: dict[TopicPartition, list[_Held]] = {}
        self._tasks: dict[tuple[str, WriterKey], asyncio.Task[None]] = {}
        self._rng = rng or random.Random()

    @property
    def sources(self) -> list[SourceRuntime]:
        return list(self.by_topic.values())

    def take(self, source: SourceRuntime, record: InRecord, ticket: Ticket, lane: Lane) -> bool:
        """True when `record` may be admitted now; else it is held (its schema is being read,
        or an earlier record of its partition waits)."""
        source.stats.records_in += 1
        tp = record.source.tp
        queue = self._held.get(tp)
        missing = source.codec.missing(record.value)
        if queue is None and missing is None:
            return True
        if missing is not None:
            self._prepare(source, missing)
        self._held.setdefault(tp, []).append(_Held(record, ticket, lane))
        source.stats.held += 1
        return False

    def past_range(self, record: InRecord) -> bool:
        """Whether `record` lies past the bounded range (a backfill's end)."""
        if self._stop_at is None:
            return False
        end = self._stop_at.get(record.source.tp)
        return end is not None and record.source.offset >= end

    def released(self) -> list[Ready]:
        """The held records whose schemas are known now, per partition in offset order (a
        partition's queue stops at its first record still waiting)."""
        out: list[Ready] = []
        for tp in list(self._held):
            queue = self._held[tp]
            source = self.by_topic[tp.topic]
            taken = 0
            for held in queue:
                missing = source.codec.missing(held.record.value)
                if missing is not None:
                    self._prepare(source, missing)
                    break
                out.append((held.record, held.ticket, held.lane, source))
                taken += 1
            source.stats.held -= taken
            if taken == len(queue):
                del self._held[tp]
            elif taken:
                del queue[:taken]
        return out

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        """Catch the memos of the sources whose partitions came up on what was written since."""
        memos = {id(s.memo): s.memo for s in self.by_topic.values() if s.memo is not None
                 and any(tp.topic == s.topic for tp in partitions)}
        for memo in memos.values():
            await memo.catch_up()

    def drop_partitions(self, partitions: set[TopicPartition]) -> None:
        """Forget the held records of revoked partitions (uncommitted: read again by their next owner)."""
        for tp in partitions:
            queue = self._held.pop(tp, None)
            if queue:
                self.by_topic[tp.topic].stats.held -= len(queue)

    def _prepare(self, source: SourceRuntime, writer: WriterKey) -> None:
        key = (source.name, writer)
        if key in self._tasks:
            return
        self._tasks[key] = asyncio.get_running_loop().create_task(self._learn(source, writer))

    async def _learn(self, source: SourceRuntime, writer: WriterKey) -> None:
        """Read one writer schema, retrying while the registry is unreachable."""
        delay_s = RETRY_FIRST_S
        try:
            while True:
                try:
                    await source.codec.prepare(writer)
                    return
                except RegistryUnavailable as exc:
                    log.warning(
                        "source %s: schema id %d: %s; its records wait (retry in %.1f s)",
                        source.name, writer[0], exc, delay_s,
                    )
                except PromptbusError as exc:
                    log.error(
                        "source %s: schema id %d cannot be used: %s; its records wait",
                        source.name, writer[0], exc,
                    )
                await asyncio.sleep(delay_s * self._rng.uniform(0.8, 1.2))
                delay_s = min(delay_s * 2, RETRY_MAX_S)
        finally:
            self._tasks.pop((source.name, writer), None)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
