"""A source's offline job: its batch member keeps the source record (a job's member keeps what
it always did), and the member of a finished batch is written back as the enriched record an
online answer would be, from the batch record alone."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest

from consumer.core.completion import Completion, Usage
from consumer.core.errors import ErrorKind, ProviderError
from consumer.core.lanes import Lane
from consumer.core.offline import BatchItemResult, BatchJob, BatchStatus
from consumer.core.routing import ModePolicy
from consumer.kafka.intake import InRecord
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.kafka.sink import Ticket
from consumer.registry.codecs import SourceCodec
from consumer.runtime.admission import Admission
from consumer.runtime.context import JobContext
from consumer.runtime.offline import batch_record, outcome_records, read_batch_record
from consumer.runtime.offline.records import RECORD_ENVELOPE_BYTES, batch_member, record_runs
from consumer.runtime.outcomes import RecordLimits
from consumer.runtime.sources import SourceRuntime
from consumer.runtime.stats import ServiceStats
from consumer.settings import TierConfig, parse_tier_file
from consumer.settings.sources import SourceConfig
from consumer.testing.harness import service_env, settings_from_env

SETTINGS = settings_from_env(service_env("127.0.0.1:9"))
LANE = Lane("default", "jobs", rank=0)
NOW_S = 100.0


@dataclass
class _Tier:
    name: str
    config: TierConfig
    dedupe: Any = None

    @property
    def modes(self) -> ModePolicy:
        return self.config.mode_policy()


TIER = _Tier("small", TierConfig(provider="openai", model="m", offline={"enabled": True}))
ADMISSION = Admission(
    {"small": cast(Any, TIER)}, max_job_bytes=10_000, offline_runs=True, start_trace=lambda job, record: None
)


def _source(**fields: Any) -> SourceRuntime:
    config = SourceConfig.model_validate(
        {
            "topic": "shop.reviews",
            "tier": "small",
            "mode": "offline",
            "prompt": "Label this review:\n${review.text}",
            "into": {"topic": "shop.reviews.enriched", "field": "sentiment"},
            "unchanged": "ask",
            **fields,
        }
    )
    codec = SourceCodec(
        "json", None, out_topic=config.into.topic, out_format="same", fields=config.output_fields()
    )
    return SourceRuntime("reviews", config, codec, LANE, ServiceStats(instance="a").source("reviews"))


def _source_ctx(source: SourceRuntime, offset: int, key: bytes, text: str) -> tuple[JobContext, InRecord]:
    where = SourceOffset(TopicPartition("shop.reviews", 2), offset)
    value = orjson.dumps({"id": offset, "review": {"text": text}})
    record = InRecord(where, key, value, (("trace-id", b"t-1"), ("empty", None)), 1_000_000)
    ctx = ADMISSION.admit_source(source, record, Ticket(where, 1), NOW_S, LANE)
    assert isinstance(ctx, JobContext) and ctx.mode == "offline"
    return ctx, record


def _finished(members: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch record as the tracker reads it back from the batches topic."""
    job = BatchJob("batch-1", "openai", BatchStatus.COMPLETED, total=len(members))
    return read_batch_record(orjson.dumps(batch_record("small", job, members, 10)))


def _answer(custom_id: str, text: str) -> BatchItemResult:
    return BatchItemResult(
        custom_id, Completion(text, "stop", usage=Usage(3, 1), provider="openai", model="m")
    )


def test_a_job_members_batch_record_keeps_its_shape_and_size() -> None:
    """A job's member is what it always was: no origin, not a byte more."""
    job = {"id": "j1", "tier": "small", "prompt": "Label:\n${t}", "variables": {"t": "x"}, "mode": "offline"}
    where = SourceOffset(TopicPartition("jobs", 0), 7)
    ctx = ADMISSION.admit(
        InRecord(where, b"j1", orjson.dumps(job), (), 1_000_000), Ticket(where, 1), NOW_S, LANE
    )
    assert isinstance(ctx, JobContext)
    member = batch_member("pb-0", ctx)
    before = {
        "custom_id": "pb-0",
        "job": ctx.parsed_job().model_dump(mode="json"),
        "timestamp": 1000.0,
        "lane": "default",
        "tenant": "default",
        "source": {"topic": "jobs", "partition": 0, "offset": 7},
    }
    assert member == before
    assert len(orjson.dumps(member)) == len(orjson.dumps(before))


def test_a_source_member_is_written_back_enriched_from_the_batch_record_alone() -> None:
    source = _source()
    ctx, record = _source_ctx(source, 41, b"rev-41", "good kettle")
    member = batch_member("pb-0", ctx)
    stored = member["origin"]
    assert stored["source"] == "reviews" and stored["read"] == ctx.origin.read_digest  # type: ignore[union-attr]
    assert base64.b64decode(stored["key"]) == b"rev-41"
    assert base64.b64decode(stored["value"]) == record.value
    assert stored["headers"] == [["trace-id", base64.b64encode(b"t-1").decode()], ["empty", None]]
    assert member["source"] == {"topic": "shop.reviews", "partition": 2, "offset": 41}

    # another instance's tracker: a source runtime of the same name, the batch record read back
    collecting = _source()
    (out,) = outcome_records(
        SETTINGS,
        _finished([member]),
        BatchStatus.COMPLETED,
        [_answer("pb-0", "positive")],
        sources={"reviews": collecting},
    )
    assert out is not None and out.topic == "shop.reviews.enriched" and out.key == b"rev-41"
    assert orjson.loads(out.value or b"") == {
        "id": 41,
        "review": {"text": "good kettle"},
        "sentiment": "positive",
    }
    assert out.headers == (
        ("trace-id", b"t-1"),
        ("empty", b""),
        ("promptbus-source", b"shop.reviews/2/41"),
        ("promptbus-tier", b"small"),
        ("promptbus-attempts", b"1"),
    )
    assert collecting.stats.enriched == 1


def test_a_failed_source_member_follows_the_online_rules() -> None:
    """A failed item: a dead letter keyed by the record's key with its bytes and headers, or
    with on_error: field, the enriched record with the error; an unknown source: a dead letter."""
    failed = BatchItemResult("pb-0", error=ProviderError("boom", status_code=400))
    for on_error in ("dead_letter", "field"):
        source = _source(on_error=on_error)
        ctx, record = _source_ctx(source, 5, b"rev-5", "meh")
        (out,) = outcome_records(
            SETTINGS,
            _finished([batch_member("pb-0", ctx)]),
            BatchStatus.COMPLETED,
            [failed],
            sources={"reviews": source},
        )
        assert out is not None and out.key == b"rev-5"
        headers = dict(out.headers)
        assert headers["trace-id"] == b"t-1" and headers["promptbus-source"] == b"shop.reviews/2/5"
        value = orjson.loads(out.value or b"")
        if on_error == "dead_letter":
            assert out.topic == SETTINGS.dlq_topic and value["error"]["kind"] == "batch_failed"
            assert base64.b64decode(value["raw"]) == record.value
            assert headers["promptbus-error-kind"] == b"batch_failed"
        else:
            assert out.topic == "shop.reviews.enriched"
            assert value["sentiment"] is None and value["sentiment_error"]["kind"] == "batch_failed"
        assert source.stats.dead_letters == {"batch_failed": 1}

    ctx, record = _source_ctx(_source(), 6, b"rev-6", "meh")
    (out,) = outcome_records(
        SETTINGS,
        _finished([batch_member("pb-0", ctx)]),
        BatchStatus.COMPLETED,
        [_answer("pb-0", "x")],
        sources={},
    )
    assert out is not None and out.topic == SETTINGS.dlq_topic and out.key == b"rev-6"
    dead = orjson.loads(out.value or b"")
    assert (
        dead["error"]["kind"] == ErrorKind.INVALID_JOB.value and "not configured" in dead["error"]["message"]
    )
    assert base64.b64decode(dead["raw"]) == record.value


def test_an_older_version_collected_after_a_newer_one_is_dropped() -> None:
    """While their batches are open, a key's members are in flight in its source's key order:
    the newer version written first, the older one's answer is dropped (None) and counted."""
    source = _source()
    old, _ = _source_ctx(source, 1, b"k", "old")
    new, _ = _source_ctx(source, 2, b"k", "new")
    for ctx in (old, new):  # as the tracker does for each open batch's source members
        source.order.admitted(ctx.origin.key)  # type: ignore[union-attr]
    sources = {"reviews": source}
    (newer,) = outcome_records(
        SETTINGS,
        _finished([batch_member("pb-0", new)]),
        BatchStatus.COMPLETED,
        [_answer("pb-0", "n")],
        sources=sources,
    )
    (older,) = outcome_records(
        SETTINGS,
        _finished([batch_member("pb-0", old)]),
        BatchStatus.COMPLETED,
        [_answer("pb-0", "o")],
        sources=sources,
    )
    assert newer is not None and older is None
    assert source.stats.stale_dropped == 1 and source.stats.enriched == 1


def test_a_collection_is_cut_where_its_batch_record_would_be_too_large() -> None:
    limit = RECORD_ENVELOPE_BYTES + 100
    runs, too_large = record_runs([40, 40, 40, 500, 10], limit)
    assert runs == [range(0, 2), range(2, 3), range(4, 5)]
    assert too_large == [3]
    assert record_runs([10] * 5, RecordLimits().batches) == ([range(0, 5)], [])


def test_check_config_takes_an_offline_source_where_its_tier_allows_offline() -> None:
    def tier_file(offline: bool, mode: str) -> Any:
        return parse_tier_file(
            {
                "tiers": {"small": {"provider": "openai", "model": "m", "offline": {"enabled": offline}}},
                "sources": {
                    "reviews": {
                        "topic": "in",
                        "tier": "small",
                        "mode": mode,
                        "prompt": "${a}",
                        "into": {"topic": "out"},
                    }
                },
            }
        )

    assert tier_file(True, "offline").sources["reviews"].mode == "offline"
    assert tier_file(False, "auto").sources["reviews"].mode == "auto"  # auto goes online there
    with pytest.raises(Exception, match=r"sources\.reviews\.mode.*does not allow mode 'offline'"):
        tier_file(False, "offline")
