"""Outcome delivery: the one place a job's result or dead letter is built and handed to the sink.

Every part that ends a job (admission's rejections, plan runners, the offline collector) ends
it here, so each job ends exactly once (`JobContext.done`), its trace ends with it, and the
service counters for results and dead letters are counted in one place.
"""

from __future__ import annotations

from consumer.core.errors import ErrorKind, ProviderError
from consumer.kafka.records import OutRecord
from consumer.kafka.sink import OutcomeSink, Ticket
from consumer.runtime.admission import Rejection
from consumer.runtime.context import JobContext
from consumer.runtime.outcomes import RecordLimits, dead_letter_record
from consumer.runtime.stats import ServiceStats
from consumer.settings import Settings
from consumer.telemetry import Telemetry


class OutcomeWriter:
    """Builds dead letters and hands every outcome to the sink; counts them."""

    def __init__(
        self,
        settings: Settings,
        sink: OutcomeSink,
        stats: ServiceStats,
        telemetry: Telemetry,
        limits: RecordLimits,
    ) -> None:
        self._settings = settings
        self._sink = sink
        self._stats = stats
        self._telemetry = telemetry
        self.limits = limits

    @property
    def results_topic(self) -> str:
        return self._settings.results_topic

    def reject(self, ticket: Ticket, rejection: Rejection) -> None:
        """An input that cannot become a job context: dead letter with the original bytes."""
        record = dead_letter_record(
            self._settings.dlq_topic,
            source=ticket.source,
            kind=rejection.kind,
            message=rejection.message,
            job=rejection.job,
            job_id=rejection.job_id,
            raw=rejection.raw,
            max_bytes=self.limits.dead_letters,
        )
        self._stats.dead_letters[rejection.kind.value] += 1
        self._sink.deliver(ticket, [record])

    def fail(
        self,
        ctx: JobContext,
        kind: ErrorKind,
        message: str,
        *,
        attempts: int,
        error: ProviderError | None = None,
    ) -> None:
        """The job's dead letter (its parsed job, the provider error's details)."""
        if ctx.done:
            return
        record = dead_letter_record(
            self._settings.dlq_topic,
            source=ctx.source,
            kind=kind,
            message=message,
            job=ctx.job,
            attempts=attempts,
            retryable=bool(error and error.retryable),
            status_code=error.status_code if error else None,
            provider=error.provider if error else None,
            traceparent=self._telemetry.traceparent(ctx.trace),
            max_bytes=self.limits.dead_letters,
        )
        self._stats.dead_letters[kind.value] += 1
        self._end(ctx, record, ok=False)

    def succeed(self, ctx: JobContext, record: OutRecord) -> None:
        """The job's result record."""
        if ctx.done:
            return
        self._stats.results += 1
        self._end(ctx, record, ok=True)

    def offline_recorded(self, ctx: JobContext) -> None:
        """An offline job's batch is recorded durably: its input offset may commit (no outcome yet)."""
        if ctx.done:
            return
        ctx.done = True
        self._telemetry.end_job(ctx.trace, ok=True)
        self._sink.deliver(ctx.ticket, [])

    def offline_failed(self, ctx: JobContext, kind: ErrorKind, message: str, error: ProviderError) -> None:
        """An offline job whose submission failed for good."""
        self.fail(ctx, kind, message, attempts=1, error=error)

    def abandon(self, ctx: JobContext) -> None:
        """No outcome: the job stays uncommitted and is read again by the partition's next owner."""
        ctx.done = True
        self._telemetry.end_job(ctx.trace, ok=False)

    def _end(self, ctx: JobContext, record: OutRecord, *, ok: bool) -> None:
        ctx.done = True
        self._telemetry.end_job(ctx.trace, ok=ok)
        self._sink.deliver(ctx.ticket, [record])
