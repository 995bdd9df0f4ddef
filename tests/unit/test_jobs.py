"""Job / Result / DeadLetter models: strict decoding, clear errors, compact encoding."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.errors import ErrorKind, JobError
from consumer.core.jobs import (
    BatchInfo,
    DeadLetter,
    ErrorInfo,
    Job,
    JobOptions,
    Result,
    SourceRef,
    UsageInfo,
    decode_job,
    encode,
)


def _raw(**fields: object) -> bytes:
    base: dict[str, object] = {"id": "j1", "tier": "small", "prompt": "Summarize: ${text}"}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


def _error(raw: bytes) -> str:
    with pytest.raises(JobError) as info:
        decode_job(raw)
    assert info.value.kind is ErrorKind.INVALID_JOB
    return str(info.value)


def test_minimal_prompt_job_defaults() -> None:
    job = decode_job(_raw(variables={"text": "hello"}))
    assert job.id == "j1" and job.tier == "small"
    assert job.variables == {"text": "hello"}
    assert job.options == {} and job.batch is False and job.mode is None and job.fallback is True
    assert job.deadline is None and job.metadata is None and job.messages is None


def test_messages_job() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    job = decode_job(_raw(prompt=..., messages=messages))
    assert job.messages is not None and [m.role for m in job.messages] == ["system", "user"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"id": "x", ', "not JSON"),
        (b"", "not JSON"),
        (b"[1, 2]", "not a JSON object (got list)"),
        (b'"text"', "not a JSON object (got str)"),
    ],
)
def test_undecodable_bytes(raw: bytes, expected: str) -> None:
    assert expected in _error(raw)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"variables": {"text": 1}}, "field 'variables.text': Input should be a valid string"),
        ({"id": ""}, "field 'id': String should have at least 1 character"),
        ({"id": "x" * 257}, "field 'id': String should have at most 256 characters"),
        ({"id": 7}, "field 'id': Input should be a valid string"),
        ({"id": ...}, "field 'id': Field required"),
        ({"tier": ""}, "field 'tier'"),
        ({"varaibles": {}}, "field 'varaibles': Extra inputs are not permitted"),
        ({"batch": "yes"}, "field 'batch': Input should be a valid boolean"),
        ({"batch": 1}, "field 'batch'"),
        ({"mode": "later"}, "field 'mode': Input should be 'online', 'offline' or 'auto'"),
        ({"prompt": ..., }, "exactly one of 'prompt' or 'messages' is required"),
        ({"messages": [{"role": "user", "content": "x"}]}, "exactly one of 'prompt' or 'messages'"),
        ({"prompt": ..., "messages": []}, "field 'messages'"),
        ({"prompt": ..., "messages": [{"role": "robot", "content": "x"}]}, "field 'messages.0.role'"),
        ({"prompt": ..., "messages": [{"role": "user", "content": "x"}], "variables": {"a": "b"}},
         "'variables' is only allowed with 'prompt'"),
        ({"deadline": 1767225600}, "field 'deadline': must be an RFC 3339 date-time string"),
        ({"deadline": "2026-01-01T00:00:00"}, "field 'deadline': must carry a time zone offset"),
        ({"deadline": "tomorrow"}, "field 'deadline'"),
        ({"options": []}, "field 'options'"),
        ({"options": {"max_tokens": "50"}}, "field 'options.max_tokens': Input should be a valid integer"),
        ({"options": {"max_tokens": 0}}, "field 'options.max_tokens': Input should be greater than or equal"),
        ({"options": {"max_tokens": True}}, "field 'options.max_tokens'"),
        ({"options": {"temperature": "hot"}}, "field 'options.temperature"),
        ({"options": {"top_p": 2}}, "field 'options.top_p"),
        ({"options": {"stop": ["a", 1]}}, "field 'options.stop"),
        ({"options": {"seed": 1.5}}, "field 'options.seed'"),
        ({"options": {"response_format": "json"}}, "field 'options.response_format'"),
        ({"metadata": "x"}, "field 'metadata'"),
    ],
)
def test_schema_errors_name_field_and_problem(fields: dict[str, object], expected: str) -> None:
    assert expected in _error(_raw(**fields))


def test_error_message_never_echoes_values_and_is_bounded() -> None:
    secret = "s3cr3t-" + "x" * 10_000
    message = _error(_raw(id=secret * 2, tier=5, variables={"a": 1, "b": 2, "c": 3, "d": 4}))
    assert "s3cr3t" not in message
    assert "and 3 more" in message and len(message) < 400


def test_known_options_are_checked_and_others_pass_through() -> None:
    options = {"max_tokens": 50, "temperature": 0.5, "top_p": 1, "seed": 7, "stop": "\n",
               "response_format": {"type": "json_object"}, "logit_bias": {"50256": -100}, "n": 1}
    job = decode_job(_raw(options=options))
    assert job.options == options and isinstance(job.options, dict)


def test_deadline_is_normalized_to_utc_and_encoded_with_z() -> None:
    job = decode_job(_raw(deadline="2026-01-01T02:00:00+02:00"))
    assert job.deadline == datetime(2026, 1, 1, tzinfo=UTC)
    assert b'"deadline":"2026-01-01T00:00:00Z"' in encode(job)


def test_job_roundtrip_through_encode() -> None:
    job = decode_job(
        _raw(variables={"text": "ü ☃ \n"}, options={"temperature": 0, "stop": ["\n"]}, batch=True,
             metadata={"k": [1, {"x": None}]}, deadline="2026-05-01T10:00:00.5Z", mode="offline")
    )
    assert decode_job(encode(job)) == job


def test_large_job_decodes() -> None:
    text = "lorem ipsum " * 90_000  # ~1 MB, the broker's default message size
    job = decode_job(_raw(variables={"text": text}))
    assert job.variables == {"text": text}


def test_models_are_frozen() -> None:
    job = decode_job(_raw())
    with pytest.raises(ValueError):
        job.id = "other"  # type: ignore[misc]


def _source() -> SourceRef:
    return SourceRef(topic="promptbus.jobs", partition=3, offset=42)


def test_result_encoding() -> None:
    result = Result(
        id="j1", tier="small", output="short", provider="openai", model="m", finish_reason="stop",
        usage=UsageInfo(input_tokens=10, output_tokens=3), batch=BatchInfo(request_id="req-1", size=4),
        attempts=2, latency_ms=12.5, metadata={"a": 1}, source=_source(),
        completed_at=datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone(timedelta(hours=1))),
    )
    data = orjson.loads(encode(result))
    assert data["status"] == "ok"
    assert data["completed_at"] == "2026-03-01T11:00:00Z"
    assert data["usage"] == {
        "input_tokens": 10, "output_tokens": 3, "cached_input_tokens": 0, "cache_write_tokens": 0
    }
    assert data["batch"] == {"request_id": "req-1", "size": 4}
    assert data["dedupe_of"] is None
    assert data["source"] == {"topic": "promptbus.jobs", "partition": 3, "offset": 42}
    assert b" " not in encode(result).replace(b'"2026', b"")  # compact


def test_naive_timestamps_we_stamp_are_taken_as_utc() -> None:
    result = Result(
        id="j", tier="t", output="", provider="p", model="m", finish_reason="stop", latency_ms=0,
        source=_source(), completed_at=datetime(2026, 1, 1, 0, 0, 0),
    )
    assert orjson.loads(encode(result))["completed_at"] == "2026-01-01T00:00:00Z"
    assert result.batch is None and result.usage == UsageInfo()


def test_dead_letter_for_unparsable_bytes() -> None:
    raw = b"\xff not json"
    letter = DeadLetter(
        error=ErrorInfo(kind=ErrorKind.INVALID_JOB, message="not UTF-8 (byte 0)"),
        raw=base64.b64encode(raw).decode(), source=_source(), failed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    data = orjson.loads(encode(letter))
    assert data["id"] is None and data["job"] is None and data["status"] == "failed"
    assert data["error"] == {
        "kind": "invalid_job", "message": "not UTF-8 (byte 0)", "retryable": False,
        "status_code": None, "provider": None,
    }
    assert base64.b64decode(data["raw"]) == raw


def test_dead_letter_with_parsed_job_roundtrips() -> None:
    job = decode_job(_raw(variables={"text": "t"}))
    letter = DeadLetter(
        id=job.id, error=ErrorInfo(kind=ErrorKind.RETRIES_EXHAUSTED, message="503", retryable=True,
                                   status_code=503, provider="openai"),
        attempts=5, job=job, source=_source(), failed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert DeadLetter.model_validate_json(encode(letter)) == letter


def test_error_kind_is_a_closed_list() -> None:
    with pytest.raises(ValueError):
        ErrorInfo(kind="teapot", message="x")


_text = st.text(max_size=40)
_jobs = st.builds(
    Job,
    id=st.text(min_size=1, max_size=256),
    tier=st.text(min_size=1, max_size=20),
    prompt=_text,
    variables=st.none() | st.dictionaries(_text, _text, max_size=3),
    # orjson reads integers beyond 64 bits as floats, so a decoded job never holds one
    options=st.dictionaries(
        _text.filter(lambda k: k not in JobOptions.__annotations__),  # known keys are type-checked
        st.integers(-(2**63), 2**63 - 1) | _text | st.booleans(),
        max_size=3,
    ),
    batch=st.booleans(),
    mode=st.sampled_from(["online", "offline", "auto"]),
    deadline=st.none() | st.datetimes(timezones=st.just(UTC)),
    metadata=st.none() | st.dictionaries(_text, _text, max_size=3),
)


@given(_jobs)
def test_any_job_roundtrips(job: Job) -> None:
    assert decode_job(encode(job)) == job


def test_long_user_chosen_field_names_are_shortened() -> None:
    message = _error(_raw(variables={"k" * 5000: 1}))
    assert "field 'variables.kkk" in message and len(message) < 200
