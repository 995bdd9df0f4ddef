"""What a job's `options.response_format` asks of its output, and whether an output obeys it.

A job may ask for a JSON object (`{"type": "json_object"}`) or for JSON obeying a schema
(OpenAI's `{"type": "json_schema", "json_schema": {"schema": ...}}`, llama.cpp's
`{"type": "json_object", "schema": ...}`). Providers enforce that where they can, but not all
do (Anthropic has no such option; some local servers ignore it) and a batched request carries
the schema only as each alias's value: so every online output is checked before it is
published. One that does not obey is `output_invalid`; the plan first asks a batched member
again alone (`consumer.core.plan`).

A string schema's output is the bare string (a JSON string literal is unwrapped), as the
batched path yields it; any other output must hold JSON, which is what is published (a code
fence or prose around it is dropped, as for batched answers).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.validators import validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

from consumer.core.errors import ErrorKind, JobError
from consumer.core.packing import json_candidates

__all__ = ["OutputFormat", "job_answer_schema", "output_format", "response_format_schema"]

#: validation messages quote the offending value: keep them short
_MAX_MESSAGE_CHARS = 200
_decoder = json.JSONDecoder()
#: where a schema's `$ref`s are looked up: inside the schema only (and jsonschema's bundled
#: meta-schemas). jsonschema's default registry fetches any other URI with urllib: a request
#: from the service to wherever a job points, blocking the event loop.
_NO_RETRIEVAL = Registry()


def job_answer_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON Schema inside a job's `options.response_format`, in OpenAI's or llama.cpp's form."""
    if not isinstance(response_format, Mapping):
        return None
    schema = response_format.get("schema")
    if schema is None and isinstance(response_format.get("json_schema"), Mapping):
        schema = response_format["json_schema"].get("schema")
    return schema if isinstance(schema, dict) else None


def response_format_schema(response_format: Any) -> dict[str, Any] | None:
    """The schema a `response_format` puts on the answer, for requests that enforce it by a
    schema of their own (a batched answer's alias values, Anthropic's forced tool): its JSON
    Schema, `{"type": "object"}` for a plain JSON object, else None."""
    schema = job_answer_schema(response_format)
    if (
        schema is None
        and isinstance(response_format, Mapping)
        and response_format.get("type") == "json_object"
    ):
        return {"type": "object"}
    return schema


def _short(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."


def _json_in(output: str) -> tuple[str, Any] | None:
    """The JSON document an answer holds and its value: the answer itself, else the first
    code-fenced block, else the first object in prose around it, that parses; None: none."""
    for candidate in json_candidates(output):
        if not candidate:
            continue
        try:
            return candidate, orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
    start = output.find("{")
    if start >= 0:
        try:
            value, end = _decoder.raw_decode(output, start)
        except (ValueError, RecursionError):  # RecursionError: nested past the stack
            return None
        return output[start:end], value
    return None


def _not_json(output: str) -> str:
    try:
        orjson.loads(output)
    except orjson.JSONDecodeError as exc:
        return f"output is not JSON ({exc.msg} at char {exc.pos}); response_format asks for JSON"
    return "output is not JSON; response_format asks for JSON"


def _string_literal_value(output: str) -> str | None:
    """The string a JSON string literal holds; None when `output` is not one."""
    if len(output) < 2 or output[0] != '"':
        return None
    try:
        value = orjson.loads(output)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True, eq=False)
class OutputFormat:
    """A job's required output: a JSON object (`schema` None) or a value obeying `schema`.

    Compared and hashed by identity (`output_format` makes one per distinct schema), so a
    `Member` holding its `accept` method stays hashable.
    """

    schema: dict[str, Any] | None
    validator: Any = field(default=None, repr=False)

    @property
    def is_string(self) -> bool:
        return self.schema is not None and self.schema.get("type") == "string"

    def accept(self, output: str) -> tuple[str, str | None]:
        """The output as it is published, and what is wrong with it in one sentence (None: it
        obeys the format). A string schema's JSON string literal becomes the bare string
        (schema-constrained servers answer such a request in quotes); any other output is the
        JSON it holds, without the code fence or prose a model put around it."""
        value: Any
        if self.is_string:
            literal = _string_literal_value(output)
            published = value = output if literal is None else literal
        else:
            found = _json_in(output)
            if found is None:
                return output, _not_json(output)
            published, value = found
        return published, self._problem(value)

    def _problem(self, value: Any) -> str | None:
        if self.validator is None:
            if isinstance(value, dict):
                return None
            kind = type(value).__name__
            return f"output is a JSON {kind}; response_format asks for a JSON object"
        try:
            error = best_match(self.validator.iter_errors(value))
        except RecursionError:
            return "output is nested too deeply to check against the response_format schema"
        except Unresolvable as exc:  # a `$dynamicRef`: `$ref`s were checked at intake
            return f"the response_format schema's reference does not resolve: {_short(str(exc))}"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        return f"output does not match the response_format schema at {where}: {_short(error.message)}"


_JSON_OBJECT = OutputFormat(None)


def _unresolvable_ref(schema: dict[str, Any]) -> str | None:
    """The first `$ref` of `schema` that does not resolve inside it; None when all do.

    Walks the subschemas as the schema's dialect defines them (so a `$ref` key inside an
    `enum` value is not taken for one), each `$ref` looked up from the resource it is in.
    """
    specification = specification_with(str(schema.get("$schema", "")), default=DRAFT202012)
    root = specification.create_resource(schema)
    pending = [(root, _NO_RETRIEVAL.resolver_with_root(root))]
    while pending:
        resource, resolver = pending.pop()
        resolver = resolver.in_subresource(resource)
        ref = resource.contents.get("$ref") if isinstance(resource.contents, Mapping) else None
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except Unresolvable:
                return ref
        pending.extend((sub, resolver) for sub in resource.subresources())
    return None


def _invalid_schema(reason: str) -> JobError:
    return JobError(ErrorKind.INVALID_JOB, f"options.response_format: {reason}")


@functools.lru_cache(maxsize=256)
def _compiled(schema_json: bytes) -> OutputFormat:
    schema = orjson.loads(schema_json)
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
        unresolvable = _unresolvable_ref(schema)
    except SchemaError as exc:
        raise _invalid_schema(f"the schema is not a valid JSON Schema: {_short(exc.message)}") from None
    except RecursionError:
        raise _invalid_schema("the schema is nested too deeply to check outputs against") from None
    if unresolvable is not None:
        reason = f"the schema's $ref {_short(unresolvable)!r} does not resolve inside the schema"
        raise _invalid_schema(f"{reason} (references are not fetched)")
    return OutputFormat(schema, cls(schema, registry=_NO_RETRIEVAL))


def output_format(options: Mapping[str, Any]) -> OutputFormat | None:
    """What `options.response_format` asks of the output; None when it asks for nothing checkable
    (no response_format, or `{"type": "text"}`).

    Raises `JobError(INVALID_JOB)` when it names a schema outputs cannot be checked against:
    not a valid JSON Schema, a `$ref` out of the schema, nested too deeply. Schemas are
    compiled once per distinct schema (most jobs of a stream share theirs).
    """
    response_format = options.get("response_format")
    if not isinstance(response_format, Mapping):
        return None
    schema = job_answer_schema(response_format)
    if schema is None:
        return _JSON_OBJECT if response_format.get("type") == "json_object" else None
    try:
        key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # cannot happen for a schema parsed from JSON; be clear anyway
        raise _invalid_schema("the schema is not JSON") from None
    return _compiled(key)
