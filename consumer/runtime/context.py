"""One job on its way from intake to outcome: what every runtime part knows about it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consumer.core.completion import ChatMessage
from consumer.core.jobs import Job
from consumer.core.lanes import DEFAULT_LANE_NAME, Lane
from consumer.core.output import OutputFormat
from consumer.core.templates import BatchablePrompt
from consumer.kafka.records import SourceOffset
from consumer.kafka.sink import Ticket
from consumer.runtime.tiers import TierRuntime


@dataclass(eq=False)
class JobContext:
    """One job from intake to outcome. Identity-hashed: it is a plan Member's `ref`.

    input: the batch variable's value (or the rendered prompt / last message when unbatched);
    messages / options: the job's ordinary request (options merged over the tier's);
    deadline_s: the job's deadline on the runtime's clock; batchable: the prompt split for
    batching (prefix + its one trailing variable), when it can be; trace: its tracing span;
    output_format: what its response_format asks of the output (None: nothing to check);
    dedupe_key: set while the job leads the tier's dedupe table under this key (identical
    jobs wait for its outcome, `delivery.OutcomeWriter` ends them with it);
    mode: the way it goes, online or offline (`core/routing.py`: its `mode` or the tier's
    default_mode, `auto` decided by its deadline);
    fallback_from: the tier the job asked for, once its fallback tier took it
    (`runtime/fallback.py`; `tier` is then the tier that answers);
    done: an outcome was handed to the sink (or the job was abandoned): nothing more happens;
    lane: the lane whose topic the job was read from (None: a job not read from a lane);
    timestamp_s, sent: what its latency histograms are observed with.
    """

    job: Job
    ticket: Ticket
    tier: TierRuntime
    received_s: float
    input: str
    messages: tuple[ChatMessage, ...]
    options: dict[str, Any]
    deadline_s: float | None
    batchable: BatchablePrompt | None = None
    trace: Any = None
    output_format: OutputFormat | None = None
    dedupe_key: str | None = None
    mode: str = "online"
    fallback_from: str | None = None
    done: bool = field(default=False)
    lane: Lane | None = None
    #: the job record's Kafka timestamp (s since the epoch; job latency counts from it), and
    #: whether a request carrying it was sent yet (queue wait ends then)
    timestamp_s: float = 0.0
    sent: bool = False

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
        return self.output_format.accept if self.output_format is not None else None
