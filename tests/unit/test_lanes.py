"""Lanes: the tier file's `lanes`, and the pure scheduler's priority, min_share and deadline order."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from consumer.core.errors import ConfigError
from consumer.core.lanes import DEFAULT_MIN_SHARE, Lane, pack_lane
from consumer.core.scheduling import LaneScheduler
from consumer.core.window import LaneWindows, PackKey, WindowLimits
from consumer.settings import lane_topic, parse_tier_file

TIERS = {"small": {"provider": "openai", "model": "m"}}
INTERACTIVE = Lane("interactive", "t.i", rank=0)
STANDARD = Lane("standard", "t.s", rank=1, min_share=0.05)
BULK = Lane("bulk", "t.b", rank=2, min_share=0.1)


# ---------------------------------------------------------------- the tier file
def test_no_lanes_is_one_default_lane_on_the_jobs_topic() -> None:
    tf = parse_tier_file({"tiers": TIERS})
    (lane,) = tf.lane_list("promptbus.jobs", 123)
    assert (lane.name, lane.topic, lane.rank, lane.min_share, lane.max_inflight) == (
        "default",
        "promptbus.jobs",
        0,
        0.0,
        123,
    )


def test_lanes_in_order_with_defaults() -> None:
    tf = parse_tier_file(
        {
            "tiers": TIERS,
            "lanes": {
                "interactive": {"topic": "promptbus.jobs.interactive", "max_wait_ms": 50},
                "standard": {"topic": "promptbus.jobs"},
                "bulk": {"topic": "promptbus.jobs.bulk", "min_share": 0.1, "max_inflight": 7},
            },
        }
    )
    lanes = tf.lane_list("ignored", 100)
    assert [(lane.name, lane.rank) for lane in lanes] == [("interactive", 0), ("standard", 1), ("bulk", 2)]
    assert [lane.min_share for lane in lanes] == [0.0, DEFAULT_MIN_SHARE, 0.1]
    assert [lane.max_inflight for lane in lanes] == [100, 100, 7]
    assert [lane.max_wait_ms for lane in lanes] == [50, None, None]
    assert lane_topic(tf, "bulk", "promptbus.jobs") == "promptbus.jobs.bulk"
    assert lane_topic(tf, None, "promptbus.jobs") == "promptbus.jobs"
    with pytest.raises(ConfigError, match="unknown"):
        lane_topic(tf, "nope", "promptbus.jobs")
    with pytest.raises(ConfigError, match="no lanes"):
        lane_topic(parse_tier_file({"tiers": TIERS}), "bulk", "promptbus.jobs")


@pytest.mark.parametrize(
    ("lanes", "message"),
    [
        ({"a": {"topic": "x"}, "b": {"topic": "x"}}, "another lane"),
        ({"a": {"topic": "x", "min_share": 1.0}}, "less than 1"),
        ({"a": {"topic": "x", "min_share": -0.1}}, "greater than or equal"),
        ({"a": {"topic": "x", "min_share": 0.6}, "b": {"topic": "y", "min_share": 0.5}}, "add up"),
        ({"a": {"topic": "x", "max_wait_ms": 0}}, "greater than 0"),
        ({"a": {"topic": ""}}, "at least 1"),
        ({"a": {"topic": "x", "priority": 1}}, "unknown key, not permitted here"),
    ],
)
def test_bad_lanes_name_the_problem(lanes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_tier_file({"tiers": TIERS, "lanes": lanes})
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- the scheduler
def test_highest_lane_first_then_nearest_deadline() -> None:
    s: LaneScheduler[str] = LaneScheduler()
    s.push("bulk-1", BULK)
    s.push("int-late", INTERACTIVE, deadline_s=20.0)
    s.push("int-none", INTERACTIVE)
    s.push("int-soon", INTERACTIVE, deadline_s=10.0)
    s.push("int-soon-2", INTERACTIVE, deadline_s=10.0)
    order = [s.pop(0.0) for _ in range(5)]
    assert order == ["int-soon", "int-soon-2", "int-late", "int-none", "bulk-1"]
    assert s.pop(0.0) is None and len(s) == 0


def test_discarded_items_are_never_handed_out() -> None:
    s: LaneScheduler[str] = LaneScheduler()
    s.push("a", INTERACTIVE)
    s.push("b", INTERACTIVE)
    assert s.discard("a") and not s.discard("a")
    assert s.waiting("interactive") == 1
    assert s.peek(0.0) == "b" == s.pop(0.0)


def test_pack_lane_is_the_most_urgent_member() -> None:
    assert pack_lane([BULK, STANDARD, BULK]) is STANDARD


@settings(max_examples=60, deadline=None)
@given(
    shares=st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.3]), min_size=2, max_size=4),
    grants=st.integers(min_value=20, max_value=300),
    step_s=st.sampled_from([0.001, 0.01, 0.05]),
)
def test_every_lane_with_work_keeps_its_min_share(shares: list[float], grants: int, step_s: float) -> None:
    """Every lane always has work waiting: over the share window, each lane gets at least its
    min_share of the grants, less two (a lane is owed a slot once a whole slot behind, and
    rounding); the first lane takes the rest."""
    assume(sum(shares[1:]) < 1)  # the tier file refuses shares that add up to 1 or more
    lanes = [Lane(f"l{i}", f"t{i}", rank=i, min_share=0.0 if i == 0 else sh) for i, sh in enumerate(shares)]
    s: LaneScheduler[tuple[int, int]] = LaneScheduler(window_s=1e9)  # the whole run is one window
    for i, lane in enumerate(lanes):
        for n in range(grants):
            s.push((i, n), lane)
    counts = [0] * len(lanes)
    now_s = 0.0
    for _ in range(grants):
        item = s.pop(now_s)
        assert item is not None
        counts[item[0]] += 1
        now_s += step_s
    for lane, count in zip(lanes, counts, strict=True):
        assert count >= lane.min_share * grants - 2, (lane, counts)
    # nobody is given more than its share while a higher lane waits, beyond one grant
    for lane, count in zip(lanes[1:], counts[1:], strict=True):
        assert count <= lane.min_share * grants + 1, (lane, counts)


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(st.integers(0, 2), st.one_of(st.none(), st.floats(0, 100, allow_nan=False))),
        min_size=1,
        max_size=60,
    )
)
def test_zero_shares_is_strict_priority_then_deadline(arrivals: list[tuple[int, float | None]]) -> None:
    """Without min_share the order is: rank, then deadline (None last), then arrival."""
    lanes = [Lane(f"l{i}", f"t{i}", rank=i) for i in range(3)]
    s: LaneScheduler[int] = LaneScheduler()
    for n, (rank, deadline_s) in enumerate(arrivals):
        s.push(n, lanes[rank], deadline_s)
    popped = [s.pop(float(i)) for i in range(len(arrivals))]

    def order(n: int) -> tuple[int, float, int]:
        rank, deadline_s = arrivals[n]
        return (rank, float("inf") if deadline_s is None else deadline_s, n)

    assert popped == sorted(range(len(arrivals)), key=order)


def test_share_is_measured_over_a_sliding_window() -> None:
    """Grants older than the window no longer count: a lane that had its share long ago is owed again."""
    s: LaneScheduler[str] = LaneScheduler(window_s=5.0)
    for n in range(100):
        s.push(f"i{n}", INTERACTIVE)
        s.push(f"b{n}", BULK)
    first = [s.pop(0.1 * t) for t in range(40)]  # 4 s: bulk gets about one in ten
    assert 3 <= sum(x.startswith("b") for x in first if x) <= 5
    assert s.granted("bulk", 3.9) == sum(x.startswith("b") for x in first if x)
    assert s.granted("bulk", 100.0) == 0  # all expired


# ---------------------------------------------------------------- windows
KEY = PackKey("small", "Classify:\n", "text", "{}", "online")
LIMITS = WindowLimits(max_items=10, max_input_chars=10_000, window_ms=100, max_wait_ms=2000)
FAST = Lane("interactive", "t.i", rank=0, max_wait_ms=50)


def _never(_key: PackKey) -> bool:
    return True  # something could still join: only time flushes


def test_a_window_holding_a_fast_lane_job_flushes_by_that_lanes_max_wait() -> None:
    w: LaneWindows[str] = LaneWindows()
    for n in range(2):  # a new member every 40 ms: the tier's window_ms alone would keep it open
        assert w.add(KEY, f"i{n}", lane=FAST, input_chars=5, partition=0, limits=LIMITS, now_s=n * 0.04) == []
    assert w.next_deadline_s() == pytest.approx(0.05)
    assert w.due(0.049, can_still_join=_never) == []
    (flush,) = w.due(0.05, can_still_join=_never)
    assert flush.items == ("i0", "i1")
    assert flush.reason == "max_wait"


def test_lanes_with_different_waits_never_share_a_window() -> None:
    w: LaneWindows[str] = LaneWindows()
    w.add(KEY, "bulk-0", lane=BULK, input_chars=5, partition=0, limits=LIMITS, now_s=0.0)
    w.add(KEY, "int-0", lane=FAST, input_chars=5, partition=0, limits=LIMITS, now_s=0.01)
    w.add(KEY, "std-0", lane=STANDARD, input_chars=5, partition=0, limits=LIMITS, now_s=0.02)
    assert len(w) == 3
    fast = w.due(0.061, can_still_join=_never)
    assert [f.items for f in fast] == [("int-0",)]  # the bulk window is not pulled forward
    # standard and bulk flush by the same wait: they share a window, due by the tier's timing
    (slow,) = w.due(0.121, can_still_join=_never)
    assert slow.items == ("bulk-0", "std-0") and slow.reason == "window"
    assert w.next_deadline_s() is None


def test_drains_reach_every_lane_window() -> None:
    w: LaneWindows[str] = LaneWindows()
    w.add(KEY, "a", lane=FAST, input_chars=5, partition=1, limits=LIMITS, now_s=0.0)
    w.add(KEY, "b", lane=BULK, input_chars=5, partition=2, limits=LIMITS, now_s=0.0)
    w.add(KEY, "c", lane=None, input_chars=5, partition=1, limits=LIMITS, now_s=0.0)
    assert sorted(w.drain_partitions({1})) == ["a", "c"]
    assert [f.items for f in w.drain_all()] == [("b",)]
