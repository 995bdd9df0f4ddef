"""The enqueued token limit's rules (`consumer.core.offline`): what is enqueued, what fits,
when a batch the provider failed for the limit goes again."""

from __future__ import annotations

from consumer.core.offline import (
    ENQUEUED_TOKEN_LIMIT,
    BatchJob,
    BatchStatus,
    enqueued_tokens,
    fits,
    may_resubmit,
    resubmit_backoff_s,
)


def test_a_batch_failed_for_the_limit_is_told_apart_from_other_failures() -> None:
    assert BatchJob("b", "openai", BatchStatus.FAILED, error_code=ENQUEUED_TOKEN_LIMIT).over_enqueued_limit
    assert not BatchJob("b", "openai", BatchStatus.FAILED, error_code="invalid_file").over_enqueued_limit
    assert not BatchJob(
        "b", "openai", BatchStatus.RUNNING, error_code=ENQUEUED_TOKEN_LIMIT
    ).over_enqueued_limit


def test_enqueued_tokens_are_the_tiers_records_estimates() -> None:
    records = [
        {"tier": "a", "estimated_tokens": 100},
        {"tier": "a", "estimated_tokens": "x"},  # not a number: counts none
        {"tier": "a"},  # written before records carried an estimate
        {"tier": "b", "estimated_tokens": 7},
    ]
    assert enqueued_tokens(records, "a") == 100
    assert enqueued_tokens(records, "b") == 7


def test_a_batch_fits_beside_what_is_enqueued_or_alone() -> None:
    assert fits(60, 40, 100) and not fits(61, 40, 100)
    assert fits(500, 0, 100), "with nothing enqueued a batch always gets its turn"
    assert fits(10**9, 10**9, None), "no limit"


def test_a_held_batch_goes_again_once_room_has_freed_or_its_backoff_passed() -> None:
    rule = {"tokens": 60, "enqueued": 40, "limit": 100}
    assert may_resubmit(**rule, ended_since=True, waited_s=0.0, backoff_s=60.0)
    assert not may_resubmit(**rule, ended_since=False, waited_s=10.0, backoff_s=60.0)
    assert may_resubmit(**rule, ended_since=False, waited_s=60.0, backoff_s=60.0)
    assert not may_resubmit(tokens=61, enqueued=40, limit=100, ended_since=True, waited_s=1e6, backoff_s=1.0)


def test_the_backoff_starts_at_the_poll_interval_and_doubles_to_a_cap() -> None:
    assert resubmit_backoff_s(1, poll_s=10.0) == 60.0
    assert resubmit_backoff_s(1, poll_s=120.0) == 120.0
    assert resubmit_backoff_s(3, poll_s=10.0) == 240.0
    assert resubmit_backoff_s(50, poll_s=10.0) == 1800.0
