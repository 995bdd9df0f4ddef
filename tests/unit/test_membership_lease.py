"""The membership lease: held until a session after the send time of the last request the
group answered; unarmed (no consumer group) it is always held."""

from __future__ import annotations

from consumer.kafka.assignment import Assignment, MembershipLease


def test_unarmed_lease_is_always_held() -> None:
    assert Assignment().lease.held(1e9)


def test_held_for_a_session_after_the_last_answered_send() -> None:
    lease = MembershipLease()
    lease.arm(10.0, now_s=100.0)
    assert lease.held(109.9) and not lease.held(110.0)
    lease.confirm(105.0)  # a heartbeat sent at 105 was answered
    assert lease.held(114.9) and not lease.held(115.0)
    lease.confirm(101.0)  # an older answer arriving late does not move it back
    assert lease.held(114.9)


def test_in_doubt_after_a_heartbeat_and_a_half_without_an_answer() -> None:
    lease = MembershipLease()
    lease.arm(10.0, now_s=100.0, heartbeat_s=1.0)
    assert lease.certain_for(101.0) == 0.5
    assert lease.certain_for(101.5) <= 0 and lease.held(101.5)  # in doubt long before it lapses
    lease.confirm(101.2)  # a heartbeat sent at 101.2 was answered
    assert lease.certain_for(102.0) > 0


def test_unarmed_or_without_a_heartbeat_interval_doubt_comes_with_the_lapse() -> None:
    assert Assignment().lease.certain_for(1e9) == float("inf")
    lease = MembershipLease()
    lease.arm(10.0, now_s=100.0)
    assert lease.certain_for(109.9) > 0 and lease.certain_for(110.0) <= 0


def test_a_member_that_left_the_group_is_held_and_never_in_doubt() -> None:
    """After a stop's hand-over the member leaves: no heartbeat is answered any more, and what
    it still writes (what it handed over) must not wait for one."""
    lease = MembershipLease()
    lease.arm(10.0, now_s=100.0, heartbeat_s=1.0)
    assert lease.certain_for(102.0) <= 0 and not lease.held(111.0)
    lease.leave()
    assert lease.held(1e9) and lease.certain_for(1e9) > 0
