"""How the fault runs tell a kill's duplicates apart (`consumer.testing.faultrun`), and the free
ports the test tools hand out (`consumer.testing.ports`): plain data, no broker."""

from __future__ import annotations

from consumer.core.offsets import DoneOffsets
from consumer.testing.faultrun import KillSnapshot, attribute_duplicates, era_of
from consumer.testing.outcomes import Outcome, duplicate_count
from consumer.testing.ports import RESERVED_PORTS, free_ports

KILL_MS = 10_000


def outcome(job_id: str, offset: int, source_offset: int, timestamp_ms: int) -> Outcome:
    return Outcome(False, 0, offset, job_id, 0, source_offset, "answer", timestamp_ms)


def snapshot(results_end: int, committed: int = 0, done: tuple[int, ...] = ()) -> KillSnapshot:
    return KillSnapshot({0: (committed, DoneOffsets.of(done), 0)}, {(False, 0): results_end}, KILL_MS)


def test_an_outcome_belongs_to_the_process_that_was_killed_when_it_was_in_the_log_or_made_before() -> None:
    snap = snapshot(results_end=5)
    assert era_of(outcome("a", 4, 4, KILL_MS + 500), [snap]) == 0, "in the log at the kill"
    # sent just before the kill, appended after its end offsets were read
    assert era_of(outcome("b", 7, 7, KILL_MS - 3), [snap]) == 0
    assert era_of(outcome("c", 7, 7, KILL_MS + 1500), [snap]) == 1, "made by the restarted process"


def test_duplicates_are_put_under_their_cause() -> None:
    snap = snapshot(results_end=3, committed=1, done=(2,))
    outcomes = [
        outcome("uncommitted", 0, 5, KILL_MS - 20),  # acked, not committed at the kill
        outcome("committed", 1, 2, KILL_MS - 40),  # named in the commit's metadata
        outcome("late", 3, 6, KILL_MS - 2),  # reached the log after the kill was noted
        outcome("uncommitted", 4, 5, KILL_MS + 2000),
        outcome("committed", 5, 2, KILL_MS + 2000),
        outcome("late", 6, 6, KILL_MS + 2100),
        outcome("twice", 7, 8, KILL_MS + 2200),
        outcome("twice", 8, 8, KILL_MS + 2300),  # one process answered it twice
    ]
    causes = attribute_duplicates(outcomes, [snap])
    assert causes == {"acked_uncommitted": 2, "committed_redone": 1, "same_process": 1}
    assert duplicate_count(o.job_id for o in outcomes) == sum(causes.values())


def test_free_ports_are_distinct_and_never_a_fixed_broker_port() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20 and not set(ports) & RESERVED_PORTS
