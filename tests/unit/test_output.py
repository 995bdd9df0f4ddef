"""A job's response_format, checked against each output (output_invalid)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from consumer.core.errors import ErrorKind, JobError
from consumer.core.output import (
    OutputFormat,
    job_answer_schema,
    output_format,
    response_format_schema,
)

LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["positive", "negative"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def _openai(schema: dict[str, object]) -> dict[str, object]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def _fmt(options: Mapping[str, Any]) -> OutputFormat:
    fmt = output_format(options)
    assert fmt is not None
    return fmt


def test_nothing_to_check_without_a_json_response_format() -> None:
    assert output_format({}) is None
    assert output_format({"temperature": 0}) is None
    assert output_format({"response_format": {"type": "text"}}) is None
    assert output_format({"response_format": "json"}) is None


def test_json_object_wants_a_json_object() -> None:
    fmt = _fmt({"response_format": {"type": "json_object"}})
    assert fmt.accept('{"a": 1}')[1] is None
    assert fmt.accept("[1, 2]")[1] == "output is a JSON list; response_format asks for a JSON object"
    problem = fmt.accept("Sure! {")[1]
    assert problem is not None and problem.startswith("output is not JSON (")


def test_schema_in_openai_and_llama_cpp_form() -> None:
    for options in (_openai(LABEL), {"response_format": {"type": "json_object", "schema": LABEL}}):
        fmt = _fmt(options)
        assert fmt.accept('{"label": "positive"}')[1] is None
        assert fmt.accept('{"label": "maybe"}')[1] == (
            "output does not match the response_format schema at label: "
            "'maybe' is not one of ['positive', 'negative']"
        )
        assert fmt.accept("{}")[1] == (
            "output does not match the response_format schema at the top level: "
            "'label' is a required property"
        )
        assert fmt.accept("positive")[1] is not None  # not JSON


def test_string_schema_takes_the_bare_string_or_a_json_string_literal() -> None:
    fmt = _fmt(_openai({"type": "string", "enum": ["positive", "negative"]}))
    assert fmt.accept("positive")[1] is None
    assert fmt.accept('"negative"')[1] is None
    assert fmt.accept("neutral")[1] is not None
    assert fmt.accept('"negative"')[0] == "negative"
    assert fmt.accept("positive")[0] == "positive"
    # other formats publish the output as it came
    assert _fmt(_openai(LABEL)).accept('"x"')[0] == '"x"'


def test_a_schema_that_is_not_json_schema_is_a_bad_job() -> None:
    with pytest.raises(JobError) as info:
        output_format(_openai({"type": "objekt"}))
    assert info.value.kind is ErrorKind.INVALID_JOB
    assert str(info.value).startswith("options.response_format: the schema is not a valid JSON Schema: ")


def test_references_resolve_inside_the_schema() -> None:
    labels = {"$defs": {"label": {"enum": ["positive", "negative"]}}}
    by_ref = _fmt(_openai({**labels, "type": "object", "properties": {"label": {"$ref": "#/$defs/label"}}}))
    assert by_ref.accept('{"label": "negative"}')[1] is None
    assert "'maybe' is not one of" in str(by_ref.accept('{"label": "maybe"}')[1])
    tree = _fmt(_openai({"type": "object", "properties": {"child": {"$ref": "#"}}}))
    assert tree.accept('{"child": {"child": {}}}')[1] is None
    assert tree.accept('{"child": {"child": 3}}')[1] == (
        "output does not match the response_format schema at child/child: 3 is not of type 'object'"
    )
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "integer"}},
        "type": "object",
        "properties": {"n": {"$ref": "#/definitions/n"}},
    }
    assert _fmt(_openai(draft7)).accept('{"n": "x"}')[1] is not None
    # a sub-resource's "#" is the sub-resource, not the root
    nested = {
        "$id": "https://schemas.example/root",
        "type": "object",
        "properties": {
            "p": {
                "$id": "sub",
                "$defs": {"s": {"type": "string"}},
                "type": "object",
                "properties": {"q": {"$ref": "#/$defs/s"}},
            }
        },
    }
    assert _fmt(_openai(nested)).accept('{"p": {"q": 1}}')[1] is not None


def test_a_reference_outside_the_schema_is_a_bad_job_and_is_never_fetched() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        remote = f"http://127.0.0.1:{port}/label.json"
        with pytest.raises(JobError) as info:
            output_format(_openai({"type": "object", "properties": {"label": {"$ref": remote}}}))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected: the schema was not fetched
    assert info.value.kind is ErrorKind.INVALID_JOB
    assert str(info.value) == (
        f"options.response_format: the schema's $ref '{remote}' does not resolve inside the schema"
        " (references are not fetched)"
    )
    with pytest.raises(JobError, match="'#/\\$defs/nope' does not resolve"):
        output_format(_openai({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}))
    # a "$ref" key inside a value (an enum member) is data, not a reference
    as_data = _fmt(_openai({"enum": [{"$ref": remote}]}))
    assert as_data.accept(orjson.dumps({"$ref": remote}).decode())[1] is None


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_nesting_past_the_stack_is_a_bad_job_or_a_problem_never_an_exception() -> None:
    with pytest.raises(JobError) as info:
        output_format(_openai(_nested_schema(120)))
    assert info.value.kind is ErrorKind.INVALID_JOB
    assert str(info.value) == (
        "options.response_format: the schema is nested too deeply to check outputs against"
    )
    fmt = _fmt(_openai(_nested_schema(20)))
    assert fmt.accept(orjson.dumps({"x": "shallow"}).decode())[1] is not None
    deep_output = '{"x":' * 5000
    assert fmt.accept("Here: " + deep_output)[1] is not None
    assert _fmt({"response_format": {"type": "json_object"}}).accept("Here: " + deep_output)[1] is not None


def test_equal_schemas_compile_once_whatever_their_key_order() -> None:
    reordered = dict(reversed(list(LABEL.items())))
    assert output_format(_openai(LABEL)) is output_format(
        {"response_format": {"type": "json_object", "schema": reordered}}
    )


def test_long_validation_messages_are_cut() -> None:
    fmt = _fmt(_openai({"type": "object", "properties": {"a": {"enum": ["x"]}}}))
    problem = fmt.accept('{"a": "' + "y" * 1000 + '"}')[1]
    assert problem is not None and problem.endswith("...") and len(problem) < 300


def test_job_answer_schema_reads_both_forms() -> None:
    assert job_answer_schema({"type": "json_schema", "json_schema": {"schema": LABEL}}) == LABEL
    assert job_answer_schema({"type": "json_object", "schema": LABEL}) == LABEL
    assert job_answer_schema({"type": "json_object"}) is None
    assert job_answer_schema(None) is None


def test_the_schema_a_response_format_puts_on_an_answer() -> None:
    assert response_format_schema({"type": "json_schema", "json_schema": {"schema": LABEL}}) == LABEL
    assert response_format_schema({"type": "json_object", "schema": LABEL}) == LABEL
    assert response_format_schema({"type": "json_object"}) == {"type": "object"}
    assert response_format_schema({"type": "text"}) is None
    assert response_format_schema(None) is None


def test_json_in_a_code_fence_or_prose_is_taken_out_and_published() -> None:
    fmt = _fmt(_openai(LABEL))
    fenced = 'Here you go:\n```json\n{"label": "negative"}\n```'
    assert fmt.accept(fenced)[1] is None
    assert fmt.accept(fenced)[0] == '{"label": "negative"}'
    prose = 'Sure! {"label": "positive"} Hope that helps.'
    assert fmt.accept(prose)[1] is None
    assert fmt.accept(prose)[0] == '{"label": "positive"}'
    # what is taken out is what is checked
    bad = '```json\n{"label": "maybe"}\n```'
    assert fmt.accept(bad)[0] == '{"label": "maybe"}'
    problem = fmt.accept(bad)[1]
    assert problem is not None and "'maybe' is not one of" in problem
    # no JSON at all: published as it came, and not JSON
    assert fmt.accept("no idea")[0] == "no idea"
    problem = fmt.accept("no idea { at all")[1]
    assert problem is not None and problem.startswith("output is not JSON (")
    anything = _fmt({"response_format": {"type": "json_object"}})
    assert anything.accept('  {"a": 1}  ') == ('{"a": 1}', None)
    published, problem = anything.accept("plain words")
    assert published == "plain words" and problem is not None and problem.startswith("output is not JSON (")
