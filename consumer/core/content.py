"""What a job asks, from its own fields: the one content check admission and the CLI share.

A job whose own content cannot be asked (its template and variables do not fit, its
`response_format` names a schema outputs cannot be checked against) is refused here with the
`JobError` its dead letter carries, so a producer that checks first sees the same words the
service would dead-letter the job with. What depends on the configured tier (the tier exists,
offline is allowed, the provider takes the messages) is admission's alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from consumer.core.completion import ChatMessage
from consumer.core.embed import embed_options
from consumer.core.jobs import Job, decode_job
from consumer.core.output import OutputFormat, output_format
from consumer.core.templates import BatchablePrompt, render_and_split
from consumer.core.tuples import maker


class JobContent(NamedTuple):
    """A job's ordinary request and what it asks of the output (a NamedTuple: one is made per
    job).

    text: the batch variable's value, else the rendered prompt or the last message (an embed
    job: its input; it has no messages);
    own_messages: the request's chat messages, None for a prompt that splits for batching
    (`messages` is then its prefix and `text` as one user message, built when asked);
    options: the job's options merged over the tier's (an embed job: over the tier's embedding
    options only, `embed.embed_options`); batchable: the prompt split for
    batching, when it can be; output_format: what response_format asks (None: nothing).
    """

    own_messages: tuple[ChatMessage, ...] | None
    text: str
    options: dict[str, Any]
    batchable: BatchablePrompt | None
    output_format: OutputFormat | None

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        """The request's chat messages (the rendered prompt as one user message)."""
        if self.own_messages is not None:
            return self.own_messages
        if self.batchable is not None:
            return (ChatMessage("user", self.batchable.prefix + self.text),)
        return ()


_new_content = maker(JobContent)


@dataclass(frozen=True, slots=True)
class MergedOptions:
    """A job's options merged over its tier's, and what their response_format asks of the
    output (jobs with equal options may share one)."""

    options: dict[str, Any]
    output_format: OutputFormat | None


def merged_options(job: Job, tier_options: Mapping[str, Any] | None) -> MergedOptions:
    """`job`'s options over `tier_options` (an embed job's over the tier's embedding options
    only); JobError (`invalid_job`) for a response_format that cannot be checked."""
    if job.kind == "embed":
        return MergedOptions(embed_options(tier_options, job.options), None)
    options = {**(tier_options or {}), **job.options}
    return MergedOptions(options, output_format(options) if "response_format" in options else None)


def job_content(
    job: Job, tier_options: Mapping[str, Any] | None = None, merged: MergedOptions | None = None
) -> JobContent:
    """The content of `job`, its options merged over `tier_options` (or `merged`, when the
    caller merged them already).

    Raises `JobError` (`template_error` for variables that do not fit the template,
    `invalid_job` for a response_format that cannot be checked).
    """
    if merged is None:
        merged = merged_options(job, tier_options)
    if job.kind == "embed":
        assert job.input is not None  # the Job model holds an embed job's input
        return JobContent((), job.input, merged.options, None, None)
    batchable = None
    messages: tuple[ChatMessage, ...] | None
    if job.messages is not None:
        messages = tuple(ChatMessage(m.role, m.content) for m in job.messages)
        text = job.messages[-1].content
    else:
        assert job.prompt is not None  # the Job model holds exactly one of prompt / messages
        variables = job.variables or {}
        rendered, batchable = render_and_split(job.prompt, variables)
        if batchable is not None and batchable.variable in variables:
            messages, text = None, variables[batchable.variable]
        else:
            messages, text = (ChatMessage("user", rendered),), rendered
    return _new_content((messages, text, merged.options, batchable, merged.output_format))


def check_job(raw: bytes) -> Job:
    """`raw` decoded as a job whose own content can be asked; JobError as admission raises it
    (`invalid_job` for bytes that are not a job, then as `job_content`)."""
    job = decode_job(raw)
    job_content(job)
    return job
