"""Consumer lag and the age of the oldest uncommitted record, from successive intake offsets."""

from __future__ import annotations

from consumer.core.lag import LagTracker, PartitionLag, PartitionOffsets


def test_lag_is_end_minus_committed_and_in_flight_work_counts() -> None:
    tracker: LagTracker[str] = LagTracker()
    out = tracker.update(0.0, {"p0": PartitionOffsets(end=100, committed=40, position=90)})
    assert out["p0"].records == 60


def test_no_commit_yet_counts_from_the_log_start() -> None:
    tracker: LagTracker[str] = LagTracker()
    out = tracker.update(0.0, {"p0": PartitionOffsets(end=10, committed=None, position=0, start=3)})
    assert out == {"p0": PartitionLag(7, 0.0)}


def test_a_stalled_watermark_shows_as_a_growing_age_and_a_commit_resets_it() -> None:
    tracker: LagTracker[str] = LagTracker()
    assert tracker.update(0.0, {"p": PartitionOffsets(10, 0, 0)})["p"].oldest_age_s == 0.0  # nothing read
    tracker.update(5.0, {"p": PartitionOffsets(10, 0, 10)})  # offsets 0..9 read by t=5
    assert tracker.update(20.0, {"p": PartitionOffsets(20, 0, 20)})["p"].oldest_age_s == 15.0
    assert tracker.update(65.0, {"p": PartitionOffsets(20, 0, 20)})["p"].oldest_age_s == 60.0
    # offsets up to 10 committed: the oldest uncommitted (10..19) was read by t=20
    assert tracker.update(70.0, {"p": PartitionOffsets(20, 10, 20)})["p"].oldest_age_s == 50.0
    # everything committed: no uncommitted record read
    assert tracker.update(75.0, {"p": PartitionOffsets(20, 20, 20)})["p"] == PartitionLag(0, 0.0)


def test_revoked_partitions_are_forgotten_and_a_rewound_position_starts_afresh() -> None:
    tracker: LagTracker[str] = LagTracker()
    tracker.update(0.0, {"a": PartitionOffsets(5, 0, 5), "b": PartitionOffsets(5, 0, 5)})
    assert set(tracker.update(1.0, {"a": PartitionOffsets(5, 0, 5)})) == {"a"}
    out = tracker.update(9.0, {"a": PartitionOffsets(5, 0, 2)})  # assigned again, read from 0
    assert out["a"].oldest_age_s == 0.0
