"""Commit watermarks: out-of-order completion, gaps, revoke; the finished offsets above the
watermark a commit carries, and their offset-metadata text (encode / decode)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.core.offsets import (
    METADATA_MAX_CHARS,
    DecodedDone,
    DoneOffsets,
    OffsetTracker,
    decode_done,
    encode_done,
)

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


# ---------------------------------------------------------------- finished offsets above the watermark


def test_commit_points_carry_what_is_finished_above_the_watermark() -> None:
    t = OffsetTracker()
    for off in range(10, 20):
        t.track(TP, off)
    for off in (12, 13, 15, 19):
        t.complete(TP, off)
    (point,) = t.commit_points().values()
    assert point.offset == 10 and list(point.done) == [12, 13, 15, 19]
    assert t.committable() == {}, "the watermark itself did not move"
    t.mark_committed({TP: point})
    assert t.commit_points() == {}, "nothing finished since that commit"
    t.complete(TP, 10)
    t.complete(TP, 11)
    (point,) = t.commit_points().values()
    assert point.offset == 14 and list(point.done) == [15, 19]
    assert t.done_above(TP) == point.done and t.done_above(TP2) == DoneOffsets()


def test_a_completion_during_a_commit_is_committed_next_round() -> None:
    t = OffsetTracker()
    for off in range(4):
        t.track(TP, off)
    t.complete(TP, 2)
    taken = t.commit_points()  # ... the commit is on its way when 3 finishes
    t.complete(TP, 3)
    t.mark_committed(taken)
    (point,) = t.commit_points().values()
    assert point.offset == 0 and list(point.done) == [2, 3]


def test_a_plain_offset_marks_only_the_position() -> None:
    t = OffsetTracker()
    for off in range(3):
        t.track(TP, off)
    t.complete(TP, 0)
    t.complete(TP, 2)
    t.mark_committed({TP: 1})  # e.g. a transactional commit: no finished offsets carried
    (point,) = t.commit_points().values()
    assert point.offset == 1 and list(point.done) == [2]


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=80),
    st.randoms(use_true_random=False),
    st.integers(1, 80),
)
def test_commit_points_name_only_finished_offsets(gaps: list[int], rnd: object, steps: int) -> None:
    t = OffsetTracker()
    offsets = []
    off = 0
    for g in gaps:
        off += g
        offsets.append(off)
        t.track(TP, off)
    order = offsets[:]
    rnd.shuffle(order)  # type: ignore[attr-defined]
    done: set[int] = set()
    for o in order[:steps]:
        t.complete(TP, o)
        done.add(o)
        points = t.commit_points()
        assert TP in points, "every completion is news for the next commit"
        point = points[TP]
        assert set(point.done) == {x for x in done if x > point.offset}
        assert all(x in done for x in offsets if x < point.offset)
        t.mark_committed(points)


# ---------------------------------------------------------------- the offset metadata text

offset_sets = st.frozensets(st.integers(0, 3000), max_size=300)
bases = st.integers(0, 2**40)


@given(bases, offset_sets)
def test_decode_of_encode_is_the_same_set(base: int, rel: frozenset[int]) -> None:
    done = DoneOffsets.of(base + r for r in rel)
    text = encode_done(base, done, max_chars=100_000)
    decoded = decode_done(base, text)
    assert decoded.reason is None and decoded.done == done
    assert text.isascii() and (text == "") == (not rel)


@given(bases, offset_sets, st.integers(0, 200))
def test_what_does_not_fit_is_left_out_from_the_high_end(
    base: int, rel: frozenset[int], max_chars: int
) -> None:
    done = DoneOffsets.of(base + r for r in rel)
    text = encode_done(base, done, max_chars=max_chars)
    assert len(text) <= max_chars
    decoded = decode_done(base, text)
    assert decoded.reason is None
    kept = set(decoded.done)
    assert kept <= set(done), "never names an offset that is not finished"
    if kept:  # the lowest ones: nothing below the highest kept is left out
        assert {o for o in done if o <= max(kept)} == kept


def test_runs_and_bitmaps_are_both_used_and_a_long_run_is_short() -> None:
    runs = encode_done(1000, DoneOffsets.of(range(1001, 1_001_001)))
    assert runs.startswith("pb1r1000:") and len(runs) < 40
    assert len(decode_done(1000, runs).done) == 1_000_000
    scattered = DoneOffsets.of(range(1001, 3000, 2))
    bits = encode_done(1000, scattered)
    assert bits.startswith("pb1b1000:") and decode_done(1000, bits).done == scattered


def test_a_full_set_fits_the_default_limit_from_the_low_end() -> None:
    every_third = DoneOffsets.of(range(1, 60_000, 3))
    text = encode_done(0, every_third)
    assert len(text) <= METADATA_MAX_CHARS
    kept = list(decode_done(0, text).done)
    assert kept == list(every_third)[: len(kept)] and len(kept) > 5000


def test_offsets_below_the_committed_one_are_left_out() -> None:
    text = encode_done(10, DoneOffsets.of([3, 9, 10, 11]))
    assert list(decode_done(10, text).done) == [10, 11]
    assert encode_done(10, DoneOffsets.of([3, 9])) == ""


@given(bases, offset_sets.filter(bool), st.data())
def test_a_truncated_or_damaged_text_decodes_to_nothing_with_a_reason(
    base: int, rel: frozenset[int], data: st.DataObject
) -> None:
    text = encode_done(base, DoneOffsets.of(base + r for r in rel), max_chars=100_000)
    cut = data.draw(st.integers(1, len(text) - 1))
    for broken in (text[:cut], text[:cut] + "x" + text[cut + 1 :]):
        if broken == text:
            continue
        decoded = decode_done(base, broken)
        assert decoded.done == DoneOffsets() and decoded.reason, broken


@given(st.integers(-5, 2**63), st.text(max_size=60))
def test_any_text_decodes_without_raising(base: int, text: str) -> None:
    decoded = decode_done(base, text)
    assert decoded.reason or not text or decoded.done


@given(bases, st.from_regex(r"pb1[rb][0-9]{1,6}:[A-Za-z0-9_-]{0,12}:[0-9a-f]{8}", fullmatch=True))
def test_lookalike_garbage_decodes_to_nothing_with_a_reason(base: int, text: str) -> None:
    decoded = decode_done(base, text)
    assert decoded.done == DoneOffsets() and decoded.reason


def test_reasons_name_what_is_wrong() -> None:
    good = encode_done(7, DoneOffsets.of([8, 9]))
    assert decode_done(7, "") == DecodedDone(DoneOffsets())
    assert decode_done(7, "written by another tool").reason == "not promptbus offset metadata"
    assert "unknown metadata version" in (decode_done(7, "pb2r7:AQE:00000000").reason or "")
    assert "checksum" in (decode_done(7, good[:-1] + "0").reason or "")
    assert "not the committed 8" in (decode_done(8, good).reason or "")


@given(st.frozensets(st.integers(0, 200)), st.frozensets(st.integers(0, 200)), st.integers(0, 210))
def test_done_offsets_behave_like_sets(a: frozenset[int], b: frozenset[int], cut: int) -> None:
    da, db = DoneOffsets.of(a), DoneOffsets.of(b)
    assert set(da) == a and len(da) == len(a) and bool(da) == bool(a)
    assert all((x in da) == (x in a) for x in range(-1, 202))
    assert set(da.union(db)) == a | b
    assert da.union(db) == DoneOffsets.of_ranges(da.ranges + db.ranges)
    assert set(da.from_offset(cut)) == {x for x in a if x >= cut}
    assert list(da.lowest(cut)) == sorted(a)[:cut]
