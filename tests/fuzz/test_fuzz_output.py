"""Fuzz target `output`: `OutputFormat.accept`, a model's output checked against the job's
response_format before it is published.

Contract (`consumer.core.output`): never raises; returns the text to publish and None (it
obeys) or a one-line-ish problem sentence. "It obeys" is checked independently here: the
published text is JSON (orjson, as the results' readers parse it) and, checked with jsonschema
against the job's schema, valid (a string schema: the bare string is); a plain JSON object
format: an object. And a problem is only said of a text that does not obey.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.output import OutputFormat, output_format
from tests.fuzz._harness import awkward_text, fuzz_settings, mutated, nested, run_budget, text_of

_FORMATS = [
    output_format({"response_format": {"type": "json_object"}}),
    output_format(
        {"response_format": {"type": "json_object", "schema": {"type": "string", "enum": ["a", "b"]}}}
    ),
    output_format(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "r",
                    "schema": {
                        "type": "object",
                        "properties": {"score": {"type": "integer"}, "tags": {"type": "array"}},
                        "required": ["score"],
                    },
                },
            }
        }
    ),
]
FORMATS: list[OutputFormat] = [f for f in _FORMATS if f is not None]
_NOT_JSON = object()


def _value_of(fmt: OutputFormat, published: str) -> Any:
    """What a reader of the result gets: the bare string (string schema), else the JSON value."""
    if fmt.is_string:
        return published
    try:
        return orjson.loads(published)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _obeys(fmt: OutputFormat, value: Any) -> bool | None:
    """Whether `value` obeys the format, by jsonschema on its own (None: too deep to tell)."""
    if value is _NOT_JSON:
        return False
    if fmt.schema is None:
        return isinstance(value, dict)
    try:
        jsonschema.validate(value, fmt.schema)
    except jsonschema.ValidationError:
        return False
    except RecursionError:
        return None
    return True


def check_output(fmt: OutputFormat, output: str) -> None:
    """accept's verdict on `output`, checked against the contract and against jsonschema."""
    published, problem = fmt.accept(output)
    assert isinstance(published, str)
    assert problem is None or (isinstance(problem, str) and problem)
    obeys = _obeys(fmt, _value_of(fmt, published))
    if problem is None:
        assert obeys is True, f"no problem said, but {published[:200]!r} does not obey {fmt.schema}"
    elif obeys is True:
        raise AssertionError(f"{problem!r} said of {published[:200]!r}, which obeys {fmt.schema}")


def fuzz_one(data: bytes) -> None:
    """First byte: which format; the rest: the output text."""
    if data:
        check_output(FORMATS[data[0] % len(FORMATS)], text_of(data[1:]))


SEED_TEXTS = [
    '{"score": 3, "tags": ["x"]}',
    '```json\n{"score": 1}\n```',
    '"a"',
    "b",
    'Sure: {"score": 2}',
    '{"score": "high"}',
    "[1, 2]",
    nested(2000),
]
SEEDS = [bytes([i % len(FORMATS)]) + t.encode() for i, t in enumerate(SEED_TEXTS)]


@fuzz_settings
@given(data=st.binary(max_size=200))
def _raw_bytes(data: bytes) -> None:
    fuzz_one(data)


@fuzz_settings
@given(fmt=st.sampled_from(FORMATS), text=st.one_of(mutated(SEED_TEXTS), awkward_text))
def _mutated_seeds(fmt: OutputFormat, text: str) -> None:
    check_output(fmt, text)


def test_raw_bytes() -> None:
    run_budget(_raw_bytes)


def test_mutated_seeds() -> None:
    run_budget(_mutated_seeds)


def test_formats_are_built() -> None:
    assert len(FORMATS) == 3 and FORMATS[1].is_string
