"""A source's record codec: its values decoded into rows, and enriched rows encoded back.

`SourceCodec` serves one source: `json` values are UTF-8 JSON; `avro`, `protobuf` and
`json_schema` values are in the Confluent wire format, a zero magic byte and the 4-byte
big-endian schema id (then, for Protobuf, the message indexes: a zigzag varint count and the
indexes, a single 0 for the first message), then the payload. A registry format's codec learns
each writer schema once (`prepare`, the one step that awaits the registry) and, when the
enriched record keeps the input's format, the output schema made from it: the writer schema
plus the answer's field (and its error field), registered under the output topic's subject
(TopicNameStrategy: `<topic>-value`). After that, `decode` and `encode` are plain CPU work.

Decoding problems are `JobError(UNDECODABLE)`: the record is dead-lettered with its bytes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from consumer.core.errors import ErrorKind, JobError, PromptbusError
from consumer.registry.avro_types import avro_type
from consumer.registry.client import SchemaNotFound, SchemaRegistry, SchemaType

__all__ = ["MAGIC_BYTE", "SourceCodec", "WriterKey", "avro_output_schema", "to_json", "wire_schema_id"]

MAGIC_BYTE = 0
Format = Literal["json", "avro", "protobuf", "json_schema"]
_SCHEMA_TYPES: dict[str, SchemaType] = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}


def wire_schema_id(value: bytes) -> int:
    """The schema id of a Confluent wire-format value (JobError UNDECODABLE when it is none)."""
    if len(value) < 5:
        problem = f"{len(value)} bytes: too short for the wire format's header"
        raise JobError(ErrorKind.UNDECODABLE, problem)
    if value[0] != MAGIC_BYTE:
        problem = f"magic byte {value[0]}, not 0: not in the Confluent wire format"
        raise JobError(ErrorKind.UNDECODABLE, problem)
    return int.from_bytes(value[1:5], "big")


def _message_indexes(value: bytes, at: int) -> tuple[tuple[int, ...], int]:
    """The Protobuf message indexes after the schema id, and where the payload starts."""

    def varint(pos: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            if pos >= len(value):
                raise JobError(ErrorKind.UNDECODABLE, "the message indexes run past the value")
            byte = value[pos]
            result |= (byte & 0x7F) << shift
            pos += 1
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1), pos  # zigzag
            shift += 7

    count, pos = varint(at)
    if count == 0:
        return (0,), pos
    indexes = []
    for _ in range(count):
        index, pos = varint(pos)
        indexes.append(index)
    return tuple(indexes), pos


def _varint(n: int, out: bytearray) -> None:
    """`n` (not negative) as a base-128 varint, appended to `out`."""
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag_varints(numbers: tuple[int, ...]) -> bytes:
    out = bytearray()
    for n in numbers:
        _varint((n << 1) ^ (n >> 63), out)
    return bytes(out)


def _json_default(value: Any) -> Any:
    """What JSON cannot hold as it is (Avro's decimals, bytes, dates): text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def to_json(row: Any) -> bytes:
    """A row as JSON bytes (Avro's decimals, bytes and dates as text)."""
    return orjson.dumps(row, default=_json_default)


#: how many wire-format headers a codec keeps the writer keys of (a topic has a few writers)
_HEADERS_KEPT = 1024

#: what a value was written with: its schema id and, for Protobuf, its message indexes
WriterKey = tuple[int, tuple[int, ...]]


@dataclass(slots=True)
class _Writer:
    """What one writer schema (and message) reads, and the schema id its enriched records are
    written with (None: JSON)."""

    decode: Any  # (payload bytes) -> row
    encode: Any  # (row) -> payload bytes
    #: the wire-format header of its enriched records: magic byte, output schema id and, for
    #: Protobuf, the message indexes (None: JSON)
    out_header: bytes | None
    #: (the added fields' values) -> their encoding, to follow the input's own payload (None:
    #: the row is encoded whole; a field the input schema already has changes the payload)
    append: Any = None


class SourceCodec:
    """One source's values: decoded into rows, enriched rows encoded back (module docstring).

    fields: the answer's field and, with on_error: field, its error field. schemas: the JSON
    Schema of those of them that hold an object (a response_format's answer, the error object).
    A registry format's output schema adds each as optional: in Avro a field with a schema is
    typed from it (`consumer.registry.avro_types`), in JSON Schema it is that schema, and
    otherwise (any field in Protobuf) it is a string, an object kept as its JSON text.
    """

    def __init__(
        self,
        fmt: Format,
        registry: SchemaRegistry | None,
        *,
        out_topic: str,
        out_format: Literal["same", "json"],
        fields: tuple[str, ...],
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if fmt != "json" and registry is None:
            raise PromptbusError(f"format {fmt} needs a Schema Registry (PROMPTBUS_SCHEMA_REGISTRY__URL)")
        self.format = fmt
        self._registry = registry
        self._out_subject = f"{out_topic}-value"
        self._out_format = out_format
        self._fields = fields
        self._schemas = dict(schemas or {})
        self._writers: dict[WriterKey, _Writer] = {}
        #: a wire-format header (magic byte, schema id) -> its writer key
        self._by_header: dict[bytes, WriterKey] = {}

    def _key(self, value: bytes) -> tuple[WriterKey, int]:
        """The writer key of a wire-format value and where its payload starts (JobError
        UNDECODABLE when it is not in the wire format)."""
        if self.format != "protobuf":
            # asked two or three times per record, of a handful of schema ids: by header
            header = value[:5]
            key = self._by_header.get(header)
            if key is None:
                key = (wire_schema_id(value), ())
                if len(self._by_header) < _HEADERS_KEPT:
                    self._by_header[header] = key
            return key, 5
        schema_id = wire_schema_id(value)
        indexes, at = _message_indexes(value, 5)
        return (schema_id, indexes), at

    def missing(self, value: bytes | None) -> WriterKey | None:
        """The writer `value` needs that `prepare` has not learnt yet (None: none; a value that
        is not in the wire format needs none: `decode` dead-letters it)."""
        if self.format == "json" or not value:
            return None
        try:
            key, _at = self._key(value)
        except JobError:
            return None
        return None if key in self._writers else key

    async def prepare(self, key: WriterKey) -> None:
        """Learn the writer `key` names (and register its output schema). An id the registry
        does not know is remembered as undecodable; RegistryUnavailable propagates: try again."""
        assert self._registry is not None
        schema_id, indexes = key
        try:
            registered = await self._registry.schema(schema_id)
        except SchemaNotFound as exc:
            self._writers[key] = _Writer(_unknown(str(exc)), None, None)
            return
        expected = _SCHEMA_TYPES[self.format]
        if registered.schema_type != expected:
            problem = f"schema id {schema_id} is {registered.schema_type}, not {expected}"
            self._writers[key] = _Writer(_unknown(problem), None, None)
            return
        try:
            made = _writer_for(self.format, registered.text, indexes, self._fields, self._schemas)
        except (PromptbusError, ValueError) as exc:  # a schema this codec cannot read
            self._writers[key] = _Writer(_unknown(f"schema id {schema_id}: {exc}"), None, None)
            return
        if self._out_format == "same":
            out_id = await self._registry.register(self._out_subject, expected, made.out_text)
            header = bytes((MAGIC_BYTE,)) + out_id.to_bytes(4, "big")
            if self.format == "protobuf":
                header += b"\x00" if indexes in ((), (0,)) else _zigzag_varints((len(indexes), *indexes))
            made.writer.out_header = header
        self._writers[key] = made.writer

    def decode(self, value: bytes) -> tuple[Any, WriterKey]:
        """The row of a value and what it was written with ((0, ()) for JSON); JobError
        UNDECODABLE."""
        if self.format == "json":
            try:
                return orjson.loads(value), (0, ())
            except orjson.JSONDecodeError as exc:
                raise JobError(ErrorKind.UNDECODABLE, f"not JSON: {exc.msg} at char {exc.pos}") from None
        key, at = self._key(value)
        writer = self._writers.get(key)
        if writer is None:  # the caller prepares every writer first
            problem = f"schema id {key[0]} was never read from the registry"
            raise JobError(ErrorKind.UNDECODABLE, problem)
        try:
            return writer.decode(value[at:]), key
        except JobError:
            raise
        except Exception as exc:
            problem = f"schema id {key[0]} cannot read the value: {exc}"
            raise JobError(ErrorKind.UNDECODABLE, problem) from None

    def encode(self, row: Mapping[str, Any], key: WriterKey, *, input_value: bytes | None = None) -> bytes:
        """An enriched row in the output's format (`key`: what its input was written with).

        input_value: the value `row` was decoded from, when `row` is that value plus the
        codec's fields and nothing else changed. An Avro record's encoding is its fields'
        encodings in schema order, as is a Protobuf message's in any order, and the output
        schema only adds fields at the end: so the input's payload is kept as it is and the
        added fields' encodings appended, which decodes as `row` does without encoding the
        whole row again."""
        writer = self._writers.get(key)
        if writer is None or writer.out_header is None:
            return to_json(row)
        header = writer.out_header
        try:
            if input_value is not None and writer.append is not None:
                at = self._key(input_value)[1] if self.format == "protobuf" else 5
                return header + input_value[at:] + writer.append([row.get(name) for name in self._fields])
            return header + writer.encode(row)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # an answer that obeyed its JSON Schema but not the Avro type made from it (3.0
            # for an integer): the job's output is invalid, as one that broke the schema is
            problem = f"the answer does not fit the output schema of {self._out_subject}: {exc}"
            raise JobError(ErrorKind.OUTPUT_INVALID, problem) from None


def _unknown(problem: str) -> Any:
    def decode(_payload: bytes) -> Any:
        raise JobError(ErrorKind.UNDECODABLE, problem)

    return decode


@dataclass(slots=True)
class _Made:
    writer: _Writer
    out_text: str


def _writer_for(
    fmt: Format,
    text: str,
    indexes: tuple[int, ...],
    fields: tuple[str, ...],
    schemas: Mapping[str, Mapping[str, Any]],
) -> _Made:
    if fmt == "avro":
        return _avro(text, fields, schemas)
    if fmt == "json_schema":
        return _json_schema(text, fields, schemas)
    return _protobuf(text, indexes, fields)


def _added_avro_fields(
    fields: tuple[str, ...], schemas: Mapping[str, Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """The Avro fields an enriched record adds: each optional (null by default, so the output
    subject stays BACKWARD compatible), typed from its JSON Schema where Avro can hold it, else
    a string (an object as its JSON text)."""
    out = []
    for name in fields:
        schema = (schemas or {}).get(name)
        typed = avro_type(schema, f"promptbus_{name}") if schema is not None else None
        if typed is None:
            typed = "string"
        field_type = typed if isinstance(typed, list) else ["null", typed]
        out.append({"name": name, "type": field_type, "default": None})
    return out


def avro_output_schema(
    text: str, fields: tuple[str, ...], schemas: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """The enriched records' Avro schema: the writer's record plus `fields` (`_added_avro_fields`)."""
    writer_schema = orjson.loads(text)
    if not isinstance(writer_schema, dict) or writer_schema.get("type") != "record":
        raise PromptbusError("an Avro source's schema must be a record")
    taken = {f["name"] for f in writer_schema.get("fields", [])}
    extra = [f for f in _added_avro_fields(fields, schemas) if f["name"] not in taken]
    return orjson.dumps({**writer_schema, "fields": [*writer_schema.get("fields", []), *extra]}).decode()


def _avro(text: str, fields: tuple[str, ...], schemas: Mapping[str, Mapping[str, Any]]) -> _Made:
    import fastavro

    out_text = avro_output_schema(text, fields, schemas)
    parsed_in = fastavro.parse_schema(orjson.loads(text))
    parsed_out = fastavro.parse_schema(orjson.loads(out_text))
    added = _added_avro_fields(fields, schemas)
    #: the added fields that hold text (a string, or an object as its JSON)
    text_fields = tuple(f["name"] for f in added if f["type"] == ["null", "string"])

    def decode(payload: bytes) -> Any:
        buf = io.BytesIO(payload)
        row = fastavro.schemaless_reader(buf, parsed_in, None)
        if buf.tell() != len(payload):
            # bytes past the record: the schema id names a schema the value was not written
            # with (one whose fields are a prefix of the writer's), or two values were joined
            past = len(payload) - buf.tell()
            raise JobError(ErrorKind.UNDECODABLE, f"{past} bytes follow the record its schema describes")
        return row

    def encode(row: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed_out, _strings(row, text_fields))
        return buf.getvalue()

    def append_texts(values: list[Any]) -> bytes:
        """The added fields, each a ["null", "string"] union: its branch, then the string."""
        out = bytearray()
        for value in values:
            if value is None:
                out.append(0)
            else:
                data = _text(value).encode()
                out.append(2)  # branch 1, zigzag
                _varint(len(data) << 1, out)
                out += data
        return bytes(out)

    # a record of the added fields alone encodes as their encodings one after the other
    parsed_added = fastavro.parse_schema({"type": "record", "name": "promptbus_added", "fields": added})

    def append_typed(values: list[Any]) -> bytes:
        """The added fields, some typed records: encoded by fastavro under their own schema."""
        buf = io.BytesIO()
        row = dict(zip(fields, values, strict=True))
        fastavro.schemaless_writer(buf, parsed_added, _strings(row, text_fields))
        return buf.getvalue()

    taken = {f["name"] for f in orjson.loads(text).get("fields", [])}
    appendable = not any(name in taken for name in fields)
    append = append_texts if len(text_fields) == len(fields) else append_typed
    return _Made(_Writer(decode, encode, None, append if appendable else None), out_text)


def _json_schema(text: str, fields: tuple[str, ...], schemas: Mapping[str, Mapping[str, Any]]) -> _Made:
    writer_schema = orjson.loads(text)
    if not isinstance(writer_schema, dict):
        raise PromptbusError("a JSON Schema source's schema must be an object")
    properties = dict(writer_schema.get("properties") or {})
    for name in fields:
        schema = schemas.get(name)
        # optional: null when the job failed (on_error: field) or the row was never answered
        typed: dict[str, Any] = {"type": ["string", "object", "array", "null"]}
        if schema is not None:
            typed = {"anyOf": [dict(schema), {"type": "null"}]}
        properties.setdefault(name, typed)
    out_schema = {**writer_schema, "properties": properties}

    def decode(payload: bytes) -> Any:
        return orjson.loads(payload)

    def encode(row: Mapping[str, Any]) -> bytes:
        return to_json(row)

    return _Made(_Writer(decode, encode, None), orjson.dumps(out_schema).decode())


def _protobuf(text: str, indexes: tuple[int, ...], fields: tuple[str, ...]) -> _Made:
    """The message `indexes` name (top-level or nested), and the same schema with the fields
    added to that message."""
    from consumer.registry.protobuf import ProtoSchema, message_path, with_string_field

    indexes = indexes or (0,)
    schema_in = ProtoSchema(text)
    message = schema_in.descriptor(indexes)
    path = message_path(message)
    out_text = text
    number = max((f.number for f in message.fields), default=0)
    tags = []
    for name in fields:
        if name not in message.fields_by_name:
            number += 1
            out_text = with_string_field(out_text, path, name, number)
            tags.append(number << 3 | 2)  # length-delimited
    schema_out = ProtoSchema(out_text)

    def decode(payload: bytes) -> Any:
        return schema_in.decode(indexes, payload)

    def encode(row: Mapping[str, Any]) -> bytes:
        return schema_out.encode(indexes, _strings(row, fields))

    def append(values: list[Any]) -> bytes:
        """The added string fields: a tag, the length, the text (an unset or empty string,
        as proto3 writes it: nothing)."""
        out = bytearray()
        for tag, value in zip(tags, values, strict=True):
            data = _text(value).encode() if value is not None else b""
            if data:
                _varint(tag, out)
                _varint(len(data), out)
                out += data
        return bytes(out)

    appendable = len(tags) == len(fields)
    return _Made(_Writer(decode, encode, None, append if appendable else None), out_text)


def _text(value: Any) -> str:
    """An added field's value as a string schema holds it (an object answer as its JSON)."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _strings(row: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The row with `fields` as text (an object as its JSON): the added fields the output
    schema holds as strings."""
    if all(isinstance(row.get(name), (str, type(None))) for name in fields):
        return dict(row) if not isinstance(row, dict) else row
    out = dict(row)
    for name in fields:
        value = out.get(name)
        if value is not None:
            out[name] = _text(value)
    return out
