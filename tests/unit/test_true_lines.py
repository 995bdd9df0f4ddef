"""The rules behind the one true line a newcomer's mistake gets, pure: a refused budget says
whether it was spent or too small for one request, a job without a lane goes where a lane
reads it, a lag whose partitions no live instance reads has no age, a dead letter keeps its
record's key, a misspelt PROMPTBUS_ variable has its nearest setting, a tier file's problems
are said together."""

from __future__ import annotations

import base64

import orjson
import pytest

from consumer.core.budgets import BudgetBook, Cost, Exhausted, LeaseWanted
from consumer.core.errors import ConfigError, ErrorKind
from consumer.core.snapshots import live_partitions, with_group_lag
from consumer.core.tenants import TenantPolicies, TenantPolicy
from consumer.kafka.admin import topic_specs
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.runtime.outcomes import dead_letter_record
from consumer.settings import Settings, lane_topic, parse_tier_file, unread_jobs_topic_note
from consumer.settings.environment import setting_variables, unknown_variables

NOON_S = 1796119200.0
TIER = {"provider": "openai", "model": "m"}


def _book(tokens: int) -> BudgetBook:
    policies = TenantPolicies({"t": TenantPolicy("t", tokens_per_day=tokens)})
    return BudgetBook(policies, "i1", now_s=NOON_S)


def test_a_budget_smaller_than_one_request_says_so_and_that_nothing_was_spent() -> None:
    book = _book(300)
    refused = book.try_reserve("t", Cost(0.0, 1034), NOON_S)
    assert isinstance(refused, Exhausted)
    assert refused.message.startswith(
        "tenant 't': a request's estimate, 1034 tokens, is more than the daily budget left "
        "(300 of 300 tokens free"
    )
    assert book.spent("t", NOON_S) == Cost()


def test_a_budget_spent_to_its_end_says_it_was_spent() -> None:
    book = _book(1000)
    wanted = book.try_reserve("t", Cost(0.0, 1000), NOON_S)
    assert isinstance(wanted, LeaseWanted)
    book.claimed(wanted)
    held = book.try_reserve("t", Cost(0.0, 1000), NOON_S)
    book.settle(held, Cost(0.0, 1000))  # type: ignore[arg-type]
    refused = book.try_reserve("t", Cost(0.0, 10), NOON_S)
    assert isinstance(refused, Exhausted)
    assert refused.message.startswith("tenant 't' has spent its daily budget (1000 of 1000 tokens on")


LANES = {"tiers": {"a": TIER}, "lanes": {"fast": {"topic": "jobs.fast"}, "bulk": {"topic": "jobs.bulk"}}}


def test_a_job_without_a_lane_goes_to_the_lowest_priority_lane_unless_a_lane_reads_the_jobs_topic() -> None:
    tier_file = parse_tier_file(LANES)
    assert lane_topic(tier_file, None, "promptbus.jobs") == "jobs.bulk"
    assert lane_topic(tier_file, "fast", "promptbus.jobs") == "jobs.fast"
    assert lane_topic(tier_file, None, "jobs.fast") == "jobs.fast"  # a lane reads it
    assert lane_topic(parse_tier_file({"tiers": {"a": TIER}}), None, "promptbus.jobs") == "promptbus.jobs"
    note = unread_jobs_topic_note(tier_file, "promptbus.jobs")
    assert note is not None and note.startswith("PROMPTBUS_JOBS_TOPIC 'promptbus.jobs' is read by no lane")
    assert unread_jobs_topic_note(tier_file, "jobs.bulk") is None


def test_with_lanes_the_jobs_topic_is_not_made() -> None:
    names = [spec.name for spec in topic_specs(Settings(), ["jobs.fast", "jobs.bulk"])]
    assert "jobs.fast" in names and "jobs.bulk" in names and Settings().jobs_topic not in names
    assert Settings().jobs_topic in [spec.name for spec in topic_specs(Settings())]


def test_a_lag_on_partitions_no_live_instance_reads_has_no_age() -> None:
    snaps = [{"updated_at": 100.0, "lag": [{"topic": "jobs", "partition": 0, "records": 3}]}]
    assert live_partitions(snaps, now_s=101.0, live_within_s=5.0) == {("jobs", 0)}
    assert live_partitions(snaps, now_s=200.0, live_within_s=5.0) == set()
    merged = {"oldest_uncommitted_age_s": 4.0}
    assert with_group_lag(merged, records=3, partitions=2)["oldest_uncommitted_age_s"] == 4.0
    unknown = with_group_lag(merged, records=3, partitions=2, unread=1)
    assert unknown["oldest_uncommitted_age_s"] is None and unknown["lag_partitions_unread"] == 1
    assert with_group_lag(merged, records=0, partitions=2, unread=1)["oldest_uncommitted_age_s"] == 0.0


@pytest.mark.parametrize(
    ("key", "field", "raw_key"),
    [
        (b"raw-1", "raw-1", None),
        (b"\xff\xfe", None, base64.b64encode(b"\xff\xfe").decode()),
        (None, None, None),
    ],
)
def test_a_dead_letter_keeps_its_records_key(
    key: bytes | None, field: str | None, raw_key: str | None
) -> None:
    record = dead_letter_record(
        "dlq",
        source=SourceOffset(TopicPartition("jobs", 0), 7),
        kind=ErrorKind.INVALID_JOB,
        message="job is not JSON",
        raw=b"{not json",
        key=key,
    )
    dead = orjson.loads(record.value or b"")
    assert record.key == key and (dead["key"], dead["raw_key"], dead["id"]) == (field, raw_key, None)


def test_a_misspelt_setting_has_its_nearest_name_and_every_setting_is_known() -> None:
    assert unknown_variables({"PROMPTBUS_GROUPID": "x", "PROMPTBUS_GROUP_ID": "y", "HOME": "/"}) == [
        "PROMPTBUS_GROUPID is not a promptbus setting and is ignored; did you mean PROMPTBUS_GROUP_ID?"
    ]
    assert unknown_variables(dict.fromkeys(setting_variables(), "1")) == []
    assert "PROMPTBUS_KAFKA__SASL_PASSWORD" in setting_variables()


def test_a_tier_files_problems_are_said_together_unknown_keys_first() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tier_file({"tier": {"a": TIER}, "lanes": {"x": {"topic": "t", "priorty": 1}}}, source="f.yaml")
    assert caught.value.lines() == [
        "lanes.x.priorty: unknown key, not permitted here (in f.yaml)",
        "tier: unknown key, not permitted here; did you mean 'tiers'? (in f.yaml)",
        "tiers: Field required (in f.yaml)",
    ]
