"""A rebalance in the middle of in-flight work, on the in-memory edges and on the real broker
(`make_bus`), and exactly_once across a scale-out (real broker: transactions).

One instance has every job in flight (its provider holds the answers) when a second one
joins the group. The sticky assignment moves half the partitions. at_least_once hands the
moved partitions' work over: the new owner parks those records and the old owner's answers,
when they come, are written and complete them there (nobody asks twice); an old owner that
does not finish by the hand-over's deadline has them done by the new owner, and its late
answers are dropped. A stopping instance hands its work over the same way, leaving the group
before it drains. exactly_once hands nothing over: a moved partition's jobs are asked again
by their new owner and the old owner's answers to them are dropped, never written.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from consumer.core.completion import Completion, CompletionRequest
from consumer.kafka.partitioning import partition_for
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import InProcessService, KafkaBus, job, tier_file_dict, until
from consumer.testing.simulator import answer_for, extract_input

PARTITIONS = 4
JOBS = 24
#: bounded waits: this many checks, WAIT_S apart
CHECKS, WAIT_S = 600, 0.05
UNTIL_S = CHECKS * WAIT_S


class HeldProvider:
    """A provider per instance whose answers wait for one shared gate; counts what each asked."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.asked: Counter[str] = Counter()

    def provider(self) -> FakeProvider:
        async def held(request: CompletionRequest) -> Completion:
            text = extract_input(request.messages[-1].content)
            self.asked[text] += 1
            await self.gate.wait()
            return text_completion(answer_for(text))

        return FakeProvider(held, name="small")


def _tiers() -> dict[str, Any]:
    # every job its own request, all of them in flight at once
    limiter = {"algorithm": "aimd", "initial": 64, "min": 1, "max": 64}
    return tier_file_dict("http://127.0.0.1:9/v1", batching=False, limiter=limiter)


def _jobs() -> tuple[list[dict[str, Any]], dict[str, str], dict[str, int]]:
    jobs = [job(i, batch=False) for i in range(JOBS)]
    partitions = list(range(PARTITIONS))
    text_of = {j["id"]: j["variables"]["text"] for j in jobs}
    partition_of = {j["variables"]["text"]: partition_for(j["id"].encode(), partitions) for j in jobs}
    return jobs, text_of, partition_of


async def _committed_all(bus: Any, partition_of: dict[str, int]) -> list[int]:
    """The committed offsets once every partition's are past all its jobs (bounded wait)."""
    per_partition = Counter(partition_of.values())
    wanted = [per_partition[p] for p in range(PARTITIONS)]
    committed: list[int] = []
    for _ in range(CHECKS):
        committed = [await bus.committed(p) for p in range(PARTITIONS)]
        if committed == wanted:
            break
        await asyncio.sleep(WAIT_S)
    return committed


def _moved_jobs(partition_of: dict[str, int], two: Any) -> set[str]:
    """The texts of the jobs on the partitions `two` owns now."""
    owned = {tp.partition for tp in two.pipeline._intake.assignment()}
    return {text for text, p in partition_of.items() if p in owned}


async def test_a_rebalance_mid_flight_hands_the_moved_work_over(make_bus: Callable[..., Any]) -> None:
    """The old owner finishes the moved partitions' running requests; their new owner parks
    those records and completes them on the old owner's word: nothing asked twice, nothing
    lost, every offset committed by the new owner."""
    bus = make_bus(partitions=PARTITIONS)
    jobs, text_of, partition_of = _jobs()
    gate = asyncio.Event()
    first, second = HeldProvider(gate), HeldProvider(gate)
    one = bus.service(_tiers(), providers={"small": first.provider()})
    async with one:
        await bus.produce(jobs)
        assert await until(lambda: len(first.asked) == JOBS, UNTIL_S), (
            "the first instance did not take every job"
        )
        two = bus.service(_tiers(), providers={"small": second.provider()})
        async with two:
            assert await until(lambda: one.stats_snapshot()["partitions_lost"] == PARTITIONS // 2, UNTIL_S)
            moved = _moved_jobs(partition_of, two)
            # the new owner read the moved records and parks them: the old owner is on them
            assert await until(lambda: two.stats_snapshot()["handover_parked"] == len(moved), UNTIL_S)
            assert second.asked == Counter()
            gate.set()  # every answer comes now, the moved jobs' from the old owner
            outcomes = await bus.wait_for_outcomes(set(text_of), timeout_s=60)
            assert await until(lambda: two.stats_snapshot()["handover_completed"] == len(moved), UNTIL_S)
            committed = await _committed_all(bus, partition_of)
            snapshot = two.stats_snapshot()

    assert len(moved) > 0 and {partition_of[t] for t in moved} != set(range(PARTITIONS))
    assert outcomes.ids() == set(text_of) and not outcomes.dead
    assert outcomes.duplicates() == {}
    for jid, (result, *_) in outcomes.results.items():
        assert result["output"] == answer_for(text_of[jid])
    assert all(n == 1 for n in first.asked.values()) and len(first.asked) == JOBS
    assert second.asked == Counter(), "a handed-over job was asked again by its new owner"
    assert snapshot["handover_redone"] == 0 and snapshot["handover_parked"] == 0
    assert one.stats_snapshot()["dropped_late"] == 0
    assert committed == [Counter(partition_of.values())[p] for p in range(PARTITIONS)]


async def test_a_moved_partitions_queued_jobs_stay_with_the_old_owner(make_bus: Callable[..., Any]) -> None:
    """One request at a time: at the rebalance most jobs wait in the old owner's plan queue,
    not started. They are handed over with the running one and the old owner does them all;
    the new owner asks none of them."""
    bus = make_bus(partitions=PARTITIONS)
    jobs, text_of, partition_of = _jobs()
    single = {"algorithm": "fixed", "initial": 1, "min": 1, "max": 1}
    one_at_a_time = tier_file_dict("http://127.0.0.1:9/v1", batching=False, limiter=single)
    gate = asyncio.Event()
    first, second = HeldProvider(gate), HeldProvider(gate)
    one = bus.service(one_at_a_time, providers={"small": first.provider()})
    async with one:
        await bus.produce(jobs)
        assert await until(
            lambda: len(first.asked) == 1 and one.stats_snapshot()["inflight"] == JOBS, UNTIL_S
        )
        two = bus.service(one_at_a_time, providers={"small": second.provider()})
        async with two:
            assert await until(lambda: one.stats_snapshot()["partitions_lost"] == PARTITIONS // 2, UNTIL_S)
            moved = _moved_jobs(partition_of, two)
            assert await until(lambda: two.stats_snapshot()["handover_parked"] == len(moved), UNTIL_S)
            gate.set()
            outcomes = await bus.wait_for_outcomes(set(text_of), timeout_s=60)
            assert await until(lambda: two.stats_snapshot()["handover_completed"] == len(moved), UNTIL_S)

    assert moved and outcomes.ids() == set(text_of) and outcomes.duplicates() == {}
    assert second.asked == Counter() and len(first.asked) == JOBS


async def test_an_old_owner_that_does_not_finish_has_its_work_redone_at_the_deadline(
    make_bus: Callable[..., Any],
) -> None:
    """Without the old owner's answers (it hangs, as a dead one would) the new owner runs the
    parked records itself at the hand-over's deadline; the old owner's answers coming after it
    are dropped: one outcome per job."""
    bus = make_bus(partitions=PARTITIONS, PROMPTBUS_HANDOVER_TIMEOUT_S="1")
    jobs, text_of, partition_of = _jobs()
    held, answering = asyncio.Event(), asyncio.Event()
    answering.set()
    first, second = HeldProvider(held), HeldProvider(answering)
    one = bus.service(_tiers(), providers={"small": first.provider()})
    async with one:
        await bus.produce(jobs)
        assert await until(lambda: len(first.asked) == JOBS, UNTIL_S), (
            "the first instance did not take every job"
        )
        two = bus.service(_tiers(), providers={"small": second.provider()})
        async with two:
            assert await until(lambda: one.stats_snapshot()["partitions_lost"] == PARTITIONS // 2, UNTIL_S)
            moved = _moved_jobs(partition_of, two)
            # past the deadline the new owner asks them itself
            assert await until(lambda: set(second.asked) == moved, UNTIL_S)
            ids_moved = {jid for jid, text in text_of.items() if text in moved}
            await bus.wait_for_outcomes(ids_moved, timeout_s=60)
            held.set()  # the old owner answers at last: too late for the moved jobs
            outcomes = await bus.wait_for_outcomes(set(text_of), timeout_s=60)
            assert await until(lambda: one.stats_snapshot()["dropped_late"] >= len(moved), UNTIL_S)
            committed = await _committed_all(bus, partition_of)
            snapshot = two.stats_snapshot()

    assert len(moved) > 0
    assert outcomes.ids() == set(text_of) and not outcomes.dead
    assert outcomes.duplicates() == {}, "a job was written by both owners"
    assert all(n == 1 for n in second.asked.values())
    assert snapshot["handover_redone"] == len(moved) and snapshot["handover_completed"] == 0
    assert one.stats_snapshot()["dropped_late"] == len(moved)
    assert committed == [Counter(partition_of.values())[p] for p in range(PARTITIONS)]


async def test_a_stopping_instance_hands_its_work_over_and_leaves_at_once(
    make_bus: Callable[..., Any],
) -> None:
    """Stopped (SIGTERM's stop) with requests running, an instance hands them over and leaves
    the group before it drains: the other one takes its partitions at once, parks the running
    records and completes them when the stopping one's answers are written; new jobs of those
    partitions are done meanwhile by their new owner."""
    bus = make_bus(partitions=PARTITIONS)
    jobs, text_of, _ = _jobs()
    later = [job(i, batch=False) for i in range(JOBS, 2 * JOBS)]
    held, answering = asyncio.Event(), asyncio.Event()
    answering.set()
    first, second = HeldProvider(held), HeldProvider(answering)
    one = bus.service(_tiers(), providers={"small": first.provider()})
    two = bus.service(_tiers(), providers={"small": second.provider()})
    async with two:
        await one.__aenter__()
        try:
            assert await until(lambda: len(one.pipeline._intake.assignment()) == PARTITIONS // 2, UNTIL_S)
            await bus.produce(jobs)
            assert await until(lambda: len(first.asked) + len(second.asked) == JOBS, UNTIL_S)
            mine = set(first.asked)
            assert mine, "the stopping instance took no job"
            one.stop.set()  # what SIGTERM does
            # its partitions move while its answers are still held: the other one parks them
            assert await until(lambda: two.stats_snapshot()["handover_parked"] == len(mine), UNTIL_S)
            await bus.produce(later)
            later_ids = {j["id"] for j in later}
            await bus.wait_for_outcomes(later_ids, timeout_s=60)  # every partition is served
            held.set()
            assert one.task is not None
            await asyncio.wait_for(one.task, 60)
        finally:
            held.set()
            await one.__aexit__(None, None, None)
        outcomes = await bus.wait_for_outcomes(set(text_of) | later_ids, timeout_s=60)
        assert await until(lambda: two.stats_snapshot()["handover_completed"] == len(mine), UNTIL_S)
        snapshot = two.stats_snapshot()

    assert outcomes.ids() == set(text_of) | later_ids and not outcomes.dead
    assert outcomes.duplicates() == {}
    assert all(n == 1 for n in first.asked.values()) and set(first.asked) == mine
    assert not set(second.asked) & mine, "a handed-over job was asked again"
    assert snapshot["handover_redone"] == 0


async def test_two_instances_stopping_together_hand_their_work_to_the_third(
    make_bus: Callable[..., Any],
) -> None:
    """A scale in: two of three instances stop at once, their requests still running (one's
    leave may reach the other while it leaves). The third parks every record they hand over
    and completes each on their word, none at a deadline: nothing asked twice."""
    bus = make_bus(partitions=PARTITIONS + 2)
    jobs = [job(i, batch=False) for i in range(JOBS)]
    ids = {j["id"] for j in jobs}
    held, answering = asyncio.Event(), asyncio.Event()
    answering.set()
    leaving = [HeldProvider(held), HeldProvider(held)]
    staying = HeldProvider(answering)
    stays = bus.service(_tiers(), providers={"small": staying.provider()})
    async with stays:
        going = [bus.service(_tiers(), providers={"small": p.provider()}) for p in leaving]
        for svc in going:
            await svc.__aenter__()
        try:
            shares = lambda: [len(s.pipeline._intake.assignment()) for s in (stays, *going)]  # noqa: E731
            assert await until(lambda: shares() == [2, 2, 2], UNTIL_S), shares()
            await bus.produce(jobs)
            theirs = lambda: set(leaving[0].asked) | set(leaving[1].asked)  # noqa: E731
            assert await until(lambda: len(theirs()) + len(staying.asked) == JOBS, UNTIL_S)
            handed = theirs()
            for svc in going:
                svc.stop.set()
            assert await until(lambda: stays.stats_snapshot()["handover_parked"] == len(handed), UNTIL_S)
            held.set()
            for svc in going:
                assert svc.task is not None
                await asyncio.wait_for(svc.task, 60)
        finally:
            held.set()
            for svc in going:
                await svc.__aexit__(None, None, None)
        outcomes = await bus.wait_for_outcomes(ids, timeout_s=60)
        assert await until(lambda: stays.stats_snapshot()["handover_completed"] == len(handed), UNTIL_S)
        snapshot = stays.stats_snapshot()

    assert handed and outcomes.ids() == ids and not outcomes.dead
    assert outcomes.duplicates() == {}
    assert not set(staying.asked) & handed, "a handed-over job was asked again"
    assert snapshot["handover_redone"] == 0


async def _rebalance_mid_flight(bus: Any) -> None:
    jobs = [job(i, batch=False) for i in range(JOBS)]
    text_of = {j["id"]: j["variables"]["text"] for j in jobs}
    partitions = list(range(PARTITIONS))
    partition_of = {j["variables"]["text"]: partition_for(j["id"].encode(), partitions) for j in jobs}
    gate = asyncio.Event()
    first, second = HeldProvider(gate), HeldProvider(gate)
    one = bus.service(_tiers(), providers={"small": first.provider()})
    async with one:
        await bus.produce(jobs)
        assert await until(lambda: len(first.asked) == JOBS, UNTIL_S), (
            "the first instance did not take every job"
        )
        two = bus.service(_tiers(), providers={"small": second.provider()})
        async with two:
            # the moved partitions' jobs are read again by their new owner, from offset 0
            def moved_all_asked() -> bool:
                moved = {partition_of[text] for text in second.asked}
                wanted = {text for text, p in partition_of.items() if p in moved}
                return bool(moved) and set(second.asked) == wanted

            assert await until(moved_all_asked, UNTIL_S), "the second instance did not take over a partition"
            gate.set()  # every answer comes now: the old owner's to the moved jobs too
            outcomes = await bus.wait_for_outcomes(set(text_of), timeout_s=60)
            # the old owner's answers to the moved jobs end after the loss: dropped, not written
            await until(lambda: one.stats_snapshot()["dropped_late"] >= len(second.asked), UNTIL_S)
            dropped = one.stats_snapshot()["dropped_late"]
            committed = await _committed_all(bus, partition_of)

    moved = {partition_of[text] for text in second.asked}
    assert len(moved) == PARTITIONS // 2, f"the sticky assignment moved {sorted(moved)}"
    assert outcomes.ids() == set(text_of) and not outcomes.dead
    assert outcomes.duplicates() == {}, "a job of a moved partition was written by both owners"
    for jid, (result, *_) in outcomes.results.items():
        assert result["output"] == answer_for(text_of[jid])
    assert all(n == 1 for n in first.asked.values()) and len(first.asked) == JOBS
    assert all(n == 1 for n in second.asked.values())
    kept_asked_again = [t for t in second.asked if partition_of[t] not in moved]
    assert kept_asked_again == [], "a kept partition's job was asked again"
    assert dropped == len(second.asked)
    per_partition = Counter(partition_of.values())
    assert committed == [per_partition[p] for p in range(PARTITIONS)]


async def test_without_hand_overs_a_rebalance_mid_flight_redoes_only_the_moved_partitions(
    make_bus: Callable[..., Any],
) -> None:
    await _rebalance_mid_flight(make_bus(partitions=PARTITIONS, PROMPTBUS_HANDOVER_TIMEOUT_S="0"))


@pytest.mark.integration
async def test_exactly_once_across_a_scale_out(kafka_bootstrap: str) -> None:
    """The moved partitions' new producers fence the old owner's; its held outcomes go with
    its producers, uncommitted: a read_committed reader sees one result per job."""
    await _rebalance_mid_flight(KafkaBus(kafka_bootstrap, partitions=PARTITIONS, guarantee="exactly_once"))


def _instance(bus: KafkaBus, name: str, provider: FakeProvider) -> InProcessService:
    settings = bus.settings.model_copy(update={"instance_id": name})
    return InProcessService(settings, _tiers(), providers={"small": provider})


@pytest.mark.integration
async def test_static_membership_a_restart_within_the_session_is_no_rebalance(kafka_bootstrap: str) -> None:
    """Two instances with PROMPTBUS_INSTANCE_ID; one stops and starts again under the same
    name within the session: the group does not rebalance (the other one goes on untouched)
    and the restarted one is given its partitions back, reading on from their commits."""
    bus = KafkaBus(kafka_bootstrap, partitions=PARTITIONS)
    gate = asyncio.Event()
    gate.set()
    answers = HeldProvider(gate)
    jobs = [job(i, batch=False) for i in range(3 * JOBS)]
    ids = [j["id"] for j in jobs]
    stays = _instance(bus, "pod-1", answers.provider())
    async with stays:
        async with _instance(bus, "pod-0", answers.provider()):
            await bus.produce(jobs[:JOBS])
            await bus.wait_for_outcomes(set(ids[:JOBS]), timeout_s=60)
            before = stays.stats_snapshot()["rebalances"]
        await bus.produce(jobs[JOBS : 2 * JOBS])  # half of them wait for the restarted one
        restarted = _instance(bus, "pod-0", answers.provider())
        async with restarted:
            await bus.produce(jobs[2 * JOBS :])
            outcomes = await bus.wait_for_outcomes(set(ids), timeout_s=60)
            after = stays.stats_snapshot()["rebalances"]
            again = restarted.stats_snapshot()
    assert before >= 1  # the two joined one after the other
    assert after == before, "the restart rebalanced the group"
    assert again["rebalances"] == 0 and again["items_in"] > 0, "the restarted one got no partition back"
    assert outcomes.ids() == set(ids) and not outcomes.dead
    assert outcomes.duplicates() == {}
    assert all(n == 1 for n in answers.asked.values())
