"""Remembered batching evidence: record keys, reading the topic, restoring, what is published."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from consumer.core.window import PackKey
from consumer.providers.fake import FakeProvider
from consumer.runtime.evidence import RememberedEvidence, evidence_key
from consumer.runtime.stats import TierStats
from consumer.runtime.tiers import TierRuntime
from consumer.settings import TierConfig

KEY = PackKey("small", "Classify:\nTEXT:\n", "text", "{}", "template")


def tier_config(**changes: Any) -> TierConfig:
    spec: dict[str, Any] = {
        "provider": "openai_compat",
        "base_url": "http://127.0.0.1:8080/v1",
        "model": "m",
        "batching": {"enabled": True, "max_items": 8, "verify_fraction": 0.25},
    }
    spec.update(changes)
    return TierConfig.model_validate(spec)


def tier(remembered: RememberedEvidence, config: TierConfig | None = None) -> TierRuntime:
    config = config or tier_config()
    never = FakeProvider(lambda _r: AssertionError("no request is sent here"))
    return TierRuntime.build("small", config, never, TierStats(), remembered)


def learnt(runtime: TierRuntime) -> None:
    """Size 2 proven on the tier's key: valid and agreeing answers."""
    for _ in range(20):
        runtime.sizes.record(KEY, "complete", 2, 1.0)
        runtime.sizes.record_agreement(KEY, 1, 1, 2, 1.0)
    assert runtime.sizes.get(KEY).size == 2


def test_the_record_key_names_the_tier_and_hashes_what_the_evidence_is_about() -> None:
    key = evidence_key("small", tier_config(), KEY)
    assert key.startswith(b"small/") and b"Classify" not in key, "the prompt is never written"
    assert key == evidence_key("small", tier_config(), KEY)
    for changed in (
        {"model": "other"},
        {"base_url": "http://127.0.0.1:8081/v1"},
        {"batching": {"enabled": True, "max_items": 8, "structured": "off"}},
    ):
        assert evidence_key("small", tier_config(**changed), KEY) != key, changed
    assert evidence_key("small", tier_config(), KEY._replace(prefix="Other:\n")) != key


def test_a_new_instance_starts_from_what_the_last_one_published() -> None:
    first = RememberedEvidence(instance="a")
    runtime = tier(first)
    tiers = {"small": runtime}
    assert list(first.records(tiers)) == [], "nothing learnt, nothing published"
    learnt(runtime)
    records = list(first.records(tiers))
    assert [k for k, _ in records] == [evidence_key("small", runtime.config, KEY)]
    value = records[0][1]
    assert value["tier"] == "small" and value["instance"] == "a" and value["written_at"] > 0
    assert list(first.records(tiers)) == [], "only what changed since the last round"

    topic = {k: orjson.dumps(v) for k, v in records}
    second = tier(RememberedEvidence.read(topic, instance="b"))
    assert second.sizes.get(KEY).size == 2, "restored, not size 1"
    assert tier(RememberedEvidence.read(topic), tier_config(model="other")).sizes.get(KEY).size == 1


def test_records_that_are_not_evidence_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    runtime = tier(RememberedEvidence())
    learnt(runtime)
    good = orjson.dumps({"state": runtime.sizes.get(KEY).export()})
    key = evidence_key("small", runtime.config, KEY)
    topic = {b"junk": b"not json", b"list": b"[1]", key: good}
    with caplog.at_level(logging.WARNING):
        remembered = RememberedEvidence.read(topic)
    assert set(remembered.states) == {key}
    assert "b'junk'" in caplog.text and "b'list'" in caplog.text


def test_evidence_that_does_not_restore_starts_the_key_afresh(caplog: pytest.LogCaptureFixture) -> None:
    key = evidence_key("small", tier_config(), KEY)
    remembered = RememberedEvidence({key: {"levels": {"2": {"valid": 5, "judged": 1}}}})
    with caplog.at_level(logging.WARNING):
        runtime = tier(remembered)
        assert runtime.sizes.get(KEY).size == 1
    assert "not used: level 2: valid (5) exceeds judged (1)" in caplog.text


def test_a_round_publishes_at_most_its_share_the_keys_that_learnt_most_first() -> None:
    remembered = RememberedEvidence(per_round=3)
    runtime = tier(remembered)
    tiers = {"small": runtime}
    keys = [KEY._replace(prefix=f"Prompt {i}:\n") for i in range(5)]
    for reports, key in enumerate(keys, start=1):
        for _ in range(reports):
            runtime.sizes.record_speed(key, 1, 1, 0.1, 1.0)
    first = [k for k, _ in remembered.records(tiers)]
    expected = [evidence_key("small", runtime.config, key) for key in reversed(keys)]
    assert first == expected[:3], "most new reports first"
    assert [k for k, _ in remembered.records(tiers)] == expected[3:], "the rest in the next round"
    assert remembered.records(tiers) == []
