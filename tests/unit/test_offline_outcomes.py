"""A finished provider batch's members: what each item means for its job (the pure decision,
`item_outcome`) and the records published for it (`outcome_records`)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from consumer.core.completion import Completion, Usage
from consumer.core.embed import Embeddings
from consumer.core.errors import ErrorKind, ProviderError
from consumer.core.jobs import Job
from consumer.core.offline import Answered, BatchItemResult, BatchStatus, Failed, item_outcome
from consumer.runtime.offline import outcome_records, read_batch_record
from consumer.testing.harness import service_env, settings_from_env


def _member(i: int, options: dict[str, Any]) -> dict[str, Any]:
    job = {
        "id": f"j{i}",
        "tier": "small",
        "prompt": "Label: ${x}",
        "variables": {"x": "t"},
        "options": options,
    }
    return {"custom_id": f"c{i}", "job": job, "source": {"topic": "jobs", "partition": 0, "offset": i}}


def test_batch_answers_that_break_the_output_format_are_output_invalid() -> None:
    settings = settings_from_env(service_env("127.0.0.1:9"))
    label = {"type": "string", "enum": ["yes", "no"]}
    plain_text = {"response_format": {"type": "text"}}  # overrides the tier's: nothing to check
    as_schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": label}}}
    record = {
        "tier": "small",
        "provider": "openai",
        "batch_id": "b1",
        "submitted_at": 0,
        "members": [_member(0, as_schema), _member(1, as_schema), _member(2, plain_text), _member(3, {})],
    }
    answers = ['"yes"', "maybe", "free text", "free text"]
    items = [
        BatchItemResult(f"c{i}", Completion(text, "stop", usage=Usage(3, 1), provider="openai", model="m"))
        for i, text in enumerate(answers)
    ]
    # job j3 gets the tier's options: a JSON object is asked for, and "free text" is not one
    records = outcome_records(
        settings, record, BatchStatus.COMPLETED, items, {"response_format": {"type": "json_object"}}
    )
    by_key = {r.key: (r.topic, orjson.loads(r.value or b"")) for r in records}
    assert by_key[b"j0"][0] == settings.results_topic
    assert by_key[b"j0"][1]["output"] == "yes"  # a string schema's literal is published bare
    topic, dead = by_key[b"j1"]
    assert topic == settings.dlq_topic and dead["error"]["kind"] == "output_invalid"
    assert dead["error"]["message"].startswith("output does not match the response_format schema")
    assert by_key[b"j2"][0] == settings.results_topic and by_key[b"j2"][1]["output"] == "free text"
    topic, dead = by_key[b"j3"]
    assert topic == settings.dlq_topic and dead["error"]["kind"] == "output_invalid"


def test_batches_topic_records_are_read_or_refused_with_the_reason() -> None:
    record = {
        "tier": "small",
        "provider": "openai",
        "batch_id": "b1",
        "submitted_at": 0,
        "members": [_member(0, {})],
    }
    assert read_batch_record(orjson.dumps(record)) == record
    broken_job = {**record, "members": [{**_member(1, {}), "job": {"id": "j1"}}]}
    refused = {
        b"not json": "batch record: Invalid JSON",
        b"[1]": "batch record: Input should be an object",
        orjson.dumps({"tier": "small", "members": []}): "field 'batch_id': Field required",
        orjson.dumps(broken_job): "field 'members.0.job.tier': Field required",
    }
    for value, reason in refused.items():
        with pytest.raises(ValueError) as info:
            read_batch_record(value)
        assert str(info.value).startswith(reason), (value, str(info.value))


def _job(options: dict[str, Any] | None = None) -> Job:
    return Job.model_validate({"id": "j1", "tier": "small", "prompt": "p", "options": options or {}})


def _answer(text: str) -> Completion:
    return Completion(text, "stop", usage=Usage(3, 1), provider="openai", model="m")


def _vectors(n: int) -> Embeddings:
    vectors = tuple((0.1 * i, 0.2) for i in range(n))
    return Embeddings(vectors=vectors, usage=Usage(3), provider="openai", model="e")


#: not a JSON Schema: outputs cannot be checked against it
BROKEN_SCHEMA = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": 9}}}
}
LABEL_SCHEMA = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": {"type": "string", "enum": ["yes", "no"]}},
    }
}


@pytest.mark.parametrize(
    ("item", "options", "tier_options", "expected"),
    [
        # an answer the job's own format accepts: published as the format reads it
        (BatchItemResult("c", _answer('"yes"')), LABEL_SCHEMA, {}, ("answered", "yes")),
        (BatchItemResult("c", _answer("free text")), {}, {}, ("answered", "free text")),
        # the tier's options hold under the job's: the job's text format overrides a JSON one
        (BatchItemResult("c", _answer("free")), {"response_format": {"type": "text"}},
         {"response_format": {"type": "json_object"}}, ("answered", "free")),
        (BatchItemResult("c", _answer("free")), {}, {"response_format": {"type": "json_object"}},
         ("failed", ErrorKind.OUTPUT_INVALID)),
        (BatchItemResult("c", _answer("maybe")), LABEL_SCHEMA, {}, ("failed", ErrorKind.OUTPUT_INVALID)),
        # the tier's options changed since the job was read: its format cannot be checked
        (BatchItemResult("c", _answer("x")), {}, BROKEN_SCHEMA, ("failed", ErrorKind.OUTPUT_INVALID)),
    ],
)
def test_an_answered_item_ends_as_its_output_format_says(
    item: BatchItemResult, options: dict[str, Any], tier_options: dict[str, Any], expected: tuple[str, Any]
) -> None:
    outcome = item_outcome(item, _job(options), BatchStatus.COMPLETED, "b1", tier_options)
    if expected[0] == "answered":
        assert isinstance(outcome, Answered)
        assert (outcome.output, outcome.embedding, outcome.answer) == (expected[1], None, item.completion)
    else:
        assert isinstance(outcome, Failed)
        assert (outcome.kind, outcome.status_code) == (expected[1], None)


def test_an_embedding_item_is_one_vector() -> None:
    one = item_outcome(BatchItemResult("c", _vectors(1)), _job(), BatchStatus.COMPLETED, "b1", {})
    assert isinstance(one, Answered) and one.output is None and one.embedding == (0.0, 0.2)
    two = item_outcome(BatchItemResult("c", _vectors(2)), _job(), BatchStatus.COMPLETED, "b1", {})
    assert two == Failed(ErrorKind.OUTPUT_INVALID, "the batch answered 2 vectors for one input")


EXPIRED = "provider batch b1 expired before this item ran"


@pytest.mark.parametrize(
    ("item", "status", "expected"),
    [
        (BatchItemResult("c", error=ProviderError("ran out", status_code=500), expired=True),
         BatchStatus.COMPLETED, Failed(ErrorKind.BATCH_EXPIRED, EXPIRED, 500)),
        (None, BatchStatus.EXPIRED, Failed(ErrorKind.BATCH_EXPIRED, EXPIRED)),
        (BatchItemResult("c", error=ProviderError("bad input", status_code=400)), BatchStatus.COMPLETED,
         Failed(ErrorKind.BATCH_FAILED, "batch item failed: bad input", 400)),
        (None, BatchStatus.CANCELLED,
         Failed(ErrorKind.BATCH_FAILED, "provider batch b1 ended cancelled without this item")),
        (None, BatchStatus.COMPLETED,
         Failed(ErrorKind.BATCH_FAILED, "provider batch b1 ended completed without this item")),
    ],
)
def test_an_item_without_an_answer_is_a_dead_letter_naming_why(
    item: BatchItemResult | None, status: BatchStatus, expected: Failed
) -> None:
    assert item_outcome(item, _job(), status, "b1", {}) == expected
