"""Fuzz target `output`: `OutputFormat.accept`, a model's output checked against the job's
response_format before it is published.

Contract (`consumer.core.output`): never raises; returns the text to publish and None (it
obeys) or a one-line-ish problem sentence.
"""

from __future__ import annotations

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


def check_output(fmt: OutputFormat, output: str) -> None:
    """accept's verdict on `output`, checked against the contract."""
    published, problem = fmt.accept(output)
    assert isinstance(published, str)
    assert problem is None or (isinstance(problem, str) and problem)


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
