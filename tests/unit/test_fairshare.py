"""Weighted fair share between tenants (`consumer.core.fairshare`, and the limiter's scheduler
that uses it within each lane), as pure properties on a fake clock: nobody with work waits more
than one slot per other active tenant, shares follow the weights, an idle tenant banks no
credit, lanes stay above tenants, deadlines order a tenant's own requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.fairshare import FairQueue, fair_order
from consumer.core.lanes import Lane
from consumer.core.scheduling import LaneScheduler


class Item:
    """A waiting request (items are told apart by identity, as a limiter's waiters are)."""

    def __init__(self, tenant: str, n: int = 0) -> None:
        self.tenant, self.n = tenant, n

    def __repr__(self) -> str:
        return f"{self.tenant}#{self.n}"


def weights(table: dict[str, float]) -> Callable[[str], float]:
    return lambda tenant: table.get(tenant, 1.0)


def _waits_per_grant(order: list[str], tenant: str) -> list[Counter[str]]:
    """The other tenants' grants before each grant of `tenant`, and after its last one (the
    wait still going on at the end)."""
    gaps: list[Counter[str]] = [Counter()]
    for granted in order:
        if granted == tenant:
            gaps.append(Counter())
        else:
            gaps[-1][granted] += 1
    return gaps


@settings(max_examples=200, deadline=None)
@given(
    backlog=st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 40), min_size=2, max_size=6),
    pops=st.integers(1, 200),
)
def test_no_tenant_with_work_waits_more_than_one_slot_per_other_active_tenant(
    backlog: dict[str, int], pops: int
) -> None:
    queue: FairQueue[Item] = FairQueue()
    for tenant, n in backlog.items():
        for i in range(n):
            queue.push(Item(tenant, i), tenant)
    order: list[str] = []
    for _ in range(pops):
        item = queue.pop()
        if item is None:
            break
        order.append(item.tenant)
    for tenant in backlog:
        served = order.count(tenant)
        # while the tenant still had work, every gap before its next grant holds at most one
        # grant of each other tenant
        for gap in _waits_per_grant(order, tenant)[: served + (served < backlog[tenant])]:
            assert all(n <= 1 for n in gap.values()), (tenant, gap, order)


@settings(max_examples=100, deadline=None)
@given(
    waiting=st.dictionaries(st.sampled_from("abcde"), st.integers(1, 20), min_size=1, max_size=5),
    newcomer_at=st.integers(0, 60),
)
def test_a_tenant_that_arrives_waits_at_most_one_slot_per_active_tenant(
    waiting: dict[str, int], newcomer_at: int
) -> None:
    queue: FairQueue[Item] = FairQueue()
    for tenant, n in waiting.items():
        for i in range(n * 10):
            queue.push(Item(tenant, i), tenant)
    for _ in range(newcomer_at):
        queue.pop()
    active = len(queue.flows())
    queue.push(Item("new"), "new")
    before: list[str] = []
    while (item := queue.pop()) is not None and item.tenant != "new":
        before.append(item.tenant)
    assert item is not None and item.tenant == "new"
    assert len(before) <= active and len(set(before)) == len(before)


@settings(max_examples=25, deadline=None)
@given(table=st.dictionaries(st.sampled_from("abcd"), st.sampled_from([0.5, 1, 2, 3, 4, 7.5]), min_size=2))
def test_shares_follow_the_weights_within_10_percent_over_10000_slots(table: dict[str, float]) -> None:
    queue: FairQueue[Item] = FairQueue(weights(table))
    per_tenant = 10_000
    for tenant in table:
        for i in range(per_tenant):  # every tenant backlogged for the whole run
            queue.push(Item(tenant, i), tenant)
    served: Counter[str] = Counter()
    for _ in range(10_000):
        item = queue.pop()
        assert item is not None
        served[item.tenant] += 1
    total_weight = sum(table.values())
    for tenant, weight in table.items():
        expected = 10_000 * weight / total_weight
        assert abs(served[tenant] - expected) <= 0.1 * expected + 1, (served, table)


def test_the_issues_weights_1_1_2_4() -> None:
    table = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 4.0}
    queue: FairQueue[Item] = FairQueue(weights(table))
    for tenant in table:
        for i in range(8000):
            queue.push(Item(tenant, i), tenant)
    served = Counter(item.tenant for item in (queue.pop() for _ in range(8000)) if item is not None)
    assert served == {"a": 1000, "b": 1000, "c": 2000, "d": 4000}


@settings(max_examples=100, deadline=None)
@given(idle_slots=st.integers(1, 500), weight=st.sampled_from([1.0, 2.0, 4.0]))
def test_an_idle_tenant_banks_no_credit(idle_slots: int, weight: float) -> None:
    """b serves alone while a is idle; when a comes back it gets its share from then on, not a
    burst that makes up for the slots it did not ask for."""
    queue: FairQueue[Item] = FairQueue(weights({"a": weight}))
    queue.push(Item("a", -1), "a")
    assert queue.pop() is not None  # a was served once, then went idle
    for i in range(idle_slots + 100):
        queue.push(Item("b", i), "b")
    for _ in range(idle_slots):
        queue.pop()
    for i in range(100):
        queue.push(Item("a", i), "a")
    window = [item.tenant for item in (queue.pop() for _ in range(40)) if item is not None]
    share = weight / (weight + 1.0)
    assert window.count("a") <= round(40 * share) + 1, window
    assert window.count("b") >= round(40 * (1 - share)) - 1, window


def test_within_a_tenant_the_nearest_deadline_goes_first_then_arrival() -> None:
    queue: FairQueue[Item] = FairQueue()
    late, soon, none1, none2, sooner = (Item("a", n) for n in range(5))
    queue.push(late, "a", 30.0)
    queue.push(none1, "a")
    queue.push(soon, "a", 10.0)
    queue.push(none2, "a")
    queue.push(sooner, "a", 5.0)
    assert [queue.pop() for _ in range(5)] == [sooner, soon, late, none1, none2]


def test_discard_and_remove_where_forget_items_and_empty_flows() -> None:
    queue: FairQueue[Item] = FairQueue()
    items = [Item("a", i) for i in range(3)] + [Item("b", i) for i in range(3)]
    for item in items:
        queue.push(item, item.tenant)
    assert queue.discard(items[0]) and not queue.discard(items[0])
    removed = queue.remove_where(lambda item: item.tenant == "b")
    assert sorted(removed, key=lambda i: i.n) == items[3:]
    assert len(queue) == 2 and queue.waiting("b") == 0 and queue.flows() == ["a"]
    assert [queue.pop(), queue.pop(), queue.pop()] == [items[1], items[2], None]


def test_fair_order_interleaves_by_weight_and_keeps_each_tenants_order() -> None:
    flushes = [("a", i) for i in range(6)] + [("b", 0), ("b", 1)]
    ordered = fair_order(flushes, lambda f: f[0], weights({"a": 2.0}))
    assert ordered[:3] == [("a", 0), ("b", 0), ("a", 1)]
    assert [f for f in ordered if f[0] == "a"] == [("a", i) for i in range(6)]
    assert fair_order(flushes[:3], lambda f: f[0], weights({})) == flushes[:3]  # one tenant: as given


HIGH = Lane("interactive", "t.i", rank=0)
LOW = Lane("bulk", "t.b", rank=1, min_share=0.1)


def test_lanes_stay_above_tenants_and_tenants_share_within_a_lane() -> None:
    sched: LaneScheduler[Item] = LaneScheduler(weight_of=weights({"big": 3.0}))
    for i in range(30):
        sched.push(Item("big", i), LOW, tenant="big")
        sched.push(Item("small", i), LOW, tenant="small")
    urgent = Item("small", 99)
    sched.push(urgent, HIGH, tenant="small")
    now_s = 0.0
    assert sched.pop(now_s) is urgent  # the higher lane first, whatever the tenants' service
    order = []
    for _ in range(20):
        now_s += 0.1
        item = sched.pop(now_s)
        assert item is not None
        order.append(item.tenant)
    assert order.count("big") == 15 and order.count("small") == 5  # 3:1 within the lane
    assert sched.waiting("bulk") == 40 and sched.waiting_of("bulk", "small") == 25


def test_a_lane_owed_its_min_share_still_gets_it_with_tenants() -> None:
    sched: LaneScheduler[Item] = LaneScheduler()
    for i in range(200):
        sched.push(Item("t1", i), HIGH, tenant="t1")
        sched.push(Item("t2", i), LOW, tenant="t2" if i % 2 else "t3")
    lanes = Counter()
    now_s = 0.0
    for _ in range(100):
        now_s += 0.01
        item = sched.pop(now_s)
        assert item is not None
        lanes[item.tenant in ("t2", "t3")] += 1
    assert lanes[True] >= 9  # bulk's 10% of the slots
