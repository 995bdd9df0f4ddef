"""Kafka consume and produce spans in the OpenTelemetry messaging semantic conventions.

    process <topic>   CONSUMER, one per job from its admission to its outcome: a child of the
                      producer's span when the record's `traceparent` header names one (the
                      job continues the producer's trace), else the root of a new trace
    send <topic>      PRODUCER, a child of the job's span: its outcome (result or dead letter)
                      handed to the producer; the producer sends it asynchronously (acks=all)
                      and the input offset commits once the broker acknowledged it

Attributes: `messaging.system` kafka, `messaging.operation.name` / `.type` (process / send),
`messaging.destination.name` (the topic), `messaging.destination.partition.id`,
`messaging.kafka.offset` and `messaging.consumer.group.name` (the job's record),
`messaging.kafka.message.key` (when the key is UTF-8 text), and `promptbus.job.id`,
`promptbus.tier`, `promptbus.batch` on the job's span, `promptbus.outcome` (result /
dead_letter) on the send span. A dead-lettered job's span has `error.type` its dead letter's
`error.kind`; an abandoned one (shutdown or revoke before its outcome: it is read again)
`abandoned`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SYSTEM = "kafka"
PROCESS, SEND = "process", "send"
#: the W3C trace context headers a job record may carry (the service reads and writes only these)
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
W3C = TraceContextTextMapPropagator()
_ROOT = Context()


class SourceRecord(Protocol):
    """Where a job record was read: what its span says of it."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


class ConsumedRecord(Protocol):
    """A job's input record (`consumer.kafka.intake.InRecord`)."""

    @property
    def source(self) -> SourceRecord: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class ProducedRecord(Protocol):
    """An outcome record (`consumer.kafka.records.OutRecord`)."""

    @property
    def topic(self) -> str: ...

    @property
    def key(self) -> bytes | None: ...


def producer_context(headers: Sequence[tuple[str, bytes | None]]) -> Context:
    """The producer's span context from a record's `traceparent` (and `tracestate`); an empty
    context when there is none or it is not valid (the job's span then starts a new trace).
    Kafka allows a header without a value (None)."""
    carrier = {k: v.decode("latin-1") for k, v in headers if k in TRACE_HEADERS and v is not None}
    return W3C.extract(carrier) if carrier else _ROOT


def process_attributes(record: ConsumedRecord, group: str | None) -> dict[str, Any]:
    source = record.source
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": PROCESS,
        "messaging.operation.type": PROCESS,
        "messaging.destination.name": source.topic,
        "messaging.destination.partition.id": str(source.partition),
        "messaging.kafka.offset": source.offset,
    }
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
    key = key_text(record.key)
    if key is not None:
        attributes["messaging.kafka.message.key"] = key
    return attributes


def send_attributes(record: ProducedRecord, outcome: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": SEND,
        "messaging.operation.type": SEND,
        "messaging.destination.name": record.topic,
        "promptbus.outcome": outcome,
    }
    key = key_text(record.key)
    if key is not None:
        attributes["messaging.kafka.message.key"] = key
    return attributes


def key_text(key: bytes | None) -> str | None:
    """A record key as the conventions want it: its text, or nothing when it has no text form."""
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None
