"""The messages promptbus reads and writes: Job, Result, DeadLetter (DESIGN.md "Messages").

These pydantic models are the edge of the service and the source of `schemas/*.json`
(`python -m consumer.schemas`). Everything inside the service works on the
parsed, frozen models.

Decoding (`decode_job`) never raises anything but `JobError(INVALID_JOB, message)`; the
message names the offending field and the problem, e.g.
``field 'variables.text': Input should be a valid string``, and never echoes the input
value (a job may carry private data and can be megabytes long). Whether `tier` names a
configured tier is checked by the caller, which knows the tiers (`unknown_tier`).

Encoding (`encode`) is compact orjson; every datetime is written in UTC with a `Z`
suffix (RFC 3339), because the models normalize datetimes to UTC when they are built.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict

from consumer.core.errors import ErrorKind, JobError
from consumer.core.tenants import DEFAULT_TENANT, TENANT_PATTERN

__all__ = [
    "BatchInfo",
    "DeadLetter",
    "ErrorInfo",
    "Job",
    "JobOptions",
    "Message",
    "Result",
    "SourceRef",
    "UsageInfo",
    "checked_json_object",
    "decode_job",
    "encode",
    "validation_message",
]

#: How many validation problems one `invalid_job` message lists before "and N more".
_MAX_REPORTED_ERRORS = 3


def _require_rfc3339_string(value: Any) -> Any:
    # pydantic would also take a Unix timestamp; the contract says RFC 3339 text.
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string")
    return value


def _require_aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must carry a time zone offset (e.g. 'Z' or '+02:00')")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before the first datetime in UTC
        raise ValueError("is out of range in UTC (years 1 to 9999)") from None


def _writable(value: Any) -> Any:
    # metadata is echoed in the result and the job is kept in its dead letter, both written by
    # orjson: what it cannot write would fail the job's every outcome. An integer beyond 64
    # bits fails here, then decode_job's second pass reads it as orjson does (a float);
    # nesting deeper than orjson writes makes an invalid job
    if value:
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError as exc:
            raise ValueError(f"cannot be written back as JSON ({exc})") from None
    return value


def _assume_utc(value: datetime) -> datetime:
    # Timestamps we produce ourselves: a naive datetime is taken to be UTC.
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


#: A job's deadline: RFC 3339 text with an offset; stored in UTC.
DeadlineTime = Annotated[
    datetime, BeforeValidator(_require_rfc3339_string), AfterValidator(_require_aware_utc)
]
#: A time promptbus stamps (completed_at, failed_at): naive means UTC; stored in UTC.
UtcTime = Annotated[datetime, AfterValidator(_assume_utc)]


Number = StrictInt | StrictFloat


@with_config(ConfigDict(extra="allow"))
class JobOptions(TypedDict, total=False):
    """Provider options of a job. The common ones are type-checked at intake, so a typo
    such as ``"max_tokens": "50"`` is an `invalid_job` instead of a wasted provider call;
    any other key passes through to the provider as is."""

    max_tokens: Annotated[StrictInt, Field(ge=1)]
    temperature: Annotated[Number, Field(ge=0)]
    top_p: Annotated[Number, Field(ge=0, le=1)]
    seed: StrictInt
    stop: StrictStr | list[StrictStr]
    response_format: dict[str, Any]
    dimensions: Annotated[StrictInt, Field(ge=1)]


if TYPE_CHECKING:
    # For type checkers the options stay a plain dict (callers use .get and dict()).
    OptionsField = dict[str, Any]
else:
    OptionsField = Annotated[JobOptions, AfterValidator(_writable)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Message(_Frozen):
    """One chat message of a `messages` job."""

    role: Literal["system", "user", "assistant"]
    content: StrictStr


class Job(_Frozen):
    """A unit of LLM work read from the jobs topic (Kafka key: the job id).

    A chat job (`kind` "chat", the default) gives exactly one of `prompt` (a `${name}`
    template, optionally with `variables`) or `messages`; an embed job (`kind` "embed") gives
    its `input` text and neither. Unknown fields are an error (a typo such as `varaibles` would
    otherwise be silently ignored).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        # a chat job has exactly one of prompt / messages, an embed job its input and neither
        # (an explicit null counts as absent)
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["prompt"],
                    "properties": {"prompt": {"type": "string"}, "kind": {"const": "chat"}},
                    "not": {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
                },
                {
                    "required": ["messages"],
                    "properties": {"messages": {"type": "array"}, "kind": {"const": "chat"}},
                    "not": {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                },
                {
                    "required": ["kind", "input"],
                    "properties": {"kind": {"const": "embed"}, "input": {"type": "string"}},
                    "not": {
                        "anyOf": [
                            {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                            {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
                        ]
                    },
                },
            ]
        },
    )

    id: StrictStr = Field(min_length=1, max_length=256, description="Unique per logical job.")
    tier: StrictStr = Field(min_length=1, description="Must name a configured tier.")
    prompt: StrictStr | None = Field(default=None, description="Template with ${name} placeholders.")
    variables: dict[str, StrictStr] | None = Field(default=None, description="Values for the placeholders.")
    messages: list[Message] | None = Field(default=None, min_length=1, description="A chat conversation.")
    options: OptionsField = Field(
        default_factory=dict, description="Provider options, merged over the tier's options."
    )
    batch: StrictBool = Field(default=False, description="This job may share a prompt with others.")
    mode: Literal["online", "offline", "auto"] | None = Field(
        default=None,
        description="online; offline (the provider's Batch API); auto (offline when the deadline leaves "
        "the tier's completion window and margin); null: the tier's default_mode.",
    )
    deadline: DeadlineTime | None = Field(
        default=None, description="RFC 3339; not done by then -> dead letter."
    )
    metadata: Annotated[dict[str, Any] | None, AfterValidator(_writable)] = Field(
        default=None, description="Echoed back untouched."
    )
    fallback: StrictBool = Field(
        default=True, description="The tier's fallback tier may answer this job while the tier is down."
    )
    kind: Literal["chat", "embed"] = Field(
        default="chat", description="chat: a prompt or messages; embed: the embedding of `input`."
    )
    input: StrictStr | None = Field(default=None, description="The text to embed (embed jobs only).")
    tenant: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=TENANT_PATTERN,
        description="Who the job belongs to (1-64 of A-Z a-z 0-9 . _ -); null: the record header "
        "promptbus-tenant, else default.",
    )

    @model_validator(mode="after")
    def _one_input(self) -> Job:
        if self.kind == "embed":
            if self.input is None:
                raise ValueError("an embed job needs 'input'")
            if self.prompt is not None or self.messages is not None or self.variables is not None:
                raise ValueError("an embed job takes 'input', not 'prompt', 'variables' or 'messages'")
            return self
        if self.input is not None:
            raise ValueError("'input' is only allowed with kind 'embed'")
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' or 'messages' is required")
        if self.variables is not None and self.prompt is None:
            raise ValueError("'variables' is only allowed with 'prompt'")
        return self


class SourceRef(_Frozen):
    """Where a job was read from."""

    topic: StrictStr
    partition: StrictInt = Field(ge=0)
    offset: StrictInt = Field(ge=0)


class UsageInfo(_Frozen):
    """Token usage; a batched job gets its share of the request's usage."""

    input_tokens: StrictInt = Field(default=0, ge=0, description="Every prompt token, cached ones included.")
    output_tokens: StrictInt = Field(default=0, ge=0)
    cached_input_tokens: StrictInt = Field(
        default=0, ge=0, description="Of input_tokens, read from the provider's prompt cache."
    )
    cache_write_tokens: StrictInt = Field(
        default=0, ge=0, description="Of input_tokens, written to the provider's prompt cache."
    )


class BatchInfo(_Frozen):
    """The shared request a batched job's answer came from."""

    request_id: StrictStr | None = Field(default=None, description="The provider's request id, if any.")
    size: StrictInt = Field(ge=1, description="Jobs in that request.")


class ErrorInfo(_Frozen):
    """Why a job failed: `kind` is the closed list of `ErrorKind`."""

    kind: ErrorKind
    message: StrictStr
    retryable: StrictBool = False
    status_code: StrictInt | None = None
    provider: StrictStr | None = None


class Result(_Frozen):
    """One answer per job id, published to the results topic (Kafka key: the job id)."""

    id: StrictStr
    tier: StrictStr = Field(description="The tier that answered.")
    status: Literal["ok"] = "ok"
    output: StrictStr | None = Field(description="The answer; null for embed jobs.")
    embedding: list[float] | None = Field(default=None, description="The input's vector (embed jobs).")
    dimensions: StrictInt | None = Field(default=None, description="The embedding's length (embed jobs).")
    provider: StrictStr
    model: StrictStr
    finish_reason: StrictStr
    usage: UsageInfo = UsageInfo()
    batch: BatchInfo | None = None
    attempts: StrictInt = Field(default=1, ge=0, description="Provider requests that carried this job.")
    latency_ms: float = Field(ge=0, description="From intake to the answer.")
    metadata: dict[str, Any] | None = None
    source: SourceRef
    completed_at: UtcTime
    dedupe_of: StrictStr | None = Field(
        default=None,
        description="The job whose identical request answered this one (tier dedupe); "
        "null when this job's own request did.",
    )
    lane: StrictStr | None = Field(
        default=None,
        description="The lane whose topic the job was read from (`default` without lanes).",
    )
    mode: Literal["online", "offline"] = Field(default="online", description="The way the job went.")
    fallback_from: StrictStr | None = Field(
        default=None, description="The tier the job asked for, when its fallback tier answered."
    )
    deployment: StrictStr | None = Field(
        default=None,
        description="The tier's deployment that answered (its name); null for a tier without deployments.",
    )
    tenant: StrictStr = Field(
        default=DEFAULT_TENANT,
        description="The job's tenant: its tenant field, else its promptbus-tenant header, else default.",
    )


class DeadLetter(_Frozen):
    """A job that could not be served, published to the dead-letter topic."""

    id: StrictStr | None = Field(default=None, description="The job id when it could be read.")
    status: Literal["failed"] = "failed"
    error: ErrorInfo
    attempts: StrictInt = Field(default=0, ge=0)
    job: Job | None = Field(default=None, description="The parsed job, when it could be parsed.")
    raw: StrictStr | None = Field(default=None, description="Base64 of the original bytes when unparsable.")
    key: StrictStr | None = Field(
        default=None,
        description="The original record's Kafka key as text (null: it had none, or it is not UTF-8: "
        "then raw_key). The dead letter's own Kafka key is this key too, else the job id.",
    )
    raw_key: StrictStr | None = Field(
        default=None, description="Base64 of the original record's key when it is not UTF-8 text."
    )
    source: SourceRef
    failed_at: UtcTime
    tenant: StrictStr | None = Field(
        default=None,
        description="The job's tenant (as on its result); null when the record gave none that could be "
        "read: not a job, or a tenant that is not a tenant name.",
    )


#: Field paths can hold user-chosen keys (variables, extra fields): keep them short.
_MAX_LOC_CHARS = 80


def _loc(loc: tuple[int | str, ...]) -> str:
    text = ".".join(str(p) for p in loc)
    return text if len(text) <= _MAX_LOC_CHARS else text[: _MAX_LOC_CHARS - 3] + "..."


def validation_message(exc: ValidationError, *, what: str = "job") -> str:
    """A short, value-free description of a pydantic error: "field 'a.b': problem; ..."."""
    parts: list[str] = []
    errors = exc.errors(include_url=False, include_input=False)
    for err in errors[:_MAX_REPORTED_ERRORS]:
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = _loc(err["loc"])
        parts.append(f"field '{loc}': {msg}" if loc else f"{what}: {msg}")
    if len(errors) > _MAX_REPORTED_ERRORS:
        parts.append(f"and {len(errors) - _MAX_REPORTED_ERRORS} more")
    return "; ".join(parts)


def checked_json_object(value: bytes, model: type[BaseModel], *, what: str) -> dict[str, Any]:
    """`value` as a JSON object, once `model` accepts it (the fields it declares typed as it
    says; others kept as they are). Raises ValueError naming what is wrong, for records of
    promptbus's own topics that something else may have written."""
    try:
        model.model_validate_json(value)
    except ValidationError as exc:
        raise ValueError(validation_message(exc, what=what)) from None
    checked: dict[str, Any] = orjson.loads(value)
    return checked


#: `Job.model_validate_json` without its wrapper's per-call work (one call per record read)
_job_from_json = Job.__pydantic_validator__.validate_json


def decode_job(raw: bytes) -> Job:
    """Parse one record value into a Job.

    Raises `JobError(ErrorKind.INVALID_JOB, message)` when the bytes are not UTF-8, not
    JSON, not a JSON object or do not match the Job schema.
    """
    try:
        # the common case in one pass (pydantic parses the JSON itself); anything wrong is
        # explained by the checks below, which name the problem as the user sees it
        return _job_from_json(raw)
    except ValidationError:
        pass
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson reports invalid UTF-8 as a decode error too; tell the two apart for the user.
        try:
            bytes(raw).decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise JobError(ErrorKind.INVALID_JOB, f"not UTF-8 (byte {uexc.start})") from None
        raise JobError(ErrorKind.INVALID_JOB, f"not JSON: {exc.msg} at char {exc.pos}") from None
    if not isinstance(data, dict):
        raise JobError(ErrorKind.INVALID_JOB, f"not a JSON object (got {type(data).__name__})")
    return job_from_fields(data)


def job_from_fields(fields: dict[str, Any]) -> Job:
    """A Job from its fields (a source's record mapped into one; a decoded record); raises
    `JobError(ErrorKind.INVALID_JOB, message)` when they do not match the Job schema."""
    try:
        return Job.model_validate(fields)
    except ValidationError as exc:
        raise JobError(ErrorKind.INVALID_JOB, validation_message(exc)) from None


def encode(model: BaseModel) -> bytes:
    """Serialize a message model as compact JSON (orjson); datetimes in UTC with `Z`."""
    return orjson.dumps(model.model_dump(mode="python"), option=orjson.OPT_UTC_Z)
