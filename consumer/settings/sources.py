"""The tier file's `sources` section: topics a company already has, each read into one tier and
written back enriched (`SourceConfig`), and the core's `SourceMapping` made from each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from consumer.core.jobs import Message
from consumer.core.output import response_format_schema
from consumer.core.sources import ANSWER_ERROR_SCHEMA, SourceMapping, mapping_problem
from consumer.settings.base import StrictModel


class SourceOutput(StrictModel):
    """Where a source's enriched records go (`sources.NAME.into`)."""

    topic: str = Field(min_length=1, description="the enriched topic: each record under its input's key")
    field: str = Field(
        "enrichment",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the field of the record that holds the answer (a string, or the object the "
        "response_format gives)",
    )
    format: Literal["same", "json"] = Field(
        "same",
        description="same: the input's format (a registry format: the input schema plus the field, "
        "registered under the output topic's subject); json: JSON",
    )


class SourceTenant(StrictModel):
    """A source's tenant read from each record (`sources.NAME.tenant: {field: PATH}`)."""

    field: str = Field(min_length=1, description="the dotted path of the field that names the tenant")


class SourceConfig(StrictModel):
    """One source: an existing topic read into one tier, in the same group and pipeline as jobs."""

    topic: str = Field(min_length=1, description="the topic to enrich")
    tier: str = Field(min_length=1, description="the tier its jobs go to")
    format: Literal["json", "avro", "protobuf", "json_schema"] = Field(
        "json",
        description="json: UTF-8 JSON; avro, protobuf, json_schema: the Confluent wire format (magic byte, "
        "schema id), decoded through the Schema Registry",
    )
    envelope: Literal["none", "debezium"] = Field(
        "none",
        description="debezium: a change event (before/after/op/source); c, r and u are enriched from after, "
        "a delete writes a tombstone",
    )
    prompt: str | None = Field(
        None, description="the prompt, ${dotted.path} placeholders over the decoded value"
    )
    messages: list[Message] | None = Field(
        None, description="chat messages instead of a prompt, their content with ${dotted.path} placeholders"
    )
    kind: Literal["chat", "embed"] = Field("chat", description="embed: the record's `input` is embedded")
    input: str | None = Field(None, description="an embed source's text, with ${dotted.path} placeholders")
    batch: bool = Field(False, description="its jobs may share a prompt (the tier's batching rules apply)")
    response_format: dict[str, Any] | None = Field(
        None, description="the job's options.response_format: the answer is then an object"
    )
    options: dict[str, Any] | None = Field(None, description="the jobs' options (merged over the tier's)")
    tenant: str | SourceTenant | None = Field(
        None, description="the jobs' tenant: a name, or {field: PATH} read from each record"
    )
    deadline_s: float | None = Field(
        None, gt=0, description="a job not answered this long after its record was read is dead-lettered"
    )
    mode: Literal["online", "offline", "auto"] | None = Field(
        None,
        description="the jobs' mode (unset: the tier's default_mode); offline needs the tier's "
        "offline.enabled",
    )
    id: str = Field(
        "key",
        min_length=1,
        description="a job's id: key (the record key), offset (topic/partition/offset) or a field's "
        "dotted path",
    )
    into: SourceOutput = Field(description="where the enriched records go")
    unchanged: Literal["skip", "ask"] = Field(
        "skip",
        description="skip: an update of a key whose prompt fields equal those of its last enrichment is "
        "written with that answer, without asking the model; ask: every record is asked",
    )
    on_error: Literal["dead_letter", "field"] = Field(
        "dead_letter",
        description="dead_letter: a failed job is a dead letter with the record's key, bytes and headers; "
        "field: the enriched record is written with the field null and an error object beside it",
    )
    lane: str | None = Field(
        None, description="the lane whose priority and bounds its records share (unset: the lowest lane)"
    )

    @model_validator(mode="after")
    def _check_job(self) -> SourceConfig:
        problem = mapping_problem(self.mapping_fields())
        if problem is not None:
            raise ValueError(problem)
        if self.into.topic == self.topic:
            raise ValueError("into.topic must differ from topic (an enriched record would be read again)")
        return self

    def output_fields(self) -> tuple[str, ...]:
        """The fields an enriched record adds: the answer's, and with on_error: field, its error's."""
        answer = self.into.field
        return (answer, f"{answer}_error") if self.on_error == "field" else (answer,)

    def output_schemas(self) -> dict[str, dict[str, Any]]:
        """The JSON Schemas of the added fields that have one: the answer's (an embedding, or
        what a response_format gives), and the error object's."""
        out: dict[str, dict[str, Any]] = {}
        answer = response_format_schema(_options(self.options, self.response_format).get("response_format"))
        if self.kind == "embed":
            out[self.into.field] = {"type": "array", "items": {"type": "number"}}
        elif answer is not None:
            out[self.into.field] = answer
        if self.on_error == "field":
            out[f"{self.into.field}_error"] = ANSWER_ERROR_SCHEMA
        return out

    def mapping_fields(self) -> dict[str, Any]:
        """The fields `consumer.core.sources.SourceMapping` is made from."""
        tenant = self.tenant
        return {
            "tier": self.tier,
            "envelope": self.envelope,
            "prompt": self.prompt,
            "messages": tuple((m.role, m.content) for m in self.messages) if self.messages else None,
            "kind": self.kind,
            "input": self.input,
            "batch": self.batch,
            "options": _options(self.options, self.response_format),
            "tenant": tenant if isinstance(tenant, str) else None,
            "tenant_path": tenant.field if isinstance(tenant, SourceTenant) else None,
            "deadline_s": self.deadline_s,
            "mode": self.mode,
            "id_from": self.id,
            "answer_field": self.into.field,
        }

    def mapping(self, name: str) -> SourceMapping:
        """The core's mapping of this source's records into jobs and enriched values."""
        return SourceMapping(name=name, **self.mapping_fields())


def _options(options: dict[str, Any] | None, response_format: dict[str, Any] | None) -> dict[str, Any]:
    """The jobs' options: `options`, and `response_format` among them when given."""
    out = dict(options or {})
    if response_format is not None:
        out["response_format"] = response_format
    return out


def sources_problem(
    sources: Mapping[str, SourceConfig], tiers: Mapping[str, Any], lane_topics: Mapping[str, str]
) -> tuple[str, str] | None:
    """What the sources cannot be together with the tiers and lanes: (dotted key, reason), or None."""
    topics: dict[str, str] = {}
    for name, source in sources.items():
        if source.tier not in tiers:
            return f"sources.{name}.tier", f"unknown tier {source.tier!r} (tiers: {', '.join(sorted(tiers))})"
        if source.mode == "offline" and not tiers[source.tier].offline.enabled:
            # admission's rule for a job's mode offline, said before any record is read
            reason = f"tier '{source.tier}' does not allow mode 'offline' (offline.enabled is false)"
            return f"sources.{name}.mode", reason
        if source.topic in topics:
            other = topics[source.topic]
            return f"sources.{name}.topic", f"{source.topic} is the topic of source {other!r} too"
        if source.topic in lane_topics.values():
            return f"sources.{name}.topic", f"{source.topic} is a lane's job topic"
        if source.lane is not None and source.lane not in lane_topics:
            known = ", ".join(lane_topics) or "none: the tier file has no lanes"
            return f"sources.{name}.lane", f"unknown lane {source.lane!r} (lanes: {known})"
        topics[source.topic] = name
    return None
