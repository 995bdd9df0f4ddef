"""Fuzz target `answer`: `packing.parse_answer`, a model's text answer to a batched request.

Contract (`consumer.core.packing` module doc): never raises; returns an `AnswerVerdict` of
one of the five kinds, whose answers are keyed by the request's aliases only, whose `missing`
is every other alias in request order, and whose answers can be published (UTF-8 text: a
Result record is orjson, which refuses lone surrogates).
"""

from __future__ import annotations

import json
import random

from hypothesis import example, given
from hypothesis import strategies as st

from consumer.core.packing import AnswerKind, AnswerVerdict, make_aliases, parse_answer, strip_code_fence
from tests.fuzz._harness import (
    awkward,
    awkward_text,
    fuzz_settings,
    json_values,
    mutated,
    nested,
    run_budget,
    text_of,
)

ALIASES = make_aliases(3, random.Random(7))
A, B, C = ALIASES
FINISH_REASONS = ("stop", "length", None)


def check_answer(text: str, aliases: tuple[str, ...], finish_reason: str | None) -> AnswerVerdict:
    """parse_answer's verdict on `text`, once it is checked to be one the contract allows."""
    verdict = parse_answer(text, aliases, finish_reason)
    assert isinstance(verdict, AnswerVerdict)
    assert verdict.kind in AnswerKind
    assert set(verdict.answers) <= set(aliases)
    for answer in verdict.answers.values():
        assert isinstance(answer, str)
        answer.encode("utf-8")  # publishable: raises on a lone surrogate
    assert verdict.missing == tuple(a for a in aliases if a not in verdict.answers)
    assert not set(verdict.unexpected) & set(aliases)
    if verdict.kind in (AnswerKind.MALFORMED, AnswerKind.UNEXPECTED):
        assert not verdict.answers
    if verdict.kind == AnswerKind.UNEXPECTED:
        assert verdict.unexpected
    if verdict.kind == AnswerKind.COMPLETE:
        assert not verdict.missing
    if finish_reason == "length":
        assert verdict.kind in (AnswerKind.TRUNCATED, AnswerKind.UNEXPECTED)
    else:
        assert verdict.kind != AnswerKind.TRUNCATED
    strip_code_fence(text)
    return verdict


def fuzz_one(data: bytes) -> None:
    """First byte: the finish reason; the rest: the answer text."""
    if data:
        check_answer(text_of(data[1:]), ALIASES, FINISH_REASONS[data[0] % len(FINISH_REASONS)])


#: an answer cut at max_tokens
SEED_CUT = f'{{"{A}": "positive", "{B}": "nega'
#: answers as models give them: bare, fenced, in prose, wrapped, as items, cut, nested values
SEED_TEXTS = [
    json.dumps({A: "positive", B: "negative", C: "neutral"}),
    f'```json\n{{"{A}": "positive", "{B}": "negative", "{C}": "neutral"}}\n```',
    f'Here are the answers:\n{{"{A}": "yes", "{B}": "no", "{C}": "maybe"}}\nHope this helps!',
    json.dumps({"answers": {A: "x", B: "y", C: "z"}}),
    json.dumps([{"id": A, "output": "x"}, {"id": B, "output": "y"}, {"id": C, "output": "z"}]),
    SEED_CUT,
    f'{{"{A}": {{"label": "spam", "score": 0.9}}, "{B}": [1, 2], "{C}": 12}}',
    f'{{"{A}": "\\"quoted\\"", "{B}": null, "{C}": true}}',
    f'{{"{A}": "x", "zz99": "foreign"}}',
    "I cannot help with that.",
    "{}",
]
#: the seeds as `fuzz_one` reads them: a cut answer with finish reason "length", the rest "stop"
SEEDS = [bytes([1 if t == SEED_CUT else 0]) + t.encode() for t in SEED_TEXTS]

finish_reasons = st.sampled_from(FINISH_REASONS)
alias_keys = st.one_of(st.sampled_from(ALIASES), st.sampled_from(("id", "answers", "zz99")), awkward_text)


@st.composite
def json_answers(draw: st.DrawFn) -> str:
    """A JSON-ish answer: a value with alias keys, dumped one way, maybe cut, maybe wrapped."""
    value = draw(json_values(alias_keys, strings=awkward(surrogates=True)))
    indent = draw(st.sampled_from((None, 2)))
    text = json.dumps(value, ensure_ascii=draw(st.booleans()), indent=indent)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # a model's text holds no lone surrogate (its body was UTF-8), only their JSON escapes
        text = json.dumps(value, indent=indent)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    before, after = draw(st.sampled_from((("", ""), ("```json\n", "\n```"), ("Sure! ", " Done."))))
    return before + text + after


@fuzz_settings
@given(data=st.binary(max_size=400))
@example(data=b"\x00" + f'{{"{A}": "\\ud800"}}'.encode())  # a JSON escape of a lone surrogate
@example(data=b"\x01" + f'{{"{A}": "\\udfff", "{B}": "ok"'.encode())
@example(data=b"\x00" + nested(5000, open_='{"a":', close="}").encode())
def _raw_bytes(data: bytes) -> None:
    fuzz_one(data)


@fuzz_settings
@given(text=mutated(SEED_TEXTS), finish_reason=finish_reasons)
def _mutated_seeds(text: str, finish_reason: str | None) -> None:
    check_answer(text, ALIASES, finish_reason)


@fuzz_settings
@given(text=json_answers(), finish_reason=finish_reasons)
def _json_answers(text: str, finish_reason: str | None) -> None:
    check_answer(text, ALIASES, finish_reason)


def test_raw_bytes() -> None:
    run_budget(_raw_bytes)


def test_mutated_seeds() -> None:
    run_budget(_mutated_seeds)


def test_json_answers() -> None:
    run_budget(_json_answers)


def test_seeds_are_realistic() -> None:
    """The seeds reach the verdicts they are meant to (so mutating them explores near-valid input)."""
    kinds = {check_answer(text_of(s[1:]), ALIASES, FINISH_REASONS[s[0]]).kind for s in SEEDS}
    assert kinds == set(AnswerKind)
