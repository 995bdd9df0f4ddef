"""Structured answers: how a `CompletionRequest.answer_schema` is enforced, per provider mode.

    json_schema   OpenAI, vLLM: response_format {type: json_schema, json_schema: {name, schema, strict: true}}
    json_object   llama.cpp server: response_format {type: json_object, schema}
    tool          Anthropic (and OpenAI function tools): one forced tool whose input is the answer
    off           the schema is not sent; the prompt alone asks for the shape

json_schema and tool need an object at the root. A schema with another root type (a job's
answer schema may be `{"type": "string"}`) is wrapped as `{"answer": <schema>}` and unwrapped
when the answer is read, so callers never see the wrapper.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import orjson

StructuredMode = Literal["json_schema", "json_object", "tool", "off"]
STRUCTURED_MODES: tuple[str, ...] = ("json_schema", "json_object", "tool", "off")

#: name of the schema (json_schema) or of the forced tool (tool mode)
SCHEMA_NAME = "answer"
TOOL_DESCRIPTION = "Record the answer. Always call this tool with the complete answer."
_WRAP_KEY = "answer"


def root_schema(schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(schema with an object root, whether it was wrapped)."""
    if schema.get("type") == "object":
        return dict(schema), False
    wrapped = {
        "type": "object",
        "properties": {_WRAP_KEY: dict(schema)},
        "required": [_WRAP_KEY],
        "additionalProperties": False,
    }
    return wrapped, True


def answer_text(value: Any, *, wrapped: bool) -> str:
    """A structured answer (tool input or parsed JSON) -> the Completion text.

    Unwraps a wrapped schema's answer; a string answer is returned as is, anything else as
    compact JSON.
    """
    if wrapped and isinstance(value, Mapping) and _WRAP_KEY in value:
        value = value[_WRAP_KEY]
        if isinstance(value, str):
            return value
    return orjson.dumps(value).decode()


def unwrap_json_text(text: str, *, wrapped: bool) -> str:
    """The text of a json_schema/json_object answer: the wrapper (if we added one) removed, and a
    JSON string answer (llama.cpp json_object with a string schema answers `"positive"`) decoded.
    Anything else, broken JSON included, is returned as it came (the caller's validation judges it)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if isinstance(value, str):
        return value
    return answer_text(value, wrapped=True) if wrapped else text
