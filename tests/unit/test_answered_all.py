"""`OutcomeWriter.answered_all` ends the jobs of one answer as `answered` ends each: the same
records (key, value, headers), the same dead letters, the same counters and latency counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson

from consumer.core.completion import Completion, Usage
from consumer.core.lanes import Lane
from consumer.core.routing import ModePolicy
from consumer.kafka.intake import InRecord
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import Ticket
from consumer.runtime.admission import Admission
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.latency import JOB_LATENCY
from consumer.runtime.outcomes import AnswerResults, RecordLimits
from consumer.runtime.stats import ServiceStats
from consumer.settings import TierConfig
from consumer.telemetry import Telemetry
from consumer.testing.harness import service_env, settings_from_env

SETTINGS = settings_from_env(service_env("127.0.0.1:9"))
LANE = Lane("bulk", "jobs.bulk", rank=1)
NOW_S = 100.0


@dataclass
class _Tier:
    """What admission and the outcome writer read of a tier."""

    name: str
    config: TierConfig
    dedupe: Any = None

    @property
    def modes(self) -> ModePolicy:
        return self.config.mode_policy()


class _RecordingSink:
    def __init__(self) -> None:
        self.delivered: list[tuple[Ticket, OutRecord | None]] = []

    def deliver(self, ticket: Ticket, record: OutRecord | None) -> None:
        self.delivered.append((ticket, record))

    def deliver_all(self, outcomes: Sequence[tuple[Ticket, OutRecord | None]]) -> None:
        self.delivered.extend(outcomes)


def _contexts(deadline_passed: set[int]) -> list[JobContext]:
    tier = _Tier("small", TierConfig(provider="openai_compat", model="m", base_url="http://127.0.0.1:9/v1"))
    admission = Admission(
        {"small": cast(Any, tier)},
        max_job_bytes=10_000,
        offline_runs=False,
        start_trace=lambda job, record: None,
    )
    contexts = []
    for i in range(6):
        job: dict[str, Any] = {
            "id": f"j{i}",
            "tier": "small",
            "prompt": "Label:\n${text}",
            "variables": {"text": f"text {i}"},
            "batch": True,
        }
        if i == 2:
            job["metadata"] = {"trace": "x", "n": i}
        if i == 3:
            job["tenant"] = "team-b"
        source = SourceOffset(TopicPartition("jobs.bulk", i % 2), 10 + i)
        record = InRecord(source, job["id"].encode(), orjson.dumps(job), (), 1_000_000 + i)
        ctx = admission.admit(record, Ticket(source, 1), NOW_S - 0.5, LANE)
        assert isinstance(ctx, JobContext)
        if i in deadline_passed:
            ctx.deadline_s = NOW_S - 0.1
        contexts.append(ctx)
    return contexts


def _end(together: bool) -> tuple[_RecordingSink, ServiceStats]:
    sink, stats = _RecordingSink(), ServiceStats(instance="a")
    settings = SETTINGS
    writer = OutcomeWriter(
        settings, cast(Any, sink), stats, Telemetry.disabled(), RecordLimits(results=600), clock=lambda: NOW_S
    )
    completion = Completion(
        "x", "stop", usage=Usage(60, 12), provider="openai_compat", model="sim-model", request_id="r1"
    )
    results = AnswerResults(
        settings.results_topic, completion, 6, completed_at=datetime(2026, 12, 1, tzinfo=UTC)
    )
    contexts = _contexts(deadline_passed={4})
    outputs = [f"out {i}" if i != 5 else "long " * 200 for i in range(6)]  # j5: too large a result
    contexts[1].done = True  # ended already (by a deadline, say): no second outcome
    if together:
        writer.answered_all(
            results, [(c, o, None, 2) for c, o in zip(contexts, outputs, strict=True)], now_s=NOW_S
        )
    else:
        for ctx, output in zip(contexts, outputs, strict=True):
            writer.answered(ctx, results, output, attempts=2, now_s=NOW_S)
    return sink, stats


def _comparable(sink: _RecordingSink) -> list[tuple[Any, ...]]:
    out = []
    for ticket, r in sink.delivered:
        assert r is not None  # an answered job's outcome is a record
        value = orjson.loads(r.value or b"")
        value.pop("failed_at", None)  # a dead letter's own clock reading
        out.append((ticket, r.topic, r.key, value, r.headers))
    return sorted(out, key=lambda row: (row[1], row[2]))


def test_answered_all_ends_each_job_as_answered_does() -> None:
    one_by_one, one_stats = _end(together=False)
    together, all_stats = _end(together=True)
    assert _comparable(together) == _comparable(one_by_one)
    topics = {r.key: r.topic for _, r in together.delivered if r is not None}
    settings = SETTINGS
    assert topics == {
        b"j0": settings.results_topic,
        b"j2": settings.results_topic,
        b"j3": settings.results_topic,
        b"j4": settings.dlq_topic,
        b"j5": settings.dlq_topic,
    }
    a, b = all_stats.snapshot(), one_stats.snapshot()
    for part in ("results", "dead_letters", "lanes", "tenants"):
        assert a[part] == b[part], part
    assert a["results"] == 3
    counts = {labels: sum(h.counts) for labels, h in all_stats.latency.series(JOB_LATENCY)}
    assert counts == {labels: sum(h.counts) for labels, h in one_stats.latency.series(JOB_LATENCY)}
    assert sum(counts.values()) == 5
