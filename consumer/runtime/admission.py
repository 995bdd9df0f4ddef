"""Admission: an input record becomes a JobContext, or a Rejection that says why not.

Nothing here performs I/O: the caller delivers a rejection to the dead-letter topic (with the
record's original bytes) and routes an admitted job. Every rejection of a record read from a
bound topic is its tenant's (its dead letter goes to that tenant's dead-letter topic), whatever
the record says. The checks, in order:

    1. the record is at most `max_job_bytes`;
    2. it decodes as a Job (UTF-8 JSON of the job schema: `invalid_job`);
    3. its tenant (its `tenant` field, else its `promptbus-tenant` header, else `default`) is a
       tenant name (`invalid_job`; `consumer.core.tenants`), and the one its topic allows: a
       bound topic's job is its tenant's, a claim of another tenant there or of a bound tenant
       elsewhere is `tenant_mismatch` (`TenantTopics.claim`);
    4. its tier is configured (`unknown_tier`);
    5. `mode: offline` only where the tier enables it and offline processing runs (`invalid_job`);
       `auto` (or no mode, by the tier's `default_mode`) is decided here (`core/routing.py`);
    6. its own content can be asked: its template renders, its response_format can be
       checked (`template_error` / `invalid_job`; `consumer.core.content`, which the CLI
       checks too); an Anthropic tier's chat job has a message besides system ones
       (`invalid_job`); an embed job's tier has an embeddings endpoint (`invalid_job`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from consumer.core.content import MergedOptions, job_content, merged_options
from consumer.core.embed import embed_limits, no_embeddings
from consumer.core.errors import ErrorKind, JobError
from consumer.core.jobs import Job, decode_job
from consumer.core.lanes import Lane
from consumer.core.tenants import TENANT_HEADER, TenantTopics, tenant_problem
from consumer.kafka.intake import InRecord
from consumer.kafka.records import OutRecord
from consumer.kafka.sink import Ticket
from consumer.runtime.context import JobContext
from consumer.runtime.outcomes import job_id_hint
from consumer.runtime.sources import SourceOrigin, SourceRuntime
from consumer.runtime.tiers import TierRuntime

#: distinct (tier, options) merges kept for reuse: producers send a few option sets over and over
MERGED_OPTIONS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record cannot become a job: dead-lettered with `raw`, the record's own bytes;
    `tenant`: whose it is, when that could be read."""

    kind: ErrorKind
    message: str
    raw: bytes
    job: Job | None = None
    job_id: str | None = None
    tenant: str | None = None
    #: the record's key (its dead letter keeps it); a source record's headers and its source
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    source: SourceRuntime | None = None


class Admission:
    """Turns records into job contexts for the configured tiers.

    start_trace: starts a job's tracing span from the job and its record.
    offline_runs: offline processing is wired (some tier enables it).
    tenants: the bound topics (None: none, every job's tenant is what it claims).
    """

    def __init__(
        self,
        tiers: Mapping[str, TierRuntime],
        *,
        max_job_bytes: int,
        offline_runs: bool,
        start_trace: Callable[[Job, InRecord], Any],
        tenants: TenantTopics | None = None,
    ) -> None:
        self._tiers = tiers
        self._tenants = tenants if tenants is not None else TenantTopics("", "")
        self._max_job_bytes = max_job_bytes
        self._offline_runs = offline_runs
        self._start_trace = start_trace
        self._known = ", ".join(sorted(tiers))
        #: (tier, canonical job options) -> the merge: jobs of equal options share one dict
        self._merged: dict[tuple[str, str], MergedOptions] = {}
        #: the clock reading of the current poll and the wall clock then (see `_wall_at`)
        self._wall_now_s = float("nan")
        self._wall_s = 0.0

    def admit(
        self, record: InRecord, ticket: Ticket, now_s: float, lane: Lane | None = None
    ) -> JobContext | Rejection:
        """The job context of `record` (read in `lane`), or the reason it is rejected.

        One pass per record: the checks in the module's order, then the context built from
        the job's fields directly."""
        raw = record.value if record.value is not None else b""
        owner = self._tenants.owner(record.source.tp.topic)
        if len(raw) > self._max_job_bytes:
            message = f"job is {len(raw)} bytes, over max_job_bytes ({self._max_job_bytes})"
            return Rejection(
                ErrorKind.INVALID_JOB, message, raw, job_id=key_text(record.key), tenant=owner, key=record.key
            )
        try:
            job = decode_job(raw)
        except JobError as exc:
            tenant = owner if owner is not None else self._readable_claim(record)
            return Rejection(exc.kind, str(exc), raw, job_id=job_id_hint(raw), tenant=tenant, key=record.key)
        admitted = self._admit_job(job, raw, record, ticket, now_s, lane)
        if isinstance(admitted, Rejection):
            return dataclasses.replace(admitted, key=record.key)
        return admitted

    def admit_source(
        self, source: SourceRuntime, record: InRecord, ticket: Ticket, now_s: float, lane: Lane
    ) -> JobContext | Rejection | OutRecord | None:
        """A source record's job context (its `origin` set), or the reason it is rejected (a
        dead letter with its key, bytes and headers), or the tombstone record of a deleted row
        (None: a newer record of its key was written already)."""
        raw = record.value
        offset = record.source
        try:
            change, decoded, writer = source.read(raw)
            if change.row is None:
                return source.tombstone(record)
            mapping = source.mapping
            read = mapping.read_fields(change.row)
            digest = mapping.fingerprint(read)
            kept = source.kept(record.key, digest)
            if kept is not None:
                return source.unchanged(record, decoded, writer, kept)
            ref = offset.header_value().decode()
            job_id = mapping.job_id(change.row, key_text(record.key), ref)
            deadline = None
            if mapping.deadline_s is not None:
                deadline = datetime.fromtimestamp(self._wall_at(now_s) + mapping.deadline_s, UTC)
            job = mapping.job_of(change.row, read, job_id, deadline=deadline)
        except JobError as exc:
            return Rejection(
                exc.kind,
                str(exc),
                raw or b"",
                job_id=key_text(record.key),
                tenant=self._tenants.owner(record.source.tp.topic),
                key=record.key,
                headers=source.headers(record.headers, offset),
                source=source,
            )
        # its context's `raw` stays empty: its dead letter carries the record's own bytes, and
        # `parsed_job` the job from its origin
        admitted = self._admit_job(job, b"", record, ticket, now_s, lane)
        if isinstance(admitted, Rejection):
            return dataclasses.replace(
                admitted,
                raw=raw or b"",
                key=record.key,
                headers=source.headers(record.headers, offset),
                source=source,
            )
        admitted.origin = SourceOrigin(
            source, record.key, raw, record.headers, offset, decoded, writer, digest, job
        )
        source.order.admitted(record.key)
        return admitted

    def _admit_job(
        self, job: Job, raw: bytes, record: InRecord, ticket: Ticket, now_s: float, lane: Lane | None
    ) -> JobContext | Rejection:
        """The checks after decoding (tenant, tier, mode, content), then the context."""
        topic = record.source.tp.topic
        claimed = job.tenant
        if claimed is None:
            claimed = header_tenant(record.headers)
            if claimed is not None and (problem := tenant_problem(claimed)) is not None:
                message = f"header '{TENANT_HEADER}': {problem}"
                owner = self._tenants.owner(topic)
                return Rejection(ErrorKind.INVALID_JOB, message, raw, job=job, tenant=owner)
        tenant, mismatch = self._tenants.claim(topic, claimed)
        if mismatch is not None:
            return Rejection(ErrorKind.TENANT_MISMATCH, mismatch, raw, job=job, tenant=tenant)
        tier = self._tiers.get(job.tier)
        if tier is None:
            message = f"tier '{job.tier}' is not configured (known: {self._known})"
            return Rejection(ErrorKind.UNKNOWN_TIER, message, raw, job=job, tenant=tenant)
        config = tier.config
        mode = job.mode
        if mode == "offline" and not (self._offline_runs and config.offline.enabled):
            message = f"tier '{tier.name}' does not allow mode 'offline' (offline.enabled is false)"
            return Rejection(ErrorKind.INVALID_JOB, message, raw, job=job, tenant=tenant)
        try:
            options_key, merged = self._merge(job, tier)
            content = job_content(job, merged=merged)
            self._check_for_provider(job, tier)
        except JobError as exc:
            return Rejection(exc.kind, str(exc), raw, job=job, tenant=tenant)
        deadline_s = None
        if job.deadline is not None:
            deadline_s = now_s + job.deadline.timestamp() - self._wall_at(now_s)
        return JobContext(
            job,
            raw,
            ticket,
            tier,
            now_s,
            content.text,
            content.own_messages,
            content.batchable,
            content.options,
            options_key,
            deadline_s,
            content.output_format,
            self._start_trace(job, record),
            tier.modes.mode_for(mode, None if deadline_s is None else deadline_s - now_s),
            lane,
            record.timestamp_ms / 1000.0,
            tenant,
            record.key,
        )

    def _readable_claim(self, record: InRecord) -> str | None:
        """The tenant an undecodable record's header names, when it is a tenant name that is
        not bound (a bound tenant's dead letters hold only its own topics' records)."""
        header = header_tenant(record.headers)
        if header is None or tenant_problem(header) is not None:
            return None
        return None if self._tenants.claim(record.source.tp.topic, header)[1] is not None else header

    @staticmethod
    def _check_for_provider(job: Job, tier: TierRuntime) -> None:
        """JobError when the tier's provider cannot take what the job asks: embeddings from a
        provider without an embeddings endpoint, an Anthropic call without a non-system message."""
        provider = tier.config.provider
        if job.kind == "embed" and embed_limits(provider) is None:
            raise JobError(ErrorKind.INVALID_JOB, no_embeddings(tier.name, provider))
        if provider == "anthropic" and job.messages is not None:
            if all(m.role == "system" for m in job.messages):
                # Anthropic takes system text apart from the messages and refuses a call
                # without one; in a Message Batches submission it would fail every member
                raise JobError(
                    ErrorKind.INVALID_JOB,
                    f"tier '{tier.name}' (anthropic) needs a user or assistant message; "
                    "this job has only system messages",
                )

    def _wall_at(self, now_s: float) -> float:
        """The wall clock (Unix seconds) when the clock read `now_s`: read once per `now_s`, so
        every job of one poll has its deadline placed on the same instant (reading the wall
        clock per job would move later jobs' deadlines earlier by the time taken before them)."""
        if now_s != self._wall_now_s:
            self._wall_now_s, self._wall_s = now_s, time.time()
        return self._wall_s

    def _merge(self, job: Job, tier: TierRuntime) -> tuple[str, MergedOptions]:
        """The canonical JSON of the job's options and their merge over the tier's, shared with
        every earlier job of the tier with equal options (JobError as `merged_options`)."""
        key = orjson.dumps(job.options, option=orjson.OPT_SORT_KEYS).decode() if job.options else "{}"
        found = self._merged.get((tier.name, key))
        if found is None:
            found = merged_options(job, tier.config.options)
            if len(self._merged) < MERGED_OPTIONS_KEPT:
                self._merged[(tier.name, key)] = found
        return key, found


def header_tenant(headers: tuple[tuple[str, bytes | None], ...]) -> str | None:
    """The `promptbus-tenant` header's value as text (None: no such header); a value that is
    not UTF-8 is returned as text that is no tenant name, so it is refused like any other."""
    for name, value in headers:
        if name == TENANT_HEADER:
            if value is None:
                return ""
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return "\ufffd"
    return None


def key_text(key: bytes | None) -> str | None:
    """The record key as a job id hint (producers key jobs by id)."""
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if len(text) <= 256 else None
