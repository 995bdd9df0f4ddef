"""Hand-overs (consumer/core/handover.py): what an old owner still owes, what a new owner makes
of each record it reads, and the commit rule across the two; the hand-over record's codec."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.core.handover import HandOver, HandOverBook, OutgoingHandOver, Verdict
from consumer.core.offsets import DoneOffsets, OffsetTracker
from consumer.kafka.handover import decode_hand_over, encode_hand_over

TOPIC = "promptbus.jobs"
NOW_MS = 1_000_000


def _handover(offsets: list[int], deadline_ms: int = NOW_MS + 60_000, partition: int = 0) -> HandOver:
    return HandOver(f"h-{partition}-{offsets}", TOPIC, partition, DoneOffsets.of(offsets), deadline_ms)


def test_an_outgoing_hand_over_is_open_until_every_offset_is_completed_or_given_up() -> None:
    out = OutgoingHandOver(_handover([3, 4, 5]))
    assert out.open and out.owes(4)
    assert out.complete(4) and not out.complete(4)  # once
    assert out.give_up(5) and not out.owes(5)
    assert not out.complete(9)  # never handed over
    assert out.open
    assert out.complete(3) and not out.open
    finished = out.finished()
    assert finished.finished and list(finished.completed) == [3, 4]
    assert list(finished.offsets) == [3, 4, 5]  # what was handed over, unchanged


def test_a_withdrawn_hand_over_completes_nothing_and_parks_nothing() -> None:
    h = _handover([1, 2])
    book = HandOverBook()
    book.load([h.withdrawn()])
    assert book.verdict(TOPIC, 0, 1, NOW_MS) is Verdict.RUN
    assert not book.active


def test_the_book_parks_until_the_deadline_then_runs() -> None:
    book = HandOverBook()
    book.load([_handover([10, 11], deadline_ms=NOW_MS + 5)])
    assert book.active and book.touches(TOPIC, 0) and not book.touches(TOPIC, 1)
    assert book.verdict(TOPIC, 0, 10, NOW_MS) is Verdict.PARK
    assert book.verdict(TOPIC, 0, 12, NOW_MS) is Verdict.RUN  # not handed over
    assert book.verdict(TOPIC, 1, 10, NOW_MS) is Verdict.RUN  # another partition
    assert book.verdict(TOPIC, 0, 10, NOW_MS + 5) is Verdict.RUN


def test_a_finished_hand_over_completes_what_it_names_and_releases_the_rest() -> None:
    out = OutgoingHandOver(_handover([10, 11, 12]))
    out.complete(10)
    out.complete(12)
    out.give_up(11)
    book = HandOverBook()
    book.load([out.finished()])
    assert book.verdict(TOPIC, 0, 10, NOW_MS) is Verdict.COMPLETED
    assert book.verdict(TOPIC, 0, 11, NOW_MS) is Verdict.RUN
    assert book.verdict(TOPIC, 0, 12, NOW_MS) is Verdict.COMPLETED


def test_hand_overs_in_a_row_each_park_their_own_offsets() -> None:
    """A partition moved twice in an answer time: the first old owner's offsets stay parked
    under its hand-over (the second never ran them), the second's under its own."""
    first, second = _handover([1, 2]), _handover([3])
    book = HandOverBook()
    book.load([first, second])
    assert [book.verdict(TOPIC, 0, o, NOW_MS) for o in (1, 2, 3, 4)] == [
        Verdict.PARK,
        Verdict.PARK,
        Verdict.PARK,
        Verdict.RUN,
    ]
    done = OutgoingHandOver(first)
    done.complete(1)
    done.complete(2)
    book.load([done.finished(), second])
    assert [book.verdict(TOPIC, 0, o, NOW_MS) for o in (1, 2, 3)] == [
        Verdict.COMPLETED,
        Verdict.COMPLETED,
        Verdict.PARK,
    ]


@given(
    count=st.integers(1, 40),
    handed=st.sets(st.integers(0, 39), max_size=40),
    completed=st.sets(st.integers(0, 39), max_size=40),
    finished_in_time=st.booleans(),
)
def test_the_new_owner_commits_past_an_offset_only_once_one_owner_has_its_outcome(
    count: int, handed: set[int], completed: set[int], finished_in_time: bool
) -> None:
    """The new owner reads every offset; the old owner completes some handed-over ones and
    gives up the rest, then says so (in time) or never (the deadline passes). The new owner's
    watermark never passes a parked offset, and in the end every offset has exactly one
    outcome: the old owner's (completed) or the new owner's (run)."""
    handed = {o for o in handed if o < count}
    completed &= handed
    h = _handover(sorted(handed), deadline_ms=NOW_MS + 10)
    book = HandOverBook()
    book.load([h])
    tracker = OffsetTracker()
    parked: list[int] = []
    outcomes: dict[int, str] = {}
    for offset in range(count):
        tracker.track(TOPIC, offset)
        verdict = book.verdict(TOPIC, 0, offset, NOW_MS)
        if verdict is Verdict.PARK:
            parked.append(offset)
        else:
            assert verdict is Verdict.RUN
            outcomes[offset] = "new"
            tracker.complete(TOPIC, offset)
    assert sorted(parked) == sorted(handed)
    mark = tracker.watermark(TOPIC)
    assert mark is not None and all(mark <= o for o in parked), "committed past a parked offset"

    now_ms = NOW_MS
    if finished_in_time:
        out = OutgoingHandOver(h)
        for offset in completed:
            outcomes[offset] = "old"  # written and acknowledged before it says finished
            out.complete(offset)
        for offset in handed - completed:
            out.give_up(offset)
        book.load([out.finished()])
    else:
        now_ms = NOW_MS + 10  # the old owner went silent: its deadline passes
    for offset in parked:
        verdict = book.verdict(TOPIC, 0, offset, now_ms)
        if verdict is Verdict.COMPLETED:
            assert outcomes.get(offset) == "old"
        else:
            assert verdict is Verdict.RUN and offset not in outcomes
            outcomes[offset] = "new"
        tracker.complete(TOPIC, offset)
    assert tracker.watermark(TOPIC) == count
    assert sorted(outcomes) == list(range(count))
    expected_old = completed if finished_in_time else set()
    assert {o for o, who in outcomes.items() if who == "old"} == expected_old


@given(
    offsets=st.lists(st.integers(0, 2**40), max_size=30),
    completed=st.lists(st.integers(0, 2**40), max_size=30),
    deadline_ms=st.integers(0, 2**50),
    finished=st.booleans(),
    partition=st.integers(0, 10_000),
)
def test_a_hand_over_record_reads_back_as_written(
    offsets: list[int], completed: list[int], deadline_ms: int, finished: bool, partition: int
) -> None:
    done = DoneOffsets.of(completed)
    h = HandOver("a/b", "jobs.topic", partition, DoneOffsets.of(offsets), deadline_ms, finished, done)
    assert decode_hand_over("a/b", encode_hand_over(h)) == h


def test_an_unreadable_hand_over_record_is_ignored() -> None:
    assert decode_hand_over("x", b"not json") is None
    assert decode_hand_over("x", b'{"topic": "t"}') is None
    backwards = (
        b'{"topic": "t", "partition": 0, "offsets": [[2, 1]], "deadline_ms": 0, "finished": false,'
        b' "completed": []}'
    )
    assert decode_hand_over("x", backwards) is None


def test_hand_overs_long_past_their_deadline_are_left_out() -> None:
    out = OutgoingHandOver(_handover([7], deadline_ms=NOW_MS))
    out.complete(7)
    book = HandOverBook()
    book.load([out.finished()], now_ms=NOW_MS + 60_000, keep_ms=60_000)
    assert book.verdict(TOPIC, 0, 7, NOW_MS + 60_000) is Verdict.COMPLETED
    book.load([out.finished()], now_ms=NOW_MS + 60_001, keep_ms=60_000)
    assert book.verdict(TOPIC, 0, 7, NOW_MS + 60_001) is Verdict.RUN and not book.active
