"""Fuzz target `admission`: `Admission.admit`, an input record -> a JobContext or a Rejection.

Contract (`consumer.runtime.admission` module doc): never raises; a record is admitted or
rejected with one of the kinds admission decides (`invalid_job`, `unknown_tier`,
`template_error`) and a one-line message, keeping the record's own bytes for the dead letter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from consumer.core.errors import ErrorKind
from consumer.core.routing import ModePolicy
from consumer.kafka.intake import InRecord
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.kafka.sink import Ticket
from consumer.runtime.admission import Admission, Rejection
from consumer.runtime.context import JobContext
from consumer.settings import TierConfig
from tests.fuzz._harness import awkward_text, fuzz_settings, json_values, mutated, run_budget
from tests.fuzz.test_fuzz_job import SEED_JOBS, SEED_TEXTS, job_objects

MAX_JOB_BYTES = 2000
REJECTION_KINDS = {ErrorKind.INVALID_JOB, ErrorKind.UNKNOWN_TIER, ErrorKind.TEMPLATE_ERROR}
SOURCE = SourceOffset(TopicPartition("jobs", 0), 7)


@dataclass
class _Tier:
    """What admission reads of a tier: its name and config (the rest is the runner's)."""

    name: str
    config: TierConfig

    @property
    def modes(self) -> ModePolicy:
        return self.config.mode_policy()


TIERS = {
    "fast": _Tier("fast", TierConfig(provider="openai", model="m", offline={"enabled": True})),
    "chat": _Tier("chat", TierConfig(provider="anthropic", model="m")),
    "local": _Tier(
        "local",
        TierConfig(
            provider="openai_compat",
            model="m",
            base_url="http://127.0.0.1:9/v1",
            options={"response_format": {"type": "json_object"}},
        ),
    ),
}
ADMISSION = Admission(
    TIERS,
    max_job_bytes=MAX_JOB_BYTES,
    offline_runs=True,  # type: ignore[arg-type]
    start_trace=lambda job, headers: None,
)


def check_admit(value: bytes | None, key: bytes | None = b"j1") -> JobContext | Rejection:
    """admit's verdict on a record with this value and key, checked against the contract."""
    record = InRecord(SOURCE, key, value, (), 0)
    verdict = ADMISSION.admit(record, Ticket(SOURCE, 1), 100.0)
    if isinstance(verdict, Rejection):
        assert verdict.kind in REJECTION_KINDS
        assert verdict.message and "\n" not in verdict.message
        assert verdict.raw == (value or b"")
    else:
        assert isinstance(verdict, JobContext)
        assert verdict.tier is TIERS[verdict.requested_tier]
        assert isinstance(verdict.input, str) and verdict.messages
        # the compact copy agrees with the job decoded again from the record's bytes
        job = verdict.parsed_job()
        assert (job.id, job.tier, job.metadata, job.batch, job.mode, job.kind) == (
            verdict.id,
            verdict.requested_tier,
            verdict.metadata,
            verdict.batch,
            verdict.requested_mode,
            verdict.kind,
        )
    return verdict


def fuzz_one(data: bytes) -> None:
    """The bytes are the record value (the key stays a job id)."""
    check_admit(data)


def _with_tier(job: dict[str, object], tier: str) -> bytes:
    return json.dumps({**job, "tier": tier}).encode()


SEEDS = (
    [t.encode() for t in SEED_TEXTS]
    + [_with_tier(j, "chat") for j in SEED_JOBS]
    + [
        _with_tier(SEED_JOBS[0], "local"),
        _with_tier(SEED_JOBS[0], "nope"),
        _with_tier({"id": "s", "messages": [{"role": "system", "content": "only"}]}, "chat"),
    ]
)

prompts = st.one_of(
    st.sampled_from(("Classify: ${text}", "${a}${b}", "$${text} ${text}", "x ${1}", "${")), awkward_text
)


@st.composite
def templated_jobs(draw: st.DrawFn) -> bytes:
    """A job that decodes, on any tier, with an awkward template and variables."""
    job = {
        "id": "j",
        "tier": draw(st.sampled_from((*TIERS, "nope"))),
        "prompt": draw(prompts),
        "variables": draw(
            st.dictionaries(st.sampled_from(("text", "a", "b", "1")), awkward_text, max_size=3)
        ),
        "mode": draw(st.sampled_from(("online", "offline"))),
        "options": draw(
            st.dictionaries(
                st.sampled_from(("response_format", "max_tokens", "stop")),
                json_values(st.sampled_from(("type", "schema", "json_schema"))),
                max_size=2,
            )
        ),
    }
    return json.dumps(job).encode()


@fuzz_settings
@given(data=st.binary(max_size=300), key=st.one_of(st.none(), st.binary(max_size=20)))
def _raw_bytes(data: bytes, key: bytes | None) -> None:
    check_admit(data, key)


@fuzz_settings
@given(text=mutated([t.decode() for t in SEEDS]))
def _mutated_seeds(text: str) -> None:
    check_admit(text.encode("utf-8", "surrogatepass"))


@fuzz_settings
@given(raw=st.one_of(job_objects(), templated_jobs()))
@example(raw=None)
@example(raw=b'{"id":"j","tier":"fast","prompt":"x","deadline":"9999-12-31T23:59:59Z"}')
def _jobs(raw: bytes | None) -> None:
    check_admit(raw)


def test_raw_bytes() -> None:
    run_budget(_raw_bytes)


def test_mutated_seeds() -> None:
    run_budget(_mutated_seeds)


def test_jobs() -> None:
    run_budget(_jobs)


def test_seeds_are_realistic() -> None:
    """Seeds reach admission's every verdict: admitted, and each kind of rejection."""
    verdicts = [check_admit(seed) for seed in SEEDS]
    assert any(isinstance(v, JobContext) for v in verdicts)
    assert {v.kind for v in verdicts if isinstance(v, Rejection)} >= {
        ErrorKind.INVALID_JOB,
        ErrorKind.UNKNOWN_TIER,
    }
