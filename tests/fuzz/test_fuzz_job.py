"""Fuzz target `job`: `jobs.decode_job`, a jobs-topic record's bytes -> a Job.

Contract (`consumer.core.jobs` module doc): returns a Job or raises `JobError(INVALID_JOB)`
with a one-line message that never echoes an input value; nothing else. A Job it returns
can be written back (`encode`: its dead letter holds it, its result echoes its metadata)
and decodes again.
"""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from consumer.core.errors import ErrorKind, JobError
from consumer.core.jobs import Job, decode_job, encode
from tests.fuzz._harness import awkward_text, fuzz_settings, json_values, mutated, nested, run_budget

#: a value no error message may contain (messages name fields, never their values)
CANARY = "c4n4ry-private-value"


def check_job(raw: bytes) -> Job | None:
    """decode_job's verdict on `raw` (None: a JobError), once checked against the contract."""
    try:
        job = decode_job(raw)
    except JobError as exc:
        assert exc.kind == ErrorKind.INVALID_JOB
        message = str(exc)
        assert message and "\n" not in message
        assert CANARY not in message
        return None
    assert isinstance(job, Job)
    again = decode_job(encode(job))
    assert again.id == job.id
    return job


def fuzz_one(data: bytes) -> None:
    """The bytes are the record value as they are."""
    check_job(data)


SEED_JOBS = [
    {
        "id": "j1",
        "tier": "fast",
        "prompt": "Classify: ${text}",
        "variables": {"text": "great product"},
        "batch": True,
    },
    {
        "id": "j2",
        "tier": "chat",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "options": {"max_tokens": 50, "temperature": 0.2, "stop": ["\n"], "seed": 7},
    },
    {
        "id": "j3",
        "tier": "fast",
        "prompt": "Hello",
        "mode": "offline",
        "deadline": "2026-05-01T10:00:00.5+02:00",
        "metadata": {"k": [1, {"x": None}], "n": 12},
    },
    {
        "id": "j4",
        "tier": "fast",
        "prompt": "Rate ${x}",
        "variables": {"x": "ok"},
        "options": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "r",
                    "schema": {"type": "object", "properties": {"score": {"type": "integer"}}},
                },
            }
        },
    },
    {"id": "j5", "tier": "fast", "prompt": "x", "varaibles": {"x": CANARY}},
    {"id": "j6", "tier": "fast", "prompt": "x", "deadline": "9999-12-31T23:59:59Z"},
]
SEED_TEXTS = [json.dumps(job) for job in SEED_JOBS] + ["[]", '"job"', "", '{"id": "j7"']
SEEDS = [t.encode() for t in SEED_TEXTS]

FIELDS = ("id", "tier", "prompt", "variables", "messages", "options", "batch", "mode", "deadline", "metadata")
#: deadlines at the edges of what datetime holds, with offsets that move them past the edge
DEADLINES = st.one_of(
    st.sampled_from(
        [
            "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59-01:00",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00",
            "2026-13-01T00:00:00Z",
            "2026-01-01T00:00:00+24:00",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999+00:00",
        ]
    ),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    awkward_text,
)
field_values = st.one_of(
    json_values(
        st.one_of(st.sampled_from(("role", "content", "text", "max_tokens")), awkward_text),
        strings=st.one_of(st.just(CANARY), awkward_text),
    ),
    DEADLINES,
)


@st.composite
def job_objects(draw: st.DrawFn) -> bytes:
    """A near-valid job: a seed with some fields replaced by other JSON values (or dropped)."""
    job = dict(draw(st.sampled_from(SEED_JOBS)))
    for name in draw(st.lists(st.sampled_from((*FIELDS, "extra")), max_size=3)):
        if draw(st.booleans()):
            job.pop(name, None)
        else:
            job[name] = draw(field_values)
    return json.dumps(job).encode()


@fuzz_settings
@given(data=st.binary(max_size=300))
def _raw_bytes(data: bytes) -> None:
    fuzz_one(data)


@fuzz_settings
@given(text=mutated(SEED_TEXTS))
def _mutated_seeds(text: str) -> None:
    check_job(text.encode("utf-8", "surrogatepass"))


@fuzz_settings
@given(raw=job_objects())
@example(raw=b'{"id":"a","tier":"t","prompt":"x","deadline":"0001-01-01T00:00:00+01:00"}')
@example(raw=b'{"id":"a","tier":"t","prompt":"x","deadline":"9999-12-31T23:59:59-01:00"}')
@example(raw=b'{"id":"a","tier":"t","prompt":"x","metadata":{"n":100000000000000000000000}}')
@example(raw=b'{"id":"a","tier":"t","prompt":"x","options":{"logit_bias":{"1":-100000000000000000000}}}')
@example(raw=b'{"id":"a","tier":"t","prompt":"x","metadata":{"n":' + nested(300).encode() + b"}}")
def _job_objects(raw: bytes) -> None:
    check_job(raw)


def test_raw_bytes() -> None:
    run_budget(_raw_bytes)


def test_mutated_seeds() -> None:
    run_budget(_mutated_seeds)


def test_job_objects() -> None:
    run_budget(_job_objects)


def test_seeds_are_realistic() -> None:
    """Most seeds decode (mutations start near valid jobs); the rest are each a kind of invalid."""
    decoded = [check_job(seed) for seed in SEEDS]
    assert sum(job is not None for job in decoded) == 5
