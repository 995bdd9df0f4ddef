"""A source's record codec on the registry fake (`MemoryRegistry`): the wire format, writer
schemas learnt once, output schemas registered under the output subject, and what is
undecodable; and the Protobuf text a field is added to."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.errors import ErrorKind, JobError, RegistryUnavailable
from consumer.core.sources import enriched_value
from consumer.registry.codecs import SourceCodec, avro_output_schema
from consumer.registry.memory import MemoryRegistry
from consumer.registry.protobuf import ProtoSchema, with_string_field

SCHEMA = {
    "type": "record",
    "name": "R",
    "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "int"}],
}


def avro_value(schema_id: int, row: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(SCHEMA), row)
    return b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()


async def test_an_avro_value_is_read_with_its_writer_schema_and_written_with_the_field_added() -> None:
    registry = MemoryRegistry()
    schema_id = await registry.register("in-value", "AVRO", orjson.dumps(SCHEMA).decode())
    codec = SourceCodec("avro", registry, out_topic="out", out_format="same", fields=("answer",))
    value = avro_value(schema_id, {"id": "a", "n": 1})
    missing = codec.missing(value)
    assert missing == (schema_id, ())
    await codec.prepare(missing)
    assert codec.missing(value) is None
    calls = registry.calls
    row, writer = codec.decode(value)
    assert row == {"id": "a", "n": 1} and registry.calls == calls  # learnt once: no more calls
    out = codec.encode({**row, "answer": {"label": "x"}}, writer)
    out_schema = await registry.latest("out-value")
    assert out[1:5] == out_schema.schema_id.to_bytes(4, "big")
    parsed = fastavro.parse_schema(orjson.loads(out_schema.text))
    back = fastavro.schemaless_reader(io.BytesIO(out[5:]), parsed, None)
    assert back == {"id": "a", "n": 1, "answer": '{"label":"x"}'}  # an object answer as its JSON text
    assert out_schema.text == avro_output_schema(orjson.dumps(SCHEMA).decode(), ("answer",))


async def test_what_cannot_be_decoded_says_why() -> None:
    registry = MemoryRegistry()
    codec = SourceCodec("avro", registry, out_topic="out", out_format="same", fields=("answer",))
    for value, reason in ((b"\x01abcdef", "magic byte 1"), (b"\x00\x00", "too short")):
        assert codec.missing(value) is None
        with pytest.raises(JobError, match=reason) as caught:
            codec.decode(value)
        assert caught.value.kind is ErrorKind.UNDECODABLE
    unknown = b"\x00\x00\x00\x00\x63payload"
    await codec.prepare(codec.missing(unknown) or (99, ()))
    with pytest.raises(JobError, match="no schema id 99"):
        codec.decode(unknown)
    json_schema_id = await registry.register("x-value", "JSON", "{}")
    mismatch = b"\x00" + json_schema_id.to_bytes(4, "big") + b"{}"
    await codec.prepare((json_schema_id, ()))
    with pytest.raises(JobError, match="is JSON, not AVRO"):
        codec.decode(mismatch)
    good = await registry.register("in-value", "AVRO", orjson.dumps(SCHEMA).decode())
    await codec.prepare((good, ()))
    with pytest.raises(JobError, match="cannot read the value"):
        codec.decode(b"\x00" + good.to_bytes(4, "big") + b"\xff")


async def test_a_registry_that_is_down_is_an_outage_not_an_undecodable_record() -> None:
    registry = MemoryRegistry()
    schema_id = await registry.register("in-value", "AVRO", orjson.dumps(SCHEMA).decode())
    codec = SourceCodec("avro", registry, out_topic="out", out_format="same", fields=("answer",))
    registry.down = True
    with pytest.raises(RegistryUnavailable):
        await codec.prepare((schema_id, ()))
    value = avro_value(schema_id, {"id": "a", "n": 1})
    assert codec.missing(value) == (schema_id, ())  # still to learn: its records wait
    registry.down = False
    await codec.prepare((schema_id, ()))
    assert codec.decode(value)[0] == {"id": "a", "n": 1}


def test_json_values_and_json_output() -> None:
    codec = SourceCodec("json", None, out_topic="out", out_format="same", fields=("answer",))
    assert codec.decode(b'{"a": 1}') == ({"a": 1}, (0, ()))
    with pytest.raises(JobError, match="not JSON"):
        codec.decode(b"{nope")
    assert orjson.loads(codec.encode({"a": 1, "answer": "x"}, (0, ()))) == {"a": 1, "answer": "x"}
    with pytest.raises(Exception, match="needs a Schema Registry"):
        SourceCodec("avro", None, out_topic="out", out_format="same", fields=("answer",))


def test_a_string_field_is_added_to_the_message_it_names() -> None:
    text = (
        'syntax = "proto3";\n// a { comment\nmessage Other { string x = 1; }\n'
        'message Review {\n  string id = 1; /* } */\n  message Inner { string y = 1; }\n'
        '  Inner inner = 2;\n  string note = 3; // "}"\n}\n'
    )
    out = with_string_field(text, "Review", "answer", 4)
    schema = ProtoSchema(out)
    review = schema.descriptor((1,))
    assert review.name == "Review" and review.fields_by_name["answer"].number == 4
    assert "answer" not in schema.descriptor((0,)).fields_by_name
    payload = schema.encode((1,), {"id": "r", "inner": {"y": "z"}, "answer": "yes"})
    assert schema.decode((1,), payload)["answer"] == "yes"


PROTO = (
    'syntax = "proto3";\nmessage Review {\n  string id = 1;\n  int32 n = 2;\n  repeated string tags = 3;\n}\n'
)
#: what an answer holds: none (a failure), text, or an object (a response_format's; a JSON int fits 64 bits)
ANSWERS = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3),
)
ERRORS = st.one_of(st.none(), st.fixed_dictionaries({"kind": st.sampled_from(["provider_error", "timeout"])}))


async def _prepared(fmt: str, text: str, value_of: Any, fields: tuple[str, ...]) -> tuple[SourceCodec, Any]:
    registry = MemoryRegistry()
    schema_id = await registry.register("in-value", "AVRO" if fmt == "avro" else "PROTOBUF", text)
    codec = SourceCodec(fmt, registry, out_topic="out", out_format="same", fields=fields)  # type: ignore[arg-type]
    await codec.prepare((schema_id, (0,) if fmt == "protobuf" else ()))
    return codec, value_of(schema_id)


@settings(max_examples=60)
@given(
    row=st.fixed_dictionaries({"id": st.text(max_size=30), "n": st.integers(-(2**31), 2**31 - 1)}),
    answer=ANSWERS,
    error=ERRORS,
)
async def test_an_avro_row_written_by_appending_to_its_input_is_the_row_encoded_whole(
    row: dict[str, Any], answer: Any, error: Any
) -> None:
    codec, value = await _prepared(
        "avro", orjson.dumps(SCHEMA).decode(), lambda i: avro_value(i, row), ("answer", "answer_error")
    )
    decoded, writer = codec.decode(value)
    enriched = enriched_value(decoded, "answer", answer, error)
    appended = codec.encode(enriched, writer, input_value=value)
    assert appended == codec.encode(enriched, writer)  # Avro's encoding of a row is one


@settings(max_examples=60)
@given(
    row=st.fixed_dictionaries(
        {
            "id": st.text(max_size=30),
            "n": st.integers(-(2**31), 2**31 - 1),
            "tags": st.lists(st.text(max_size=5)),
        }
    ),
    answer=ANSWERS,
)
async def test_a_protobuf_message_written_by_appending_to_its_input_decodes_as_the_row(
    row: dict[str, Any], answer: Any
) -> None:
    schema = ProtoSchema(PROTO)
    payload = schema.encode((0,), row)
    codec, value = await _prepared(
        "protobuf", PROTO, lambda i: b"\x00" + i.to_bytes(4, "big") + b"\x00" + payload, ("answer",)
    )
    decoded, writer = codec.decode(value)
    enriched = enriched_value(decoded, "answer", answer)
    appended = codec.encode(enriched, writer, input_value=value)
    whole = codec.encode(enriched, writer)
    out = ProtoSchema(with_string_field(PROTO, "Review", "answer", 4))
    assert appended[:6] == whole[:6]
    assert out.decode((0,), appended[6:]) == out.decode((0,), whole[6:])


async def test_a_field_the_input_schema_has_already_is_written_by_encoding_the_row_whole() -> None:
    schema = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "answer", "type": ["null", "string"]}]}
    registry = MemoryRegistry()
    schema_id = await registry.register("in-value", "AVRO", orjson.dumps(schema).decode())
    codec = SourceCodec("avro", registry, out_topic="out", out_format="same", fields=("answer",))
    await codec.prepare((schema_id, ()))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), {"id": "a", "n": 1, "answer": "old"})
    value = b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()
    decoded, writer = codec.decode(value)
    out = codec.encode(enriched_value(decoded, "answer", "new"), writer, input_value=value)
    out_schema = fastavro.parse_schema(orjson.loads((await registry.latest("out-value")).text))
    back = fastavro.schemaless_reader(io.BytesIO(out[5:]), out_schema, None)
    assert back == {"id": "a", "n": 1, "answer": "new"}


async def test_an_avro_value_longer_than_its_record_is_undecodable() -> None:
    codec, value = await _prepared(
        "avro", orjson.dumps(SCHEMA).decode(), lambda i: avro_value(i, {"id": "a", "n": 1}), ("answer",)
    )
    with pytest.raises(JobError, match="3 bytes follow the record") as caught:
        codec.decode(value + b"\x02\x02x")
    assert caught.value.kind is ErrorKind.UNDECODABLE


#: a response_format's schema of the shape structured extraction asks for
LABEL_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["positive", "negative"]},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "source": {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        "note": {"type": ["string", "null"]},
    },
    "required": ["label", "score"],
}
TYPED_ANSWERS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"label": st.sampled_from(["positive", "negative"]), "score": st.floats(allow_nan=False)},
        optional={
            "tags": st.lists(st.text(max_size=5), max_size=3),
            "source": st.fixed_dictionaries({"page": st.integers(-(2**63), 2**63 - 1)}),
            "note": st.one_of(st.none(), st.text(max_size=8)),
        },
    ),
)


def test_a_json_schema_maps_to_the_avro_type_that_holds_its_values() -> None:
    from consumer.registry.avro_types import avro_type

    made = avro_type(LABEL_SCHEMA, "promptbus_answer")
    assert made["type"] == "record" and made["name"] == "promptbus_answer"
    by_name = {f["name"]: f for f in made["fields"]}
    assert by_name["label"] == {"name": "label", "type": "string"}  # required: no null
    assert by_name["score"]["type"] == "double"
    tags_type = ["null", {"type": "array", "items": "string"}]
    assert by_name["tags"] == {"name": "tags", "type": tags_type, "default": None}
    assert by_name["source"]["type"][1]["fields"] == [{"name": "page", "type": "long"}]
    assert by_name["note"] == {"name": "note", "type": ["null", "string"], "default": None}
    fastavro.parse_schema(made)  # a schema Avro accepts
    assert avro_type({"type": "object", "additionalProperties": {"type": "integer"}}, "m") == {
        "type": "map", "values": "long",
    }
    # no Avro type: the field is then JSON text
    for schema in (
        {"type": "object"},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "object", "properties": {"not-a-name": {"type": "string"}}},
        {"type": ["string", "integer"]},
        {"type": "array"},
        {"$ref": "#/defs/x"},
    ):
        assert avro_type(schema, "x") is None, schema


@settings(max_examples=60)
@given(answer=TYPED_ANSWERS, error=ERRORS)
async def test_a_structured_answer_is_a_typed_avro_record_and_reads_back_as_the_object(
    answer: Any, error: Any
) -> None:
    from consumer.core.sources import ANSWER_ERROR_SCHEMA

    registry = MemoryRegistry()
    schema_id = await registry.register("in-value", "AVRO", orjson.dumps(SCHEMA).decode())
    fields = ("answer", "answer_error")
    schemas = {"answer": LABEL_SCHEMA, "answer_error": ANSWER_ERROR_SCHEMA}
    codec = SourceCodec("avro", registry, out_topic="out", out_format="same", fields=fields, schemas=schemas)
    await codec.prepare((schema_id, ()))
    value = avro_value(schema_id, {"id": "a", "n": 1})
    decoded, writer = codec.decode(value)
    if error is not None:
        error = {"kind": error["kind"], "message": "it failed"}
        answer = None
    enriched = enriched_value(decoded, "answer", answer, error)
    appended = codec.encode(enriched, writer, input_value=value)
    assert appended == codec.encode(enriched, writer)  # appended or encoded whole: one encoding
    out_schema = await registry.latest("out-value")
    assert out_schema.text == avro_output_schema(orjson.dumps(SCHEMA).decode(), fields, schemas)
    parsed = fastavro.parse_schema(orjson.loads(out_schema.text))
    back = fastavro.schemaless_reader(io.BytesIO(appended[5:]), parsed, None)
    assert back["id"] == "a" and back["answer_error"] == error
    if answer is None:
        assert back["answer"] is None
    else:  # the object itself, its optional properties null where the answer left them out
        expected = {"tags": None, "source": None, "note": None, **answer}
        assert back["answer"] == expected


async def test_an_answer_the_avro_type_cannot_hold_is_an_invalid_output() -> None:
    registry = MemoryRegistry()
    schema_id = await registry.register("in-value", "AVRO", orjson.dumps(SCHEMA).decode())
    schemas = {"answer": LABEL_SCHEMA}
    codec = SourceCodec("avro", registry, out_topic="out", out_format="same", fields=("answer",),
                        schemas=schemas)
    await codec.prepare((schema_id, ()))
    value = avro_value(schema_id, {"id": "a", "n": 1})
    decoded, writer = codec.decode(value)
    bad = enriched_value(decoded, "answer", {"label": "positive", "score": 1.0, "source": {"page": 2.5}})
    with pytest.raises(JobError, match="does not fit the output schema of out-value") as caught:
        codec.encode(bad, writer, input_value=value)
    assert caught.value.kind is ErrorKind.OUTPUT_INVALID


async def test_a_json_schema_output_gives_the_answer_its_schema() -> None:
    registry = MemoryRegistry()
    in_schema = {"type": "object", "properties": {"id": {"type": "string"}}}
    schema_id = await registry.register("in-value", "JSON", orjson.dumps(in_schema).decode())
    codec = SourceCodec(
        "json_schema", registry, out_topic="out", out_format="same", fields=("answer",),
        schemas={"answer": LABEL_SCHEMA},
    )
    await codec.prepare((schema_id, ()))
    out_schema = orjson.loads((await registry.latest("out-value")).text)
    assert out_schema["properties"]["answer"] == {"anyOf": [LABEL_SCHEMA, {"type": "null"}]}
    value = b"\x00" + schema_id.to_bytes(4, "big") + b'{"id": "a"}'
    decoded, writer = codec.decode(value)
    out = codec.encode(enriched_value(decoded, "answer", {"label": "positive", "score": 1}), writer)
    assert orjson.loads(out[5:]) == {"id": "a", "answer": {"label": "positive", "score": 1}}


NESTED_PROTO = (
    'syntax = "proto3";\npackage shop;\nmessage Other { message Line { string x = 1; } }\n'
    "message Order {\n  string id = 1;\n  message Line {\n    string sku = 1;\n    int32 qty = 2;\n  }\n"
    "  repeated Line lines = 2;\n}\n"
)


async def test_a_nested_protobuf_message_is_enriched_in_the_message_its_indexes_name() -> None:
    """Message indexes [1, 0]: the first message nested in the second top-level one (Order.Line,
    not Other.Line): the field is added there and nowhere else."""
    schema = ProtoSchema(NESTED_PROTO)
    payload = schema.encode((1, 0), {"sku": "k-1", "qty": 3})
    header_indexes = b"\x04\x02\x00"  # zigzag: count 2, then 1 and 0
    def wire(schema_id: int) -> bytes:
        return b"\x00" + schema_id.to_bytes(4, "big") + header_indexes + payload

    codec, value = await _prepared("protobuf", NESTED_PROTO, wire, ("answer",))
    missing = codec.missing(value)
    assert missing is not None and missing[1] == (1, 0)
    await codec.prepare(missing)
    decoded, writer = codec.decode(value)
    assert decoded == {"sku": "k-1", "qty": 3} and writer[1] == (1, 0)
    out = codec.encode(enriched_value(decoded, "answer", "ok"), writer, input_value=value)
    assert out[5:8] == header_indexes  # the output names the same nested message
    out_text = with_string_field(NESTED_PROTO, ("Order", "Line"), "answer", 3)
    out_schema = ProtoSchema(out_text)
    assert out_schema.decode((1, 0), out[8:]) == {"sku": "k-1", "qty": 3, "answer": "ok"}
    assert "answer" not in out_schema.descriptor((0, 0)).fields_by_name  # Other.Line untouched
    assert "answer" not in out_schema.descriptor((1,)).fields_by_name
