"""Collection windows (DESIGN.md rules 2-4), driven by an explicit clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.jobs import Job
from consumer.core.templates import split_batchable
from consumer.core.window import CollectionWindows, Flush, PackKey, WindowLimits, options_key, pack_key_for

LIMITS = WindowLimits(max_items=3, max_input_chars=100, window_ms=100, max_wait_ms=1000)
K1 = PackKey("small", "Summarize:\n", "text", "{}", "online")
K2 = PackKey("small", "Classify:\n", "text", "{}", "online")


def never(_key: PackKey) -> bool:
    return True


def _add(w: CollectionWindows[str], item: str, now_s: float, *, key: PackKey = K1, chars: int = 10,
         partition: int = 0, limits: WindowLimits = LIMITS) -> list[Flush[str]]:
    return w.add(key, item, input_chars=chars, partition=partition, limits=limits, now_s=now_s)


def test_flush_on_max_items() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    assert _add(w, "a", 0.0) == [] and _add(w, "b", 0.01) == []
    assert len(w) == 2
    assert _add(w, "c", 0.02) == [Flush(K1, ("a", "b", "c"), "max_items")]
    assert len(w) == 0 and w.next_deadline_s() is None


def test_keys_are_separate_windows() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a", 0.0, key=K1)
    _add(w, "b", 0.0, key=K2)
    _add(w, "c", 0.0, key=K1)
    assert len(w) == 3 and set(w.keys()) == {K1, K2}
    flushes = w.drain_all()
    assert {f.key: f.items for f in flushes} == {K1: ("a", "c"), K2: ("b",)}
    assert all(f.reason == "drain" for f in flushes) and len(w) == 0


def test_flush_after_window_ms_without_new_member() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a", 0.0)
    _add(w, "b", 0.05)
    deadline = w.next_deadline_s()
    assert deadline is not None and abs(deadline - 0.15) < 1e-9
    assert w.due(0.14, can_still_join=never) == []
    # due exactly at next_deadline_s(): a caller sleeping until then never spins
    assert w.due(deadline, can_still_join=never) == [Flush(K1, ("a", "b"), "window")]


def test_max_wait_bounds_a_window_that_keeps_growing() -> None:
    limits = WindowLimits(max_items=1000, max_input_chars=10**6, window_ms=100, max_wait_ms=300)
    w: CollectionWindows[str] = CollectionWindows()
    now = 0.0
    flushes: list[Flush[str]] = []
    while not flushes:
        _add(w, f"i{now:.2f}", now, limits=limits)
        now += 0.05  # a member every 50 ms: window_ms alone would never fire
        flushes = w.due(now, can_still_join=never)
    assert flushes[0].reason == "max_wait"
    assert now <= 0.3 + 1e-9 and w.next_deadline_s() is None


def test_next_deadline_is_capped_by_max_wait() -> None:
    limits = WindowLimits(max_items=10, max_input_chars=1000, window_ms=500, max_wait_ms=600)
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a", 10.0, limits=limits)
    _add(w, "b", 10.4, limits=limits)
    deadline = w.next_deadline_s()
    assert deadline is not None and abs(deadline - 10.6) < 1e-9
    assert w.due(deadline, can_still_join=never)[0].reason == "max_wait"


def test_flush_when_no_other_job_could_join() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a", 0.0, key=K1)
    _add(w, "b", 0.0, key=K2)
    flushes = w.due(0.001, can_still_join=lambda key: key == K2)
    assert flushes == [Flush(K1, ("a",), "idle")]
    assert w.keys() == [K2]


def test_input_chars_split_a_window() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    assert _add(w, "a", 0.0, chars=60) == []
    assert _add(w, "b", 0.0, chars=40) == []  # exactly at the limit is fine
    flushes = _add(w, "c", 0.0, chars=1)
    assert flushes == [Flush(K1, ("a", "b"), "max_input_chars")]
    assert len(w) == 1


def test_oversized_input_goes_alone_and_leaves_window_open() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a", 0.0, chars=10)
    assert _add(w, "huge", 0.0, chars=101) == [Flush(K1, ("huge",), "max_input_chars")]
    assert len(w) == 1
    assert w.drain_all() == [Flush(K1, ("a",), "drain")]


def test_window_keeps_its_opening_limits() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a", 0.0)
    _add(w, "b", 0.0, limits=WindowLimits(max_items=2, max_input_chars=100, window_ms=100, max_wait_ms=1000))
    assert len(w) == 2  # max_items of the open window (3) still applies


def test_drain_partitions_keeps_other_items_of_mixed_windows() -> None:
    w: CollectionWindows[str] = CollectionWindows()
    _add(w, "a0", 0.0, partition=0, chars=30)
    _add(w, "b1", 0.0, partition=1, chars=30)
    _add(w, "c2", 0.0, key=K2, partition=2)
    assert w.drain_partitions({1, 2}) == ["b1", "c2"]
    assert len(w) == 1 and w.keys() == [K1]
    # the remaining window's char budget was released with the drained item
    assert _add(w, "d0", 0.0, partition=0, chars=70) == []
    assert w.drain_all() == [Flush(K1, ("a0", "d0"), "drain")]
    assert w.drain_partitions({0}) == []


def test_batch_key_for_a_job() -> None:
    job = Job(id="1", tier="small", prompt="Summarize:\n${text}", variables={"text": "x"},
              options={"temperature": 0, "max_tokens": 50}, batch=True)
    split = split_batchable(job.prompt or "")
    assert split is not None
    key = pack_key_for(job, split)
    assert key == PackKey("small", "Summarize:\n", "text", '{"max_tokens":50,"temperature":0}', "online")
    assert options_key({"b": 1, "a": {"z": 1, "y": 2}}) == options_key({"a": {"y": 2, "z": 1}, "b": 1})
    assert options_key({"a": 1}) != options_key({"a": 1.5})


def test_limits_from_config() -> None:
    from consumer.settings import BatchingConfig

    limits = WindowLimits.from_config(BatchingConfig(enabled=True, max_items=7, window_ms=50, max_wait_ms=60))
    assert limits == WindowLimits(max_items=7, max_input_chars=32000, window_ms=50, max_wait_ms=60)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "due", "drain"]),
        st.sampled_from([K1, K2]),
        st.integers(1, 150),  # chars: sometimes above max_input_chars
        st.integers(0, 2),  # partition
        st.floats(0, 0.3),  # time step
    ),
    max_size=60,
)


@settings(max_examples=200)
@given(_ops, st.integers(1, 5), st.integers(20, 120))
def test_windows_never_exceed_limits_and_lose_nothing(ops: list, max_items: int, max_chars: int) -> None:
    limits = WindowLimits(max_items=max_items, max_input_chars=max_chars, window_ms=100, max_wait_ms=250)
    w: CollectionWindows[int] = CollectionWindows()
    chars: dict[int, int] = {}
    out: list[int] = []
    now = 0.0
    n = 0
    for op, key, size, part, step in ops:
        now += step
        if op == "add":
            chars[n] = size
            flushes = w.add(key, n, input_chars=size, partition=part, limits=limits, now_s=now)
            n += 1
        elif op == "due":
            flushes = w.due(now, can_still_join=lambda k: k == K1)
            for f in flushes:
                assert f.reason in ("window", "max_wait", "idle")
            # nothing due is left behind, and only K1 windows (that can still join) stay
            left = w.next_deadline_s()
            assert left is None or left > now
            assert set(w.keys()) <= {K1}
        else:
            out.extend(w.drain_partitions({part}))
            flushes = []
        for f in flushes:
            assert 1 <= len(f.items) <= max_items
            total = sum(chars[i] for i in f.items)
            # only a lone oversized input may break the char limit
            assert total <= max_chars or (len(f.items) == 1 and f.reason == "max_input_chars")
            out.extend(f.items)
        deadline = w.next_deadline_s()
        if deadline is not None:
            assert deadline <= now + 0.25 + 1e-9
        assert len(w) + len(out) == n
    for f in w.drain_all():
        out.extend(f.items)
    assert sorted(out) == list(range(n))  # every item came out exactly once
