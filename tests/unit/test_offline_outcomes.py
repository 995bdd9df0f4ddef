"""A finished provider batch's answers are checked against each job's output format too."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from consumer.core.completion import Completion, Usage
from consumer.providers.base import BatchItemResult, BatchStatus
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
        BatchItemResult(f"c{i}", Completion(text, "stop", Usage(3, 1), "openai", "m"))
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
