"""The hand-written Result encoding must stay the `Result` model's JSON, field for field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.completion import Completion, Usage
from consumer.core.errors import ErrorKind
from consumer.core.jobs import BatchInfo, Job, Result, SourceRef, UsageInfo, encode
from consumer.kafka.records import SOURCE_HEADER, TRACEPARENT_HEADER, SourceOffset, TopicPartition
from consumer.runtime.outcomes import AnswerResults, dead_letter_record, too_large_result

_text = st.text(min_size=1, max_size=12)
_json_leaf = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8)


def _model_json(
    job: Job, source: SourceOffset, completion: Completion, output: str, size: int, attempts: int, ms: float
) -> dict[str, Any]:
    """What `encode(Result(...))` says for the same inputs (the reference)."""
    share = max(size, 1)
    result = Result(
        id=job.id,
        tier=job.tier,
        output=output,
        provider=completion.provider,
        model=completion.model,
        finish_reason=completion.finish_reason if size == 1 else "stop",
        usage=UsageInfo(
            input_tokens=completion.usage.input_tokens // share,
            output_tokens=completion.usage.output_tokens // share,
            cached_input_tokens=completion.usage.cached_input_tokens // share,
            cache_write_tokens=completion.usage.cache_write_tokens // share,
        ),
        batch=BatchInfo(request_id=completion.request_id, size=size) if size > 1 else None,
        attempts=attempts,
        latency_ms=round(ms, 3),
        metadata=job.metadata,
        source=SourceRef(topic=source.topic, partition=source.partition, offset=source.offset),
        completed_at=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    )
    return orjson.loads(encode(result))


@settings(max_examples=150, deadline=None)
@given(
    job_id=_text,
    output=st.text(max_size=40),
    metadata=st.none() | st.dictionaries(st.text(max_size=6), _json_leaf, max_size=4),
    size=st.integers(1, 50),
    attempts=st.integers(0, 9),
    latency_ms=st.floats(0, 1e6, allow_nan=False),
    tokens=st.tuples(
        st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 10**5)
    ),
    request_id=st.none() | _text,
    finish=st.sampled_from(["stop", "length", "tool_use"]),
    offset=st.integers(0, 2**40),
)
def test_result_record_is_the_result_models_json(
    job_id: str,
    output: str,
    metadata: dict[str, Any] | None,
    size: int,
    attempts: int,
    latency_ms: float,
    tokens: tuple[int, int, int, int],
    request_id: str | None,
    finish: str,
    offset: int,
) -> None:
    job = Job.model_validate(
        {"id": job_id, "tier": "small", "prompt": "Say: ${x}", "variables": {"x": "hi"}, "metadata": metadata}
    )
    source = SourceOffset(TopicPartition("jobs", 3), offset)
    completion = Completion(
        output, finish, usage=Usage(*tokens), provider="openai", model="m-1", request_id=request_id
    )
    record = AnswerResults("results", completion, size).record(
        job_id=job.id,
        requested_tier=job.tier,
        metadata=job.metadata,
        source=source,
        output=output,
        attempts=attempts,
        latency_ms=latency_ms,
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
    got = orjson.loads(record.value or b"")
    want = _model_json(job, source, completion, output, size, attempts, latency_ms)
    # the timestamp is "now": same format, compared apart
    assert got.pop("completed_at").endswith("Z")
    want.pop("completed_at")
    assert got == want
    assert set(got) == set(Result.model_fields) - {"completed_at"}  # every field of the model
    Result.model_validate_json(record.value or b"")  # and the model accepts it
    assert record.key == job_id.encode()
    assert dict(record.headers) == {
        SOURCE_HEADER: f"jobs/3/{offset}".encode(),
        TRACEPARENT_HEADER: ("00-" + "a" * 32 + "-" + "b" * 16 + "-01").encode(),
    }


def test_jobs_of_one_answer_share_its_fields_but_keep_their_own() -> None:
    """`AnswerResults` works out the shared fields once; each job's record is still its own."""
    completion = Completion(
        '{"a": 1}', "length", usage=Usage(40, 21), provider="openai", model="m-1", request_id="req-9"
    )
    at = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    results = AnswerResults("results", completion, 2, at)
    jobs = [
        Job.model_validate({"id": f"j{i}", "tier": "small", "prompt": "Say: ${x}", "variables": {"x": "hi"}})
        for i in range(2)
    ]
    sources = [SourceOffset(TopicPartition("jobs", i), 10 + i) for i in range(2)]
    records = [
        results.record(
            job_id=job.id,
            requested_tier=job.tier,
            metadata=job.metadata,
            source=src,
            output=f"out-{i}",
            attempts=i + 1,
            latency_ms=5.0 * i,
        )
        for i, (job, src) in enumerate(zip(jobs, sources, strict=True))
    ]
    for i, record in enumerate(records):
        got = orjson.loads(record.value or b"")
        want = _model_json(jobs[i], sources[i], completion, f"out-{i}", 2, i + 1, 5.0 * i)
        assert got.pop("completed_at") == "2026-01-02T03:04:05.678000Z"
        want.pop("completed_at")
        assert got == want
        assert got["usage"] == {  # each job its share
            "input_tokens": 20,
            "output_tokens": 10,
            "cached_input_tokens": 0,
            "cache_write_tokens": 0,
        }
        assert dict(record.headers) == {SOURCE_HEADER: f"jobs/{i}/{10 + i}".encode()}


def test_a_dead_letter_over_its_topics_record_size_leaves_out_its_copies_of_the_input() -> None:
    source = SourceOffset(TopicPartition("jobs", 3), 41)
    job = Job.model_validate({"id": "j1", "tier": "nope", "prompt": "x" * 5000})
    raw = encode(job)

    def dead(max_bytes: int) -> dict[str, Any]:
        record = dead_letter_record(
            "dlq",
            source=source,
            kind=ErrorKind.UNKNOWN_TIER,
            message="tier 'nope' is not configured",
            job=job,
            raw=raw,
            max_bytes=max_bytes,
        )
        assert record.value is not None and len(record.value) <= max_bytes
        value: dict[str, Any] = orjson.loads(record.value)
        return value

    whole = dead(100_000)
    assert whole["raw"] and whole["job"]["id"] == "j1"
    assert whole["error"]["message"] == "tier 'nope' is not configured"
    without_raw = dead(8_000)  # the job (~5 KB) fits, with its base64 copy it does not
    assert without_raw["raw"] is None and without_raw["job"]["id"] == "j1"
    assert without_raw["error"]["message"].startswith(
        "tier 'nope' is not configured [the original bytes left out:"
    )
    assert without_raw["error"]["message"].endswith("the input is at jobs/3/41]")
    bare = dead(2_000)
    assert bare["raw"] is None and bare["job"] is None and bare["id"] == "j1"
    assert "[the original bytes and the job left out: the dead letter was" in bare["error"]["message"]


def test_a_result_over_its_topics_record_size_is_refused_with_the_reason() -> None:
    completion = Completion("y" * 3000, "stop", usage=Usage(1, 1), provider="openai", model="m")
    record = AnswerResults("results", completion, 1).record(
        job_id="j1",
        requested_tier="t",
        metadata=None,
        source=SourceOffset(TopicPartition("jobs", 0), 1),
        output="y" * 3000,
        attempts=1,
        latency_ms=1.0,
    )
    size = len(record.value or b"")
    assert too_large_result(record, size) is None
    assert too_large_result(record, 2000) == (
        f"the result would be {size} bytes, over the results topic's 2000: the output is too long"
    )


@settings(max_examples=150, deadline=None)
@given(
    dedupe_of=st.none() | _text,
    answered_by=st.sampled_from([None, "small", "big"]),
    lane=st.none() | _text,
    mode=st.sampled_from(["online", "offline"]),
    tenant=st.sampled_from(["default", "team-a"]),
    embedding=st.none() | st.lists(st.floats(-1, 1), min_size=1, max_size=4),
    size=st.integers(1, 5),
)
def test_every_member_a_job_may_have_is_the_result_models_json(
    dedupe_of: str | None,
    answered_by: str | None,
    lane: str | None,
    mode: str,
    tenant: str,
    embedding: list[float] | None,
    size: int,
) -> None:
    """The optional members (dedupe, fallback tier, lane, mode, tenant, embedding) as the model
    writes them, whether the record's tail is its own (`record`) or its group's (`tail`)."""
    completion = Completion("x", "stop", usage=Usage(40, 20), provider="openai", model="m-1", request_id="r")
    at = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    results = AnswerResults("results", completion, size, at)
    source = SourceOffset(TopicPartition("jobs", 1), 5)
    output = None if embedding is not None else "out"
    record = results.record(
        job_id="j1",
        requested_tier="small",
        metadata=None,
        source=source,
        output=output,
        attempts=1,
        latency_ms=2.0,
        dedupe_of=dedupe_of,
        lane=lane,
        tier=answered_by,
        mode=mode,
        embedding=embedding,
        tenant=tenant,
    )
    tier = answered_by or "small"
    share = 1 if dedupe_of is not None else size  # a deduped job used no tokens of its own
    want = Result(
        id="j1",
        tier=tier,
        output=output,
        embedding=embedding,
        dimensions=len(embedding) if embedding is not None else None,
        provider="openai",
        model="m-1",
        finish_reason="stop",
        usage=UsageInfo(input_tokens=40 // share, output_tokens=20 // share)
        if dedupe_of is None
        else UsageInfo(),
        batch=BatchInfo(request_id="r", size=size) if size > 1 else None,
        attempts=1,
        latency_ms=2.0,
        source=SourceRef(topic="jobs", partition=1, offset=5),
        completed_at=at,
        dedupe_of=dedupe_of,
        lane=lane,
        mode=mode,  # type: ignore[arg-type]
        fallback_from="small" if tier != "small" else None,
        tenant=tenant,
    )
    assert orjson.loads(record.value or b"") == orjson.loads(encode(want))
    if dedupe_of is None:  # a group's jobs end with the tail `answered_all` looks up
        tail = results.tail(tier, "small", lane, mode, tenant)
        again = results.result(tail, "j1", None, source, output, 1, 2.0, embedding)
        assert again.value == record.value and again.key == record.key
