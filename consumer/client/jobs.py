"""Run ids and the job dicts a call produces: every input checked as the service reads it,
before anything is produced (ValueError naming the index and the reason)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from consumer.core.content import job_content
from consumer.core.errors import JobError
from consumer.core.jobs import Job, Message, validation_message
from consumer.core.templates import placeholders, render, split_batchable
from consumer.core.tenants import tenant_problem

#: the variable that carries each input when `map` gets no template
INPUT_VARIABLE = "input"
#: job ids are at most this long (the Job model's limit)
MAX_ID_CHARS = 256
MODES = ("online", "offline")

_RUN_TIME = re.compile(r"^(\d{8}T\d{6})(\d{3})Z-")


# ---------------------------------------------------------------------------- run ids
def new_run_id(now_s: float, token: str) -> str:
    """A run id carrying its start time: `YYYYMMDDTHHMMSSmmmZ-TOKEN` (UTC, milliseconds)."""
    at = datetime.fromtimestamp(now_s, UTC)
    return f"{at:%Y%m%dT%H%M%S}{at.microsecond // 1000:03d}Z-{token}"


def run_started_at(run_id: str) -> float | None:
    """The start time (Unix seconds) a generated run id carries; None for other run ids."""
    m = _RUN_TIME.match(run_id)
    if m is None:
        return None
    try:
        at = datetime.strptime(m.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return at.timestamp() + int(m.group(2)) / 1000


def check_run_id(run_id: str, total: int) -> None:
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id: must be a non-empty string")
    longest = len(run_id) + 1 + len(str(total - 1))
    if longest > MAX_ID_CHARS:
        raise ValueError(f"run_id: job ids RUN_ID-INDEX would be {longest} characters, over {MAX_ID_CHARS}")


# ---------------------------------------------------------------------------- building jobs
def _check_common(tier: str, mode: str, count: int, what: str) -> None:
    if not isinstance(tier, str) or not tier:
        raise ValueError("tier: must be a non-empty string")
    if mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r} (known: {', '.join(MODES)})")
    if count == 0:
        raise ValueError(f"{what}: empty list, nothing to map")


def _probe_options(tier: str, options: Mapping[str, Any] | None, mode: str) -> dict[str, Any]:
    """The options every job of a call shares, checked once as the service checks them."""
    opts = dict(options or {})
    try:
        Job.model_validate({"id": "probe", "tier": tier, "prompt": "", "options": opts, "mode": mode})
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None
    return opts


def _not_batchable(prompt: str) -> ValueError:
    # the core's rule (consumer.core.templates.split_batchable), worded for the caller
    count = len(placeholders(prompt))
    where = ", not at its very end" if count == 1 else ""
    return ValueError(
        "batch=True: the prompt is not batchable: it needs exactly one ${name} with nothing after it "
        f"(it has {count} placeholder{'s' if count != 1 else ''}{where})"
    )


def prompt_jobs(
    tier: str, inputs: Sequence[str | Mapping[str, str]], prompt: str | None, batch: bool,
    options: Mapping[str, Any] | None, mode: str,
) -> list[dict[str, Any]]:
    """One job dict (without id) per input; ValueError naming the index and the reason.

    With `prompt`, a string input fills the template's one `${name}`, a dict input gives its
    variables. Without it, each input (a string) is the whole prompt, sent as the value of a
    one-placeholder template so text such as `${x}` in it is never read as a placeholder.
    """
    if isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
        raise ValueError("inputs: must be a list of strings or dicts")
    _check_common(tier, mode, len(inputs), "inputs")
    opts = _probe_options(tier, options, mode)
    template = prompt if prompt is not None else "${" + INPUT_VARIABLE + "}"
    if not isinstance(template, str):
        raise ValueError("prompt: must be a string")
    if batch and split_batchable(template) is None:
        raise _not_batchable(template)
    names = sorted(set(placeholders(template)))
    base: dict[str, Any] = {"tier": tier, "prompt": template}
    if batch:
        base["batch"] = True
    if opts:
        base["options"] = opts
    if mode != "online":
        base["mode"] = mode
    jobs: list[dict[str, Any]] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            if len(names) != 1:
                where = "the input is the whole prompt" if prompt is None else f"the prompt has {len(names)}"
                raise ValueError(
                    f"input {i}: a string fills a template's one ${{name}}; {where} "
                    f"({', '.join(names) or 'none'}): give dicts of variables"
                )
            variables = {names[0]: item}
        elif isinstance(item, Mapping):
            if prompt is None:
                raise ValueError(f"input {i}: a dict of variables needs prompt= (a template to fill)")
            variables = dict(item)
            for name, value in variables.items():
                if not isinstance(value, str):
                    raise ValueError(f"input {i}: variable {name!r} is {type(value).__name__}, not a string")
            try:
                render(template, variables)
            except JobError as exc:
                raise ValueError(f"input {i}: {exc}") from None
        else:
            raise ValueError(
                f"input {i}: expected a string or a dict of variables, got {type(item).__name__}"
            )
        jobs.append({**base, "variables": variables})
    return jobs


def chat_jobs(
    tier: str, conversations: Sequence[Sequence[Mapping[str, Any]]],
    options: Mapping[str, Any] | None, mode: str,
) -> list[dict[str, Any]]:
    """One chat job dict (without id) per conversation; ValueError naming the index and the reason."""
    if isinstance(conversations, str | bytes) or not isinstance(conversations, Sequence):
        raise ValueError("conversations: must be a list of message lists")
    _check_common(tier, mode, len(conversations), "conversations")
    opts = _probe_options(tier, options, mode)
    jobs: list[dict[str, Any]] = []
    for i, conv in enumerate(conversations):
        if isinstance(conv, str | bytes | Mapping) or not isinstance(conv, Sequence) or not conv:
            raise ValueError(f"conversation {i}: expected a non-empty list of {{role, content}} messages")
        messages = []
        for n, msg in enumerate(conv):
            try:
                messages.append(Message.model_validate(msg).model_dump())
            except ValidationError as exc:
                raise ValueError(
                    f"conversation {i}, message {n}: {validation_message(exc, what='message')}"
                ) from None
        job: dict[str, Any] = {"tier": tier, "messages": messages}
        if opts:
            job["options"] = opts
        if mode != "online":
            job["mode"] = mode
        jobs.append(job)
    return jobs


def embed_jobs(
    tier: str, texts: Sequence[str], options: Mapping[str, Any] | None, mode: str
) -> list[dict[str, Any]]:
    """One embed job dict (without id) per text; ValueError naming the index and the reason."""
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
        raise ValueError("texts: must be a list of strings")
    _check_common(tier, mode, len(texts), "texts")
    opts = _probe_options(tier, options, mode)
    base: dict[str, Any] = {"tier": tier, "kind": "embed"}
    if opts:
        base["options"] = opts
    if mode != "online":
        base["mode"] = mode
    jobs: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"text {i}: expected a string, got {type(text).__name__}")
        jobs.append({**base, "input": text})
    return jobs


def check_jobs(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Whole job dicts (tier, prompt/messages, variables, batch, options, mode, deadline,
    metadata) checked as the service reads them; an `id` in them is dropped (the run gives
    ids). ValueError naming the index and the reason."""
    if isinstance(jobs, str | bytes) or not isinstance(jobs, Sequence):
        raise ValueError("jobs: must be a list of job dicts")
    if not jobs:
        raise ValueError("jobs: empty list, nothing to map")
    checked: list[dict[str, Any]] = []
    for i, raw in enumerate(jobs):
        if not isinstance(raw, Mapping):
            raise ValueError(f"job {i}: expected a dict, got {type(raw).__name__}")
        job = {k: v for k, v in raw.items() if k != "id"}
        try:
            parsed = Job.model_validate({"id": "probe", **job})
        except ValidationError as exc:
            raise ValueError(f"job {i}: {validation_message(exc)}") from None
        try:
            job_content(parsed)  # admission's own content check: the same words as its dead letter
        except JobError as exc:
            raise ValueError(f"job {i}: {exc}") from None
        if parsed.prompt is not None:
            if parsed.batch and split_batchable(parsed.prompt) is None:
                raise ValueError(f"job {i}: {_not_batchable(parsed.prompt)}")
        elif parsed.batch and parsed.kind == "chat":
            raise ValueError(f"job {i}: batch=True: a chat job (messages) cannot share a prompt")
        checked.append(job)
    return checked


def with_tenant(jobs: list[dict[str, Any]], tenant: str) -> None:
    """Every job that names no tenant gets `tenant` (ValueError when it is not a tenant name)."""
    problem = tenant_problem(tenant)
    if problem is not None:
        raise ValueError(f"tenant: {problem}")
    for job in jobs:
        job.setdefault("tenant", tenant)


def encode_jobs(run_id: str, jobs: Sequence[dict[str, Any]], max_bytes: int) -> list[bytes]:
    """Each job with its id `RUN_ID-INDEX`, as the record value; ValueError for one too large."""
    check_run_id(run_id, len(jobs))
    values = []
    for i, job in enumerate(jobs):
        value = orjson.dumps({"id": f"{run_id}-{i}", **job})
        if len(value) > max_bytes:
            raise ValueError(
                f"input {i}: the job is {len(value)} bytes, over the {max_bytes} the service reads"
            )
        values.append(value)
    return values
