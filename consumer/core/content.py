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
from typing import Any

from consumer.core.completion import ChatMessage
from consumer.core.embed import embed_options
from consumer.core.jobs import Job, decode_job
from consumer.core.output import OutputFormat, output_format
from consumer.core.templates import BatchablePrompt, render_and_split


@dataclass(frozen=True, slots=True)
class JobContent:
    """A job's ordinary request and what it asks of the output.

    messages: the request's chat messages (the rendered prompt as one user message);
    text: the batch variable's value, else the rendered prompt or the last message (an embed
    job: its input; it has no messages);
    options: the job's options merged over the tier's (an embed job: over the tier's embedding
    options only, `embed.embed_options`); batchable: the prompt split for
    batching, when it can be; output_format: what response_format asks (None: nothing).
    """

    messages: tuple[ChatMessage, ...]
    text: str
    options: dict[str, Any]
    batchable: BatchablePrompt | None
    output_format: OutputFormat | None


def job_content(job: Job, tier_options: Mapping[str, Any] | None = None) -> JobContent:
    """The content of `job`, its options merged over `tier_options`.

    Raises `JobError` (`template_error` for variables that do not fit the template,
    `invalid_job` for a response_format that cannot be checked).
    """
    if job.kind == "embed":
        assert job.input is not None  # the Job model holds an embed job's input
        return JobContent((), job.input, embed_options(tier_options, job.options), None, None)
    options = {**(tier_options or {}), **job.options}
    batchable = None
    if job.messages is not None:
        messages = tuple(ChatMessage(m.role, m.content) for m in job.messages)
        text = job.messages[-1].content
    else:
        assert job.prompt is not None  # the Job model holds exactly one of prompt / messages
        variables = job.variables or {}
        rendered, batchable = render_and_split(job.prompt, variables)
        messages = (ChatMessage("user", rendered),)
        text = variables.get(batchable.variable, rendered) if batchable else rendered
    wanted = output_format(options) if "response_format" in options else None
    return JobContent(messages, text, options, batchable, wanted)


def check_job(raw: bytes) -> Job:
    """`raw` decoded as a job whose own content can be asked; JobError as admission raises it
    (`invalid_job` for bytes that are not a job, then as `job_content`)."""
    job = decode_job(raw)
    job_content(job)
    return job
