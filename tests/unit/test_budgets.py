"""Tenants' daily budgets (`consumer.core.budgets`), pure: leases claimed before they are
spent, reservations settled from usage, the group's claims read from other instances, the UTC
day, and the bound on overspending."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.budgets import (
    LEASE_FRACTION,
    BudgetBook,
    Cost,
    Exhausted,
    LeaseWanted,
    Reservation,
    next_utc_midnight_s,
    utc_day,
)
from consumer.core.tenants import TenantPolicies, TenantPolicy

#: 2026-12-01 10:00:00 UTC
NOON_S = 1796119200.0


def book(usd: float | None = 1.0, tokens: int | None = None, instance: str = "i1") -> BudgetBook:
    policies = TenantPolicies({"t": TenantPolicy("t", usd_per_day=usd, tokens_per_day=tokens)})
    return BudgetBook(policies, instance, now_s=NOON_S)


def reserve(b: BudgetBook, estimate: Cost, now_s: float = NOON_S) -> Reservation | Exhausted:
    """What the runtime does: claim the lease the book wants (as if its write was acknowledged),
    then reserve again."""
    verdict = b.try_reserve("t", estimate, now_s)
    if isinstance(verdict, LeaseWanted):
        b.claimed(verdict)
        verdict = b.try_reserve("t", estimate, now_s)
    assert not isinstance(verdict, LeaseWanted)
    return verdict


def test_utc_days() -> None:
    assert utc_day(NOON_S) == "2026-12-01"
    assert utc_day(next_utc_midnight_s(NOON_S)) == "2026-12-02"
    assert next_utc_midnight_s(NOON_S) - NOON_S == 14 * 3600


def test_a_reservation_needs_a_lease_first_and_the_lease_is_a_slice_of_the_budget() -> None:
    b = book(usd=10.0)
    wanted = b.try_reserve("t", Cost(0.01, 100), NOON_S)
    assert isinstance(wanted, LeaseWanted)
    assert wanted.amount.usd == pytest.approx(10.0 * LEASE_FRACTION)  # not the whole budget
    assert b.spent("t", NOON_S) == Cost()  # nothing spent before the lease is recorded
    b.claimed(wanted)
    held = b.try_reserve("t", Cost(0.01, 100), NOON_S)
    assert isinstance(held, Reservation)
    # the next ones fit in the same lease: no new board write
    assert all(isinstance(b.try_reserve("t", Cost(0.01, 100), NOON_S), Reservation) for _ in range(19))
    assert isinstance(b.try_reserve("t", Cost(0.01, 100), NOON_S), LeaseWanted)


def test_settled_usage_replaces_the_estimate_and_frees_what_it_did_not_cost() -> None:
    b = book(usd=1.0)
    held = reserve(b, Cost(0.5, 10))
    assert isinstance(held, Reservation)
    assert b.spent("t", NOON_S).usd == pytest.approx(0.5)
    b.settle(held, Cost(0.1, 4))
    assert b.spent("t", NOON_S) == Cost(pytest.approx(0.1), 4)  # type: ignore[arg-type]
    assert isinstance(reserve(b, Cost(0.8, 10)), Reservation)  # 0.9 of 1.0: fits
    refused = reserve(b, Cost(0.2, 10))
    assert isinstance(refused, Exhausted) and "$" in refused.message
    assert b.exhausted("t", NOON_S)


def test_exhausted_until_room_for_the_refused_estimate_comes_back() -> None:
    b = book(usd=1.0)
    first, second = reserve(b, Cost(0.6, 0)), reserve(b, Cost(0.3, 0))
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    assert isinstance(reserve(b, Cost(0.3, 0)), Exhausted)
    assert b.exhausted("t", NOON_S)
    b.settle(first, Cost(0.55, 0))  # 0.05 back: still no room for 0.3
    assert b.exhausted("t", NOON_S)
    b.release(second)  # not sent: its 0.3 back
    assert not b.exhausted("t", NOON_S)
    assert isinstance(reserve(b, Cost(0.3, 0)), Reservation)


def test_a_new_utc_day_starts_from_nothing() -> None:
    b = book(usd=1.0)
    held = reserve(b, Cost(1.0, 0))
    assert isinstance(held, Reservation) and isinstance(reserve(b, Cost(0.1, 0)), Exhausted)
    tomorrow_s = next_utc_midnight_s(NOON_S) + 1
    assert not b.exhausted("t", tomorrow_s)
    assert b.roll(tomorrow_s) is False  # rolled already by the question above
    b.settle(held, Cost(1.0, 0))  # yesterday's request counts in no day
    assert b.spent("t", tomorrow_s) == Cost()
    assert isinstance(reserve(b, Cost(0.5, 0), tomorrow_s), Reservation)


def test_token_budgets_work_without_pricing() -> None:
    b = book(usd=None, tokens=1000)
    held = reserve(b, Cost(0.0, 600))
    assert isinstance(held, Reservation)
    assert isinstance(reserve(b, Cost(0.0, 600)), Exhausted)
    b.settle(held, Cost(0.0, 300))
    assert isinstance(reserve(b, Cost(0.0, 600)), Reservation)


def test_other_instances_claims_count_and_a_record_of_another_day_does_not() -> None:
    a, other = book(usd=1.0, instance="a"), book(usd=1.0, instance="b")
    for _ in range(40):
        held = reserve(other, Cost(0.02, 0))
        assert isinstance(held, Reservation)
    record = other.record(NOON_S)
    a.observe("b", record, NOON_S)
    assert a.spent("t", NOON_S).usd == pytest.approx(record["accounts"]["t"]["claimed_usd"])
    assert isinstance(reserve(a, Cost(0.3, 0)), Exhausted)  # b claimed 0.8 or more
    a.observe("b", {**record, "day": "2026-11-30"}, NOON_S)
    assert a.spent("t", NOON_S) == Cost()
    a.observe("a", record, NOON_S)  # its own key: not another instance
    assert a.spent("t", NOON_S) == Cost()


def test_a_stopping_instance_gives_its_unspent_leases_back() -> None:
    a, other = book(usd=1.0, instance="a"), book(usd=1.0, instance="b")
    held = reserve(other, Cost(0.01, 0))
    assert isinstance(held, Reservation)
    other.settle(held, Cost(0.01, 0))
    claimed = other.record(NOON_S)["accounts"]["t"]["claimed_usd"]
    final = other.record(NOON_S, final=True)["accounts"]["t"]
    assert claimed > 0.01 and final["claimed_usd"] == pytest.approx(0.01) == final["settled_usd"]
    a.observe("b", final, NOON_S)  # not a record: ignored
    a.observe("b", other.record(NOON_S, final=True), NOON_S)
    assert a.spent("t", NOON_S).usd == pytest.approx(0.01)


def test_a_killed_instances_leases_stay_spent() -> None:
    """What a SIGKILL leaves: the last record written, with every lease claimed; a restarted
    instance (a new key) counts all of it, spent or not."""
    killed = book(usd=1.0, instance="old")
    for _ in range(10):
        reserve(killed, Cost(0.05, 0))  # reserved, never settled: the process died
    last_written = killed.record(NOON_S)
    restarted = book(usd=1.0, instance="new")
    restarted.observe("old", last_written, NOON_S)
    assert restarted.spent("t", NOON_S).usd >= 0.5


@settings(max_examples=60, deadline=None)
@given(
    instances=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    estimate_usd=st.floats(0.001, 0.05),
)
def test_spend_never_passes_the_budget_by_more_than_the_estimates_error(
    instances: int, seed: int, estimate_usd: float
) -> None:
    """Instances sharing a budget through their records, requests costing up to 10% more than
    estimated: the group's settled spend stays within the budget plus that error of the
    requests that were reserved."""
    rng = random.Random(seed)
    books = [book(usd=1.0, instance=f"i{n}") for n in range(instances)]
    spent, reserved_estimates, refused = 0.0, 0.0, False
    for _ in range(400):
        b = books[rng.randrange(instances)]
        for n, other in enumerate(books):
            if other is not b:
                b.observe(f"i{n}", other.record(NOON_S), NOON_S)  # the board's latest
        held = reserve(b, Cost(estimate_usd, 0))
        if isinstance(held, Exhausted):
            refused = True
            continue
        actual = estimate_usd * rng.uniform(0.3, 1.1)
        b.settle(held, Cost(actual, 0))
        spent += actual
        reserved_estimates += estimate_usd
    assert spent <= 1.0 + 0.1 * reserved_estimates + 1e-9
    if refused:  # refused only once the group had claimed all but less than one estimate
        claimed = sum(b.record(NOON_S)["accounts"]["t"]["claimed_usd"] for b in books)
        assert claimed > 1.0 - estimate_usd - 1e-9
