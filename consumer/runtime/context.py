"""One job on its way from intake to outcome: what every runtime part knows about it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from consumer.core.completion import ChatMessage
from consumer.core.jobs import Job, decode_job
from consumer.core.lanes import DEFAULT_LANE_NAME, Lane
from consumer.core.output import OutputFormat
from consumer.core.plan import PlanMember
from consumer.core.templates import BatchablePrompt
from consumer.core.tenants import DEFAULT_TENANT
from consumer.kafka.records import SourceOffset
from consumer.kafka.sink import Ticket
from consumer.runtime.tiers import TierRuntime

if TYPE_CHECKING:
    from consumer.runtime.sources import SourceOrigin


class JobContext:
    """One job from intake to outcome: a compact copy of what its routing, its requests and
    its outcome need, and the record's own bytes (the parsed job is decoded from them again
    on the rare paths that publish it whole: dead letters, offline batches). Identity-hashed:
    it is the member of its request plan (`consumer.core.plan.PlanMember`).

    id, requested_tier, metadata, kind, batch, requested_mode, fallback_allowed: the job's
    own fields (`requested_tier` its `tier`, `requested_mode` its `mode`, `fallback_allowed`
    its `fallback`); raw: the record's value;
    input: the batch variable's value (or the rendered prompt / last message when it cannot
    be batched; an embed job's input);
    batchable: the prompt split for batching (prefix + its one trailing variable), when it
    can be; its ordinary request's one user message is then the prefix and the input;
    messages: the job's own request's messages (`messages` property: built from `batchable`
    when it is set);
    options: the job's options merged over its tier's (shared by the jobs of equal options:
    never mutated); options_key: the canonical JSON of the job's own options;
    deadline_s: the job's deadline on the runtime's clock; trace: its tracing span;
    output_format: what its response_format asks of the output (None: nothing to check);
    dedupe_key: set while the job leads the tier's dedupe table under this key (identical
    jobs wait for its outcome, `delivery.OutcomeWriter` ends them with it);
    mode: the way it goes, online or offline (`core/routing.py`);
    fallback_from: the tier the job asked for, once its fallback tier took it
    (`runtime/fallback.py`; `tier` is then the tier that answers);
    done: an outcome was handed to the sink (or the job was abandoned): nothing more happens;
    lane: the lane whose topic the job was read from (None: a job not read from a lane);
    timestamp_s, sent: the job record's Kafka timestamp (s since the epoch; job latency counts
    from it), and whether a request carrying it was sent yet (queue wait ends then);
    tenant: whose job it is (`consumer.core.tenants`: its field, its header, else `default`);
    origin: a source's job: the record it was made of, which its outcome is written back as
    (`consumer.runtime.sources`; None: a job read from a job topic).
    """

    __slots__ = (
        "_messages",
        "batch",
        "batchable",
        "deadline_s",
        "dedupe_key",
        "done",
        "fallback_allowed",
        "fallback_from",
        "id",
        "input",
        "kind",
        "lane",
        "metadata",
        "mode",
        "options",
        "options_key",
        "origin",
        "output_format",
        "raw",
        "received_s",
        "record_key",
        "requested_mode",
        "requested_tier",
        "sent",
        "tenant",
        "ticket",
        "tier",
        "timestamp_s",
        "trace",
    )

    def __init__(
        self,
        job: Job,
        raw: bytes,
        ticket: Ticket,
        tier: TierRuntime,
        received_s: float,
        input_text: str,
        messages: tuple[ChatMessage, ...] | None,
        batchable: BatchablePrompt | None,
        options: dict[str, Any],
        options_key: str,
        deadline_s: float | None,
        output_format: OutputFormat | None = None,
        trace: Any = None,
        mode: str = "online",
        lane: Lane | None = None,
        timestamp_s: float = 0.0,
        tenant: str = DEFAULT_TENANT,
        record_key: bytes | None = None,
        /,
    ) -> None:
        # positional only: admission makes one per record, and keyword arguments cost a call more
        self.id = job.id
        self.requested_tier = job.tier
        self.metadata = job.metadata
        self.kind = job.kind
        self.batch = job.batch
        self.requested_mode = job.mode
        self.fallback_allowed = job.fallback
        self.raw = raw
        self.ticket = ticket
        self.tier = tier
        self.received_s = received_s
        self.input = input_text
        # a batchable prompt's message is its prefix and input: built when it is asked alone
        self._messages = None if batchable is not None and messages is None else messages
        self.batchable = batchable
        self.options = options
        self.options_key = options_key
        self.deadline_s = deadline_s
        self.output_format = output_format
        self.trace = trace
        self.mode = mode
        self.lane = lane
        self.timestamp_s = timestamp_s
        self.tenant = tenant
        self.record_key = record_key
        self.dedupe_key: str | None = None
        self.fallback_from: str | None = None
        self.done = False
        self.sent = False
        self.origin: SourceOrigin | None = None

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        """The job's own request's messages (an embed job has none)."""
        if self._messages is not None:
            return self._messages
        if self.batchable is not None:
            return (ChatMessage("user", self.batchable.prefix + self.input),)
        return ()

    @property
    def alone_chars(self) -> int:
        """Characters of the job's own request's messages (what it costs asked alone)."""
        if self._messages is not None:
            return sum(len(m.content) for m in self._messages)
        if self.batchable is not None:
            return len(self.batchable.prefix) + len(self.input)
        return 0

    def parsed_job(self) -> Job:
        """The job as it was read (decoded again from the record's bytes, which admission
        accepted; a source's job, as its record was mapped): what a dead letter or an offline
        batch carries whole."""
        if self.origin is not None:
            return self.origin.job
        return decode_job(self.raw)

    # ------------------------------------------------------------------ as a plan member
    @property
    def ref(self) -> JobContext:
        return self

    @property
    def max_tokens(self) -> int | None:
        """The job's effective max_tokens (its options merged over the tier's), if any."""
        value = self.options.get("max_tokens")
        return value if isinstance(value, int) and value > 0 else None

    @property
    def check(self) -> Callable[[str], tuple[str, str | None]] | None:
        """The check each output of this job must pass before it is published, if any."""
        return self.output_format.accept if self.output_format is not None else None

    # ------------------------------------------------------------------ where it is
    @property
    def lane_name(self) -> str:
        """The lane's name, as metrics label it (`default` for a job read from no lane)."""
        return self.lane.name if self.lane is not None else DEFAULT_LANE_NAME

    @property
    def source(self) -> SourceOffset:
        return self.ticket.source

    def past_deadline(self, now_s: float) -> bool:
        """True once the job's own deadline has passed."""
        return self.deadline_s is not None and now_s >= self.deadline_s

    def output_check(self) -> Callable[[str], tuple[str, str | None]] | None:
        """The check each output of this job must pass before it is published, if any."""
        return self.check

    def __repr__(self) -> str:
        return f"JobContext(id={self.id!r}, tier={self.tier.name!r}, source={self.source})"


def as_context(member: PlanMember) -> JobContext:
    """A runner's plan member as the job context it is (the runners plan their jobs' contexts).

    A view for the type checker, not a conversion: it runs once per member per step, so it
    does nothing at run time (no `typing.cast` call either)."""
    return member  # type: ignore[return-value]


def as_contexts(members: Sequence[PlanMember]) -> Sequence[JobContext]:
    """`as_context` of every member, without a copy."""
    return members  # type: ignore[return-value]
