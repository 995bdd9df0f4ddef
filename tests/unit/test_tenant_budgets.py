"""Tenants' budgets at run time on the group's board (`consumer.kafka.board.TopicBoard`) over
the in-memory edges: leases written before they are spent, every instance's claims read at
start and as they come, unspent leases given back at stop and kept after a kill; held jobs
going on at the next UTC day (a fake wall clock)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from consumer.core.budgets import Cost, Exhausted, Reservation, next_utc_midnight_s
from consumer.core.tenants import TenantPolicies, TenantPolicy
from consumer.kafka.board import TopicBoard, board_key
from consumer.kafka.records import TopicPartition
from consumer.runtime.accounts import TenantLedger
from consumer.runtime.budgets import BUDGETS_RECORD, TenantBudgets
from consumer.runtime.context import JobContext
from consumer.runtime.delivery import OutcomeWriter
from consumer.runtime.stats import ServiceStats
from consumer.runtime.tenancy import TenantGate
from consumer.testing.harness import until
from consumer.testing.memory import MemoryBroker, MemoryProducer, MemoryTopicFollower

TOPIC = "budgets"
NOON_S = 1796119200.0  # 2026-12-01 10:00 UTC


def policies(on_exhausted: str = "dead_letter") -> TenantPolicies:
    return TenantPolicies({"t": TenantPolicy("t", usd_per_day=1.0, on_exhausted=on_exhausted)})  # type: ignore[arg-type]


def budgets(broker: MemoryBroker, instance: str, clock: list[float] | None = None) -> TenantBudgets:
    broker.topic(TOPIC, 1)
    board = TopicBoard(
        MemoryTopicFollower(broker, TOPIC), MemoryProducer(broker), topic=TOPIC, group="g", instance=instance
    )
    now = clock if clock is not None else [NOON_S]
    return TenantBudgets(policies(), instance, board, publish_interval_s=0.05, clock=lambda: now[0])


async def test_a_lease_is_on_the_board_before_it_is_spent_and_other_instances_count_it() -> None:
    broker = MemoryBroker(partitions=1)
    a = budgets(broker, "a")
    await a.start()
    held = await a.reserve("t", Cost(0.1, 0))
    assert isinstance(held, Reservation)
    (record,) = broker.records(TOPIC)  # the lease went out before the reservation was granted
    assert record.key == board_key("g", "a", BUDGETS_RECORD) and b'"claimed_usd":' in (record.value or b"")
    b = budgets(broker, "b")
    await b.start()  # reads every instance's latest first
    assert b.spent("t").usd >= 0.1
    # together they cannot reserve more than the day holds
    granted = 0.1
    for instance in (a, b) * 12:
        verdict = await instance.reserve("t", Cost(0.1, 0))
        if isinstance(verdict, Reservation):
            granted += 0.1
    assert granted <= 1.0 + 1e-9
    assert isinstance(await b.reserve("t", Cost(0.1, 0)), Exhausted)
    await a.stop()
    await b.stop()


async def test_instances_claiming_at_once_never_grant_more_than_the_day_holds() -> None:
    broker = MemoryBroker(partitions=1)
    instances = [budgets(broker, name) for name in "abc"]
    for instance in instances:
        await instance.start()
    # every instance asks for many estimates at once: their lease claims interleave on the board
    verdicts = await asyncio.gather(*(i.reserve("t", Cost(0.07, 0)) for i in instances for _ in range(8)))
    granted = sum(v.estimate.usd for v in verdicts if isinstance(v, Reservation))
    assert 0.07 * 10 <= granted <= 1.0 + 1e-9, granted  # most of the day, never past it
    assert any(isinstance(v, Exhausted) for v in verdicts)
    for instance in instances:
        await instance.stop()


async def test_a_stopping_instance_gives_back_what_it_did_not_spend_and_a_killed_one_does_not() -> None:
    broker = MemoryBroker(partitions=1)
    graceful, killed, watcher = budgets(broker, "graceful"), budgets(broker, "killed"), budgets(broker, "w")
    for instance in (graceful, killed, watcher):
        await instance.start()
    for instance in (graceful, killed):
        held = await instance.reserve("t", Cost(0.05, 0))
        assert isinstance(held, Reservation)
        instance.settle(held, Cost(0.05, 0))  # spent 0.05 of a lease of 0.2 (four estimates)
    assert await until(lambda: watcher.spent("t").usd >= 0.4 - 1e-9, 5)
    await graceful.stop()  # its record shrinks to what it spent
    assert await until(lambda: abs(watcher.spent("t").usd - 0.25) < 1e-9, 5), watcher.spent("t")
    # `killed` is never stopped: a restart (a new instance id) still counts its whole lease
    restarted = budgets(broker, "restarted")
    await restarted.start()
    assert abs(restarted.spent("t").usd - 0.25) < 1e-9
    await watcher.stop()
    await restarted.stop()


@dataclass
class _Job:
    """What the budget gate reads of a job context."""

    tenant: str
    n: int
    done: bool = False
    source: Any = field(default_factory=lambda: _Source(TopicPartition("jobs", 0)))


@dataclass
class _Source:
    tp: TopicPartition


@dataclass
class _Outcomes:
    failed: list[tuple[Any, str, str]] = field(default_factory=list)

    def fail(self, ctx: Any, kind: Any, message: str, *, attempts: int) -> None:
        ctx.done = True
        self.failed.append((ctx, kind.value, message))


def gate(on_exhausted: str, clock: list[float]) -> tuple[TenantGate, _Outcomes]:
    stats = ServiceStats(instance="i")
    ledger = TenantLedger(policies(on_exhausted), stats)
    spend = TenantBudgets(policies(on_exhausted), "i", None, clock=lambda: clock[0])
    outcomes = _Outcomes()
    return TenantGate(ledger, spend, cast(OutcomeWriter, outcomes)), outcomes


async def _exhaust(g: TenantGate) -> None:
    assert isinstance(await g.budgets.reserve("t", Cost(0.9, 0)), Reservation)
    assert isinstance(await g.budgets.reserve("t", Cost(0.2, 0)), Exhausted)


async def test_held_jobs_wait_for_the_next_utc_day() -> None:
    clock = [NOON_S]
    g, outcomes = gate("hold", clock)
    await _exhaust(g)
    jobs = [_Job("t", n) for n in range(3)] + [_Job("someone-else", 9)]
    admitted = [g.admits(cast(JobContext, j)) for j in jobs]
    assert admitted == [False, False, False, True]  # the unnamed tenant is 'other': unlimited
    assert g.held("t") == 3 and not outcomes.failed
    assert g.take_released() == []  # still the same day
    clock[0] = next_utc_midnight_s(NOON_S) + 1
    assert [cast(_Job, c).n for c in g.take_released()] == [0, 1, 2]
    assert g.held("t") == 0


async def test_held_jobs_of_revoked_partitions_are_handed_back_and_a_drain_takes_the_rest() -> None:
    clock = [NOON_S]
    g, _ = gate("hold", clock)
    await _exhaust(g)
    mine, revoked = _Job("t", 1), _Job("t", 2, source=_Source(TopicPartition("jobs", 7)))
    for j in (mine, revoked):
        g.admits(cast(JobContext, j))
    assert g.drop_partitions({TopicPartition("jobs", 7)}) == [revoked]
    assert g.drain() == [mine] and g.held("t") == 0


async def test_a_dead_letter_tenant_is_refused_budget_exhausted_at_once() -> None:
    clock = [NOON_S]
    g, outcomes = gate("dead_letter", clock)
    await _exhaust(g)
    job = _Job("t", 1)
    assert not g.admits(cast(JobContext, job)) and job.done
    ((_, kind, message),) = outcomes.failed
    # $0.90 of $1 spent: the next estimate, $0.20, is more than the $0.10 left
    assert kind == "budget_exhausted"
    said = "tenant 't': a request's estimate, $0.2000, is more than the daily budget left ($0.1000 of $1"
    assert said in message
    g.refresh_gauges()
    assert g._ledger.stats_of("t").budget_usd == 1.0
