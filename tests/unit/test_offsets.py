"""Commit watermarks: out-of-order completion, gaps, revoke."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.core.offsets import OffsetTracker

TP = ("promptbus.jobs", 0)
TP2 = ("promptbus.jobs", 1)


def test_watermark_waits_for_the_lowest_unfinished() -> None:
    t = OffsetTracker()
    for off in (10, 11, 12):
        t.track(TP, off)
    assert t.committable() == {}  # nothing done yet: watermark is still 10
    assert t.complete(TP, 12) and t.complete(TP, 11)
    assert t.committable() == {} and t.watermark(TP) == 10
    assert t.complete(TP, 10)
    assert t.committable() == {TP: 13}  # Kafka convention: the next offset to read
    assert t.pending_count(TP) == 0


def test_only_advanced_partitions_are_committable() -> None:
    t = OffsetTracker()
    t.track(TP, 0)
    t.track(TP2, 5)
    t.complete(TP, 0)
    assert t.committable() == {TP: 1}
    t.mark_committed({TP: 1})
    assert t.committable() == {}
    t.mark_committed({TP: 0, ("other", 9): 3})  # never moves back; unknown ignored
    t.track(TP, 1)
    t.complete(TP, 1)
    assert t.committable() == {TP: 2}


def test_gaps_are_not_waited_for() -> None:
    t = OffsetTracker()
    for off in (3, 7, 8, 20):  # compaction / transaction markers leave gaps
        t.track(TP, off)
    t.complete(TP, 3)
    assert t.watermark(TP) == 7
    t.complete(TP, 8)
    t.complete(TP, 7)
    assert t.watermark(TP) == 20
    t.complete(TP, 20)
    assert t.watermark(TP) == 21


def test_late_and_double_completions_are_ignored() -> None:
    t = OffsetTracker()
    t.track(TP, 1)
    assert t.complete(TP, 1) and not t.complete(TP, 1)
    assert not t.complete(TP, 99) and not t.complete(TP, 0)
    assert not t.complete(TP2, 1)
    t.track(TP, 2)
    t.forget(TP)  # revoked
    assert not t.complete(TP, 2)
    assert t.watermark(TP) is None and t.committable() == {} and t.pending_count() == 0


def test_tracking_must_increase() -> None:
    t = OffsetTracker()
    t.track(TP, 5)
    try:
        t.track(TP, 5)
    except ValueError as exc:
        assert "not above" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected ValueError")
    t.forget(TP)
    t.track(TP, 2)  # after forget (e.g. a seek back on reassignment) it starts over
    assert t.partitions() == [TP]


def test_pending_counts() -> None:
    t = OffsetTracker()
    for off in range(5):
        t.track(TP, off)
    t.track(TP2, 0)
    t.complete(TP, 3)
    assert t.pending_count(TP) == 4 and t.pending_count(TP2) == 1 and t.pending_count() == 5
    assert t.pending_count(("nope", 0)) == 0


@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=60),  # gaps between offsets
    st.randoms(use_true_random=False),
)
def test_watermark_never_passes_an_unfinished_offset(gaps: list[int], rnd: object) -> None:
    t = OffsetTracker()
    offsets = []
    off = 100
    for g in gaps:
        off += g
        offsets.append(off)
        t.track(TP, off)
    order = offsets[:]
    rnd.shuffle(order)  # type: ignore[attr-defined]
    done: set[int] = set()
    committed = offsets[0]
    for o in order:
        assert t.complete(TP, o)
        done.add(o)
        ready = t.committable()
        if TP in ready:
            mark = ready[TP]
            assert mark > committed
            # everything below the mark is finished; the mark itself is unfinished or past the end
            assert all(x in done for x in offsets if x < mark)
            assert (mark in offsets and mark not in done) or mark == offsets[-1] + 1
            t.mark_committed(ready)
            committed = mark
    assert t.watermark(TP) == offsets[-1] + 1
